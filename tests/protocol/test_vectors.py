"""Primitive encodings against Kafka's own unit-test vectors
(../shared/kafka-spec/vectors/primitive_encodings.tsv, copied from ByteUtilsTest.java)."""
import math
import struct

import pytest

from protocol import wire
from tests.support.shared import require_shared, shared_missing, shared_path
from tools import construct_codec as cc

SPEC_FILE = ("kafka-spec", "vectors", "primitive_encodings.tsv")
TSV = shared_path(*SPEC_FILE)


def _rows():
    if not TSV.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=shared_missing(*SPEC_FILE)))]
    rows = []
    lines = TSV.read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["kind", "value", "encoded_hex"]
    for line in lines[1:]:
        if not line.strip():
            continue
        kind, value, hexed = line.split("\t")[:3]
        rows.append(pytest.param((kind, value, bytes.fromhex(hexed)), id=f"{kind}:{value}"))
    return rows


ROWS = _rows()


def test_vector_file_is_complete():
    require_shared(*SPEC_FILE)
    kinds = {}
    for p in ROWS:
        kinds[p.values[0][0]] = kinds.get(p.values[0][0], 0) + 1
    assert kinds == {"unsigned_varint": 14, "varint": 21, "varlong": 43, "float64": 13}


@pytest.mark.parametrize("row", ROWS)
def test_vector(row):
    kind, text, encoded = row
    trailing = b"\x99"  # a following byte must not be consumed
    if kind == "unsigned_varint":
        java_int = int(text)
        unsigned = java_int & 0xFFFFFFFF  # negative Java ints are written as their unsigned pattern
        assert wire.uvarint_bytes(java_int) == encoded
        assert wire.uvarint_bytes(unsigned) == encoded
        out = bytearray(b"\x01")
        wire.write_uvarint(out, java_int)
        assert bytes(out) == b"\x01" + encoded
        assert wire.read_uvarint(b"\x01" + encoded + trailing, 1) == (unsigned, 1 + len(encoded))
        assert cc.uvarint(unsigned) == encoded  # the independent codec agrees
    elif kind == "varint":
        value = int(text)
        out = bytearray()
        wire.write_varint(out, value)
        assert bytes(out) == encoded
        assert wire.read_varint(encoded + trailing, 0) == (value, len(encoded))
    elif kind == "varlong":
        value = int(text)
        out = bytearray()
        wire.write_varlong(out, value)
        assert bytes(out) == encoded
        assert wire.read_varlong(encoded + trailing, 0) == (value, len(encoded))
    elif kind == "float64":
        value = float(text)
        if math.isnan(value):
            assert wire.FLOAT64.pack(value) == encoded  # Java's canonical NaN
            assert math.isnan(wire.FLOAT64.unpack(encoded)[0])
        else:
            assert wire.FLOAT64.pack(value) == encoded
            back = wire.FLOAT64.unpack(encoded)[0]
            assert back == value and math.copysign(1, back) == math.copysign(1, value)
    else:
        pytest.fail(f"unknown kind {kind!r}")


# ------------------------------------------------------------------------------------------------
# the wire helpers' edges (independent of the vector file)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b"", b"\x80", b"\xff\xff\xff\xff", b"\xff\xff\xff\xff\x7f",
                                 b"\xff\xff\xff\xff\xff\x01", b"\x80\x80\x80\x80\x80\x00"])
def test_bad_uvarints(raw):
    with pytest.raises(wire.ProtocolError):
        wire.read_uvarint(raw, 0)
    with pytest.raises(wire.ProtocolError):
        wire.read_varint(raw, 0)


def test_uvarint_reads_at_the_end_of_the_buffer():
    with pytest.raises(wire.ProtocolError):
        wire.read_uvarint(b"\x01", 1)


@pytest.mark.parametrize("raw", [b"", b"\x80" * 9, b"\xff" * 10 + b"\x01", b"\x80" * 10 + b"\x02"])
def test_bad_varlongs(raw):
    with pytest.raises(wire.ProtocolError):
        wire.read_varlong(raw, 0)


def test_out_of_range_values_raise_encode_error():
    with pytest.raises(wire.EncodeError):
        wire.uvarint_bytes(1 << 32)
    with pytest.raises(wire.EncodeError):
        wire.write_varint(bytearray(), 1 << 31)
    with pytest.raises(wire.EncodeError):
        wire.write_varint(bytearray(), -(1 << 31) - 1)
    with pytest.raises(wire.EncodeError):
        wire.write_varlong(bytearray(), 1 << 63)


def test_varint_extremes_round_trip():
    for value in (0, 1, -1, (1 << 31) - 1, -(1 << 31)):
        out = bytearray()
        wire.write_varint(out, value)
        assert wire.read_varint(bytes(out), 0) == (value, len(out))
    for value in (0, -1, (1 << 63) - 1, -(1 << 63)):
        out = bytearray()
        wire.write_varlong(out, value)
        assert wire.read_varlong(bytes(out), 0) == (value, len(out))


def test_tagged_field_helpers():
    out = bytearray()
    wire.write_tagged_fields(out, [(300, b"b"), (1, b"a" * 200)])
    assert bytes(out) == b"\x02" + b"\x01\xc8\x01" + b"a" * 200 + b"\xac\x02\x01b"
    assert wire.read_tagged_fields(bytes(out), 0) == ([(1, b"a" * 200), (300, b"b")], len(out))
    assert wire.read_tagged_fields(b"\x00", 0) == (None, 1)
    out = bytearray()
    wire.write_tagged_fields(out, None)
    assert bytes(out) == b"\x00"
    with pytest.raises(wire.EncodeError):
        wire.write_tagged_fields(bytearray(), [(1, b""), (1, b"")])
    for bad in (b"\x01\x01\x05ab", b"\x02\x01\x00", b"\x05"):
        with pytest.raises(wire.ProtocolError):
            wire.read_tagged_fields(bad, 0)


def test_fixed_width_structs():
    assert wire.INT16.pack(-2) == b"\xff\xfe"
    assert wire.UINT16.pack(65535) == b"\xff\xff"
    assert wire.UINT32.pack(0xFFFFFFFF) == b"\xff\xff\xff\xff"
    assert wire.INT64.unpack(b"\x80" + b"\x00" * 7) == (-(1 << 63),)
    assert struct.calcsize(wire.INT8.format) == 1
