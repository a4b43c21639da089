"""Damaged log files against the real daemon process.

Every test writes commits through herd (one request each, so one fsynced batch each: with
``fsync=always`` the first entry of every batch carries PREFIX_DURABLE), kills it (SIGKILL: a
crash), damages ``<data>/shard-00/current.log`` (one shard, so every group lives there), and
starts it again.

* Damage at the tail after a crash (cut short, bytes flipped in the last entry, garbage appended,
  the file cut mid-entry): herd starts, keeps every intact entry before the damage (checked with
  OffsetFetch), and logs the cut as a JSON ``log.tail_truncated`` line naming the byte offset.
* The same damage after a clean stop (SIGTERM) is corruption: nothing was being written then.
* Damage in the middle (an early entry flipped, intact durable entries after it): herd refuses to
  start with exit code 2 and one ``herd: error:`` line naming the file and the offset, and changes
  nothing; ``--repair`` starts, keeps the prefix and logs ``log.repaired`` at error level.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from coordinator.core.records import decode_key
from coordinator.store.logformat import read_log_file
from protocol import messages as m
from tools.daemon import REPO, Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration

N = 8  # commits written before the damage: partition i holds offset 100 + i
ARGS = ("--offsets-partitions", "1")


def _commit(c, partition, offset, group="g"):
    r = c.call(m.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=-1, member_id="",
        topics=[m.OffsetCommitRequestTopic(name="t", partitions=[
            m.OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset,
                                           committed_metadata=f"m{offset}")])]), 8)
    assert r.topics[0].partitions[0].error_code == 0


def _fetch(address, group="g") -> dict[int, int]:
    with RawClient(address) as c:
        r = c.call(m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=group, topics=None)]), 8)
    g = r.groups[0]
    assert g.error_code == 0
    return {p.partition_index: p.committed_offset for t in g.topics for p in t.partitions}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A data dir holding N acknowledged commits, left by a crash (written once per module, copied
    per test); -> (data dir, [(entry position, partition)])."""
    data = tmp_path_factory.mktemp("damage-template") / "data"
    with Daemon(data, *ARGS) as d:
        with RawClient(d.address) as c:
            for i in range(N):
                _commit(c, i, 100 + i)
        d.kill()
    path = data / "shard-00" / "current.log"
    os.truncate(path, read_log_file(path, 0).end)  # the preallocated zeros (tested on their own)
    lf = read_log_file(path, 0)
    assert lf.durable_end < lf.end, "the header of a crashed herd does not cover the tail"
    assert lf.damage is None and lf.header_damage is None
    entries = []
    for pos, key, _value in lf.entries:
        _rtype, k = decode_key(key)
        if hasattr(k, "partition"):
            entries.append((pos, k.partition))
    assert [p for _, p in entries] == list(range(N)), "one offset entry per commit, in order"
    return data, entries


@pytest.fixture
def written(template, tmp_path):
    """A private copy of the template: -> (data dir, log path, [(entry position, partition)])."""
    src, entries = template
    data = tmp_path / "data"
    shutil.copytree(src, data, ignore=shutil.ignore_patterns(".lock"))
    return data, data / "shard-00" / "current.log", entries


def _daemon(data, *extra) -> Daemon:
    """A Daemon whose log holds this run only (the support class appends to one file per data dir)."""
    (data.parent / f"{data.name}.herd.log").unlink(missing_ok=True)
    return Daemon(data, *ARGS, *extra)


def _events(daemon, name) -> list[dict]:
    out = []
    for line in daemon.logs().splitlines():
        if line.startswith("{"):
            ev = json.loads(line)
            if ev.get("event") == name:
                out.append(ev)
    return out


def _expect_prefix(data, keep: int, cut_at: int, cut_bytes: int | None = None, restart: bool = False):
    """Start herd on the damaged dir: partitions < keep survive, the rest are gone, the cut is logged."""
    with _daemon(data) as d:
        assert _fetch(d.address) == {i: 100 + i for i in range(keep)}
        cuts = _events(d, "log.tail_truncated")
        assert len(cuts) == 1, d.logs()
        assert cuts[0]["offset"] == cut_at and cuts[0]["kept_entries"] >= keep
        assert cuts[0]["level"] == "warning" and cuts[0]["path"].endswith("shard-00/current.log")
        if cut_bytes is not None:
            assert cuts[0]["cut_bytes"] == cut_bytes
        # and the log takes writes again after the cut
        with RawClient(d.address) as c:
            _commit(c, 50, 5000)
    if restart:
        with _daemon(data) as d:  # the cut and the new write survive a clean restart
            assert _fetch(d.address) == {**{i: 100 + i for i in range(keep)}, 50: 5000}
            assert not _events(d, "log.tail_truncated")


def test_last_entry_cut_short(written):
    data, path, entries = written
    last = entries[-1][0]
    size = path.stat().st_size
    os.truncate(path, size - 3)
    _expect_prefix(data, N - 1, last, size - 3 - last)


def test_bytes_flipped_in_the_last_entry(written):
    data, path, entries = written
    last = entries[-1][0]
    size = path.stat().st_size
    buf = bytearray(path.read_bytes())
    for off in (last + 20, size - 1):  # in the key and in the value
        buf[off] ^= 0x5A
    path.write_bytes(bytes(buf))
    _expect_prefix(data, N - 1, last, size - last)


def test_garbage_appended(written):
    data, path, _entries = written
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x30" + os.urandom(200))
    _expect_prefix(data, N, size, 204)


def test_garbage_that_looks_like_a_huge_entry_appended(written):
    data, path, _entries = written
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x7f\xff\xff\xff\x00\x00\x00\x00\x00\x01")  # length 2 GiB, "durable" attributes
    _expect_prefix(data, N, size, 10)


def test_file_cut_mid_entry(written):
    """The tail of the file lost from the middle of entry 4 on (entries 4-7 gone)."""
    data, path, entries = written
    pos4 = entries[4][0]
    os.truncate(path, pos4 + 9)
    _expect_prefix(data, 4, pos4, 9, restart=True)


def test_file_cut_inside_an_entry_header(written):
    data, path, entries = written
    pos2 = entries[2][0]
    # 6 bytes: past the length's low byte. A tail of nothing but zeros (the first 3 bytes of a
    # length) reads as preallocated space, not damage: same entries kept, no cut logged.
    os.truncate(path, pos2 + 6)
    _expect_prefix(data, 2, pos2, 6)


def test_file_cut_to_exactly_an_entry_boundary_is_not_damage(written):
    data, path, entries = written
    os.truncate(path, entries[5][0])
    with _daemon(data) as d:
        assert _fetch(d.address) == {i: 100 + i for i in range(5)}
        assert not _events(d, "log.tail_truncated")


def test_damage_at_the_tail_after_a_clean_stop_refuses_to_start(written):
    data, path, entries = written
    with _daemon(data):  # a clean start and stop (SIGTERM): the header now covers every entry
        pass
    assert read_log_file(path, 0).durable_end == path.stat().st_size
    last = entries[-1][0]
    buf = bytearray(path.read_bytes())
    buf[last + 20] ^= 0x5A  # bit rot in the last acknowledged commit
    path.write_bytes(bytes(buf))
    res = _serve(data)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    line = next(x for x in res.stderr.splitlines() if x.startswith("herd: error:"))
    assert f"byte {last}" in line and "clean stop" in line and "--repair" in line, line
    assert path.read_bytes() == bytes(buf)


# ---- damage in the middle ----------------------------------------------------------------------

def _serve(data, *extra, timeout=60):
    cmd = [sys.executable, "-m", "coordinator", "serve", "--host", "127.0.0.1", "--port", "0",
           "--data-dir", str(data), "--log-format", "json", *ARGS, *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO), env=env,
                          start_new_session=True)


def test_mid_log_corruption_refuses_to_start_with_one_clear_line(written):
    data, path, entries = written
    pos = entries[2][0]
    buf = bytearray(path.read_bytes())
    buf[pos + 20] ^= 0xFF  # inside entry 2; entries 3..7 are intact and were written after an fsync
    path.write_bytes(bytes(buf))
    before = path.read_bytes()
    res = _serve(data)
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("herd: error:")]
    assert len(errors) == 1, res.stderr
    line = errors[0]
    assert str(path) in line and f"byte {pos}" in line and "--repair" in line, line
    assert path.read_bytes() == before, "a refused start changes no log file"
    # the JSON log (stderr) names it too
    corrupt = [json.loads(x) for x in res.stderr.splitlines() if x.startswith("{") and "\"log.corrupt\"" in x]
    assert corrupt and corrupt[0]["offset"] == pos and corrupt[0]["level"] == "error"


def test_mid_log_corruption_with_repair_keeps_the_prefix_and_logs_loudly(written):
    data, path, entries = written
    pos = entries[3][0]
    buf = bytearray(path.read_bytes())
    buf[pos + 9] ^= 0x01  # the attributes byte: the CRC no longer matches
    path.write_bytes(bytes(buf))
    with _daemon(data, "--repair") as d:
        assert _fetch(d.address) == {i: 100 + i for i in range(3)}
        repaired = _events(d, "log.repaired")
        assert len(repaired) == 1, d.logs()
        ev = repaired[0]
        assert ev["level"] == "error" and ev["offset"] == pos and "LOST" in ev["action"]
        assert ev["kept_entries"] >= 3 and ev["cut_bytes"] > 0
    with _daemon(data) as d:  # repaired for good: a normal start works and says nothing
        assert _fetch(d.address) == {i: 100 + i for i in range(3)}
        assert not _events(d, "log.repaired") and not _events(d, "log.tail_truncated")


def test_corrupt_file_header_refuses_to_start(written):
    data, path, _entries = written
    buf = bytearray(path.read_bytes())
    buf[3] ^= 0x20  # the magic
    path.write_bytes(bytes(buf))
    res = _serve(data)
    assert res.returncode == 2
    assert "herd: error:" in res.stderr and "byte 0" in res.stderr and str(path) in res.stderr


# ---- an empty shard file ----------------------------------------------------------------------

def test_an_empty_shard_file_keeps_what_is_acknowledged_after_it(written):
    """A zero-length current.log (an operator's ``: > current.log``, a file system that lost the
    data of a renamed file) must not make later acknowledged commits disappear or stop herd from
    starting. BUG (see docs/reliability.md, "Known issues"): herd opens the empty file without
    writing a file header, appends entries at byte 0, and the next start either drops them as a
    "short header" (< 24 bytes) or refuses the whole data dir as a bad header."""
    data, path, _entries = written
    os.truncate(path, 0)
    with _daemon(data) as d:
        assert _fetch(d.address) == {}
        with RawClient(d.address) as c:
            _commit(c, 1, 7001)
            _commit(c, 2, 7002)
    assert path.read_bytes()[:8] == b"HERDLOG\x00", "the file needs its header back before entries"
    with _daemon(data) as d:
        assert _fetch(d.address) == {1: 7001, 2: 7002}
