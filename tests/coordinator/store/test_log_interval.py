"""fsync="interval" (the file log acknowledges a write once it is in the OS and fdatasyncs every
interval), and that the writer's syncs are real ones (issue 33 item 13). The interval thread's
timer is replaced by a ticking event where timing matters; one test runs it unstubbed."""
from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from coordinator.config import Config, ConfigError
from coordinator.store import ShardFailedError
from coordinator.store import writer as LW
from coordinator.store.filelog import LogStore
from coordinator.store.logformat import HEADER_SIZE, PREFIX_DURABLE, _scan, read_log_file
from tests.coordinator.store.test_log import kv, listen_for

WAIT = 30  # seconds: only a bound for a hung test, never a pacing sleep
HOUR_MS = 3_600_000


def reopen(d, n=2, **kw) -> dict:
    s = LogStore(d, n, **kw)
    data = s.open()
    s.close()
    return data


class Ticks:
    """Stands in for the interval thread's stop event: each ``tick()`` lets one ``wait(timeout)``
    return (one interval elapsed), so no test sleeps."""

    def __init__(self):
        self.timeouts: list[float] = []
        self._sem = threading.Semaphore(0)
        self._waiting = threading.Semaphore(0)
        self._stopped = False

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        self._waiting.release()
        self._sem.acquire()
        return self._stopped

    def tick(self):
        """One interval passes: the thread syncs, then is back waiting."""
        assert self._waiting.acquire(timeout=WAIT)
        self._sem.release()
        assert self._waiting.acquire(timeout=WAIT)  # back in wait(): this interval's syncs are done
        self._waiting.release()

    def set(self):
        self._stopped = True
        self._sem.release()


def interval_store(tmp_path, monkeypatch, n=2, interval_ms=250):
    s = LogStore(tmp_path, n, fsync="interval", fsync_interval_ms=interval_ms)
    ticks = Ticks()
    monkeypatch.setattr(s.writer, "_interval_stop", ticks)
    s.open()
    return s, ticks


def flushed(s, n=1) -> list:
    """``s.flush()``'s results for the ``n`` writes staged; when the writer thread held the files (its
    start-up check, a compaction) flush() leaves them to it, which reports them to the listener: wait
    for that (under "interval" either way means written to the OS)."""
    results, done = listen_for(s, n)
    got = s.flush()
    if len(got) < n:
        assert done.wait(WAIT), "the writer thread never wrote what flush() left to it"
        got = got + results
    s.set_listener(None)
    return got


def test_a_write_is_acknowledged_once_in_the_os_before_any_sync(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(LW, "_fdatasync", lambda fd: calls.append(fd))
    s, ticks = interval_store(tmp_path, monkeypatch)
    s.submit(0, [kv(1)])
    s.submit(1, [kv(2)])
    assert sorted(flushed(s, 2)) == [(0, 1, None), (1, 1, None)]  # acknowledged: in the OS
    assert calls == []  # before any fdatasync
    path = s.writer.shards[0].path
    with open(path, "rb") as f:  # in the file, for any reader (what survives herd being killed)
        assert b"value-1" in f.read()
    fut = s.append(0, [kv(3)])
    assert fut.result(WAIT) is None and calls == []
    ticks.tick()
    assert sorted(calls) == sorted(st.fd for st in s.writer.shards)  # one interval: each file once
    ticks.tick()
    assert len(calls) == 2  # nothing written since: no sync
    s.close()
    assert reopen(tmp_path) == {0: [kv(1), kv(3)], 1: [kv(2)]}


def test_the_thread_syncs_once_per_interval_what_was_written_in_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(LW, "_fdatasync", lambda fd: calls.append(fd))
    s, ticks = interval_store(tmp_path, monkeypatch, interval_ms=250)
    fd0, fd1 = (st.fd for st in s.writer.shards)
    for rnd in range(3):
        s.submit(rnd % 2, [kv(rnd)])
        flushed(s)
        ticks.tick()
        assert calls[-1] == (fd0, fd1)[rnd % 2] and len(calls) == rnd + 1
    assert set(ticks.timeouts) == {0.25}  # it waits fsync_interval_ms between rounds
    assert [st.fsyncs for st in s.stats()] == [2, 1]
    s.close()


def test_a_batch_after_an_interval_sync_says_its_prefix_is_durable(tmp_path, monkeypatch):
    # the torn-tail rule is the same as under always: PREFIX_DURABLE only after an fdatasync
    s, ticks = interval_store(tmp_path, monkeypatch, n=1)
    s.submit(0, [kv(1)])
    flushed(s)
    s.submit(0, [kv(2)])
    flushed(s)  # no sync between: no flag
    ticks.tick()
    s.submit(0, [kv(3)])
    flushed(s)
    path = s.writer.shards[0].path
    with open(path, "rb") as f:
        data = f.read()
    s.close()
    sc = _scan(data, 0, str(path), positions=True)
    flags = [attrs & PREFIX_DURABLE for _pos, _nxt, attrs, _k, _v in sc.entries]
    assert [bool(f) for f in flags] == [True, False, True], flags


def test_a_failed_interval_sync_fails_the_shard_and_is_not_retried(tmp_path, monkeypatch):
    calls = []

    def eio(fd):
        calls.append(fd)
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(LW, "_fdatasync", eio)
    s, ticks = interval_store(tmp_path, monkeypatch, n=1)
    s.submit(0, [kv(1)])
    assert flushed(s) == [(0, 1, None)]
    ticks.tick()
    assert len(calls) == 1 and s.stats()[0].failed is not None
    s.submit(0, [kv(2)])
    ((sid, seq, exc),) = flushed(s)
    assert (sid, seq) == (0, 2) and isinstance(exc, ShardFailedError)
    ticks.tick()
    assert len(calls) == 1  # never retried
    s.close()


def test_interval_unstubbed_makes_at_least_one_real_fdatasync_per_interval(tmp_path):
    # no stub: the real os.fdatasync (stats count a sync only once it returned), a 20 ms interval
    assert LW._fdatasync is getattr(os, "fdatasync", os.fsync)
    s = LogStore(tmp_path, 1, fsync="interval", fsync_interval_ms=20)
    s.open()
    st = s.writer.shards[0]
    try:
        for rnd in range(5):
            before = s.stats()[0].fsyncs
            s.submit(0, [kv(rnd)])
            assert flushed(s) == [(0, rnd + 1, None)]
            deadline = time.monotonic() + WAIT
            while s.stats()[0].fsyncs == before or not st.synced:  # the next interval syncs it
                assert time.monotonic() < deadline, "no fdatasync within the bound"
                time.sleep(0.005)
        assert s.stats()[0].fsyncs >= 5
    finally:
        s.close()
    assert reopen(tmp_path, 1)[0] == [kv(i) for i in range(5)]


def test_a_clean_stop_under_interval_makes_the_whole_file_durable(tmp_path, monkeypatch):
    s, _ticks = interval_store(tmp_path, monkeypatch, n=1)
    s.submit(0, [kv(1)])
    flushed(s)
    path = s.writer.shards[0].path
    s.close()
    lf = read_log_file(path)
    assert lf.durable_end == os.path.getsize(path) > HEADER_SIZE


# ---- the syncs are real (issue 33 item 13) ------------------------------------------------------


def test_the_writers_sync_is_the_real_fdatasync():
    assert LW._fdatasync is getattr(os, "fdatasync", os.fsync)
    assert LW._fdatasync.__module__ in ("posix", "nt", "os")  # the OS call, not a Python no-op


def test_always_makes_at_least_one_real_sync_per_acknowledged_batch(tmp_path, monkeypatch):
    real = os.fdatasync if hasattr(os, "fdatasync") else os.fsync
    count = [0]

    def counting(fd):  # the real call, counted
        real(fd)
        count[0] += 1

    monkeypatch.setattr(LW, "_fdatasync", counting)
    s = LogStore(tmp_path, 2, fsync="always")
    s.open()
    try:
        for i in range(6):
            results, done = listen_for(s, 1)
            s.submit(i % 2, [kv(i)])
            assert s.flush() == []  # nothing acknowledged before its sync
            assert done.wait(WAIT)
            assert results == [(i % 2, i // 2 + 1, None)]
            assert count[0] >= i + 1
    finally:
        s.close()


# ---- settings ---------------------------------------------------------------------------------


def test_config_takes_interval_and_checks_its_period():
    c = Config(fsync="interval").validate()
    assert c.fsync_interval_ms == 1000
    assert Config(fsync="interval", fsync_interval_ms=50).validate().fsync_interval_ms == 50
    with pytest.raises(ConfigError, match="fsync_interval_ms"):
        Config(fsync="interval", fsync_interval_ms=0).validate()
    with pytest.raises(ConfigError, match="'always', 'interval' or 'never'"):
        Config(fsync="sometimes").validate()
    with pytest.raises(ValueError):
        LogStore("/nonexistent", 1, fsync="interval", fsync_interval_ms=0)
