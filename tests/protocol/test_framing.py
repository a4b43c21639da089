"""Length-prefixed framing and request/response headers."""
import struct

import pytest

from protocol import headers as h
from protocol import messages as m
from protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, FrameTooLarge, frame
from protocol.wire import EncodeError, ProtocolError
from tools import construct_codec as cc

PAYLOADS = [b"", b"a", b"hello world", bytes(range(256)) * 3, b"\x00\x00\x00\x05"]


def test_frame_prefix():
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"


def test_one_byte_at_a_time_equals_all_at_once():
    stream = b"".join(frame(p) for p in PAYLOADS)
    whole = FrameDecoder().feed(stream)
    assert whole == PAYLOADS
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i:i + 1])
    assert got == PAYLOADS
    assert dec.buffered == 0


@pytest.mark.parametrize("chunk", [2, 3, 5, 7, 64, 1000])
def test_arbitrary_chunking(chunk):
    stream = b"".join(frame(p) for p in PAYLOADS)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(stream), chunk):
        got += dec.feed(stream[i:i + chunk])
    assert got == PAYLOADS


def test_several_frames_in_one_chunk_and_a_trailing_partial_frame():
    dec = FrameDecoder()
    partial = frame(b"0123456789")[:7]
    assert dec.feed(frame(b"one") + frame(b"two") + frame(b"three") + partial) == [b"one", b"two", b"three"]
    # the size prefix is consumed once read; ``buffered`` is the body bytes held so far
    assert dec.buffered == len(partial) - 4
    assert dec.feed(b"") == []
    assert dec.buffered == len(partial) - 4
    assert dec.feed(b"3456789") == [b"0123456789"]
    assert dec.buffered == 0


def test_partial_size_prefix_stays_buffered():
    dec = FrameDecoder()
    assert dec.feed(b"\x00\x00") == []
    assert dec.buffered == 2
    assert dec.feed(b"\x00\x01x") == [b"x"]


def test_accepts_bytearray_and_memoryview():
    dec = FrameDecoder()
    assert dec.feed(bytearray(frame(b"ab"))) == [b"ab"]
    assert dec.feed(memoryview(frame(b"cd"))) == [b"cd"]


def test_frame_exactly_at_the_limit():
    dec = FrameDecoder(max_frame_size=8)
    assert dec.feed(frame(b"12345678")) == [b"12345678"]


def test_huge_size_rejected_as_soon_as_the_prefix_arrives():
    dec = FrameDecoder(max_frame_size=1024)
    prefix = struct.pack(">i", 1025)
    for b in prefix[:3]:
        assert dec.feed(bytes([b])) == []
    with pytest.raises(FrameTooLarge) as info:
        dec.feed(prefix[3:])
    assert info.value.size == 1025 and info.value.limit == 1024
    assert dec.buffered == 0
    assert isinstance(info.value, ProtocolError)


def test_huge_size_with_body_in_the_same_chunk_buffers_nothing():
    dec = FrameDecoder(max_frame_size=1024)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">i", 0x7FFFFFFF) + b"x" * 4096)
    assert dec.buffered == 0


def test_huge_size_after_good_frames():
    dec = FrameDecoder(max_frame_size=16)
    with pytest.raises(FrameTooLarge):
        dec.feed(frame(b"ok") + struct.pack(">i", 17))
    assert dec.buffered == 0


def test_split_returns_the_frames_before_an_invalid_size_with_the_error():
    dec = FrameDecoder(max_frame_size=16)
    frames, error = dec.split(frame(b"ok") + frame(b"also") + struct.pack(">i", 17) + frame(b"never"))
    assert frames == [b"ok", b"also"] and isinstance(error, FrameTooLarge) and error.size == 17
    assert dec.buffered == 0
    assert dec.split(frame(b"later")) == ([], error)  # the stream cannot be resynchronised
    with pytest.raises(FrameTooLarge):
        dec.feed(frame(b"later"))


def test_split_across_reads_keeps_the_partial_frame_until_the_bad_prefix():
    dec = FrameDecoder(max_frame_size=16)
    stream = frame(b"abc")
    assert dec.split(stream[:5]) == ([], None)
    frames, error = dec.split(stream[5:] + struct.pack(">i", -3))
    assert frames == [b"abc"] and isinstance(error, ProtocolError) and "negative" in str(error)


def test_default_limit():
    assert DEFAULT_MAX_FRAME_SIZE == 100 * 1024 * 1024
    with pytest.raises(FrameTooLarge):
        FrameDecoder().feed(struct.pack(">i", DEFAULT_MAX_FRAME_SIZE + 1))


@pytest.mark.parametrize("size", [-1, -2, -(1 << 31)])
def test_negative_size(size):
    dec = FrameDecoder()
    with pytest.raises(ProtocolError) as info:
        dec.feed(struct.pack(">i", size))
    assert not isinstance(info.value, FrameTooLarge)
    assert dec.buffered == 0


# ------------------------------------------------------------------------------------------------
# headers
# ------------------------------------------------------------------------------------------------

def _first_flexible(api_key):
    return m.REQUESTS[api_key].FLEXIBLE_VERSION


def test_header_versions():
    assert h.request_header_version(12, 3) == 1  # Heartbeat v3: classic
    assert h.request_header_version(12, 4) == 2  # Heartbeat v4: flexible
    assert h.response_header_version(12, 3) == 0
    assert h.response_header_version(12, 4) == 1
    assert h.response_header_version(18, 3) == 0  # ApiVersions: always v0 (KIP-511)
    assert h.response_header_version(18, 4) == 0
    assert h.request_header_version(18, 3) == 2
    for key, cls in m.REQUESTS.items():
        for v in range(cls.MIN_VERSION, cls.MAX_VERSION + 1):
            flexible = cls.FLEXIBLE_VERSION is not None and v >= cls.FLEXIBLE_VERSION
            assert h.request_header_version(key, v) == (2 if flexible else 1)
            if key != 18:
                assert h.response_header_version(key, v) == (1 if flexible else 0)


@pytest.mark.parametrize("client_id", ["", "consumer-1", "c" * 200, "kliënt", None])
@pytest.mark.parametrize("api_key,api_version", [(12, 3), (12, 4), (11, 5), (11, 9), (18, 0), (18, 3)])
def test_request_header_round_trip(api_key, api_version, client_id):
    out = bytearray()
    h.encode_request_header(out, api_key, api_version, 12345, client_id)
    body = b"BODY"
    hdr, pos = h.decode_request_header(bytes(out) + body)
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id) == (
        api_key, api_version, 12345, client_id)
    assert pos == len(out)
    assert hdr.flexible == (h.request_header_version(api_key, api_version) == 2)
    # the independent codec reads the same header (RequestHeader schema, v1 or v2)
    hv = h.request_header_version(api_key, api_version)
    parsed = cc.parse("RequestHeader", hv, bytes(out))
    assert parsed["client_id"] == client_id
    assert (parsed["request_api_key"], parsed["request_api_version"]) == (api_key, api_version)
    # and the generated RequestHeader class agrees byte for byte
    gen = m.RequestHeader(request_api_key=api_key, request_api_version=api_version, correlation_id=12345,
                          client_id=client_id)
    assert gen.encode(hv) == bytes(out)


def test_client_id_keeps_int16_length_in_header_v2():
    out = bytearray()
    h.encode_request_header(out, 12, 4, 7, "abc")
    assert bytes(out) == struct.pack(">hhi", 12, 4, 7) + b"\x00\x03abc" + b"\x00"
    out = bytearray()
    h.encode_request_header(out, 12, 4, 7, None)
    assert bytes(out) == struct.pack(">hhi", 12, 4, 7) + b"\xff\xff" + b"\x00"
    assert m.RequestHeader(request_api_key=12, request_api_version=4, correlation_id=7,
                           client_id="abc").encode(2) == struct.pack(">hhi", 12, 4, 7) + b"\x00\x03abc\x00"


@pytest.mark.parametrize("call", [
    lambda: h.encode_request_header(bytearray(), 12, 4, 1, "x" * 40000),
    lambda: h.encode_request_header(bytearray(), 12, 4, 1 << 31, "c"),
    lambda: h.encode_request_header(bytearray(), 1 << 15, 0, 1, "c"),
    lambda: h.encode_response_header(1 << 31, 12, 4),
], ids=["long-client-id", "correlation-id", "api-key", "response-correlation-id"])
def test_header_encode_refuses_impossible_values_with_encode_error(call):
    with pytest.raises(EncodeError):
        call()


def test_request_header_v2_keeps_unknown_tags():
    raw = struct.pack(">hhi", 12, 4, 9) + b"\x00\x01c" + b"\x01\x05\x02hi" + b"BODY"
    hdr, pos = h.decode_request_header(raw)
    assert hdr.tagged_fields == [(5, b"hi")]
    assert raw[pos:] == b"BODY"


def test_request_header_for_an_unknown_api_is_read_as_v1():
    raw = struct.pack(">hhi", 999, 7, 3) + b"\x00\x01c" + b"rest"
    hdr, pos = h.decode_request_header(raw)
    assert (hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id) == (999, 7, 3, "c")
    assert raw[pos:] == b"rest"


@pytest.mark.parametrize("raw", [
    b"",
    struct.pack(">hhi", 12, 4, 1),  # no client id
    struct.pack(">hhi", 12, 4, 1) + b"\x00\x05ab",  # client id runs past the end
    struct.pack(">hhi", 12, 4, 1) + b"\x00\x01c",  # v2 without its tagged-field byte
    struct.pack(">hhi", 12, 4, 1) + b"\x00\x01c" + b"\x01\x05\x09x",  # tag runs past the end
    struct.pack(">hhi", 12, 4, 1) + b"\x00\x01c" + b"\xff\xff\xff\xff\x0f",  # tag count
    struct.pack(">hhi", 12, 3, 1) + b"\x00\x02\xff\xfe",  # client id not UTF-8
])
def test_malformed_request_headers(raw):
    with pytest.raises(ProtocolError):
        h.decode_request_header(raw)


def test_every_request_header_truncation_raises_protocol_error():
    out = bytearray()
    h.encode_request_header(out, 11, 9, 77, "client")
    for cut in range(len(out)):
        with pytest.raises(ProtocolError):
            h.decode_request_header(bytes(out[:cut]))


@pytest.mark.parametrize("api_key,api_version,expected", [
    (12, 3, b"\x00\x00\x30\x39"),
    (12, 4, b"\x00\x00\x30\x39\x00"),
    (18, 0, b"\x00\x00\x30\x39"),
    (18, 3, b"\x00\x00\x30\x39"),  # no tagged-field byte for ApiVersions, even when flexible
    (18, 4, b"\x00\x00\x30\x39"),
])
def test_response_header_round_trip(api_key, api_version, expected):
    enc = h.encode_response_header(12345, api_key, api_version)
    assert enc == expected
    assert h.decode_response_header(enc + b"BODY", api_key, api_version) == (12345, len(enc))
    hv = h.response_header_version(api_key, api_version)
    assert m.ResponseHeader(correlation_id=12345).encode(hv) == expected
    assert cc.parse("ResponseHeader", hv, enc) == {"correlation_id": 12345}


def test_response_header_v1_with_tags_and_truncation():
    enc = b"\x00\x00\x00\x01" + b"\x01\x02\x01z"
    assert h.decode_response_header(enc + b"B", 12, 4) == (1, len(enc))
    for raw in (b"", b"\x00\x00\x00", b"\x00\x00\x00\x01", b"\x00\x00\x00\x01\x01\x02\x05z"):
        with pytest.raises(ProtocolError):
            h.decode_response_header(raw, 12, 4)


def test_request_frame_end_to_end():
    """frame -> header -> body, the way the server reads a request."""
    req = m.HeartbeatRequest(group_id="g", generation_id=3, member_id="m-1", group_instance_id=None)
    out = bytearray()
    h.encode_request_header(out, 12, 4, 42, "cli")
    out += req.encode(4)
    stream = frame(bytes(out)) * 2
    dec = FrameDecoder()
    frames = [f for i in range(len(stream)) for f in dec.feed(stream[i:i + 1])]
    assert len(frames) == 2
    for f in frames:
        hdr, pos = h.decode_request_header(f)
        assert hdr.correlation_id == 42
        assert m.REQUESTS[hdr.api_key].decode(f, hdr.api_version, pos) == req
