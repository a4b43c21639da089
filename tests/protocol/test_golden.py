"""Frames captured from real clients decode to the fields we know they sent, and re-encode to the
identical bytes (see tests/protocol/golden/README.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol import messages as m
from protocol.headers import decode_request_header, decode_response_header, encode_request_header

GOLDEN = Path(__file__).parent / "golden"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())
KNOWN = [e for e in MANIFEST if not e["beyond_spec"] and e["api_key"] in m.REQUESTS]


def matches(expect, value) -> bool:
    if isinstance(expect, dict):
        return all(k in value and matches(v, value[k]) for k, v in expect.items())
    if isinstance(expect, list):
        return isinstance(value, list) and len(value) == len(expect) and all(
            matches(e, v) for e, v in zip(expect, value, strict=True))
    if isinstance(value, bytes):
        return expect == value.hex() or expect == value.decode("latin-1")
    return expect == value


def test_manifest_covers_every_client_and_the_group_apis():
    clients = {e["client"] for e in KNOWN}
    assert clients >= {"kafka-python", "aiokafka", "confluent-kafka"}
    apis = {e["api_name"] for e in KNOWN if e["direction"] == "request"}
    assert apis >= {"ApiVersions", "Metadata", "FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat",
                    "OffsetCommit", "OffsetFetch", "LeaveGroup"}


@pytest.mark.parametrize("entry", KNOWN, ids=[e["file"] for e in KNOWN])
def test_golden_frame(entry):
    data = (GOLDEN / entry["file"]).read_bytes()
    key, version = entry["api_key"], entry["api_version"]
    if entry["direction"] == "request":
        header, pos = decode_request_header(data)
        assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
            key, version, entry["correlation_id"], entry["client_id"])
        cls = m.REQUESTS[key]
        out = bytearray()
        encode_request_header(out, key, version, header.correlation_id, header.client_id)
        assert bytes(out) == data[:pos]
    else:
        cid, pos = decode_response_header(data, key, version)
        assert cid == entry["correlation_id"]
        cls = m.RESPONSES[key]
    msg, end = cls.decode_from(data, pos, version)
    assert end == len(data), "the whole frame is consumed"
    assert matches(entry["expect"], msg.to_dict()), (entry["expect"], msg.to_dict())
    assert msg.encode(version) == data[pos:], "re-encodes to the same bytes"
