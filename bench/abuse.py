"""Hostile neighbours (issue 32), before and after in one run: ``python -m bench.abuse [--quick]``.

Each scenario runs against two daemons, one at a time: ``before`` is herd's code at
``--before-rev`` (default: the commit before the issue's work, extracted with ``git archive`` into a
temporary directory), ``after`` is this tree. The figures (one JSON document):

* ``groups_unread``: ``--groups`` groups (each one committed offset: 20,000 OffsetCommits on one
  PLAINTEXT connection), then ``--unread`` clients send ``GET /groups`` and never read: herd's RSS
  growth, and how many of those connections herd still holds after ``--hold-s`` seconds.
* ``groups_loop``: a probe's ApiVersions every 10 ms on a Kafka connection, first alone, then while
  ``--loopers`` clients fetch ``/groups`` in a loop: the probe's latency (p50, p99, max) both times,
  and ``/groups`` fetches completed.
* ``log_flood``: ``--flood`` connections, each one JoinGroup v99 with a 32,767-byte client id: how
  many bytes herd's log grew.
* ``big_frames``: ``--frames`` connections each send an 8 MiB frame minus one byte (never
  completed): herd's RSS growth (``--max-frame-size`` 8 MiB on both; ``after`` with
  ``--max-buffered-bytes`` ``--frames-budget-mb``, as the default, min(1 GiB, RAM/4), is above
  40 x 8 MiB on most machines).
* ``auth_slots``: a SASL_PLAINTEXT herd with ``--max-connections 20`` and 20 idle sockets that
  never authenticate: does a real login succeed within ``--auth-wait-s`` seconds?

Speed is never asserted; the RESULTS section records a run.
"""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench._util import Herd, arg_parser, emit, environment, parse, percentiles, proc_rss_bytes, send_while_read

REPO = Path(__file__).resolve().parents[1]
BEFORE_REV = "9cfe155"  # main before issue 32
_I32 = struct.Struct(">i")


class TreeHerd(Herd):
    """A herd run from another source tree (``root``), or this one (None)."""

    def __init__(self, root: str | None, **kw):
        super().__init__(**kw)
        self.root = root

    def command(self) -> list[str]:
        cmd = super().command()
        if self.root is None:
            return cmd
        # run from that tree: `python -m coordinator` imports from its working directory first
        return ["env", "-C", self.root, f"PYTHONPATH={self.root}"] + cmd


def extract(rev: str, into: str) -> str:
    """``git archive rev`` of this repository into ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def settle_rss(pid: int, seconds: float = 1.0) -> int:
    time.sleep(seconds)
    return proc_rss_bytes(pid)


# ---- scenario helpers ------------------------------------------------------------------------------------

def api_versions_frame(cid: int, client_id: str = "probe") -> bytes:
    from protocol.headers import encode_request_header

    out = bytearray()
    encode_request_header(out, 18, 0, cid, client_id)
    return _I32.pack(len(out)) + bytes(out)


def recv_frame(s: socket.socket) -> bytes:
    def exact(n):
        buf = bytearray()
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    (n,) = _I32.unpack(exact(4))
    return exact(n)


def probe_latency(address, seconds: float, period: float = 0.01) -> list[float]:
    """ApiVersions every ``period`` s on one connection: the latencies in ms."""
    out = []
    with socket.create_connection(address, timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        end = time.monotonic() + seconds
        cid = 0
        while time.monotonic() < end:
            cid += 1
            t = time.perf_counter()
            s.sendall(api_versions_frame(cid))
            recv_frame(s)
            out.append((time.perf_counter() - t) * 1000)
            time.sleep(period)
    return out


def looper(port: int, seconds: float) -> None:
    """Fetch /groups in a loop for ``seconds`` (HTTP/1.0: read to the end, into one buffer, so this
    process costs little CPU); print how many fetches completed."""
    end = time.monotonic() + seconds
    buf = bytearray(1 << 20)
    n = 0
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(b"GET /groups HTTP/1.0\r\n\r\n")
                while s.recv_into(buf):
                    pass
            n += 1
        except OSError:
            time.sleep(0.05)
    print(n)


def http_get(port: int, path: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read()


def open_unread(port: int, n: int, path: str = "/groups") -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(s)
    return socks


def still_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` herd has not closed (reset or FIN): read nothing that is pending."""
    n = 0
    for s in socks:
        try:
            s.setblocking(False)
            data = s.recv(1, socket.MSG_PEEK)
            if data:
                # bytes pending: the answer is still there; herd may have given up since (a reset
                # comes after them): drain a little to see
                s.settimeout(0.2)
                while True:
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                n += 0
            else:
                continue
        except BlockingIOError:
            n += 1
        except TimeoutError:
            n += 1
        except OSError:
            continue
    return n


# ---- scenarios -----------------------------------------------------------------------------------------

def groups_scenario(root, args) -> dict:
    from bench.console import load_offsets

    out: dict = {}
    with TreeHerd(root, topics=["bench:1"], fsync="never", extra_args=["--metrics-port", "0"]) as h:
        port = h.wait_metrics_port(30)
        out["load_s"] = round(load_offsets(h.bootstrap, args.groups, 1), 2)
        body = http_get(port, "/groups")
        out["groups_bytes"] = len(body)
        alone = probe_latency(h.address, args.probe_s)
        out["probe_alone_ms"] = percentiles(alone, (50, 99, 100))
        # the fetchers in their own processes: threads here would make the probe wait for our GIL
        procs = [subprocess.Popen([sys.executable, "-m", "bench.abuse", "--looper", str(port),
                                   str(args.probe_s + 1.5)], stdout=subprocess.PIPE, cwd=str(REPO),
                                  env={**os.environ, "PYTHONPATH": str(REPO)}) for _ in range(args.loopers)]
        time.sleep(0.5)
        loaded = probe_latency(h.address, args.probe_s)
        fetched = sum(int(p.communicate(timeout=120)[0] or 0) for p in procs)
        out["probe_with_loopers_ms"] = percentiles(loaded, (50, 99, 100))
        out["groups_fetches_while_probed"] = fetched
        rss0 = settle_rss(h.pid)
        socks = open_unread(port, args.unread)
        try:
            peak = rss0
            end = time.monotonic() + args.hold_s
            while time.monotonic() < end:
                peak = max(peak, proc_rss_bytes(h.pid))
                time.sleep(0.25)
            out["unread_rss_growth_peak_mb"] = round((peak - rss0) / 2**20, 1)
            out[f"unread_still_held_after_{args.hold_s:g}s"] = still_open(socks)
            out["unread_rss_growth_after_hold_mb"] = round((proc_rss_bytes(h.pid) - rss0) / 2**20, 1)
        finally:
            for s in socks:
                s.close()
    return out


def flood_scenario(root, args) -> dict:
    from protocol.headers import encode_request_header

    with TreeHerd(root, topics=["bench:1"]) as h:
        size0 = os.path.getsize(h.log_path)
        client_id = "x" * 32767
        out = bytearray()
        encode_request_header(out, 11, 99, 1, client_id)
        frame = _I32.pack(len(out) + 8) + bytes(out) + b"\x00" * 8
        for _ in range(args.flood):
            with socket.create_connection(h.address, timeout=10) as s:
                s.sendall(frame)
                s.settimeout(10)
                try:
                    s.recv(1)
                except OSError:
                    pass
        time.sleep(0.5)
        return {"connections": args.flood, "log_growth_mb": round((os.path.getsize(h.log_path) - size0) / 2**20, 2)}


def frames_scenario(root, args) -> dict:
    extra = ["--max-frame-size", str(8 << 20)]
    if root is None:  # this tree has the setting: a budget below 40 x 8 MiB shows it at work
        extra += ["--max-buffered-bytes", str(args.frames_budget_mb << 20)]
    with TreeHerd(root, topics=["bench:1"], extra_args=extra) as h:
        rss0 = settle_rss(h.pid, 0.5)
        head = _I32.pack((8 << 20) - 1)
        socks = []
        chunk = b"\x00" * (1 << 20)
        try:
            for _ in range(args.frames):
                s = socket.create_connection(h.address, timeout=10)
                s.setblocking(False)
                socks.append(s)
            pending = {s: [head] + [chunk] * 7 + [b"\x00" * ((1 << 20) - 2)] for s in socks}
            send_while_read(pending, args.frames_s)
            grown = proc_rss_bytes(h.pid) - rss0
            blocked = len(pending)
        finally:
            for s in socks:
                s.close()
        return {"connections": args.frames, "rss_growth_mb": round(grown / 2**20, 1),
                "senders_still_blocked": blocked}


def auth_scenario(root, args) -> dict:
    from tools.rawclient import RawClient

    with tempfile.TemporaryDirectory() as tmp:
        users = Path(tmp) / "users"
        users.write_text("alice:secret\n")
        with TreeHerd(root, topics=["bench:1"], extra_args=[
                "--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", str(users),
                "--max-connections", "20"]) as h:
            idle = [socket.create_connection(h.address, timeout=5) for _ in range(20)]
            try:
                time.sleep(0.5)
                t = time.monotonic()
                ok = False
                end = t + args.auth_wait_s
                while time.monotonic() < end and not ok:
                    try:
                        with RawClient(h.address, timeout=5) as c:
                            ok = plain_login(c, "alice", "secret")
                    except Exception:
                        time.sleep(0.5)
                return {"idle_unauthenticated": 20, "login_ok": ok,
                        "login_after_s": round(time.monotonic() - t, 1) if ok else None}
            finally:
                for s in idle:
                    s.close()


def plain_login(c, user: str, password: str) -> bool:
    from protocol import messages as m

    if c.call(m.SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code:
        return False
    r = c.call(m.SaslAuthenticateRequest(auth_bytes=b"\0" + user.encode() + b"\0" + password.encode()), 1)
    return r.error_code == 0


SCENARIOS = {"groups": groups_scenario, "log_flood": flood_scenario, "big_frames": frames_scenario,
             "auth_slots": auth_scenario}


def main(argv=None):
    p = arg_parser("bench.abuse", __doc__, "fewer groups, clients and seconds")
    p.add_argument("--before-rev", default=BEFORE_REV)
    p.add_argument("--parts", default=",".join(SCENARIOS))
    p.add_argument("--sides", default="before,after")
    sized = {"groups": (2000, 20000), "unread": (30, 150), "hold_s": (12.0, 15.0), "probe_s": (2.0, 5.0),
             "flood": (200, 2000), "frames": (10, 40), "frames_s": (5.0, 10.0), "auth_wait_s": (12.0, 15.0)}
    for name, (quick, _) in sized.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(quick), default=None)
    p.add_argument("--loopers", type=int, default=10)
    p.add_argument("--frames-budget-mb", type=int, default=64,
                   help="--max-buffered-bytes of the `after` daemon in big_frames (MiB)")
    args = parse(p, argv, sized=sized)
    result: dict = {"bench": "abuse", "params": {k: v for k, v in vars(args).items() if k != "quick"},
                    "environment": environment()}
    with tempfile.TemporaryDirectory(prefix="herd-before-") as tmp:
        roots = {"before": extract(args.before_rev, tmp), "after": None}
        for part in args.parts.split(","):
            result[part] = {}
            for side in args.sides.split(","):
                result[part][side] = SCENARIOS[part](roots[side], args)
    return emit(result)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--looper":  # a /groups fetcher in its own process
        looper(int(sys.argv[2]), float(sys.argv[3]))
    else:
        main(sys.argv[1:])
