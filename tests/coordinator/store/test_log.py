"""coordinator/store/ (the file log): framing, replay, torn tails, mid-log corruption, group commit, compaction,
fsync failures, and a SIGKILL'd writer process. No sleeps: every interleaving is forced with events."""
from __future__ import annotations

import errno
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest

from coordinator.store import ShardFailedError
from coordinator.store import compaction as LC
from coordinator.store import fileio as LI
from coordinator.store import filelog as LF
from coordinator.store import logformat as L
from coordinator.store import writer as LW
from coordinator.store.filelog import LogStore
from coordinator.store.logformat import (
    HEADER_SIZE,
    LogClosedError,
    LogCorruptError,
    LogError,
    LogFormatError,
)

REPO = Path(__file__).resolve().parents[3]
WAIT = 30  # seconds: only a bound for a hung test, never a pacing sleep


class Recorder:
    """Stands in for the module's structlog logger."""

    def __init__(self):
        self.events: list[tuple[str, str, dict]] = []

    def _rec(self, level):
        def f(event, **kw):
            self.events.append((level, event, kw))
        return f

    def __getattr__(self, level):
        return self._rec(level)

    def named(self, event):
        return [kw for _lvl, ev, kw in self.events if ev == event]


@pytest.fixture
def events(monkeypatch):
    rec = Recorder()
    for module in (LF, LW, LC, LI):  # the file log's modules share the "herd.log" logger
        monkeypatch.setattr(module, "log", rec)
    return rec


def log_path(d, shard=0) -> Path:
    return Path(d) / L.shard_dir_name(shard) / L.LOG_NAME


def opened(d, n=2, **kw) -> tuple[LogStore, dict]:
    s = LogStore(d, n, **kw)
    return s, s.open()


def _trim_only(st) -> None:
    if st.allocated > st.size:
        os.ftruncate(st.fd, st.size)
        st.allocated = st.size


def write_batches(d, shard_entries, n=2, fsync="always", as_if_crashed=True, **kw) -> None:
    """Each inner list is one append, awaited before the next (so one batch each). By default the
    files end as after a crash (once the OS wrote everything): the header does not say the whole
    file is durable, as a clean stop's does, so damage at the tail reads as a torn write."""
    s, _ = opened(d, n, fsync=fsync, **kw)
    if as_if_crashed:
        s.writer._stop_cleanly = _trim_only
    try:
        for shard, entries in shard_entries:
            s.append(shard, entries).result(WAIT)
    finally:
        s.close()


def reopen(d, n=2, **kw) -> dict:
    s, data = opened(d, n, **kw)
    s.close()
    return data


def entry_offsets(d, shard=0) -> list[int]:
    return [p for p, _k, _v in L.read_log_file(log_path(d, shard)).entries]


def fold(entries) -> dict:
    state = {}
    for k, v in entries:
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state


def kv(i: int) -> tuple[bytes, bytes]:
    return b"key-%d" % i, b"value-%d" % i


# ---- format ------------------------------------------------------------------------------------


def test_crc32c_matches_the_castagnoli_check_value_and_the_pure_fallback():
    assert L.crc32c(b"123456789") == 0xE3069283
    assert L.crc32c_pure(b"123456789") == 0xE3069283
    data = random.Random(1).randbytes(3000)
    assert L.crc32c(data) == L.crc32c_pure(data)


def test_entry_layout_is_pinned():
    frame = bytes(L.encode_entries([(b"k", b"vv")], L.PREFIX_DURABLE))
    payload = b"\x00\x01" + b"\x00\x00\x00\x01k" + b"\x00\x00\x00\x02vv"
    assert frame == struct.pack(">II", len(payload), L.crc32c(payload)) + payload
    tomb = bytes(L.encode_entries([(b"k", None)]))
    payload = b"\x00\x00" + b"\x00\x00\x00\x01k" + b"\xff\xff\xff\xff"
    assert tomb == struct.pack(">II", len(payload), L.crc32c(payload)) + payload
    header = L.encode_header(7)
    assert len(header) == HEADER_SIZE == 24
    assert header[:8] == b"HERDLOG\x00" and struct.unpack(">HHQ", header[8:20]) == (1, 7, 24)


# ---- round trip --------------------------------------------------------------------------------


def test_append_and_replay_round_trip(tmp_path):
    s, data = opened(tmp_path, 3)
    assert data == {0: [], 1: [], 2: []}
    sent = {0: [], 1: [], 2: []}
    futures = []
    for i in range(60):
        shard = i % 3
        entry = (b"", b"") if i == 7 else (b"k%d" % (i % 10), None if i % 11 == 0 else b"v%d" % i)
        sent[shard].append(entry)
        futures.append(s.append(shard, [entry]))
    futures.append(s.append(1, [(b"big", bytes(range(256)) * 300)]))
    sent[1].append((b"big", bytes(range(256)) * 300))
    for f in futures:
        assert f.result(WAIT) is None
    st = s.stats()
    assert [x.entries for x in st] == [len(sent[0]), len(sent[1]), len(sent[2])]
    for x in st:  # the file may run on past the last entry with preallocated zeros
        raw = log_path(tmp_path, x.shard).read_bytes()
        assert len(raw) >= x.bytes and raw[x.bytes:] == bytes(len(raw) - x.bytes)
    s.close()
    assert reopen(tmp_path, 3) == sent
    assert (tmp_path / "shard-00" / "current.log").exists()


def test_latest_only_returns_what_compaction_keeps(tmp_path):
    write_batches(tmp_path, [(0, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", None)])])
    s = LogStore(tmp_path, 2)
    assert s.open(latest_only=True)[0] == [(b"a", b"2"), (b"c", b"1")]
    s.close()


def test_append_validates_and_refuses_when_not_open(tmp_path):
    s = LogStore(tmp_path, 2)
    with pytest.raises(LogClosedError):
        s.append(0, [(b"k", b"v")])
    s.open()
    with pytest.raises(TypeError):
        s.append(0, [("k", b"v")])
    with pytest.raises(TypeError):
        s.append(0, [(b"k", "v")])
    with pytest.raises(ValueError):
        s.append(5, [(b"k", b"v")])
    s.close()
    with pytest.raises(LogClosedError):
        s.append(0, [(b"k", b"v")])


def test_close_resolves_everything_queued(tmp_path):
    s, _ = opened(tmp_path)
    futures = [s.append(i % 2, [kv(i)]) for i in range(500)]
    s.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert len(reopen(tmp_path)[0]) == 250


def test_shard_count_is_fixed_for_a_data_dir(tmp_path):
    write_batches(tmp_path, [(0, [kv(1)])], n=2)
    with pytest.raises(LogError, match="fixed for the life"):
        LogStore(tmp_path, 3).open()
    assert reopen(tmp_path, 2)[0] == [kv(1)]


def test_shard_dirs_without_their_meta_file_need_their_own_shard_count(tmp_path):
    # a restore that copied the shard directories but not herd-log.json: started with more shards,
    # groups hash elsewhere and a new commit loses to the old record at the next replay
    write_batches(tmp_path, [(0, [kv(1)]), (1, [kv(2)])], n=2)
    (tmp_path / L.META_NAME).unlink()
    with pytest.raises(LogError, match="shard directories .*but no herd-log.json, and 3 shards"):
        LogStore(tmp_path, 3).open()
    assert not (tmp_path / L.META_NAME).exists()
    assert reopen(tmp_path, 2) == {0: [kv(1)], 1: [kv(2)]}  # its own count: the file is written again
    assert (tmp_path / L.META_NAME).exists()


# ---- group commit and fsync modes --------------------------------------------------------------


def test_group_commit_one_fsync_per_touched_file_per_batch(tmp_path, monkeypatch):
    # one sync slot: what is written while it is busy joins the next job (group commit)
    s = LogStore(tmp_path, 4, fsync="always", sync_jobs=1)
    s.open()
    real_fsync = os.fsync
    calls = []
    entered, release = threading.Event(), threading.Event()

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 1:
            entered.set()
            assert release.wait(WAIT)
        real_fsync(fd)

    monkeypatch.setattr(LW, "_fdatasync", fsync)
    first = s.append(0, [kv(-1)])
    assert entered.wait(WAIT)  # the writer is inside the first batch's fsync
    futures = []
    lock = threading.Lock()

    def producer(t):
        mine = [s.append(i % 4, [kv(t * 1000 + i)]) for i in range(50)]
        with lock:
            futures.extend(mine)

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with s.writer._settle_lock:  # until the writer has written all 200 (they wait for the sync slot)
        assert s.writer._settle_lock.wait_for(lambda: sum(len(item[1][0]) for item in s.writer._unsynced) == 200, WAIT)
    release.set()
    first.result(WAIT)
    for f in futures:
        assert f.result(WAIT) is None
    # job 1: shard 0; job 2: all 200 appends (however many writes they took), one fsync per shard
    assert len(calls) == 1 + 4
    st = s.stats()
    assert [x.fsyncs for x in st] == [2, 1, 1, 1]
    assert all(x.batches >= 1 for x in st) and st[0].batches >= 2
    assert all(x.fsync_seconds > 0 for x in st)
    s.close()
    data = reopen(tmp_path, 4)
    assert sum(len(v) for v in data.values()) == 201


def listen_for(store, n: int) -> tuple[list, threading.Event]:
    """The store's listener results, collected; the event is set once ``n`` have come."""
    results, done = [], threading.Event()

    def listener(batch):
        results.extend(batch)
        if len(results) >= n:
            done.set()

    store.set_listener(listener)
    return results, done


def test_one_turns_batches_are_dealt_out_over_the_free_sync_threads(tmp_path, monkeypatch):
    # four shards written in one flush, two sync slots: two jobs of two shards each, both syncing
    # at once (no pool of its own), never more than two fdatasyncs at a time, one per shard
    s = LogStore(tmp_path, 4, fsync="always", sync_jobs=2)
    s.open()
    real = LW._fdatasync
    lock = threading.Lock()
    running, seen = [0], []
    both = threading.Barrier(2, timeout=WAIT)

    def fdatasync(fd):
        with lock:
            running[0] += 1
            seen.append((fd, running[0], threading.get_ident()))
        if len(seen) <= 2:
            both.wait()  # the first two calls meet: two threads inside fdatasync together
        real(fd)
        with lock:
            running[0] -= 1

    monkeypatch.setattr(LW, "_fdatasync", fdatasync)
    results, done = listen_for(s, 4)
    for shard in range(4):
        s.submit(shard, [kv(shard), kv(10 + shard)])
    assert s.flush() == []  # under always nothing is settled on the calling thread
    assert done.wait(WAIT)
    assert sorted((sid, seq, exc) for sid, seq, exc in results) == [(i, 1, None) for i in range(4)]
    assert len(seen) == 4 and len({fd for fd, _, _ in seen}) == 4  # one fdatasync per file
    assert max(n for _, n, _ in seen) == 2 and len({t for _, _, t in seen}) == 2
    s.close()
    assert reopen(tmp_path, 4) == {i: [kv(i), kv(10 + i)] for i in range(4)}


def test_one_free_sync_thread_takes_a_fair_share_of_the_waiting_shards(tmp_path):
    # 3 of 4 sync threads busy, 8 shards waiting: the free one takes 2 (8 / 4), oldest first, and
    # the other 6 wait for the next thread that frees up (a slow disk still syncs 4 files at once)
    s = LogStore(tmp_path, 10, fsync="always", sync_jobs=4)
    s.open()
    try:
        with s.writer._settle_lock:
            busy = [types.SimpleNamespace(id=9)]
            waiting = [(types.SimpleNamespace(id=sid), n) for n in range(2) for sid in range(8)]
            s.writer._active, s.writer._syncing, s.writer._unsynced = 3, {9}, [(busy[0], 0)] + waiting
            (job,) = s.writer._launch()
            assert [(st.id, n) for st, n in job.items] == [(0, 0), (0, 1), (1, 0), (1, 1)]
            assert [(st.id, n) for st, n in s.writer._unsynced] == [(9, 0)] + [(sid, n) for n in range(2)
                                                                        for sid in range(2, 8)]
            assert s.writer._active == 4 and s.writer._syncing == {9, 0, 1}
            s.writer._running.clear()
            s.writer._active, s.writer._syncing, s.writer._unsynced = 0, set(), []
    finally:
        s.close()


def test_a_batch_that_waited_for_its_shard_runs_on_the_thread_that_synced_it(tmp_path, monkeypatch):
    # the job launched when a shard's fsync ends runs on that thread, not handed to an idle one
    s = LogStore(tmp_path, 2, fsync="always", sync_jobs=2)
    s.open()
    real = LW._fdatasync
    calls, entered, release = [], threading.Event(), threading.Event()

    def fdatasync(fd):
        calls.append(threading.get_ident())
        if len(calls) == 1:
            entered.set()
            assert release.wait(WAIT)
        real(fd)

    monkeypatch.setattr(LW, "_fdatasync", fdatasync)
    results, done = listen_for(s, 2)
    queued = []
    real_put = s.writer._sync_queue.put
    monkeypatch.setattr(s.writer, "_sync_queue", types.SimpleNamespace(get=s.writer._sync_queue.get,
                                                                put=lambda job: queued.append(job) or real_put(job)))
    s.submit(0, [kv(1)])
    s.flush()
    assert entered.wait(WAIT)  # a sync thread is inside shard 0's first fsync
    s.submit(0, [kv(2)])
    s.flush()  # shard 0 is syncing: this batch waits for that job
    with s.writer._settle_lock:
        assert len(s.writer._unsynced) == 1
    release.set()
    assert done.wait(WAIT)
    assert [(sid, seq, exc) for sid, seq, exc in results] == [(0, 1, None), (0, 2, None)]
    assert len(calls) == 2 and calls[0] == calls[1]
    assert len(queued) == 1  # the second job was never queued for another thread
    s.close()
    assert reopen(tmp_path, 2)[0] == [kv(1), kv(2)]


def test_fsync_never_never_calls_fsync(tmp_path, monkeypatch):
    s, _ = opened(tmp_path, 2, fsync="never")

    def no_fsync(fd):
        raise AssertionError("fsync called under fsync='never'")

    monkeypatch.setattr(os, "fsync", no_fsync)
    monkeypatch.setattr(LW, "_fdatasync", no_fsync)
    futures = [s.append(i % 2, [kv(i)]) for i in range(100)]
    for f in futures:
        assert f.result(WAIT) is None
    s.close()
    assert [x.fsyncs for x in s.stats()] == [0, 0]
    monkeypatch.undo()
    assert len(reopen(tmp_path)[1]) == 50


# ---- fsync and write failures ------------------------------------------------------------------


def test_fsync_failure_fails_the_batch_and_the_shard_refuses_further_appends(tmp_path, monkeypatch, events):
    s, _ = opened(tmp_path, 2)
    s.append(0, [kv(0)]).result(WAIT)
    bad_fd = s.writer.shards[0].fd
    real_fsync = os.fsync
    calls_on_bad = []

    def fsync(fd):
        if fd == bad_fd:
            calls_on_bad.append(fd)
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(LW, "_fdatasync", fsync)
    f = s.append(0, [kv(1)])
    with pytest.raises(OSError) as info:
        f.result(WAIT)
    assert info.value.errno == errno.EIO
    later = s.append(0, [kv(2)])
    with pytest.raises(ShardFailedError, match="shard 0"):
        later.result(WAIT)
    assert s.append(1, [kv(3)]).result(WAIT) is None  # other shards carry on
    assert calls_on_bad == [bad_fd]  # never retried (fsyncgate)
    assert s.stats()[0].failed and "Input/output error" in s.stats()[0].failed
    assert events.named("log.shard_failed")[0]["shard"] == 0
    with pytest.raises(ShardFailedError):
        s.compact(0).result(WAIT)
    s.close()
    monkeypatch.undo()
    data = reopen(tmp_path)
    assert data[0][0] == kv(0) and data[1] == [kv(3)]


def _no_space_on(bad_fd):
    """An os.pwrite that fails with ENOSPC on ``bad_fd`` and writes everything else."""
    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        if fd == bad_fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    return pwrite


def test_write_failure_fails_the_shard(tmp_path, monkeypatch):
    s, _ = opened(tmp_path, 2)
    pwrite = _no_space_on(s.writer.shards[1].fd)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(OSError, match="No space"):
        s.append(1, [kv(1)]).result(WAIT)
    with pytest.raises(ShardFailedError):
        s.append(1, [kv(2)]).result(WAIT)
    assert s.append(0, [kv(3)]).result(WAIT) is None
    s.close()


# ---- torn tails --------------------------------------------------------------------------------

GOOD = [kv(i) for i in range(6)]


def _truncate_mid_entry(p: Path, offsets):
    with open(p, "r+b") as f:
        f.truncate(offsets[-1] + 11)


def _flip_byte_in_last_entry(p: Path, offsets):
    with open(p, "r+b") as f:
        f.seek(offsets[-1] + 16)
        b = f.read(1)
        f.seek(offsets[-1] + 16)
        f.write(bytes([b[0] ^ 0x40]))


def _length_past_eof(p: Path, offsets):
    with open(p, "r+b") as f:
        f.seek(offsets[-1])
        f.write(struct.pack(">I", 10_000))


def _cut_in_frame_header(p: Path, offsets):
    with open(p, "r+b") as f:
        f.truncate(offsets[-1] + 5)


def _garbage(p: Path, offsets):
    with open(p, "ab") as f:
        f.write(random.Random(7).randbytes(5000))


def _zeros(p: Path, offsets):
    with open(p, "ab") as f:
        f.write(bytes(4096))


def _garbage_with_a_stale_frame(p: Path, offsets):
    # a complete frame after the damage, but not flagged PREFIX_DURABLE: part of the same torn write
    with open(p, "ab") as f:
        f.write(b"\x00\x00\x00\x30" + bytes(20) + bytes(L.encode_entries([kv(99)])))


@pytest.mark.parametrize("damage, kept", [
    (_truncate_mid_entry, 5),
    (_flip_byte_in_last_entry, 5),
    (_length_past_eof, 5),
    (_cut_in_frame_header, 5),
    (_garbage, 6),
    (_garbage_with_a_stale_frame, 6),
])
def test_torn_tail_is_cut_back_to_the_last_good_entry(tmp_path, events, damage, kept):
    write_batches(tmp_path, [(0, [e]) for e in GOOD] + [(1, [kv(100)])])
    p = log_path(tmp_path)
    offsets = entry_offsets(tmp_path)
    good_end = offsets[kept] if kept < len(offsets) else p.stat().st_size
    damage(p, offsets)
    s, data = opened(tmp_path)
    assert data[0] == GOOD[:kept] and data[1] == [kv(100)]
    assert p.stat().st_size == good_end
    cut = events.named("log.tail_truncated")
    assert len(cut) == 1 and cut[0]["offset"] == good_end and cut[0]["shard"] == 0 and cut[0]["cut_bytes"] > 0
    # the shard is writable after the cut, and the next open is clean
    s.append(0, [kv(50)]).result(WAIT)
    s.close()
    assert reopen(tmp_path)[0] == GOOD[:kept] + [kv(50)]
    assert len(events.named("log.tail_truncated")) == 1


def test_a_torn_last_batch_is_a_tail_even_with_intact_entries_after_the_damage(tmp_path, events):
    # One batch of 5 entries written in one pwrite and never fsynced: a crash can persist its later
    # pages and not an earlier one.
    write_batches(tmp_path, [(0, [kv(0)]), (0, [kv(1)]), (0, [kv(i) for i in range(2, 7)])])
    offsets = entry_offsets(tmp_path)
    _flip_byte_in_last_entry(log_path(tmp_path), offsets[:4])  # damage entry 3 of the last batch
    assert reopen(tmp_path)[0] == [kv(0), kv(1), kv(2)]
    assert events.named("log.tail_truncated")[0]["offset"] == offsets[3]


def test_short_header_is_rewritten(tmp_path, events):
    write_batches(tmp_path, [(1, [kv(1)])])
    p = log_path(tmp_path)
    p.write_bytes(b"HERDLOG")
    assert reopen(tmp_path) == {0: [], 1: [kv(1)]}
    assert p.stat().st_size == HEADER_SIZE
    assert events.named("log.header_rewritten")


def test_stale_compaction_file_is_removed(tmp_path):
    write_batches(tmp_path, [(0, [kv(1)])])
    tmp = tmp_path / "shard-00" / L.COMPACT_TMP
    tmp.write_bytes(b"half a compaction")
    assert reopen(tmp_path)[0] == [kv(1)]
    assert not tmp.exists()


# ---- corruption in the middle ------------------------------------------------------------------


def test_mid_log_corruption_refuses_to_open_and_changes_nothing(tmp_path, events):
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(10)])
    p = log_path(tmp_path)
    offsets = entry_offsets(tmp_path)
    _flip_byte_in_last_entry(p, offsets[:3])  # entry 2 of 10
    before = p.read_bytes()
    with pytest.raises(LogCorruptError) as info:
        LogStore(tmp_path, 2).open()
    err = info.value
    assert err.shard == 0 and err.offset == offsets[2] and err.path == str(p)
    assert str(p) in str(err) and f"byte {offsets[2]}" in str(err) and "checksum mismatch" in str(err)
    assert f"from byte {offsets[3]}" in str(err)
    assert p.read_bytes() == before
    assert events.named("log.corrupt")[0]["offset"] == offsets[2]
    # the store can be opened again (nothing was left half-open)
    with pytest.raises(LogCorruptError):
        LogStore(tmp_path, 2).open()


@pytest.mark.parametrize("damage", [_flip_byte_in_last_entry, _truncate_mid_entry])
def test_damage_at_the_tail_after_a_clean_stop_is_corruption_not_a_torn_write(tmp_path, events, damage):
    # Nothing was being written when herd last stopped cleanly, so the last (acknowledged) entry
    # cannot be torn: cutting it away would silently lose a commit.
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(4)], as_if_crashed=False)
    p = log_path(tmp_path)
    offsets = entry_offsets(tmp_path)
    assert L.read_log_file(p).durable_end == p.stat().st_size
    damage(p, offsets)
    before = p.read_bytes()
    with pytest.raises(LogCorruptError, match="clean stop") as info:
        LogStore(tmp_path, 2).open()
    assert info.value.offset == offsets[-1] and p.read_bytes() == before
    assert not events.named("log.tail_truncated")
    s, data = opened(tmp_path, repair=True)  # a human's decision: cut it
    assert data[0] == [kv(i) for i in range(3)]
    s.close()
    assert reopen(tmp_path)[0] == [kv(i) for i in range(3)]


def test_a_torn_write_after_a_clean_stop_and_a_restart_is_still_a_torn_tail(tmp_path, events):
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(3)], as_if_crashed=False)
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(3, 6)])  # then a crash
    _truncate_mid_entry(log_path(tmp_path), entry_offsets(tmp_path))
    assert reopen(tmp_path)[0] == [kv(i) for i in range(5)]
    assert len(events.named("log.tail_truncated")) == 1


def test_a_clean_stop_under_fsync_never_leaves_the_header_alone(tmp_path):
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(3)], fsync="never", as_if_crashed=False)
    assert L.read_log_file(log_path(tmp_path)).durable_end == HEADER_SIZE


def test_all_corrupt_shards_are_listed(tmp_path):
    write_batches(tmp_path, [(s, [kv(i)]) for i in range(4) for s in (0, 1)])
    for shard in (0, 1):
        _flip_byte_in_last_entry(log_path(tmp_path, shard), entry_offsets(tmp_path, shard)[:2])
    with pytest.raises(LogCorruptError) as info:
        LogStore(tmp_path, 2).open()
    assert [p.shard for p in info.value.problems] == [0, 1]


def test_repair_cuts_at_the_first_bad_entry_and_warns(tmp_path, events):
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(10)])
    offsets = entry_offsets(tmp_path)
    _flip_byte_in_last_entry(log_path(tmp_path), offsets[:5])
    s, data = opened(tmp_path, repair=True)
    assert data[0] == [kv(i) for i in range(4)]
    rep = events.named("log.repaired")
    assert rep and rep[0]["offset"] == offsets[4] and "LOST" in rep[0]["action"]
    s.append(0, [kv(77)]).result(WAIT)
    s.close()
    assert reopen(tmp_path)[0] == [kv(i) for i in range(4)] + [kv(77)]


def test_under_fsync_never_damage_before_unsynced_entries_is_a_torn_tail(tmp_path, events):
    write_batches(tmp_path, [(0, [kv(i)]) for i in range(10)], fsync="never")
    _flip_byte_in_last_entry(log_path(tmp_path), entry_offsets(tmp_path)[:3])
    assert reopen(tmp_path, fsync="never")[0] == [kv(0), kv(1)]
    assert events.named("log.tail_truncated")


def test_corruption_in_a_compacted_region_is_refused(tmp_path):
    s, _ = opened(tmp_path, fsync="never")
    for i in range(10):
        s.append(0, [kv(i)]).result(WAIT)
    s.compact(0).result(WAIT)
    s.close()
    _flip_byte_in_last_entry(log_path(tmp_path), entry_offsets(tmp_path)[:8])
    with pytest.raises(LogCorruptError, match="compaction"):
        LogStore(tmp_path, 2, fsync="never").open()


def test_bad_header_is_corruption_and_repair_rewrites_it(tmp_path, events):
    write_batches(tmp_path, [(0, [kv(1)]), (0, [kv(2)])])
    p = log_path(tmp_path)
    raw = bytearray(p.read_bytes())
    raw[3] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(LogCorruptError, match="bad file header"):
        LogStore(tmp_path, 2).open()
    assert reopen(tmp_path, repair=True)[0] == [kv(1), kv(2)]
    assert reopen(tmp_path)[0] == [kv(1), kv(2)]


def test_newer_format_and_foreign_shard_files_are_refused(tmp_path):
    write_batches(tmp_path, [(0, [kv(1)]), (1, [kv(2)])])
    p0, p1 = log_path(tmp_path, 0), log_path(tmp_path, 1)
    body = p0.read_bytes()[HEADER_SIZE:]
    head = struct.pack(">8sHHQ", L.MAGIC, 2, 0, HEADER_SIZE)
    p0.write_bytes(head + struct.pack(">I", L.crc32c(head)) + body)
    with pytest.raises(LogFormatError, match="format 2"):
        LogStore(tmp_path, 2).open()
    p0.write_bytes(p1.read_bytes())
    with pytest.raises(LogFormatError, match="belongs to shard 1"):
        LogStore(tmp_path, 2).open()


def test_unknown_entry_version_is_refused_not_truncated(tmp_path):
    write_batches(tmp_path, [(0, [kv(1)])])
    p = log_path(tmp_path)
    payload = b"\x01\x00" + b"\x00\x00\x00\x01k" + b"\x00\x00\x00\x01v"
    with open(p, "ab") as f:
        f.write(struct.pack(">II", len(payload), L.crc32c(payload)) + payload)
    size = p.stat().st_size
    with pytest.raises(LogFormatError, match="version 1") as raised:
        LogStore(tmp_path, 2).open()
    assert str(raised.value).startswith(f"{p}: entry at byte ")  # which file, for the operator
    assert p.stat().st_size == size


# ---- compaction --------------------------------------------------------------------------------


def test_compaction_keeps_last_values_drops_tombstones_and_survives_reopen(tmp_path):
    s, _ = opened(tmp_path)
    ops = [(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"a", b"2"), (b"b", None), (b"d", b"1"),
           (b"c", b"2"), (b"e", b"1"), (b"e", None), (b"b", b"3")]
    for op in ops:
        s.append(0, [op]).result(WAIT)
    before = s.stats()[0]
    info = s.compact(0).result(WAIT)
    after = s.stats()[0]
    expected = [(b"a", b"2"), (b"d", b"1"), (b"c", b"2"), (b"b", b"3")]
    assert info["bytes_before"] == before.bytes and info["bytes_after"] == after.bytes < before.bytes
    assert after.entries == 4 and after.dead_bytes == 0 and after.compactions == 1
    assert after.live_bytes == before.live_bytes
    s.append(0, [(b"f", b"1")]).result(WAIT)
    assert L.read_log_file(log_path(tmp_path)).durable_end == after.bytes  # the compacted part
    s.close()
    assert reopen(tmp_path)[0] == expected + [(b"f", b"1")]
    assert L.read_log_file(log_path(tmp_path)).durable_end == log_path(tmp_path).stat().st_size  # clean stop


def test_appends_racing_with_compaction_are_kept_in_order(tmp_path):
    s, _ = opened(tmp_path)
    for i in range(20):
        s.append(0, [(b"k%d" % (i % 5), b"old%d" % i)]).result(WAIT)
    written, release = threading.Event(), threading.Event()

    def hook(shard):
        written.set()
        assert release.wait(WAIT)

    s.compaction.written_hook = hook
    comp = s.compact(0)
    assert written.wait(WAIT)  # the compacted file is written; the writer has not swapped it in
    racing = [(b"k1", b"new1"), (b"k9", b"new9"), (b"k2", None), (b"k3", b"new3")]
    for op in racing:
        assert s.append(0, [op]).result(WAIT) is None  # acknowledged while the compaction is pending
    release.set()
    comp.result(WAIT)
    s.append(0, [(b"k9", b"after")]).result(WAIT)
    s.close()
    expected = {b"k0": b"old15", b"k1": b"new1", b"k3": b"new3", b"k4": b"old19", b"k9": b"after"}
    replayed = reopen(tmp_path)[0]
    assert fold(replayed) == expected
    assert replayed[-1] == (b"k9", b"after")


def test_concurrent_appends_and_compactions_lose_nothing(tmp_path):
    s, _ = opened(tmp_path, 2, fsync="never", compact_threshold_bytes=2048)
    rnd = random.Random(3)
    model: dict[bytes, bytes] = {}
    futures = []
    for i in range(3000):
        key = b"k%d" % rnd.randrange(40)
        value = None if rnd.random() < 0.1 else b"v%d" % i
        futures.append(s.append(0, [(key, value)]))
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
        if i % 500 == 0:
            futures.append(s.compact(0))
    for f in futures:
        f.result(WAIT)
    s.compact(0).result(WAIT)  # queued behind any automatic one still running
    assert s.stats()[0].compactions >= 2
    s.close()
    data = reopen(tmp_path)[0]
    assert data == L.latest(data)  # fully compacted: nothing was appended after the last compaction
    assert fold(data) == model


def test_automatic_compaction_trigger(tmp_path):
    s, _ = opened(tmp_path, 2, compact_threshold_bytes=4096)
    for i in range(200):  # ~30 bytes each, 4 keys: mostly dead
        s.append(0, [(b"k%d" % (i % 4), b"v%d" % i)]).result(WAIT)
    s.compact(1).result(WAIT)
    st = s.stats()
    s.close()
    assert st[0].compactions >= 1 and st[0].bytes < 4096 + 200
    assert reopen(tmp_path)[0][-4:] == [(b"k%d" % (i % 4), b"v%d" % i) for i in range(196, 200)]


def test_no_automatic_compaction_when_mostly_live(tmp_path):
    s, _ = opened(tmp_path, 2, compact_threshold_bytes=2048)
    for i in range(200):
        s.append(0, [kv(i)]).result(WAIT)
    s.close()
    assert s.stats()[0].compactions == 0


# ---- a killed writer process -------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, threading
    import structlog
    from coordinator.store.filelog import LogStore
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    data_dir, repeat, threshold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = LogStore(data_dir, 4, fsync="always", compact_threshold_bytes=threshold)
    store.open()
    out_lock = threading.Lock()
    slots = threading.BoundedSemaphore(200)

    def acked(seq):
        def done(f):
            if f.exception() is None:
                with out_lock:
                    sys.stdout.write("%d\\n" % seq)
                    sys.stdout.flush()
            slots.release()
        return done

    seq = 0
    while True:
        slots.acquire()
        shard = seq % 4
        k = (seq // 4) % repeat if repeat else seq
        value = None if repeat and seq % 10 == 9 else b"%d" % seq
        store.append(shard, [(b"s%d-k%d" % (shard, k), value)]).add_done_callback(acked(seq))
        seq += 1
""")


def _key(seq, repeat):
    shard = seq % 4
    return b"s%d-k%d" % (shard, (seq // 4) % repeat if repeat else seq)


def _value(seq, repeat):
    return None if repeat and seq % 10 == 9 else b"%d" % seq


def _run_and_kill(tmp_path, repeat, threshold, acks_wanted):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), str(repeat), str(threshold)],
                            stdout=subprocess.PIPE, env=env, cwd=REPO)
    acked = []
    try:
        for line in proc.stdout:
            acked.append(int(line))
            if len(acked) >= acks_wanted:
                break
        proc.send_signal(signal.SIGKILL)
        acked.extend(int(x) for x in proc.stdout.read().split())  # acks already in the pipe count
    finally:
        proc.kill()
        proc.wait(WAIT)
    assert len(acked) >= acks_wanted, "the child died early"
    return acked


def test_sigkill_loses_no_acknowledged_entry(tmp_path):
    acked = _run_and_kill(tmp_path, 0, 1 << 30, 1500)
    data = reopen(tmp_path, 4)
    for shard in range(4):
        seqs = [int(v) for _k, v in data[shard]]
        # a gap-free prefix of what this shard was sent, holding every acknowledged entry
        assert seqs == list(range(shard, 4 * len(seqs), 4))
        mine = [a for a in acked if a % 4 == shard]
        assert not mine or max(mine) <= seqs[-1]
        assert all(k == _key(int(v), 0) for k, v in data[shard])


def test_sigkill_during_frequent_compactions_loses_no_acknowledged_entry(tmp_path):
    repeat = 7
    acked = _run_and_kill(tmp_path, repeat, 1024, 3000)
    data = reopen(tmp_path, 4)
    for shard in range(4):
        seqs = [int(v) for _k, v in data[shard] if v is not None]
        assert seqs == sorted(seqs)  # compaction keeps log order
        mine = [a for a in acked if a % 4 == shard]
        low = max([shard] + seqs + mine)
        replayed = fold(data[shard])
        # the state equals replaying a prefix of this shard's appends that covers every ack
        for end in range(low, low + 4 * 100, 4):
            state = {}
            for seq in range(shard, end + 1, 4):
                k, v = _key(seq, repeat), _value(seq, repeat)
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
            if state == replayed:
                break
        else:
            pytest.fail(f"shard {shard}: replayed state is no prefix of the appends")
    # compactions did happen in the child (a compacted file records its durable end)
    assert any(L.read_log_file(log_path(tmp_path, shard)).durable_end > HEADER_SIZE for shard in range(4))


# ---- preallocation, the zero tail, and the loop's submit/flush/listener path ------------------------


def snapshot(src: Path, dst: Path) -> Path:
    """Copy a data dir as it is on disk right now (the store still open: what a crash leaves)."""
    dst.mkdir()
    for item in src.iterdir():
        if item.is_dir():
            (dst / item.name).mkdir()
            for f in item.iterdir():
                (dst / item.name / f.name).write_bytes(f.read_bytes())
        elif item.name != ".lock":
            (dst / item.name).write_bytes(item.read_bytes())
    return dst


def test_fsync_always_preallocates_and_a_crash_leaves_a_zero_tail_that_is_not_damage(tmp_path, events):
    s, _ = opened(tmp_path / "d", 1)
    for i in range(20):
        s.append(0, [kv(i)]).result(WAIT)
    logical = s.stats()[0].bytes
    raw = log_path(tmp_path / "d").read_bytes()
    assert len(raw) > LW.PREALLOC_MIN > logical and raw[logical:] == bytes(len(raw) - logical)
    crashed = snapshot(tmp_path / "d", tmp_path / "crashed")
    s.close()
    assert log_path(tmp_path / "d").stat().st_size == logical  # a clean stop trims the zeros
    s2, data = opened(crashed, 1)
    assert data[0] == [kv(i) for i in range(20)]
    assert not events.named("log.tail_truncated")
    assert s2.stats()[0].bytes == logical
    s2.append(0, [kv(20)]).result(WAIT)  # lands right after the last entry, over the zeros
    s2.close()
    assert reopen(crashed, 1)[0] == [kv(i) for i in range(21)]
    assert not events.named("log.tail_truncated")


def test_zeros_after_the_last_entry_end_the_log_and_the_next_append_overwrites_them(tmp_path, events):
    write_batches(tmp_path, [(0, [e]) for e in GOOD])
    p = log_path(tmp_path)
    end = p.stat().st_size
    with open(p, "ab") as f:
        f.write(bytes(5000))
    s, data = opened(tmp_path)
    assert data[0] == GOOD and not events.named("log.tail_truncated")
    assert L.read_log_file(p).damage is None and L.read_log_file(p).end == end
    s.append(0, [kv(77)]).result(WAIT)
    s.close()
    assert reopen(tmp_path)[0] == GOOD + [kv(77)]


def test_garbage_after_a_zero_tail_is_a_torn_tail(tmp_path, events):
    write_batches(tmp_path, [(0, [e]) for e in GOOD])
    p = log_path(tmp_path)
    end = p.stat().st_size
    with open(p, "ab") as f:
        f.write(bytes(3000) + b"\x00\x00\x00\x30junk")
    assert reopen(tmp_path)[0] == GOOD
    assert events.named("log.tail_truncated")[0]["offset"] == end
    assert p.stat().st_size == end


def test_zeros_inside_a_compacted_region_are_corruption(tmp_path):
    s, _ = opened(tmp_path, 1)
    for i in range(10):
        s.append(0, [kv(i % 3)]).result(WAIT)
    s.compact(0).result(WAIT)
    s.close()
    p = log_path(tmp_path)
    buf = bytearray(p.read_bytes())
    buf[HEADER_SIZE + 4:] = bytes(len(buf) - HEADER_SIZE - 4)  # everything after the first entry's length
    p.write_bytes(bytes(buf))
    with pytest.raises(LogCorruptError, match=r"made durable \(by a compaction"):
        reopen(tmp_path, 1)


def test_submit_stages_until_flush_and_the_listener_learns_each_shards_durable_sequence(tmp_path):
    s, _ = opened(tmp_path, 2)
    got = []
    done = threading.Event()

    def listener(results):
        got.extend(results)
        if any(seq == 3 and shard == 0 for shard, seq, _e in got):
            done.set()

    s.set_listener(listener)
    assert [s.submit(0, [kv(1)]), s.submit(1, [kv(2)]), s.submit(0, [kv(3)])] == [1, 1, 2]
    assert not done.wait(0.05) and got == []  # nothing is written before flush
    listener(s.flush())  # what the flush settled at once; the rest reaches the listener
    f = s.append(0, [kv(4)])  # append() goes behind everything submitted before it
    assert f.result(WAIT) is None and done.wait(WAIT)
    last = {}
    for shard, seq, exc in got:
        assert exc is None and seq > last.get(shard, 0)
        last[shard] = seq
    assert last == {0: 3, 1: 1}
    s.close()
    assert reopen(tmp_path) == {0: [kv(1), kv(3), kv(4)], 1: [kv(2)]}


def test_close_writes_what_was_submitted_but_not_flushed(tmp_path):
    s, _ = opened(tmp_path, 1)
    got = []
    s.set_listener(got.extend)
    s.submit(0, [kv(1)])
    s.close()
    assert got == [(0, 1, None)]
    assert reopen(tmp_path, 1)[0] == [kv(1)]


def test_listener_learns_of_a_failed_fsync_and_of_writes_to_the_failed_shard(tmp_path, monkeypatch):
    s, _ = opened(tmp_path, 2)
    got = []
    s.set_listener(got.extend)
    bad_fd = s.writer.shards[0].fd

    def fsync(fd):
        if fd == bad_fd:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    monkeypatch.setattr(LW, "_fdatasync", fsync)
    s.submit(0, [kv(1)])
    s.submit(1, [kv(2)])
    got.extend(s.flush())
    assert s.append(0, [kv(3)]).exception(WAIT) is not None
    s.append(1, [kv(4)]).result(WAIT)
    by = {}
    for shard, seq, exc in got:
        by.setdefault(shard, []).append((seq, type(exc).__name__ if exc else None))
    assert by[1][-1] == (2, None)
    assert by[0][0] == (1, "OSError")  # the failed batch; whatever came after it failed too
    assert by[0][1:] in ([], [(2, "OSError")], [(2, "ShardFailedError")])
    s.close()


# ---- writes on the caller's thread, fsyncs on the pool, settled in order ------------------------


def test_fsync_never_flush_writes_on_the_calling_thread_and_returns_the_results(tmp_path):
    s, _ = opened(tmp_path, 2, fsync="never")
    got = []
    s.set_listener(got.extend)
    before = log_path(tmp_path, 1).stat().st_size
    s.submit(1, [kv(1)])
    s.submit(1, [kv(2)])
    assert s.flush() == [(1, 2, None)]
    assert log_path(tmp_path, 1).stat().st_size > before  # in the file (page cache) already
    assert s.flush() == [] and got == []  # nothing else to say, nothing went to the listener
    s.close()
    assert reopen(tmp_path)[1] == [kv(1), kv(2)]


def test_fsync_always_flush_returns_at_once_and_the_listener_hears_when_durable(tmp_path, monkeypatch):
    s, _ = opened(tmp_path, 1)
    entered, release = threading.Event(), threading.Event()
    got, heard = [], threading.Event()

    def fsync(fd):
        entered.set()
        assert release.wait(WAIT)
        os.fsync(fd)

    def listener(results):
        got.extend(results)
        heard.set()

    monkeypatch.setattr(LW, "_fdatasync", fsync)
    s.set_listener(listener)
    s.submit(0, [kv(1)])
    assert s.flush() == []  # the fsync runs on the pool: the caller does not wait for it
    assert entered.wait(WAIT) and got == []
    release.set()
    assert heard.wait(WAIT) and got == [(0, 1, None)]
    s.close()


def test_one_fsync_per_file_at_a_time_so_a_failed_one_is_never_papered_over(tmp_path, monkeypatch):
    # Since Linux 4.13 a writeback error reaches ONE fdatasync of the file: two at once could hand
    # the first batch's error to the second and report the first durable. So a shard's next batch
    # waits for its running fsync (other shards' batches do not).
    s, _ = opened(tmp_path, 2)
    first_in, release_first = threading.Event(), threading.Event()
    other_done = threading.Event()
    calls = []
    bad_fd = s.writer.shards[0].fd
    got, heard = [], threading.Event()

    def fsync(fd):
        calls.append(fd)
        if fd == bad_fd:  # shard 0's first fsync hangs, then fails
            first_in.set()
            assert release_first.wait(WAIT)
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)
        other_done.set()

    def listener(results):
        got.extend(results)
        if sum(1 for shard, _seq, _e in got if shard == 0) >= 2:
            heard.set()

    monkeypatch.setattr(LW, "_fdatasync", fsync)
    s.set_listener(listener)
    s.submit(0, [kv(1)])
    s.flush()
    assert first_in.wait(WAIT)
    s.submit(0, [kv(2)])
    s.submit(1, [kv(3)])
    s.flush()
    assert other_done.wait(WAIT)  # shard 1 synced while shard 0's fsync hangs
    with s.writer._settle_lock:
        assert [item[1][1] for item in s.writer._unsynced] == [2]  # shard 0's batch 2 waits its turn
    assert calls.count(bad_fd) == 1 and got == []  # nothing settled ahead of the hanging job
    release_first.set()
    assert heard.wait(WAIT)
    mine = [(seq, exc) for shard, seq, exc in got if shard == 0]
    assert [seq for seq, _e in mine] == [1, 2]
    assert isinstance(mine[0][1], OSError) and isinstance(mine[1][1], ShardFailedError)
    assert calls.count(bad_fd) == 1  # the failed file is never fsync'd again
    assert [(seq, exc) for shard, seq, exc in got if shard == 1] == [(1, None)]
    s.close()


def test_flush_leaves_its_writes_to_the_writer_thread_while_that_holds_the_files(tmp_path):
    s, _ = opened(tmp_path, 1, fsync="never")
    got, heard = [], threading.Event()

    def listener(results):
        got.extend(results)
        heard.set()

    s.set_listener(listener)
    with s.writer._wlock:  # as during a compaction swap
        s.submit(0, [kv(1)])
        assert s.flush() == []  # the loop does not wait for the lock
        assert len(s.writer._staged) == 1 and got == []  # nobody can write it while the lock is held
    assert heard.wait(WAIT) and got == [(0, 1, None)]  # the writer thread wrote it
    s.close()
    assert reopen(tmp_path, 1)[0] == [kv(1)]


def test_under_fsync_always_a_blocked_write_never_blocks_flush_or_other_shards(tmp_path, monkeypatch):
    # A frozen file system blocks pwrite itself: under fsync="always" flush() (the event loop) only
    # frames the batch; the sync pool writes it with its fdatasync, so the loop and other shards go on
    # (answers are still settled in the order the batches were made).
    s, _ = opened(tmp_path, 2)
    blocked_fd, other_fd = s.writer.shards[0].fd, s.writer.shards[1].fd
    entered, release, other_written = threading.Event(), threading.Event(), threading.Event()
    writers = []
    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        writers.append(threading.get_ident())
        if fd == blocked_fd and not release.is_set():
            entered.set()
            assert release.wait(WAIT)
        n = real_pwrite(fd, data, offset)
        if fd == other_fd:
            other_written.set()
        return n

    got, lock = [], threading.Lock()
    heard = {0: threading.Event(), 1: threading.Event()}

    def listener(results):
        with lock:
            got.extend(results)
        for shard, _seq, _exc in results:
            heard[shard].set()

    monkeypatch.setattr(os, "pwrite", pwrite)
    s.set_listener(listener)
    s.submit(0, [kv(1)])
    assert s.flush() == []  # returns at once: nothing is written on this thread
    assert entered.wait(WAIT)  # shard 0's write hangs in the sync pool
    s.submit(0, [kv(2)])
    s.submit(1, [kv(3)])
    assert s.flush() == []
    assert other_written.wait(WAIT)  # shard 1 was written while shard 0's disk write hangs
    assert threading.get_ident() not in writers
    release.set()
    assert heard[0].wait(WAIT) and heard[1].wait(WAIT)
    s.close()
    with lock:
        assert all(exc is None for _shard, _seq, exc in got)
        assert {shard: max(seq for sh, seq, _e in got if sh == shard) for shard, _q, _e in got} == {0: 2, 1: 1}
    assert reopen(tmp_path) == {0: [kv(1), kv(2)], 1: [kv(3)]}


def test_under_fsync_always_a_failed_write_fails_its_shard_through_the_listener(tmp_path, monkeypatch):
    s, _ = opened(tmp_path, 2)
    pwrite = _no_space_on(s.writer.shards[1].fd)
    got, heard = [], threading.Event()

    def listener(results):
        got.extend(results)
        if len(got) >= 2:
            heard.set()

    monkeypatch.setattr(os, "pwrite", pwrite)
    s.set_listener(listener)
    s.submit(1, [kv(1)])
    s.submit(0, [kv(2)])
    assert s.flush() == []
    assert heard.wait(WAIT)
    by_shard = {shard: (seq, exc) for shard, seq, exc in got}
    assert by_shard[0] == (1, None)
    assert by_shard[1][0] == 1 and isinstance(by_shard[1][1], OSError) and "No space" in str(by_shard[1][1])
    assert s.stats()[1].failed is not None
    with pytest.raises(ShardFailedError):  # no more appends to the failed shard
        s.append(1, [kv(3)]).result(WAIT)
    s.close()
    monkeypatch.undo()
    assert reopen(tmp_path) == {0: [kv(2)], 1: []}


def test_under_fsync_always_compaction_reads_only_what_is_written(tmp_path, monkeypatch):
    # A compaction that starts while a batch is framed but not yet written (its write waits in the
    # sync pool) must copy it at the swap, not read the unwritten bytes as part of its snapshot.
    s, _ = opened(tmp_path, 1)
    for i in range(20):
        s.append(0, [(b"k", b"old-%d" % i)]).result(WAIT)
    fd = s.writer.shards[0].fd
    entered, release = threading.Event(), threading.Event()
    real_pwrite = os.pwrite

    def pwrite(f, data, offset):
        if f == fd and not release.is_set():
            entered.set()
            assert release.wait(WAIT)
        return real_pwrite(f, data, offset)

    got, heard = [], threading.Event()

    def listener(results):
        got.extend(results)
        heard.set()

    monkeypatch.setattr(os, "pwrite", pwrite)
    s.set_listener(listener)
    s.submit(0, [(b"k", b"new"), (b"j", b"kept")])
    s.flush()
    assert entered.wait(WAIT)
    snapped = threading.Event()
    s.compaction.written_hook = lambda _shard: snapped.set()
    done = s.compact(0)  # the compactor snapshots what is written: the 20 old entries
    assert snapped.wait(WAIT)  # its copy is made; the swap waits for the pending write
    release.set()
    info = done.result(WAIT)
    assert heard.wait(WAIT) and [exc for _s, _q, exc in got] == [None]
    assert info["entries"] == 3  # the last old value of k (the snapshot) + the batch copied at the swap
    s.close()
    monkeypatch.undo()
    assert reopen(tmp_path, 1)[0] == [(b"k", b"old-19"), (b"k", b"new"), (b"j", b"kept")]


def test_a_new_data_directory_is_announced_and_an_existing_one_is_not(tmp_path, events):
    s, _ = opened(tmp_path / "data", 2)
    s.close()
    (new,) = events.named("log.new_data_dir")
    assert new["path"] == str(tmp_path / "data") and "EMPTY" in new["detail"]
    events.events.clear()
    reopen(tmp_path / "data")
    assert events.named("log.new_data_dir") == []


def test_a_log_file_removed_under_a_running_store_fails_its_shard_instead_of_acknowledging(tmp_path, events):
    # rm -rf of the data directory (or a replaced volume) while herd runs: the writes would land in
    # unlinked files and vanish at the next start, so nothing more is reported durable.
    s, _ = opened(tmp_path, 2)
    assert s.append(1, [kv(1)]).result(WAIT) is None
    os.unlink(log_path(tmp_path, 1))
    with pytest.raises(OSError, match="was removed while herd ran"):
        s.append(1, [kv(2)]).result(WAIT)
    with pytest.raises(ShardFailedError):
        s.append(1, [kv(3)]).result(WAIT)
    assert s.append(0, [kv(4)]).result(WAIT) is None  # the other shard's file is still there
    s.close()
    (failed,) = events.named("log.shard_failed")
    assert failed["shard"] == 1 and failed["operation"] == "fsync"
