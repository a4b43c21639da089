"""Hostile input against a running daemon over TCP, with a well-behaved member watching.

``python -m bench.fuzz_daemon [--quick] [--frames 1000000] [--workers 3] [--seed N]``

A good member (a raw-protocol member in a child process: joins group ``herd-good``, heartbeats every
200 ms, commits every 500 ms) and an unmodified confluent-kafka consumer (group ``herd-good-rdkafka``)
run throughout. Fuzz workers (threads) send ``--frames`` frames drawn from a pool of hostile
payloads (:class:`Payloads`), each kind on the connections it needs:

* malformed, on a fresh connection each (herd closes it): random bytes framed or not, valid headers
  with garbage bodies, unsupported versions and unknown API keys, negative and huge length prefixes,
  truncated headers, bad client ids, garbage header tags, valid requests with bytes flipped, cut
  short or with hostile int16/int32/varint lengths and counts written over them;
* well-formed requests of every API herd serves with random values (bounded names: ``fuzz-<n>``
  groups and ``fuzz-<n>`` topics, so herd's legitimate state stays bounded), pipelined 50 to a
  connection, answers read;
* slow frames (a byte at a time), connections opened and abandoned mid-frame, and connections that
  send without reading answers.

Reported as one JSON line: frames and connections, herd's RSS (``/proc/PID/status`` VmRSS) before,
after and at its peak, whether herd is alive, and whether both good members kept one generation
(no rebalance, no error) throughout.
"""
from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from coordinator.core.versions import SUPPORTED
from protocol import messages as m
from protocol.headers import encode_request_header
from protocol.wire import EncodeError

REPO = Path(__file__).resolve().parents[1]
GOOD_GROUP = "herd-good"
GOOD_TOPIC = "good"
FUZZ_GROUPS = 50
FUZZ_TOPICS = 20
_I32 = struct.Struct(">i")
# what herd serves and our codec can encode (Produce is advertised but answered by hand)
SERVED = {k: v for k, v in SUPPORTED.items() if k in m.REQUESTS}

HOSTILE_INTS = [b"\xff\xff", b"\x7f\xff", b"\x80\x00", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
                b"\x80\x00\x00\x00", b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x10", b"\x00"]


def frame(payload: bytes) -> bytes:
    return _I32.pack(len(payload)) + payload


def header(api: int, version: int, cid: int = 1, client_id: str | None = "fuzz") -> bytes:
    out = bytearray()
    encode_request_header(out, api, version, cid, client_id)
    return bytes(out)


# ---- well-formed requests with random values ------------------------------------------------------

def _gid(rng) -> str:
    return f"fuzz-{rng.randrange(FUZZ_GROUPS)}"


def _topic(rng) -> str:
    return f"fuzz-{rng.randrange(FUZZ_TOPICS)}"


def _s(rng, n=12) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz-_.é€") for _ in range(rng.randrange(n)))


def _i32(rng) -> int:
    return rng.choice([0, 1, -1, 7, 3000, 6000, 2**31 - 1, -2**31, rng.randrange(-2**31, 2**31)])


def valid_request(rng: random.Random):
    """A well-formed request of a random served API with random values -> (api, version, obj)."""
    api = rng.choice(sorted(SERVED))
    lo, hi = SERVED[api]
    v = rng.randint(lo, hi)
    g = _gid(rng)
    sub = b"\x00\x01" + rng.randbytes(rng.randrange(40))  # a consumer subscription, or not
    if api == 11:
        obj = m.JoinGroupRequest(group_id=g, session_timeout_ms=rng.choice([6000, 5, -1, 2**31 - 1]),
                                 rebalance_timeout_ms=rng.choice([6000, 0, -1]), member_id=rng.choice(["", _s(rng)]),
                                 group_instance_id=rng.choice([None, _s(rng)]) if v >= 5 else None,
                                 protocol_type=rng.choice(["consumer", "", _s(rng)]),
                                 protocols=[m.JoinGroupRequestProtocol(name=_s(rng), metadata=sub)
                                            for _ in range(rng.randrange(3))])
    elif api == 14:
        obj = m.SyncGroupRequest(group_id=g, generation_id=_i32(rng), member_id=_s(rng),
                                 group_instance_id=None, protocol_type="consumer" if v >= 5 else None,
                                 protocol_name="range" if v >= 5 else None,
                                 assignments=[m.SyncGroupRequestAssignment(member_id=_s(rng), assignment=sub)])
    elif api == 12:
        obj = m.HeartbeatRequest(group_id=g, generation_id=_i32(rng), member_id=_s(rng))
    elif api == 13:
        obj = m.LeaveGroupRequest(group_id=g, member_id=_s(rng) if v < 3 else "",
                                  members=[m.LeaveGroupRequestMemberIdentity(member_id=_s(rng))] if v >= 3 else [])
    elif api == 8:
        obj = m.OffsetCommitRequest(
            group_id=g, generation_id_or_member_epoch=rng.choice([-1, -1, 0, 5]), member_id=rng.choice(["", _s(rng)]),
            topics=[m.OffsetCommitRequestTopic(name=_topic(rng), partitions=[
                m.OffsetCommitRequestPartition(partition_index=rng.randrange(8),
                                               committed_offset=rng.choice([0, -1, 2**62, rng.randrange(1 << 40)]),
                                               committed_metadata=rng.choice([None, "", _s(rng, 40)]))
                for _ in range(rng.randrange(1, 4))]) for _ in range(rng.randrange(1, 3))])
    elif api == 9:
        if v >= 8:
            obj = m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=_gid(rng), topics=None)
                                               for _ in range(rng.randrange(1, 4))])
        else:
            obj = m.OffsetFetchRequest(group_id=g, topics=None if v >= 2 and rng.random() < 0.5 else [
                m.OffsetFetchRequestTopic(name=_topic(rng), partition_indexes=[0, 1, 2])])
    elif api == 15:
        obj = m.DescribeGroupsRequest(groups=[_gid(rng) for _ in range(rng.randrange(4))] + [_s(rng)])
    elif api == 16:
        obj = m.ListGroupsRequest(states_filter=[rng.choice(["Stable", "Empty", _s(rng)])] if v >= 4 else [])
    elif api == 42:
        obj = m.DeleteGroupsRequest(groups_names=[_gid(rng), _s(rng)])
    elif api == 47:
        obj = m.OffsetDeleteRequest(group_id=g, topics=[m.OffsetDeleteRequestTopic(
            name=_topic(rng), partitions=[m.OffsetDeleteRequestPartition(partition_index=0)])])
    elif api == 10:
        obj = m.FindCoordinatorRequest(key=g if v < 4 else "", key_type=rng.choice([0, 1, 9]) if v >= 1 else 0,
                                       coordinator_keys=[g, ""] if v >= 4 else [])
    elif api == 3:
        obj = m.MetadataRequest(topics=[m.MetadataRequestTopic(name=rng.choice([_topic(rng), "bad name!", ""]))
                                        for _ in range(rng.randrange(3))])
    elif api == 19:
        obj = m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
            name=rng.choice([_topic(rng), "..", _s(rng)]), num_partitions=rng.choice([-1, 0, 3, 2**31 - 1, 100_001]),
            replication_factor=rng.choice([-1, 1, 3]))], timeout_ms=1000)
    elif api == 1:
        obj = m.FetchRequest(max_wait_ms=rng.choice([0, 1, -1]), min_bytes=rng.choice([0, 1]), max_bytes=1 << 20,
                             topics=[])
    else:  # ApiVersions, ListOffsets, DescribeCluster, Produce: defaults
        obj = m.REQUESTS[api]()
    return api, v, obj


def encode_valid(rng: random.Random, cid: int = 1) -> bytes | None:
    for _ in range(20):
        api, v, obj = valid_request(rng)
        try:
            return header(api, v, cid) + obj.encode(v)
        except EncodeError:  # a value this version cannot carry: draw again
            continue
    return None


# ---- hostile payloads ---------------------------------------------------------------------------

class Payloads:
    """A pool of pre-generated payloads per kind (generating is slower than sending)."""

    MALFORMED = ("random_framed", "random_unframed", "garbage_body", "wrong_version", "unknown_api",
                 "negative_length", "huge_length", "short_header", "bad_client_id", "header_tags",
                 "flipped", "truncated", "hostile_ints", "valid_then_garbage")

    def __init__(self, seed: int, per_kind: int = 400, max_frame_size: int = 1 << 20):
        self.rng = random.Random(seed)
        self.max_frame_size = max_frame_size
        self.pool = {kind: [self.make(kind) for _ in range(per_kind)] for kind in self.MALFORMED}
        self.valid = [p for p in (encode_valid(self.rng) for _ in range(per_kind * 5)) if p is not None]

    def make(self, kind: str) -> bytes:
        rng = self.rng
        if kind == "random_framed":
            return frame(rng.randbytes(rng.randrange(0, 300)))
        if kind == "random_unframed":
            return rng.randbytes(rng.randrange(1, 300))
        if kind == "garbage_body":
            api = rng.choice(sorted(SUPPORTED))
            return frame(header(api, rng.randint(*SUPPORTED[api])) + rng.randbytes(rng.randrange(0, 200)))
        if kind == "wrong_version":
            api = rng.choice(sorted(SUPPORTED))
            lo, hi = SUPPORTED[api]
            v = rng.choice([lo - 1, hi + 1, -1, 32767, -32768])
            return frame(header(api, v) + rng.randbytes(rng.randrange(0, 50)))
        if kind == "unknown_api":
            api = rng.choice([k for k in range(-5, 100) if k not in SUPPORTED] + [32767, -32768])
            return frame(header(api, rng.randrange(0, 20)) + rng.randbytes(rng.randrange(0, 50)))
        if kind == "negative_length":
            return _I32.pack(rng.choice([-1, -2, -2**31, rng.randrange(-2**31, 0)])) + rng.randbytes(20)
        if kind == "huge_length":
            return _I32.pack(rng.choice([2**31 - 1, self.max_frame_size + 1,
                                         rng.randrange(self.max_frame_size + 1, 2**31)])) + rng.randbytes(20)
        if kind == "short_header":
            return frame(rng.randbytes(rng.randrange(0, 10)))
        if kind == "bad_client_id":
            api = rng.choice(sorted(SUPPORTED))
            n = rng.choice([-2, -32768, 32767, 100, 5])
            body = struct.pack(">hhih", api, SUPPORTED[api][1], 1, n) + rng.choice([b"\xc3\x28", b"\xff" * 5, b"ab"])
            return frame(body + rng.randbytes(rng.randrange(0, 30)))
        if kind == "header_tags":  # a flexible version with a garbage header tag section
            api = rng.choice([k for k in SERVED if m.REQUESTS[k].FLEXIBLE_VERSION is not None])
            v = SERVED[api][1]
            h = header(api, v)[:-1]
            tags = rng.choice([b"\xff\xff\xff\xff\x0f", b"\x01\x00\xff\xff\xff\xff\x0f", b"\x05", b"\x80",
                               b"\x01\x00\x05ab"])
            return frame(h + tags + rng.randbytes(rng.randrange(0, 30)))
        base = encode_valid(rng) or header(18, 0)
        if kind == "flipped":
            buf = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(buf))
                buf[i] ^= rng.randint(1, 255)
            return frame(bytes(buf))
        if kind == "truncated":
            return frame(base[:rng.randrange(len(base))])
        if kind == "hostile_ints":
            buf = bytearray(base)
            for _ in range(rng.randint(1, 2)):
                patch = rng.choice(HOSTILE_INTS)
                i = rng.randrange(len(buf))
                buf[i:i + len(patch)] = patch
            return frame(bytes(buf))
        if kind == "valid_then_garbage":
            return b"".join(frame(encode_valid(rng) or b"") for _ in range(rng.randint(1, 3))) + \
                frame(header(18, 3) + b"\xff" * rng.randrange(1, 10))
        raise ValueError(kind)

    def malformed(self, rng) -> tuple[str, bytes]:
        kind = rng.choice(self.MALFORMED)
        return kind, rng.choice(self.pool[kind])


# ---- the fuzz workers ---------------------------------------------------------------------------

def _count_frames(data: bytes) -> int:
    """Frames in ``data`` by their length prefixes (a malformed one counts as one)."""
    n, pos = 0, 0
    while pos + 4 <= len(data):
        n += 1
        size = _I32.unpack_from(data, pos)[0]
        if size < 0:
            break
        pos += 4 + size
    return max(n, 1)


def _connect(address, timeout=5.0) -> socket.socket:
    s = socket.create_connection(address, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _abort(s: socket.socket) -> None:
    """Close with RST (SO_LINGER 0): no FIN handshake, nothing left in TIME_WAIT."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


def _read_frames(s: socket.socket, n: int, deadline: float) -> int:
    """Read up to ``n`` response frames; -> how many arrived before EOF/deadline."""
    buf = bytearray()
    got = 0
    while got < n and time.monotonic() < deadline:
        try:
            chunk = s.recv(1 << 16)
        except (TimeoutError, OSError):
            break
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4:
            size = _I32.unpack_from(buf, 0)[0]
            if len(buf) < 4 + size:
                break
            del buf[:4 + size]
            got += 1
    return got


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.frames = 0
        self.connections = 0
        self.responses = 0
        self.closed_by_herd = 0
        self.connect_errors = 0
        self.abandoned = 0
        self.kinds: dict[str, int] = {}

    def add(self, kind: str, frames: int, conns: int = 1, responses: int = 0, closed: int = 0) -> None:
        with self.lock:
            self.frames += frames
            self.connections += conns
            self.responses += responses
            self.closed_by_herd += closed
            self.kinds[kind] = self.kinds.get(kind, 0) + frames


def fuzz_worker(address, payloads: Payloads, stats: Stats, budget: int, seed: int, stop: threading.Event,
                pipeline: int = 50, check_close_every: int = 10, malformed_share: float = 0.3) -> None:
    """Send about ``budget`` frames: ``malformed_share`` of them malformed (one fresh connection
    each), the rest well-formed (pipelined ``pipeline`` to a connection, answers read); every
    ``check_close_every``-th malformed connection waits for herd to close it."""
    rng = random.Random(seed)
    sent = 0
    n_malformed = 0
    p_batch = (1 - malformed_share) / ((1 - malformed_share) + malformed_share * pipeline)
    while sent < budget and not stop.is_set():
        try:
            if rng.random() < p_batch:
                k = min(pipeline, budget - sent)
                batch = [rng.choice(payloads.valid) for _ in range(k)]
                s = _connect(address)
                try:
                    s.sendall(b"".join(frame(p) for p in batch))
                    got = _read_frames(s, k, time.monotonic() + 10)
                finally:
                    _abort(s)
                stats.add("valid", k, responses=got)
                sent += k
            else:
                kind, data = payloads.malformed(rng)
                n_malformed += 1
                s = _connect(address)
                closed = 0
                try:
                    s.sendall(data)
                    if n_malformed % check_close_every == 0:
                        s.settimeout(2.0)
                        try:
                            closed = 1 if s.recv(1 << 16) == b"" else 0
                        except (TimeoutError, OSError):
                            closed = 0
                finally:
                    _abort(s)
                stats.add(kind, _count_frames(data), closed=closed)
                sent += 1
        except OSError:
            with stats.lock:
                stats.connect_errors += 1
            time.sleep(0.01)


def slow_worker(address, stats: Stats, seed: int, stop: threading.Event, byte_delay: float = 0.01) -> None:
    """Valid requests a byte at a time; each must be answered correctly."""
    rng = random.Random(seed)
    while not stop.is_set():
        payload = frame(header(18, 3, 77) + m.ApiVersionsRequest(
            client_software_name="slow", client_software_version="1").encode(3))
        try:
            s = _connect(address, timeout=10)
            try:
                for i in range(len(payload)):
                    s.sendall(payload[i:i + 1])
                    if stop.wait(byte_delay * rng.random() * 2):
                        break
                else:
                    got = _read_frames(s, 1, time.monotonic() + 10)
                    stats.add("slow", 1, responses=got)
            finally:
                _abort(s)
        except OSError:
            with stats.lock:
                stats.connect_errors += 1


def abandon_worker(address, stats: Stats, seed: int, stop: threading.Event, batch: int = 50,
                   pause: float = 0.5) -> None:
    """Open connections, send part of a frame (or nothing), abandon them all at once."""
    rng = random.Random(seed)
    while not stop.is_set():
        socks = []
        try:
            for _ in range(batch):
                s = _connect(address)
                socks.append(s)
                part = rng.choice([b"", b"\x00", b"\x00\x00\x00\x40", frame(header(18, 3))[:rng.randrange(1, 12)]])
                if part:
                    s.sendall(part)
        except OSError:
            with stats.lock:
                stats.connect_errors += 1
        finally:
            for s in socks:
                (_abort if rng.random() < 0.5 else socket.socket.close)(s)
            stats.add("abandoned", 0, conns=len(socks))
            with stats.lock:
                stats.abandoned += len(socks)
        stop.wait(pause)


def unread_worker(address, stats: Stats, stop: threading.Event, seconds: float = 3.0) -> int:
    """One connection that pipelines Metadata requests for all topics (a ~25-byte request, an answer
    of a few KiB) without ever reading the answers, for ``seconds``. -> bytes it managed to send:
    with backpressure the send blocks once herd holds ``max_pending_bytes_per_connection`` plus the
    socket buffers."""
    req = frame(header(3, 1, 5) + m.MetadataRequest(topics=None).encode(1))
    chunk = req * 1000
    sent = 0
    s = _connect(address)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(0.5)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                sent += s.send(chunk)
            except TimeoutError:
                continue
            except OSError:
                break
    finally:
        _abort(s)
    stats.add("unread", sent // len(req), responses=0)
    return sent


# ---- the good members ----------------------------------------------------------------------------

class GoodMember:
    """A raw-protocol member in a child process (``python -m bench.soak --member``): its JSON
    events say when it joined (with the generation) and what went wrong."""

    def __init__(self, address, group: str = GOOD_GROUP, session_ms: int = 10000, rebalance_ms: int = 10000):
        cfg = {"address": list(address), "group": group, "topics": {GOOD_TOPIC: 4}, "name": "good-member",
               "session_ms": session_ms, "rebalance_ms": rebalance_ms, "heartbeat_ms": 200, "instance_id": None,
               "events": True}
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.soak", "--member", json.dumps(cfg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=str(REPO), env=env, start_new_session=True)
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(ev)

    def joins(self) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e.get("ev") == "joined"]

    def problems(self) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e.get("ev") in ("error", "exit")]

    def wait_joined(self, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            j = self.joins()
            if j:
                return j[0]
            if self.proc.poll() is not None:
                raise RuntimeError(f"good member exited: {self.proc.stderr.read().decode(errors='replace')}")
            time.sleep(0.05)
        raise TimeoutError("good member did not join")

    def stable_since_first_join(self) -> tuple[bool, str]:
        """(True, "") if it joined once, is alive and reported no error."""
        joins = self.joins()
        if self.proc.poll() is not None:
            return False, f"exited with {self.proc.returncode}"
        if len(joins) != 1:
            return False, f"joined {len(joins)} times: {joins}"
        if self.problems():
            return False, f"problems: {self.problems()}"
        return True, ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


def describe_good(address, group: str = GOOD_GROUP) -> tuple[str, list[str]]:
    from tools.rawclient import RawClient
    with RawClient(address, client_id="fuzz-observer") as c:
        g = c.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0]
    return g.group_state, [x.member_id for x in g.members]


def run(address, pid: int, frames: int, seed: int, workers: int = 3, extras: bool = True,
        progress=None) -> dict:
    """Fuzz ``address`` with ``frames`` frames from ``workers`` threads (plus a slow, an abandoning and
    an unread connection worker when ``extras``); -> stats."""
    from bench import _util as U
    payloads = Payloads(seed)
    stats = Stats()
    stop = threading.Event()
    rss_before = U.proc_rss_bytes(pid)
    peak = [rss_before]

    def sample():
        while not stop.wait(0.25):
            try:
                peak[0] = max(peak[0], U.proc_rss_bytes(pid))
            except OSError:
                return

    threads = [threading.Thread(target=fuzz_worker, args=(address, payloads, stats, frames // workers,
                                                          seed + i, stop), daemon=True)
               for i in range(workers)]
    side = [threading.Thread(target=sample, daemon=True)]
    if extras:
        side += [threading.Thread(target=slow_worker, args=(address, stats, seed + 100, stop), daemon=True),
                 threading.Thread(target=abandon_worker, args=(address, stats, seed + 200, stop), daemon=True)]
    started = time.perf_counter()
    for t in threads + side:
        t.start()
    try:
        last = time.monotonic()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(1.0)
            if progress and time.monotonic() - last > 10:
                last = time.monotonic()
                progress(f"{stats.frames} frames, {stats.connections} connections, "
                         f"rss {U.proc_rss_bytes(pid) / 1e6:.0f} MB")
    finally:
        stop.set()
        for t in threads + side:
            t.join(15)
    elapsed = time.perf_counter() - started
    time.sleep(0.5)
    return {
        "frames": stats.frames, "connections": stats.connections, "seconds": round(elapsed, 1),
        "frames_per_s": round(stats.frames / elapsed) if elapsed else None,
        "responses_read": stats.responses, "closes_checked": stats.closed_by_herd,
        "connect_errors": stats.connect_errors, "abandoned_connections": stats.abandoned,
        "frames_by_kind": dict(sorted((k, v) for k, v in stats.kinds.items() if v)),
        "rss_before_mb": round(rss_before / 1e6, 1), "rss_peak_mb": round(peak[0] / 1e6, 1),
        "rss_after_mb": round(U.proc_rss_bytes(pid) / 1e6, 1),
    }


def greedy_phase(address, pid: int, seconds: float = 4.0, catch_up_s: float = 60.0) -> dict:
    """One connection pipelines Metadata requests without reading answers for ``seconds`` while a
    probe member (its own group) heartbeats every 200 ms on another connection. -> herd's RSS growth
    and the probe's worst heartbeat latency (a stalled event loop stalls every group). A heartbeat
    still unanswered ``catch_up_s`` after the abuse counts with the time it has waited so far."""
    from bench import _util as U
    from bench.soak import RawMember
    probe = RawMember(address, "herd-greedy-probe", {GOOD_TOPIC: 4}, name="greedy-probe", session_ms=30000,
                      rebalance_ms=30000, heartbeat_ms=200)
    probe.conn.sock.settimeout(catch_up_s + seconds + 30)
    probe.join()
    latencies: list[float] = []
    codes: set[int] = set()
    inflight = [None]
    stop = threading.Event()

    def beat():
        while not stop.is_set():
            inflight[0] = time.monotonic()
            try:
                codes.add(probe.heartbeat())
            except OSError:
                codes.add(-999)
                return
            latencies.append(time.monotonic() - inflight[0])
            inflight[0] = None
            stop.wait(0.2)

    th = threading.Thread(target=beat, daemon=True)
    rss0 = U.proc_rss_bytes(pid)
    th.start()
    sent = unread_worker(address, Stats(), threading.Event(), seconds)
    grown = U.proc_rss_bytes(pid) - rss0
    deadline = time.monotonic() + catch_up_s  # give a stalled loop time to answer the probe
    n = len(latencies)
    while len(latencies) < n + 2 and time.monotonic() < deadline and th.is_alive():
        time.sleep(0.1)
    waiting = inflight[0]
    worst = max(latencies, default=0.0)
    if waiting is not None:
        worst = max(worst, time.monotonic() - waiting)
    stop.set()
    probe.conn.sock.shutdown(socket.SHUT_RDWR)  # unblocks a heartbeat still waiting
    th.join(10)
    probe.close()
    return {"seconds": seconds, "bytes_sent": sent, "rss_growth_mb": round(grown / 1e6, 1),
            "probe_heartbeats": len(latencies), "probe_max_heartbeat_latency_s": round(worst, 2),
            "probe_still_waiting": waiting is not None, "probe_codes": sorted(codes)}


def build_parser():
    from bench import _util as U

    ap = U.arg_parser("bench.fuzz_daemon", __doc__.split("\n")[0], "50,000 frames")
    ap.add_argument("--frames", type=int, default=None, help="default 1,000,000")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-greedy", action="store_true", help="skip the never-reading connection phase")
    ap.add_argument("--max-pending-bytes", type=int, default=None,
                    help="herd's --max-pending-bytes-per-connection (default: herd's default)")
    return ap


def main(argv=None):
    from bench import _util as U
    from tools.member import Member  # an unmodified confluent-kafka consumer
    args = U.parse(build_parser(), argv, sized={"frames": (50_000, 1_000_000)})
    frames = args.frames
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    extra = ["--max-frame-size", str(1 << 20), "--max-connections", "2000"]
    if args.max_pending_bytes:
        extra += ["--max-pending-bytes-per-connection", str(args.max_pending_bytes)]
    import tempfile
    with U.Herd(topics=[f"{GOOD_TOPIC}:4", *[f"fuzz-{i}:8" for i in range(FUZZ_TOPICS)]],
                extra_args=extra) as herd, tempfile.TemporaryDirectory() as tmp:
        address = ("127.0.0.1", herd.port)
        good = GoodMember(address)
        rd = Member(Path(tmp), "confluent", herd.bootstrap, GOOD_GROUP + "-rdkafka", [GOOD_TOPIC], "good-rdkafka",
                    session_ms=10000, heartbeat_ms=500, max_poll_ms=10000)
        try:
            joined = good.wait_joined()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (rd.state() and rd.state()["generation"] not in (None, -1)):
                time.sleep(0.1)
            rd_before = rd.state()
            before = describe_good(address)
            time.sleep(1.0)
            res = run(address, herd.pid, frames, seed, workers=args.workers,
                      progress=lambda s: print(s, file=sys.stderr, flush=True))
            time.sleep(1.0)
            alive = herd.proc.poll() is None
            after = describe_good(address) if alive else None
            ok, why = good.stable_since_first_join()
            rd_after = rd.state()
            rd_ok = (rd.alive() and rd_before is not None and rd_after is not None
                     and rd_after["generation"] == rd_before["generation"]
                     and rd_after["member_id"] == rd_before["member_id"])
            greedy = None
            if not args.no_greedy and alive:  # after the verdict above: it may stall herd for a while
                greedy = greedy_phase(address, herd.pid)
                greedy["herd_alive"] = herd.proc.poll() is None
                ok2, why2 = good.stable_since_first_join()
                greedy["good_member_still_stable"] = ok2
                greedy["good_member_why_not"] = why2
                # other connections must be served within 2 s and the greedy one must not grow herd
                greedy["ok"] = bool(greedy["herd_alive"] and greedy["probe_max_heartbeat_latency_s"] < 2.0
                                    and greedy["rss_growth_mb"] < 48 and ok2)
        finally:
            good.stop()
            rd.stop()
            rd.cleanup()
    result = {"bench": "fuzz_daemon", "seed": seed, "workers": args.workers, **res, "herd_alive": alive,
              "good_member": {"stable": ok and before == after and before[0] == "Stable", "why_not": why,
                              "generation": joined.get("generation"), "state_before": before,
                              "state_after": after},
              "good_rdkafka_member": {"stable": rd_ok, "before": rd_before, "after": rd_after},
              "greedy_connection": greedy,
              "environment": U.environment()}
    U.emit(result)
    if not (alive and result["good_member"]["stable"] and rd_ok):
        raise SystemExit("fuzz_daemon: herd died or a good member lost its generation")
    if greedy is not None and not greedy["ok"]:
        raise SystemExit("fuzz_daemon: one connection that never reads stalled herd or grew its memory")


if __name__ == "__main__":
    main(sys.argv[1:])
