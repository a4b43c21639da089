"""Hypothesis throws malformed request bodies at the decoder, for every (api, version) in
``protocol.messages.REQUESTS``, and at the pieces the server runs before it (frame splitter, request
header) and after it (the embedded consumer-protocol blobs the group core decodes).

The contract (the server relies on it to keep one bad connection from hurting the process): decoding
hostile input raises ``protocol.wire.ProtocolError`` and nothing else, and returns quickly. "Quickly"
is checked with a generous bound on the thread's CPU time (``SLOW``: 1000x what any of these inputs
needs; CPU time, so a loaded machine does not trip it) so that only runaway work (quadratic loops,
allocation proportional to a claimed length) can.

Strategies: random bytes; a valid encoding cut short and followed by garbage; a valid encoding with
negative and huge int16/int32/varint lengths and counts written over it; flexible versions with
huge, deeply nested and repeated tagged-field sections; whole frames through header + body.

``HERD_FUZZ_EXAMPLES`` scales the number of examples (default 300 per test; the deterministic
sweeps always cover every pair).
"""
from __future__ import annotations

import os
import resource
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import messages as M
from protocol.consumer import decode_assignment, decode_subscription
from protocol.framing import FrameDecoder
from protocol.headers import decode_request_header, encode_request_header
from protocol.wire import ProtocolError

EXAMPLES = int(os.environ.get("HERD_FUZZ_EXAMPLES", "300"))
SLOW = 0.5  # seconds: one decode of a < 64 KiB input taking this long is a bug

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

PAIRS = [(cls.NAME, v) for _key, cls in sorted(M.REQUESTS.items())
         for v in range(cls.MIN_VERSION, cls.MAX_VERSION + 1)]
PAIR = st.sampled_from(PAIRS)


def _cls(name):
    return getattr(M, name)


def _flexible(name, v):
    cls = _cls(name)
    return cls.FLEXIBLE_VERSION is not None and v >= cls.FLEXIBLE_VERSION


def decode_only_protocol_error(name: str, v: int, data: bytes):
    """Decode; return the message or None. Anything but ProtocolError fails the test, as does a
    decode that takes longer than SLOW."""
    cls = _cls(name)
    t0 = time.thread_time()
    try:
        out = cls.decode(data, v)
    except ProtocolError:
        out = None
    except Exception as exc:  # pragma: no cover - this is the failure being hunted
        raise AssertionError(f"{name} v{v}: {type(exc).__name__} escaped the decoder on "
                             f"{data[:200].hex()}...") from exc
    took = time.thread_time() - t0
    assert took < SLOW, f"{name} v{v}: decode of {len(data)} bytes took {took:.3f}s"
    return out


def _valid(kit, name, v, drawn=None) -> bytes:
    plain = drawn if drawn is not None else kit.rich(name, v)
    return kit.to_obj(name, plain).encode(v)


# ---- random bytes ------------------------------------------------------------------------------

@FUZZ
@given(pair=PAIR, data=st.binary(max_size=600))
def test_random_bytes(pair, data):
    decode_only_protocol_error(*pair, data)


@FUZZ
@given(pair=PAIR, data=st.binary(max_size=64), fill=st.sampled_from([b"\xff", b"\x80", b"\x7f", b"\x00"]),
       n=st.integers(0, 4000))
def test_random_prefix_then_a_run_of_one_byte(pair, data, fill, n):
    """0xff runs are -1 lengths and endless varint continuations; 0x7f runs are huge counts."""
    decode_only_protocol_error(*pair, data + fill * n)


# ---- valid prefix, then garbage ----------------------------------------------------------------

@FUZZ
@given(pair=PAIR, st_data=st.data(), cut=st.floats(0, 1), garbage=st.binary(max_size=200))
def test_valid_prefix_then_garbage(kit, pair, st_data, cut, garbage):
    name, v = pair
    plain = st_data.draw(kit.strategy(name, v), label="message")
    data = _valid(kit, name, v, plain)
    at = int(len(data) * cut)
    decode_only_protocol_error(name, v, data[:at] + garbage)


# ---- negative and huge lengths/counts ----------------------------------------------------------

HOSTILE_INTS = [
    struct.pack(">h", -1), struct.pack(">h", -2), struct.pack(">h", 0x7FFF), struct.pack(">h", -0x8000),
    struct.pack(">i", -1), struct.pack(">i", -2), struct.pack(">i", 0x7FFFFFFF),
    struct.pack(">i", -0x80000000),
    struct.pack(">i", 0x00100000),
    b"\xff\xff\xff\xff\x0f",  # uvarint 0xffffffff (compact length 2^32-2)
    b"\xfe\xff\xff\xff\x0f",  # uvarint 0xfffffffe
    b"\x80\x80\x80\x80\x10",  # uvarint just over 32 bits
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # 10-byte varint
    b"\x80\x80\x04",  # 65536
    b"\x00",  # compact null
]


@FUZZ
@given(pair=PAIR, st_data=st.data(), patches=st.lists(
    st.tuples(st.floats(0, 1), st.sampled_from(HOSTILE_INTS), st.booleans()), min_size=1, max_size=3))
def test_negative_and_huge_lengths_written_over_a_valid_message(kit, pair, st_data, patches):
    name, v = pair
    plain = st_data.draw(kit.strategy(name, v), label="message")
    buf = bytearray(_valid(kit, name, v, plain))
    for where, patch, insert in patches:
        at = int(len(buf) * where)
        if insert:
            buf[at:at] = patch
        else:
            buf[at:at + len(patch)] = patch
    decode_only_protocol_error(name, v, bytes(buf))


def test_every_pair_every_offset_every_hostile_int_is_bounded(kit):
    """Deterministic sweep: every pair, every offset of a rich encoding, every hostile integer:
    ProtocolError or a decode, within SLOW, and the process's peak RSS does not grow like a claimed
    size (``tests/protocol/test_malformed.py`` measures per-decode allocations with tracemalloc for
    two of these patches; this covers all of them, cheaply)."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    decodes = 0
    for name, v in PAIRS:
        data = _valid(kit, name, v, kit.rich(name, v, n=1))
        for i in range(0, len(data)):
            for patch in HOSTILE_INTS:
                decode_only_protocol_error(name, v, data[:i] + patch + data[i + len(patch):])
                decodes += 1
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert decodes > 10_000
    assert grown_kib < 64 * 1024, f"peak RSS grew by {grown_kib} KiB during the sweep"


# ---- tagged sections ---------------------------------------------------------------------------

def _uv(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _nested_section(depth: int, width: int = 1, tag: int = 0) -> bytes:
    """A tagged section ``depth`` levels deep: at each level ``width`` fields (tags ``tag``,
    ``tag + 1``, ...), the first holding the next level, the others a one-byte empty section.
    Linear in depth * width (one nested chain, not a tree)."""
    inner = b"\x00"
    for _ in range(depth):
        rest = b"".join(_uv(tag + k) + b"\x01\x00" for k in range(1, width))
        inner = _uv(width) + _uv(tag) + _uv(len(inner)) + inner + rest
    return inner


def _tagged_variants(base: bytes) -> list[bytes]:
    """Replace the final (empty) top-level tagged section of ``base`` with hostile ones."""
    assert base.endswith(b"\x00")
    head = base[:-1]
    return [
        head + _nested_section(200),  # deeply nested (as unknown tags: opaque bytes)
        head + _nested_section(6, width=3, tag=0),  # nested under the known tags 0, 1, 2
        head + _uv(5000) + b"\x07\x00" * 5000,  # 5000 fields of one repeated tag
        head + _uv(5000) + b"".join(_uv(t) + b"\x00" for t in range(5000)),  # 5000 distinct tags
        head + _uv(0xFFFFFFFF) + b"\x00\x00" * 100,  # count far beyond the bytes
        head + b"\x01\x00" + _uv(0xFFFFFFF0),  # a field claiming 4 GiB
        head + b"\x02\x00\x00\x00\x00",  # the same known tag twice
        head + b"\x01" + b"\xff\xff\xff\xff\x0f" + b"\x00",  # tag 2^32-1
        head + b"\x01\x00\x05" + b"\xff" * 5,  # known tag 0 holding garbage
        head + b"\x01\x01\x05" + b"\x80" * 5,  # known tag 1 holding an endless varint
        head + b"\x01\x00\x00",  # known tag 0, empty
        head + b"\x01\x01\x00",  # known tag 1, empty
    ]


def test_hostile_tagged_sections_on_every_flexible_pair(kit):
    for name, v in PAIRS:
        if not _flexible(name, v):
            continue
        base = _valid(kit, name, v, kit.sparse(name, v))
        for data in _tagged_variants(base):
            decode_only_protocol_error(name, v, data)


@FUZZ
@given(pair=PAIR.filter(lambda p: _flexible(*p)), st_data=st.data(), depth=st.integers(1, 60),
       width=st.integers(1, 4), tag=st.integers(0, 3), cut=st.integers(0, 8), junk=st.binary(max_size=8))
def test_nested_tagged_sections_anywhere(kit, pair, st_data, depth, width, tag, cut, junk):
    """A nested tagged section spliced in at a random position of a random valid message (lands in
    struct tagged sections, in array elements, in the middle of fields), possibly cut short."""
    name, v = pair
    plain = st_data.draw(kit.strategy(name, v), label="message")
    data = _valid(kit, name, v, plain)
    at = st_data.draw(st.integers(0, len(data)), label="at")
    section = _nested_section(depth, width, tag)
    section = section[:len(section) - cut] if cut else section
    decode_only_protocol_error(name, v, data[:at] + section + junk + data[at:])


# ---- whole frames: what the server does --------------------------------------------------------

def _server_path(frame: bytes):
    """FrameDecoder -> decode_request_header -> body decode, as coordinator/server.py does."""
    dec = FrameDecoder(1 << 16)
    try:
        frames = dec.feed(frame)
    except ProtocolError:
        return
    for f in frames:
        try:
            header, pos = decode_request_header(f)
        except ProtocolError:
            continue
        cls = M.REQUESTS.get(header.api_key)
        if cls is None or not cls.MIN_VERSION <= header.api_version <= cls.MAX_VERSION:
            continue
        t0 = time.thread_time()
        try:
            cls.decode_from(f, pos, header.api_version)
        except ProtocolError:
            pass
        assert time.thread_time() - t0 < SLOW


@FUZZ
@given(pair=PAIR, client_id=st.one_of(st.none(), st.text(max_size=20)), body=st.binary(max_size=300),
       header_tags=st.binary(max_size=20), size_delta=st.integers(-8, 8))
def test_frames_with_valid_headers_and_garbage_bodies(pair, client_id, body, header_tags, size_delta):
    name, v = pair
    cls = _cls(name)
    out = bytearray()
    encode_request_header(out, cls.API_KEY, v, 7, client_id)
    if _flexible(name, v) and header_tags:
        out[-1:] = header_tags  # replace the empty header tag section with garbage
    out += body
    size = max(-(1 << 31), len(out) + size_delta)
    _server_path(struct.pack(">i", size) + bytes(out))


@FUZZ
@given(data=st.binary(max_size=400), chunks=st.lists(st.integers(1, 50), max_size=40))
def test_frame_splitter_any_chunking(data, chunks):
    """Feeding any bytes in any chunking gives the same frames (or the same ProtocolError) as
    feeding them at once: a byte-at-a-time client is no different from a fast one."""
    def run(pieces):
        dec = FrameDecoder(256)
        frames = []
        try:
            for p in pieces:
                frames += dec.feed(p)
        except ProtocolError:
            return frames, "error"
        return frames, dec.buffered

    whole = run([data])
    pieces, pos = [], 0
    for n in chunks:
        pieces.append(data[pos:pos + n])
        pos += n
    pieces.append(data[pos:])
    split = run(pieces)
    assert split[0] == whole[0]
    assert (split[1] == "error") == (whole[1] == "error")


@FUZZ
@given(data=st.binary(max_size=200))
def test_request_header_random_bytes(data):
    try:
        decode_request_header(data)
    except ProtocolError:
        pass


# ---- consumer-protocol blobs (decoded by the group core from JoinGroup/SyncGroup bytes) ---------

@FUZZ
@given(data=st.one_of(st.binary(max_size=300),
                      st.tuples(st.integers(-3, 5), st.binary(max_size=300)).map(
                          lambda p: struct.pack(">h", p[0]) + p[1])))
def test_consumer_protocol_blobs(data):
    for fn in (decode_subscription, decode_assignment):
        t0 = time.thread_time()
        try:
            fn(data)
        except ProtocolError:
            pass
        assert time.thread_time() - t0 < SLOW


def test_every_request_pair_is_covered():
    assert len(PAIRS) == sum(c.MAX_VERSION - c.MIN_VERSION + 1 for c in M.REQUESTS.values())
    assert len(PAIRS) >= 100


@pytest.mark.parametrize("name,v", [("JoinGroupRequest", 9), ("OffsetCommitRequest", 9),
                                    ("FetchRequest", 17)])
def test_known_nested_tagged_struct_overrunning_its_field(kit, name, v):
    """Spot check of a specific shape: a known tagged field whose declared size is smaller than
    what its value needs must be a ProtocolError, never a silently mis-parsed message."""
    base = _valid(kit, name, v, kit.sparse(name, v))
    for tag in (0, 1):
        bad = base[:-1] + b"\x01" + bytes([tag]) + b"\x01" + b"\x05\x41\x41\x41\x41"
        decode_only_protocol_error(name, v, bad)
