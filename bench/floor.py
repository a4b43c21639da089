"""How low can a server's CPU per request go on this machine? herd beside three measuring sticks,
and what TLS and SASL add to herd's.

``python -m bench.floor [--quick] [--targets c-floor,py-floor,herd,herd-ssl,herd-sasl-ssl,mock]
[--requests N] [--conns N] [--procs N] [--depth N] [--fsync-samples N] [--sasl-mechanism M]
[--tls-key ecdsa|rsa] [--connect-conns N] [--connect-serial N]``

Issue 6 asks for <= 10 µs of daemon CPU per Heartbeat and <= 25 µs per 10-partition OffsetCommit.
This benchmark puts those figures next to what the machine itself costs, in one run, with one load
driver for every target:

* ``c-floor``: ``bench/floor_server.c`` (built here with the system C compiler): epoll, one
  thread, answers each frame with a fixed "no error" body (a Heartbeat's; an OffsetCommit's with
  no topics) after reading 8 bytes of its header. No decoding, no state, no log: the socket work
  and nothing else.
* ``py-floor``: the same server as an ``asyncio.Protocol`` on uvloop (what herd runs on): the
  least a Python server on this event loop can spend per request.
* ``herd``: the daemon, ``--fsync`` (default never: the CPU question; ``always`` adds the
  disk's), PLAINTEXT listener.
* ``herd-ssl``, ``herd-sasl-ssl``, ``herd-sasl-plaintext``: the same daemon with
  ``--security-protocol`` SSL, SASL_SSL or SASL_PLAINTEXT. The security variants are targets
  rather than one ``--security`` switch so that PLAINTEXT and TLS herd stand in adjacent rows of
  one run's table, measured minutes apart by the same driver on the same (shared) machine. The
  run makes a throwaway PKI with ``trustme`` (a CA, a certificate for 127.0.0.1; ``--tls-key``
  ECDSA P-256, trustme's default, or RSA 2048, which many operators still use and whose
  handshake costs the server much more) and a users file with one user and a random password.
  The driver's connections trust that CA (``ssl.SSLContext``, host name checked, no session
  resumption: every connection is a full handshake, as librdkafka's are) and, on SASL
  listeners, authenticate as Kafka's clients do after ApiVersions: SaslHandshake v1, then
  SaslAuthenticate with the tokens of herd's own client mechanism (``protocol.sasl``;
  ``--sasl-mechanism``, default SCRAM-SHA-256) until it is done; then they join as below.
* ``mock``: librdkafka's mock cluster (``../shared/tools/mock_cluster.py``): a real coordinator
  written in C, in memory: the issue's own reference server.

For herd and the mock each connection first joins a group of its own (one member, generation 1,
session timeout 300 s) and then sends that member's Heartbeat or a 10-partition OffsetCommit of
topic ``bench`` for its generation, as ``bench.server_cost`` does; the floors skip the join.
On herd's targets each connection also joins a KIP-848 consumer group of its own
(ConsumerGroupHeartbeat v1, subscribed to ``bench``, its assignment acknowledged) and the
``cgheartbeat`` bursts send that member's steady-state ConsumerGroupHeartbeat (group, member id
and epoch; nothing else), beside the classic Heartbeat: the KIP-848 hot path. Each
burst is ``--requests`` requests over ``--conns`` connections in ``--procs`` driver processes,
closed loop, ``1`` and ``--depth`` in flight per connection. Server CPU per request is the
server process's CPU (all threads, ``/proc/<pid>/task/*/schedstat``) over the burst, less its idle
rate, divided by the answers. An answer that is not the exact "no error" bytes is decoded and its
error counted.

Connection set-up (every herd target, after its bursts, with the burst connections still open):
what a reconnect storm costs. A connection is "set up" once it could send its JoinGroup: TCP
connect, the TLS handshake (TLS targets), ApiVersions (every Kafka client sends it first) and the
SASL exchange (SASL targets). ``storm``: ``--connect-conns`` connections opened all at once, split
over the driver processes; ``serial``: ``--connect-serial`` opened one after another by one
process (the set-up latency of an otherwise idle daemon, split into TCP+TLS / ApiVersions / SASL).
For each: the daemon's CPU per connection (idle subtracted), the driver's CPU per connection (on
this 2-core machine the driver's TLS and SCRAM work competes with the daemon's, so the storm's
wall time is not the daemon's alone), the set-up latency, connections/s, and the daemon's RSS
growth per open connection (rough: the allocator may reuse memory freed earlier). The users'
SCRAM credentials are derived by the daemon on the first login of each user (4096 PBKDF2 rounds)
and cached; the bursts' connections have logged in before, so the figures are the per-connection
cost, as in a long-running daemon. The client's PBKDF2 (per connection, as real clients) is in
the driver's CPU.

Also measured: ``pwrite`` of 300 bytes + ``fdatasync`` into a preallocated file in the bench temp
dir (``--fsync-samples`` times): the latency a durable synchronous commit cannot avoid, beside the
mock's whole round trip (the driver's one-in-flight commit latency).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import secrets
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

from bench import _util as U

TARGETS = ("c-floor", "py-floor", "herd", "herd-ssl", "herd-sasl-ssl", "herd-sasl-plaintext", "herd-acl", "mock")
# herd's targets and their listener's security protocol
SECURITY = {
    "herd": "PLAINTEXT", "herd-ssl": "SSL", "herd-sasl-ssl": "SASL_SSL", "herd-sasl-plaintext": "SASL_PLAINTEXT",
    "herd-acl": "PLAINTEXT",
}
# herd-acl: herd with --authorizer acl and ACL_COUNT ACLs (issue 30: <= 10 % more CPU than none)
ACL_COUNT = 100
DEFAULT_TARGETS = ("c-floor", "py-floor", "herd", "herd-ssl", "herd-sasl-ssl", "mock")
SASL_USER = "bench"
TARGET_US = {"heartbeat": 10.0, "commit": 25.0}  # issue 6's targets (none for cgheartbeat)
API_OF = {"heartbeat": 12, "commit": 8, "cgheartbeat": 68}
C_SOURCE = Path(__file__).with_name("floor_server.c")
_SIZE = struct.Struct(">i")
_I16 = struct.Struct(">h")
TOPIC = "bench"


# ---- the Python floor server ----------------------------------------------------------------------


class _FloorProtocol(asyncio.Protocol):
    """bench/floor_server.c in Python: fixed answers, 8 bytes of header read per frame."""

    HB_TAIL = b"\x00" + b"\x00\x00\x00\x00" + b"\x00\x00" + b"\x00"  # header tags, throttle, error, tags
    OC_TAIL = b"\x00" + b"\x00\x00\x00\x00" + b"\x01" + b"\x00"  # header tags, throttle, no topics, tags

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        pos, n = 0, len(buf)
        out = []
        while n - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if size < 8 or size > 1 << 20:
                self.transport.abort()
                return
            if n - pos < 4 + size:
                break
            api_key = int.from_bytes(buf[pos + 4 : pos + 6], "big")
            if api_key == 12:
                tail = self.HB_TAIL
            elif api_key == 8:
                tail = self.OC_TAIL
            else:
                self.transport.abort()
                return
            out.append(_SIZE.pack(4 + len(tail)) + buf[pos + 8 : pos + 12] + tail)
            pos += 4 + size
        self.buf = buf[pos:]
        if out:
            self.transport.write(b"".join(out))


def serve_python_floor() -> None:
    import uvloop

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_FloorProtocol, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        stop = loop.create_future()
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        await stop
        server.close()

    uvloop.run(main())


class _Floor:
    """A floor server as a subprocess: ``bootstrap``, ``pid``; stopped on exit."""

    def __init__(self, cmd: list[str]):
        self.cmd = cmd
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=U.die_with_parent
        )
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            U.stop_process_group(self.proc)
            raise RuntimeError(f"{self.cmd[0]} printed no port")
        self.pid = self.proc.pid
        self.bootstrap = f"127.0.0.1:{line}"
        return self

    def __exit__(self, *exc):
        U.stop_process_group(self.proc)
        self.proc.stdout.close()


def build_c_floor(workdir: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = workdir / "floor_server"
    subprocess.run([cc, "-O2", "-o", str(exe), str(C_SOURCE)], check=True, capture_output=True)
    return exe


# ---- TLS and SASL for the herd-ssl / herd-sasl-* targets ----------------------------------------


TLS_KEYS = {"ecdsa": "ECDSA P-256", "rsa": "RSA 2048"}  # trustme's key types


def make_pki(d: Path, key_type: str, password: str, tls: bool) -> dict:
    """A users file with one user and (``tls``) a throwaway CA and a server certificate for
    127.0.0.1 (key + chain in server.pem): the paths. Exits with one line when trustme is missing."""
    users = d / "users"
    users.write_text(f"{SASL_USER}:{password}\n")
    users.chmod(0o600)
    if not tls:
        return {"users": str(users)}
    try:
        import trustme
    except ImportError:
        sys.exit("bench.floor: the TLS targets need the trustme package (a test dependency: "
                 "pip install trustme into the venv)")
    kind = {"ecdsa": trustme.KeyType.ECDSA, "rsa": trustme.KeyType.RSA}[key_type]
    ca = trustme.CA(key_type=kind)
    server = ca.issue_cert("127.0.0.1", "localhost", key_type=kind)
    server.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return {"cafile": str(d / "ca.pem"), "certfile": str(d / "server.pem"), "users": str(users)}


def herd_security_args(protocol: str, pki: dict | None, mechanism: str) -> list[str]:
    if protocol == "PLAINTEXT":
        return []
    args = ["--security-protocol", protocol]
    if protocol in ("SSL", "SASL_SSL"):
        args += ["--ssl-certfile", pki["certfile"]]
    if protocol.startswith("SASL_"):
        args += ["--sasl-users-file", pki["users"], "--sasl-mechanisms", mechanism]
    return args


# Everyone is User:ANONYMOUS on PLAINTEXT; allowed where no ACL names a resource (so the ACLs below
# can be created without a super user), and the bench's groups and topic are named by ACLs, so every
# decision is made by them, not by the default.
ACL_ARGS = ["--authorizer", "acl", "--allow-everyone-if-no-acl-found"]


def install_acls(address) -> int:
    """ACL_COUNT ACLs: ANONYMOUS may READ the bench's groups (prefixed ``floor-``, the consumer
    groups' prefix too) and topic; the rest are other teams' (prefixed and literal groups and topics,
    DENYs for other principals on the bench's own resources) as a shared deployment would have."""
    from protocol import acls as W
    from tools.rawclient import RawClient

    group, topic, literal, prefixed, read, allow, deny = 3, 2, 3, 4, 3, 3, 2
    acls = [W.AclBindingData(group, "floor-", prefixed, "User:ANONYMOUS", "*", read, allow),
            W.AclBindingData(group, "cg-", prefixed, "User:ANONYMOUS", "*", read, allow),
            W.AclBindingData(topic, TOPIC, literal, "User:ANONYMOUS", "*", read, allow),
            W.AclBindingData(group, "floor-", prefixed, "User:intruder", "*", read, deny),
            W.AclBindingData(topic, TOPIC, literal, "User:intruder", "*", read, deny)]
    i = 0
    while len(acls) < ACL_COUNT:
        kind = (group, topic)[i % 2]
        acls.append(W.AclBindingData(kind, f"team-{i}-", prefixed if i % 3 else literal, f"User:team{i}", "*",
                                     read, allow))
        i += 1
    with RawClient(address) as c:
        r = c.call(W.CreateAclsRequest(acls), 3)
    bad = [x.error_code for x in r.results if x.error_code]
    if bad:
        raise SystemExit(f"bench.floor: herd-acl: CreateAcls failed: {bad[:3]}")
    return len(acls)


def client_ssl_context(cafile: str):
    import ssl

    return ssl.create_default_context(cafile=cafile)  # checks the chain and the host name (127.0.0.1)


def driver_security(protocol: str, pki: dict | None, mechanism: str, password: str) -> dict | None:
    """What a driver process needs to connect to a listener (picklable: the SSL context is made
    in the driver)."""
    if protocol == "PLAINTEXT":
        return None
    return {
        "protocol": protocol,
        "cafile": pki["cafile"] if protocol in ("SSL", "SASL_SSL") else None,
        "mechanism": mechanism if protocol.startswith("SASL_") else None,
        "user": SASL_USER,
        "password": password,
    }


# ---- the load driver (its own processes) ----------------------------------------------------------


class _Conn(asyncio.Protocol):
    def __init__(self):
        self.buf = b""
        self.waiter = None  # call(): the future of the one answer awaited
        self.burst = None  # burst(): on_answers(list of answer bytes)
        self.lost = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf + data if self.buf else data
        pos, n = 0, len(buf)
        answers = []
        while n - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if n - pos < 4 + size:
                break
            answers.append(buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
        self.buf = buf[pos:]
        if not answers:
            return
        if self.burst is not None:
            self.burst(answers)
        elif self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(answers[0])

    def connection_lost(self, exc):
        self.lost = exc or ConnectionResetError("closed by the server")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)
        if self.burst is not None:
            self.burst(None)

    async def call(self, frame: bytes) -> bytes:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(frame)
        return await asyncio.wait_for(self.waiter, 30)


class _Driver:
    """One driver process: ``conns`` connections, each with its member (or none, for a floor).

    ``security`` (:func:`driver_security`, None for PLAINTEXT): TLS and SASL for every
    connection, the burst's and the set-up measurement's (:meth:`connect`)."""

    def __init__(self, host, port, conns, join, versions, tag, security=None):
        self.host, self.port, self.nconns, self.join = host, port, conns, join
        self.v = versions
        self.tag = tag
        self.security = security
        self.ssl = client_ssl_context(security["cafile"]) if security and security["cafile"] else None
        self.conns: list[_Conn] = []
        self.extra: list[_Conn] = []  # connect(): the connections opened to measure set-up
        self.frames: dict[str, list[bytes]] = {}
        self.ok: dict[str, list[bytes]] = {}
        self._api_versions = None

    async def _rpc(self, c, req, v, cid=1):
        from bench.loadgen import encode_frame
        from protocol import messages as m
        from protocol.headers import decode_response_header

        raw = await c.call(bytes(encode_frame(req, v, cid, "floor")))
        _, pos = decode_response_header(raw, req.API_KEY, v)
        return m.RESPONSES[req.API_KEY].decode(raw, v, pos)

    async def open(self) -> tuple[_Conn, float, float, float]:
        """One connection set up as a Kafka client does it: TCP (+ TLS), ApiVersions, SASL.
        -> (connection, seconds to connect (+ TLS handshake), ApiVersions round trip, SASL)."""
        from bench.loadgen import encode_frame
        from protocol import errors as E
        from protocol import messages as m
        from protocol.headers import decode_response_header
        from protocol.sasl import client_mechanism

        if self._api_versions is None:
            req = m.ApiVersionsRequest(client_software_name="floor", client_software_version="1")
            self._api_versions = bytes(encode_frame(req, 3, 1, "floor"))
        loop = asyncio.get_running_loop()
        now = time.perf_counter
        t0 = now()
        if self.ssl is not None:
            _, c = await loop.create_connection(_Conn, self.host, self.port, ssl=self.ssl,
                                                server_hostname=self.host)
        else:
            _, c = await loop.create_connection(_Conn, self.host, self.port)
        t1 = now()
        try:
            raw = await c.call(self._api_versions)
            _, pos = decode_response_header(raw, 18, 3)
            code = _I16.unpack_from(raw, pos)[0]
            if code:
                raise RuntimeError(f"ApiVersions: {E.error_name(code)}")
            t2 = now()
            sec = self.security
            if sec is not None and sec["mechanism"]:
                r = await self._rpc(c, m.SaslHandshakeRequest(mechanism=sec["mechanism"]), 1, 2)
                if r.error_code:
                    raise RuntimeError(f"SaslHandshake: {E.error_name(r.error_code)} (enabled: {r.mechanisms})")
                mech = client_mechanism(sec["mechanism"], sec["user"], sec["password"])
                token = mech.first()
                cid = 3
                while token is not None:
                    r = await self._rpc(c, m.SaslAuthenticateRequest(auth_bytes=token), self.v["sasl_authenticate"],
                                        cid)
                    if r.error_code:
                        raise RuntimeError(f"SaslAuthenticate: {E.error_name(r.error_code)}: {r.error_message}")
                    token = mech.step(bytes(r.auth_bytes or b""))
                    cid += 1
                if not mech.done:
                    raise RuntimeError(f"SASL {mech.name}: the exchange ended before the mechanism was done")
        except BaseException:
            c.transport.abort()
            raise
        t3 = now()
        return c, t1 - t0, t2 - t1, t3 - t2

    def tls_info(self) -> dict | None:
        if self.ssl is None or not self.conns:
            return None
        obj = self.conns[0].transport.get_extra_info("ssl_object")
        if obj is None:
            return None
        cipher = obj.cipher()
        return {"version": obj.version(), "cipher": cipher[0] if cipher else None}

    async def connect(self, n: int, concurrency: int) -> dict:
        """Open ``n`` more connections, ``concurrency`` at a time, and keep them (``disconnect``)."""
        sem = asyncio.Semaphore(concurrency)
        timings = array("d")
        now = time.perf_counter

        async def one():
            async with sem:
                t = now()
                c, tcp, api, sasl = await self.open()
                self.extra.append(c)
                timings.extend((now() - t, tcp, api, sasl))

        cpu0 = time.process_time()
        t0 = now()
        results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n)), return_exceptions=True), 300)
        wall = now() - t0
        cpu = time.process_time() - cpu0
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise RuntimeError(f"{len(failed)} of {n} connections failed; first: {type(failed[0]).__name__}: "
                               f"{failed[0]}")
        return {"connections": n, "seconds": wall, "client_cpu_s": cpu, "timings_s": timings.tobytes()}

    async def disconnect(self) -> None:
        for c in self.extra:
            c.transport.close()
        self.extra = []
        await asyncio.sleep(0.05)  # let the closes (TLS close_notify) go out

    async def setup(self):
        from bench.loadgen import encode_frame, ok_answer
        from protocol import errors as E
        from protocol import messages as m
        from protocol.consumer import Assignment, TopicPartitions, encode_assignment
        from protocol.headers import decode_response_header

        loop = asyncio.get_running_loop()
        for _ in range(self.nconns):
            if self.security is not None:  # TLS, SASL: as a Kafka client (ApiVersions v3 first)
                self.conns.append((await self.open())[0])
            else:  # a floor answers only Heartbeat and OffsetCommit; the mock refuses ApiVersions v3
                _, c = await loop.create_connection(_Conn, self.host, self.port)
                self.conns.append(c)
        self.frames = {"heartbeat": [], "commit": [], "cgheartbeat": []}
        self.ok = {"heartbeat": [], "commit": [], "cgheartbeat": []}
        vj, vs, vh, vc = self.v["join"], self.v["sync"], self.v["heartbeat"], self.v["commit"]

        async def rpc(c, req, v):
            frame = encode_frame(req, v, 1, "floor")
            raw = await c.call(bytes(frame))
            cid, pos = decode_response_header(raw, req.API_KEY, v)
            return m.RESPONSES[req.API_KEY].decode(raw, v, pos)

        for i, c in enumerate(self.conns):
            cid = 1000 + i
            group = f"floor-{self.tag}-{os.getpid()}-{i}"
            member, generation = "", -1
            if self.join:
                protocols = [m.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01\x00\x00\x00\x00\x00\x00")]
                for _attempt in range(3):
                    r = await rpc(
                        c,
                        m.JoinGroupRequest(
                            group_id=group, session_timeout_ms=300_000, rebalance_timeout_ms=60_000,
                            member_id=member, group_instance_id=None, protocol_type="consumer",
                            protocols=protocols,
                        ),
                        vj,
                    )
                    member = r.member_id or member
                    if r.error_code != E.MEMBER_ID_REQUIRED:
                        break
                if r.error_code:
                    raise RuntimeError(f"JoinGroup: {E.error_name(r.error_code)}")
                generation = r.generation_id
                blob = encode_assignment(
                    Assignment(assigned_partitions=[TopicPartitions(topic=TOPIC, partitions=list(range(10)))]), 1
                )
                r = await rpc(
                    c,
                    m.SyncGroupRequest(
                        group_id=group, generation_id=generation, member_id=member, group_instance_id=None,
                        protocol_type="consumer", protocol_name="range",
                        assignments=[m.SyncGroupRequestAssignment(member_id=member, assignment=blob)],
                    ),
                    vs,
                )
                if r.error_code:
                    raise RuntimeError(f"SyncGroup: {E.error_name(r.error_code)}")
            hb = m.HeartbeatRequest(group_id=group, generation_id=generation, member_id=member, group_instance_id=None)
            first = (i * 10) % 100
            parts = [(first + p) % 100 for p in range(10)]
            oc = m.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                group_instance_id=None, retention_time_ms=-1,
                topics=[
                    m.OffsetCommitRequestTopic(
                        name=TOPIC,
                        partitions=[
                            m.OffsetCommitRequestPartition(
                                partition_index=p, committed_offset=1000 + i, committed_leader_epoch=-1,
                                committed_metadata="",
                            )
                            for p in parts
                        ],
                    )
                ],
            )
            self.frames["heartbeat"].append(bytes(encode_frame(hb, vh, cid, "floor")))
            self.frames["commit"].append(bytes(encode_frame(oc, vc, cid, "floor")))
            self.ok["heartbeat"].append(ok_answer(m.HeartbeatResponse(throttle_time_ms=0, error_code=0), 12, vh, cid))
            topics = [] if not self.join else [
                m.OffsetCommitResponseTopic(
                    name=TOPIC,
                    partitions=[m.OffsetCommitResponsePartition(partition_index=p, error_code=0) for p in parts],
                )
            ]
            self.ok["commit"].append(ok_answer(m.OffsetCommitResponse(throttle_time_ms=0, topics=topics), 8, vc, cid))
            vg = self.v.get("cg_heartbeat", -1)
            if self.join and vg >= 1:
                await self._join_consumer_group(rpc, c, f"{group}-cg", vg, cid)

    async def _join_consumer_group(self, rpc, c, group, vg, cid):
        """A KIP-848 member of a group of its own: join, acknowledge the assignment; then its
        steady-state ConsumerGroupHeartbeat frame and the exact answer it gets."""
        import uuid

        from bench.loadgen import encode_frame, ok_answer
        from protocol import errors as E
        from protocol import messages as m

        mid = str(uuid.uuid4())
        r = await rpc(c, m.ConsumerGroupHeartbeatRequest(
            group_id=group, member_id=mid, member_epoch=0, rebalance_timeout_ms=60_000,
            subscribed_topic_names=[TOPIC], topic_partitions=[]), vg)
        if r.error_code:
            raise RuntimeError(f"ConsumerGroupHeartbeat join: {E.error_name(r.error_code)}")
        owned = [] if r.assignment is None else [
            m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=tp.topic_id, partitions=tp.partitions)
            for tp in r.assignment.topic_partitions]
        r = await rpc(c, m.ConsumerGroupHeartbeatRequest(
            group_id=group, member_id=mid, member_epoch=r.member_epoch, topic_partitions=owned), vg)
        if r.error_code:
            raise RuntimeError(f"ConsumerGroupHeartbeat ack: {E.error_name(r.error_code)}")
        steady = m.ConsumerGroupHeartbeatRequest(group_id=group, member_id=mid, member_epoch=r.member_epoch)
        self.frames["cgheartbeat"].append(bytes(encode_frame(steady, vg, cid, "floor")))
        self.ok["cgheartbeat"].append(ok_answer(m.ConsumerGroupHeartbeatResponse(
            member_id=mid, member_epoch=r.member_epoch, heartbeat_interval_ms=r.heartbeat_interval_ms), 68, vg, cid))

    async def burst(self, kind: str, total: int, depth: int) -> dict:
        from protocol import errors as E
        from protocol import messages as m
        from protocol.headers import decode_response_header

        loop = asyncio.get_running_loop()
        n = len(self.conns)
        counts = [total // n + (1 if i < total % n else 0) for i in range(n)]
        lat = array("d")
        errors: dict[str, int] = {}
        done = loop.create_future()
        running = [0]
        api = API_OF[kind]
        version = self.v["cg_heartbeat" if kind == "cgheartbeat" else kind]
        now = time.perf_counter

        def make(i, c, count):
            frame, ok = self.frames[kind][i], self.ok[kind][i]
            state = {"left": count, "got": 0, "sent": []}

            def send(k):
                k = min(k, state["left"])
                if k <= 0:
                    return
                state["left"] -= k
                t = now()
                state["sent"].extend([t] * k)
                c.transport.write(frame if k == 1 else frame * k)

            def on_answers(answers):
                if answers is None:
                    if not done.done():
                        done.set_exception(c.lost)
                    return
                t = now()
                sent = state["sent"]
                for a in answers:
                    lat.append(t - sent.pop(0))
                    if a != ok:
                        cid, pos = decode_response_header(a, api, version)
                        r = m.RESPONSES[api].decode(a, version, pos)
                        if kind != "commit":
                            code = r.error_code
                        else:
                            code = next((p.error_code for tp in r.topics for p in tp.partitions if p.error_code), 0)
                        if code:
                            name = E.error_name(code)
                            errors[name] = errors.get(name, 0) + 1
                state["got"] += len(answers)
                send(len(answers))
                if state["got"] >= count:
                    c.burst = None
                    running[0] -= 1
                    if running[0] == 0 and not done.done():
                        done.set_result(None)

            c.burst = on_answers
            return send

        senders = []
        for i, (c, count) in enumerate(zip(self.conns, counts, strict=True)):
            if count:
                running[0] += 1
                senders.append((make(i, c, count), depth))
        cpu0 = time.process_time()
        t0 = now()
        for send, d in senders:
            send(d)
        await asyncio.wait_for(done, 300)
        return {
            "requests": len(lat),
            "seconds": now() - t0,
            "errors": errors,
            "client_cpu_s": time.process_time() - cpu0,
            "latency_s": lat.tobytes(),
        }

    def close(self):
        for c in self.conns:
            c.transport.close()


def _driver_main(pipe, host, port, conns, join, versions, tag, security):
    import uvloop

    async def main():
        d = _Driver(host, port, conns, join, versions, tag, security)
        try:
            await d.setup()
            pipe.send(("ready", d.tls_info()))
        except Exception as e:  # noqa: BLE001 - reported to the parent as one line
            pipe.send(("error", f"{type(e).__name__}: {e}"))
            return
        loop = asyncio.get_running_loop()
        while True:
            msg = await loop.run_in_executor(None, pipe.recv)
            if msg[0] == "stop":
                break
            try:
                if msg[0] == "connect":
                    pipe.send(("done", await d.connect(msg[1], msg[2])))
                elif msg[0] == "disconnect":
                    await d.disconnect()
                    pipe.send(("done", None))
                else:
                    _, kind, total, depth = msg
                    pipe.send(("done", await d.burst(kind, total, depth)))
            except Exception as e:  # noqa: BLE001
                pipe.send(("error", f"{type(e).__name__}: {e}"))
        await d.disconnect()
        d.close()

    uvloop.run(main())


class Drivers:
    def __init__(self, bootstrap: str, procs: int, conns: int, join: bool, versions: dict, tag: str,
                 security: dict | None = None):
        host, port = bootstrap.rsplit(":", 1)
        ctx = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        per = [conns // procs + (1 if i < conns % procs else 0) for i in range(procs)]
        for i in range(procs):
            a, b = ctx.Pipe()
            p = ctx.Process(
                target=_driver_main, args=(b, host, int(port), per[i], join, versions, f"{tag}{i}", security)
            )
            p.start()
            self.pipes.append(a)
            self.procs.append(p)
        self.tls = [self._expect(a, "ready", 120) for a in self.pipes][0]

    @staticmethod
    def _expect(pipe, what, timeout):
        if not pipe.poll(timeout):
            raise RuntimeError(f"a driver process did not answer ({what})")
        tag, val = pipe.recv()
        if tag == "error":
            raise RuntimeError(f"driver: {val}")
        return val

    def burst(self, kind: str, total: int, depth: int) -> dict:
        n = len(self.pipes)
        per = [total // n + (1 if i < total % n else 0) for i in range(n)]
        t0 = time.perf_counter()
        for a, k in zip(self.pipes, per, strict=True):
            a.send(("burst", kind, k, depth))
        outs = [self._expect(a, "burst", 600) for a in self.pipes]
        wall = time.perf_counter() - t0
        lat = array("d")
        errors: dict[str, int] = {}
        for o in outs:
            lat.frombytes(o["latency_s"])
            for k, v in o["errors"].items():
                errors[k] = errors.get(k, 0) + v
        return {
            "requests": len(lat),
            "seconds": wall,
            "errors": errors,
            "client_cpu_us_per_request": sum(o["client_cpu_s"] for o in outs) * 1e6 / max(1, len(lat)),
            "latency_us": U.percentiles([x * 1e6 for x in lat], (50, 99)),
        }

    def connect(self, n: int, serial: bool) -> dict:
        """Open ``n`` connections (kept until :meth:`disconnect`): all at once over every driver
        process, or (``serial``) one after another in the first."""
        pipes = self.pipes[:1] if serial else self.pipes
        k = len(pipes)
        per = [n // k + (1 if i < n % k else 0) for i in range(k)]
        t0 = time.perf_counter()
        for a, m in zip(pipes, per, strict=True):
            a.send(("connect", m, 1 if serial else max(1, m)))
        outs = [self._expect(a, "connect", 600) for a in pipes]
        wall = time.perf_counter() - t0
        t = array("d")
        for o in outs:
            t.frombytes(o["timings_s"])
        total, tcp, api, sasl = (t[i::4] for i in range(4))
        return {
            "connections": len(total),
            "seconds": wall,
            "client_cpu_us_per_connection": sum(o["client_cpu_s"] for o in outs) * 1e6 / max(1, len(total)),
            "setup_us": U.percentiles([x * 1e6 for x in total], (50, 99)),
            "connect_tls_us": U.percentiles([x * 1e6 for x in tcp], (50, 99)),
            "api_versions_us": U.percentiles([x * 1e6 for x in api], (50, 99)),
            "sasl_us": U.percentiles([x * 1e6 for x in sasl], (50, 99)),
        }

    def disconnect(self) -> None:
        for a in self.pipes:
            a.send(("disconnect",))
        for a in self.pipes:
            self._expect(a, "disconnect", 60)

    def close(self):
        for a in self.pipes:
            try:
                a.send(("stop",))
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def versions_for(bootstrap: str, cafile: str | None = None) -> dict:
    """Our highest versions of JoinGroup/SyncGroup/Heartbeat/OffsetCommit/SaslAuthenticate that
    the server takes (``cafile``: over TLS, trusting that CA)."""
    import socket

    from bench.loadgen import encode_frame
    from protocol import errors as E
    from protocol import messages as m
    from protocol.headers import decode_response_header

    ours = {"join": (11, 9), "sync": (14, 5), "heartbeat": (12, 4), "commit": (8, 9), "sasl_authenticate": (36, 2),
            "cg_heartbeat": (68, 1)}
    host, port = bootstrap.rsplit(":", 1)
    tls = client_ssl_context(cafile) if cafile else None
    # v3 first; a server that does not take it (librdkafka's mock) answers UNSUPPORTED_VERSION and
    # is asked again with v0, as clients do.
    for av in (3, 0):
        with socket.create_connection((host, int(port)), timeout=10) as raw_sock, (
            tls.wrap_socket(raw_sock, server_hostname=host) if tls else raw_sock
        ) as s:
            req = m.ApiVersionsRequest(client_software_name="floor", client_software_version="1")
            s.sendall(encode_frame(req, av, 1, "floor"))
            size = _SIZE.unpack(_recv_exact(s, 4))[0]
            raw = _recv_exact(s, size)
        _, pos = decode_response_header(raw, 18, av)
        r = m.ApiVersionsResponse.decode(raw, av, pos)
        if r.error_code != E.UNSUPPORTED_VERSION:
            break
    if r.error_code:
        raise RuntimeError(f"ApiVersions: {E.error_name(r.error_code)}")
    theirs = {k.api_key: k.max_version for k in r.api_keys}
    return {name: min(v, theirs.get(key, -1)) for name, (key, v) in ours.items()}


def _recv_exact(s, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


# ---- measuring -------------------------------------------------------------------------------------


def measure_target(name: str, server, args, security: dict | None = None) -> dict:
    join = name == "mock" or name in SECURITY
    cafile = security["cafile"] if security else None
    versions = (
        versions_for(server.bootstrap, cafile) if join else {"join": 9, "sync": 5, "heartbeat": 4, "commit": 9}
    )
    if name not in SECURITY:
        versions.pop("cg_heartbeat", None)  # the KIP-848 bursts are herd's only
    if name == "mock":
        # librdkafka's mock advertises JoinGroup v6 and SyncGroup v4+ but closes the connection on
        # their flexible encoding; the setup uses what librdkafka itself sends. The measured
        # requests (Heartbeat v4, OffsetCommit v9) are the same versions for every target.
        versions.update(join=min(versions["join"], 5), sync=min(versions["sync"], 3))
    if join and min(versions["heartbeat"], versions["commit"] - 4) < 4:
        raise RuntimeError(f"{name} lacks a flexible Heartbeat/OffsetCommit version: {versions}")
    out = {"target": name, "versions": versions, "pid": server.pid, "bursts": []}
    if name in SECURITY:
        out["security_protocol"] = SECURITY[name]
        out["sasl_mechanism"] = security["mechanism"] if security else None
    drivers = Drivers(server.bootstrap, args.procs, args.conns, join, versions, name, security)
    out["tls"] = drivers.tls
    kinds = ("heartbeat", "cgheartbeat", "commit") if versions.get("cg_heartbeat", -1) >= 1 else ("heartbeat", "commit")
    try:
        for kind in kinds:
            for depth in (1, args.depth):
                drivers.burst(kind, max(1000, args.requests // 10), depth)  # warm-up
        c0, w0 = U.proc_cpu_ns(server.pid), time.perf_counter()
        time.sleep(args.idle_seconds)
        idle_rate = (U.proc_cpu_ns(server.pid) - c0) / 1e9 / (time.perf_counter() - w0)
        out["idle_cpu_util"] = idle_rate
        for kind in kinds:
            for depth in (1, args.depth):
                us0 = U.proc_user_sys_seconds(server.pid)
                c0 = U.proc_cpu_ns(server.pid)
                res = drivers.burst(kind, args.requests, depth)
                cpu = (U.proc_cpu_ns(server.pid) - c0) / 1e9
                us1 = U.proc_user_sys_seconds(server.pid)
                n = res["requests"]
                net = cpu - idle_rate * res["seconds"]
                res.update(
                    kind=kind,
                    depth=depth,
                    server_cpu_us_per_request=net * 1e6 / n,
                    server_user_us_per_request=(us1[0] - us0[0]) * 1e6 / n,
                    server_sys_us_per_request=(us1[1] - us0[1]) * 1e6 / n,
                    requests_per_s=n / res["seconds"],
                    target_us=TARGET_US.get(kind),
                )
                out["bursts"].append(res)
        if name in SECURITY:
            out["setup"] = [
                measure_setup(server.pid, drivers, mode, n, idle_rate)
                for mode, n in (("storm", args.connect_conns), ("serial", args.connect_serial))
                if n > 0
            ]
    finally:
        drivers.close()
    return out


def measure_setup(pid: int, drivers: Drivers, mode: str, n: int, idle_rate: float) -> dict:
    """Daemon CPU, latency and memory of ``n`` connection set-ups (see the module docstring)."""
    time.sleep(0.2)  # the previous phase's last packets
    rss0 = U.proc_rss_bytes(pid)
    us0 = U.proc_user_sys_seconds(pid)
    c0 = U.proc_cpu_ns(pid)
    res = drivers.connect(n, serial=mode == "serial")
    cpu = (U.proc_cpu_ns(pid) - c0) / 1e9
    us1 = U.proc_user_sys_seconds(pid)
    rss1 = U.proc_rss_bytes(pid)
    drivers.disconnect()
    net = cpu - idle_rate * res["seconds"]
    n = res["connections"]
    res.update(
        mode=mode,
        server_cpu_us_per_connection=net * 1e6 / n,
        server_user_us_per_connection=(us1[0] - us0[0]) * 1e6 / n,
        server_sys_us_per_connection=(us1[1] - us0[1]) * 1e6 / n,
        connections_per_s=n / res["seconds"],
        server_rss_growth_kib_per_connection=(rss1 - rss0) / 1024 / n,
    )
    return res


def fdatasync_probe(root: str, samples: int, record: int = 300) -> dict:
    """Latency of pwrite(record) + fdatasync into a preallocated (written and synced) file."""
    d = tempfile.mkdtemp(prefix="herd-floor-", dir=root)
    path = os.path.join(d, "probe")
    size = max(samples * record, 1) + 4096
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"\x00" * size, 0)
        os.fsync(fd)
        payload = b"\x5a" * record
        lat = []
        cpu0 = time.thread_time()
        for i in range(samples):
            t = time.perf_counter()
            os.pwrite(fd, payload, i * record)
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1e6)
        cpu = time.thread_time() - cpu0
    finally:
        os.close(fd)
        shutil.rmtree(d, ignore_errors=True)
    return {
        "samples": samples,
        "record_bytes": record,
        "filesystem": U.filesystem_of(root),
        "latency_us": U.percentiles(lat, (50, 99)),
        "mean_us": statistics.fmean(lat),
        "cpu_us_per_call": cpu * 1e6 / samples,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.floor", __doc__.split("\n\n")[0], "small counts (< 60 s in all)")
    ap.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"any of {','.join(TARGETS)} (default: all but herd-sasl-plaintext)",
    )
    ap.add_argument("--requests", type=int, default=None, help="per burst (default 60000, quick 15000)")
    ap.add_argument("--conns", type=int, default=100, help="connections in all (default 100)")
    ap.add_argument("--procs", type=int, default=2, help="driver processes (default 2)")
    ap.add_argument("--depth", type=int, default=10, help="requests in flight per connection, second pass")
    ap.add_argument("--fsync", default="never", choices=["never", "always"], help="herd's fsync mode")
    ap.add_argument("--idle-seconds", type=float, default=1.0)
    ap.add_argument("--fsync-samples", type=int, default=None, help="default 3000 (quick 1000)")
    ap.add_argument("--sasl-mechanism", default="SCRAM-SHA-256", choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
                    help="the herd-sasl-* targets' mechanism (default SCRAM-SHA-256)")
    ap.add_argument("--tls-key", default="ecdsa", choices=["ecdsa", "rsa"],
                    help="the throwaway PKI's key type: ECDSA P-256 (default) or RSA 2048")
    ap.add_argument("--connect-conns", type=int, default=None,
                    help="connections opened at once to measure set-up, herd targets (default 400, quick 100; 0: skip)")
    ap.add_argument("--connect-serial", type=int, default=None,
                    help="connections opened one by one to measure set-up latency (default 100, quick 30; 0: skip)")
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={
        "requests": (15_000, 60_000),
        "fsync_samples": (1_000, 3_000),
        "connect_conns": (100, 400),
        "connect_serial": (30, 100),
    })
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        sys.exit(f"bench.floor: unknown target {', '.join(unknown)} (known: {', '.join(TARGETS)})")
    protocols = {t: SECURITY[t] for t in targets if t in SECURITY}
    env = U.environment()
    results = []
    skipped = {}
    password = secrets.token_urlsafe(18)
    with tempfile.TemporaryDirectory(prefix="herd-floor-build-") as build:
        pki = None
        if any(p != "PLAINTEXT" for p in protocols.values()):
            pki = make_pki(Path(build), args.tls_key, password, any("SSL" in p for p in protocols.values()))
        for t in targets:
            security = None
            if t == "c-floor":
                exe = build_c_floor(Path(build))
                if exe is None:
                    skipped[t] = "no C compiler (cc) on PATH"
                    continue
                ctx = _Floor([str(exe)])
            elif t == "py-floor":
                ctx = _Floor([sys.executable, "-m", "bench.floor", "--serve-python-floor"])
            elif t in SECURITY:
                limit = args.conns + args.connect_conns + args.connect_serial + 100
                ctx = U.Herd(
                    fsync=args.fsync,
                    extra_args=["--max-connections", str(limit)]
                    + herd_security_args(SECURITY[t], pki, args.sasl_mechanism)
                    + (ACL_ARGS if t == "herd-acl" else []),
                )
                security = driver_security(SECURITY[t], pki, args.sasl_mechanism, password)
            else:
                ctx = U.Mock()
            with ctx as server:
                if t == "herd-acl":
                    install_acls(server.address)
                results.append(measure_target(t, server, args, security))
    probe = fdatasync_probe(U.default_tmp_root(), args.fsync_samples) if args.fsync_samples > 0 else None
    result = {
        "benchmark": "floor",
        **env,
        "params": {
            "targets": targets,
            "requests": args.requests,
            "conns": args.conns,
            "procs": args.procs,
            "depth": args.depth,
            "herd_fsync": args.fsync,
            "idle_seconds": args.idle_seconds,
            "commit_partitions": 10,
            "quick": args.quick,
            "security_protocols": protocols,
            "sasl_mechanism": args.sasl_mechanism if any(p.startswith("SASL_") for p in protocols.values()) else None,
            "sasl_user_file_entries": 1,
            "tls_key": TLS_KEYS[args.tls_key] if any("SSL" in p for p in protocols.values()) else None,
            "tls_session_resumption": False,
            "connect_conns": args.connect_conns,
            "connect_serial": args.connect_serial,
        },
        "skipped": skipped,
        "targets_us": TARGET_US,
        "results": results,
        "fdatasync": probe,
    }
    plain = {
        (b["kind"], b["depth"]): b["server_cpu_us_per_request"]
        for r in results if r["target"] == "herd" for b in r["bursts"]
    }
    rows = []
    for r in results:
        for b in r["bursts"]:
            base = plain.get((b["kind"], b["depth"])) if r["target"] in SECURITY else None
            rows.append(
                [
                    r["target"],
                    b["kind"],
                    b["depth"],
                    f"{b['server_cpu_us_per_request']:.1f}",
                    "" if base is None else f"{b['server_cpu_us_per_request'] - base:+.1f}",
                    f"{b['server_user_us_per_request']:.0f}/{b['server_sys_us_per_request']:.0f}",
                    f"<= {TARGET_US[b['kind']]:.0f}" if b["kind"] in TARGET_US else "-",
                    f"{b['requests_per_s']:.0f}",
                    f"{b['latency_us']['p50']:.0f}",
                    f"{b['client_cpu_us_per_request']:.1f}",
                    sum(b["errors"].values()),
                ]
            )
    text = U.table(
        rows,
        ["target", "request", "in flight", "server µs/req", "vs herd", "user/sys µs", "target", "req/s", "p50 µs",
         "driver µs/req", "errors"],
    )
    setup_rows = []
    for r in results:
        for st in r.get("setup", []):
            tls = r.get("tls") or {}
            setup_rows.append(
                [
                    r["target"],
                    " ".join(x for x in (tls.get("version"), r.get("sasl_mechanism")) if x) or "-",
                    st["mode"],
                    st["connections"],
                    f"{st['server_cpu_us_per_connection']:.0f}",
                    f"{st['client_cpu_us_per_connection']:.0f}",
                    f"{st['connections_per_s']:.0f}",
                    f"{st['setup_us']['p50'] / 1000:.2f}",
                    f"{st['setup_us']['p99'] / 1000:.2f}",
                    f"{st['connect_tls_us']['p50'] / 1000:.2f}",
                    f"{st['api_versions_us']['p50'] / 1000:.2f}",
                    f"{st['sasl_us']['p50'] / 1000:.2f}",
                    f"{st['server_rss_growth_kib_per_connection']:.0f}",
                ]
            )
    if setup_rows:
        text += (
            "\n\nconnection set-up (TCP [+ TLS] + ApiVersions [+ SASL]), herd targets"
            + (f", TLS key {TLS_KEYS[args.tls_key]}" if any("SSL" in p for p in protocols.values()) else "")
            + ":\n"
            + U.table(
                setup_rows,
                ["target", "security", "mode", "conns", "server µs/conn", "driver µs/conn",
                 "conns/s", "p50 ms", "p99 ms", "tcp+tls p50", "apiver p50", "sasl p50", "RSS KiB/conn"],
            )
        )
    if probe is not None:
        lat = probe["latency_us"]
        text += (
            f"\npwrite {probe['record_bytes']} B + fdatasync, preallocated file on {probe['filesystem']}: "
            f"p50 {lat['p50']:.0f} µs, p99 {lat['p99']:.0f} µs, CPU {probe['cpu_us_per_call']:.0f} µs per call"
        )
    for t, why in skipped.items():
        text += f"\nskipped {t}: {why}"
    U.emit(result, "server CPU per request, idle subtracted (one run, one driver)\n" + text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve-python-floor"]:
        serve_python_floor()
    else:
        main(sys.argv[1:])
