"""tools/logdump: decodes real __consumer_offsets records from a data dir; usage mistakes exit 2."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.store.filelog import LogStore
from coordinator.store.logformat import LOG_NAME
from protocol.messages import (
    GroupMetadataKey,
    GroupMetadataValue,
    GroupMetadataValueMemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)
from tools import logdump

REPO = Path(__file__).resolve().parents[3]
I16 = struct.Struct(">h")


def offset_key(group, topic, partition, rtype=1) -> bytes:
    return I16.pack(rtype) + OffsetCommitKey(group=group, topic=topic, partition=partition).encode(rtype)


def offset_value(offset, version=3, metadata="") -> bytes:
    return I16.pack(version) + OffsetCommitValue(offset=offset, metadata=metadata,
                                                 commit_timestamp=1700000000000).encode(version)


def group_key(group) -> bytes:
    return I16.pack(2) + GroupMetadataKey(group=group).encode(2)


def group_value() -> bytes:
    member = GroupMetadataValueMemberMetadata(member_id="m-1", client_id="cli", client_host="/127.0.0.1",
                                              rebalance_timeout=30000, session_timeout=10000,
                                              subscription=b"\x00\x01", assignment=b"")
    value = GroupMetadataValue(protocol_type="consumer", generation=4, protocol="range", leader="m-1",
                               current_state_timestamp=5, members=[member])
    return I16.pack(3) + value.encode(3)


@pytest.fixture
def data_dir(tmp_path) -> Path:
    d = tmp_path / "data"
    s = LogStore(d, 2, fsync="never")
    s.open()
    s.append(0, [(offset_key("g1", "orders", 3), offset_value(42, metadata="meta")),
                 (group_key("g1"), group_value()),
                 (offset_key("g0", "t", 0, rtype=0), offset_value(7, version=1))]).result(10)
    s.append(1, [(offset_key("g2", "clicks", 0), None), (b"\x7f\x00\x00\x03abc", b"\x00\x00\x01")]).result(10)
    s.close()
    return d


def run(capsys, *argv) -> tuple[int, str, str]:
    code = logdump.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_output_decodes_records(data_dir, capsys):
    code, out, err = run(capsys, data_dir)
    assert code == 0 and err == ""
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert len(lines) == 5
    assert lines[0].startswith("shard 0 @24 OffsetCommitKey[1] group='g1' topic='orders' partition=3 => "
                               "OffsetCommitValue v3 offset=42 leader_epoch=-1 metadata='meta'")
    assert "GroupMetadataKey[2] group='g1' => GroupMetadataValue v3 protocol_type='consumer' generation=4" \
        in lines[1]
    assert "member_id='m-1'" in lines[1] and "subscription=0x0001" in lines[1]
    assert "OffsetCommitKey[0] group='g0'" in lines[2] and "OffsetCommitValue v1 offset=7" in lines[2]
    assert lines[3].startswith("shard 1 @24 OffsetCommitKey[1] group='g2' topic='clicks' partition=0 "
                               "=> <tombstone>")
    assert "type=32512 key=0x7f000003616263 => 0x000001" in lines[4]


@pytest.mark.parametrize("decoder", ["auto", "generated", "construct"])
def test_json_output_is_the_same_with_either_decoder(data_dir, capsys, decoder):
    pytest.importorskip("construct")
    code, out, _ = run(capsys, data_dir, "--json", "--decoder", decoder)
    assert code == 0
    rows = [json.loads(ln) for ln in out.splitlines()]
    entries = [r for r in rows if "position" in r]
    assert [(r["shard"], r["type"]) for r in entries] == [(0, 1), (0, 2), (0, 0), (1, 1), (1, 32512)]
    first = entries[0]
    assert first["position"] == 24 and first["key_schema"] == "OffsetCommitKey"
    assert first["key"] == {"group": "g1", "topic": "orders", "partition": 3}
    assert first["value_version"] == 3 and first["value"]["offset"] == 42
    assert entries[1]["value"]["members"][0]["subscription"] == "0001"
    assert entries[3]["value"] is None
    assert entries[4]["key_hex"] == "7f000003616263" and entries[4]["value_hex"] == "000001"
    headers = [r for r in rows if "entries" in r]
    assert [(h["shard"], h["entries"]) for h in headers] == [(0, 3), (1, 2)]
    # the generated and construct decoders agree
    if decoder == "construct":
        _, gen, _ = run(capsys, data_dir, "--json", "--decoder", "generated")
        assert [json.loads(ln) for ln in gen.splitlines()] == rows


def test_herds_topic_records_are_decoded(tmp_path, capsys):
    from coordinator.core.catalog import Topic, topic_key, topic_value
    d = tmp_path / "data"
    s = LogStore(d, 1, fsync="never")
    s.open()
    tid = bytes(range(16))
    s.append(0, [(topic_key("events"), topic_value(Topic("events", 6, tid))), (topic_key("old"), None)]).result(10)
    s.close()
    capsys.readouterr()  # the store's own log lines (a new data directory), not logdump's output
    code, out, _ = run(capsys, d)
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert code == 0 and lines == [
        "shard 0 @24 HerdTopicKey[32512] name='events' => HerdTopicValue v0 partitions=6 "
        "topic_id='00010203-0405-0607-0809-0a0b0c0d0e0f'",
        lines[1]]
    assert "HerdTopicKey[32512] name='old' => <tombstone>" in lines[1]
    code, out, _ = run(capsys, d, "--json")
    rows = [json.loads(ln) for ln in out.splitlines() if '"position"' in ln]
    assert rows[0]["value"] == {"partitions": 6, "topic_id": "00010203-0405-0607-0809-0a0b0c0d0e0f"}


def test_shard_filter(data_dir, capsys):
    code, out, _ = run(capsys, data_dir, "--shard", 1, "--json")
    assert code == 0
    assert {json.loads(ln)["shard"] for ln in out.splitlines()} == {1}


def test_torn_tail_is_reported_not_cut(data_dir, capsys):
    p = data_dir / "shard-00" / LOG_NAME
    with open(p, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")
    size = p.stat().st_size
    code, out, _ = run(capsys, data_dir)
    assert code == 0
    assert "# shard 0: torn tail at byte" in out and "herd will cut 11 bytes" in out
    assert p.stat().st_size == size


def test_mid_log_corruption_exits_1(tmp_path, capsys):
    s = LogStore(tmp_path, 1)
    s.open()
    for i in range(3):
        s.append(0, [(offset_key("g", "t", i), offset_value(i))]).result(10)
    s.close()
    p = tmp_path / "shard-00" / LOG_NAME
    raw = bytearray(p.read_bytes())
    raw[24 + 20] ^= 1
    p.write_bytes(bytes(raw))
    code, out, _ = run(capsys, tmp_path, "--json")
    assert code == 1
    damage = [json.loads(ln)["damage"] for ln in out.splitlines() if "damage" in ln]
    assert damage[0]["kind"] == "corrupt" and damage[0]["offset"] == 24


@pytest.mark.parametrize("argv, message", [
    (["/nonexistent/herd-data"], "no such directory"),
    (["{tmp}"], "not a herd data directory"),
    (["{data}", "--shard", "9"], "no shard 9"),
    (["{data}", "--shard", "x"], "invalid int value"),
    ([], "the following arguments are required"),
])
def test_usage_mistakes_print_one_line_and_exit_2(tmp_path, data_dir, capsys, argv, message):
    argv = [a.format(tmp=tmp_path / "empty", data=data_dir) for a in argv]
    (tmp_path / "empty").mkdir()
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("logdump: error: ") and message in err


def test_module_entry_point(data_dir):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    ok = subprocess.run([sys.executable, "-m", "tools.logdump", str(data_dir), "--shard", "0"],
                        capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert ok.returncode == 0 and "OffsetCommitKey[1] group='g1'" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "tools.logdump", str(data_dir / "missing")],
                         capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "Traceback" not in bad.stderr
