#!/usr/bin/env python3
"""Capture golden Kafka request/response frames from real clients.

Runs each client scenario against a fresh librdkafka mock cluster (from
../shared/tools/mock_cluster.py, loaded in-process so the mock can advertise
our proxy's address), with a small asyncio TCP proxy on 127.0.0.1 in front of
it.  The proxy forwards bytes unchanged and records every client->server
request frame and the server->client response with the same correlation id.

Selected frames are written to tests/protocol/golden/<scenario>/ as
NNN_<Api>_v<ver>.bin (request header + body, no size prefix) and
NNN_<Api>_v<ver>.response.bin (response header + body), plus manifest.json.
Every frame is re-checked before writing: header parses, the frame size is
what the proxy saw, and (where ../shared/kafka-spec has a schema) the body
decodes with a small schema-driven decoder that must consume every byte and
agree with the `expect` values taken from how the client was driven.

Needs an interpreter with confluent-kafka, kafka-python and aiokafka:

    python3 -m venv /tmp/golden-venv
    /tmp/golden-venv/bin/pip install confluent-kafka kafka-python aiokafka
    /tmp/golden-venv/bin/python tools/capture_golden.py            # all scenarios
    /tmp/golden-venv/bin/python tools/capture_golden.py --scenario aiokafka --dry-run

Internal: `capture_golden.py drive SCENARIO --bootstrap HOST:PORT` runs one
client session in a child process and prints a JSON report as its last line.
"""
import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
DEFAULT_OUT = os.path.join(ROOT, "tests", "protocol", "golden")

TOPIC = "golden"
PARTITIONS = 4
RECORDS_PER_PARTITION = 3
GROUP = "golden-group"
SESSION_TIMEOUT_MS = 10000
HEARTBEAT_INTERVAL_MS = 1000
MAX_POLL_INTERVAL_MS = 60000
COMMIT_METADATA = "golden-meta"
EXPLICIT_COMMIT_OFFSET = 1  # first commit: explicit offset + metadata; second: consumed positions
STATIC_INSTANCE_ID = "golden-static-1"
ASSIGNORS = ["range", "roundrobin"]
# aiokafka 0.14.0 sends one JoinGroup per configured assignor (its KIP-394 retry loop sits
# inside the loop over assignors) without carrying the member id over, so with two assignors
# a single consumer joins twice as two members.  Its default, roundrobin alone, avoids that.
AIOKAFKA_ASSIGNORS = ["roundrobin"]

MAX_FRAMES = 40           # per scenario
KEEP_PER_API_VERSION = 2  # first N of each (api_key, api_version)
MAX_FETCH_RESPONSE = 64 * 1024
MAX_FRAME = 64 * 1024 * 1024
CORE_APIS = {18, 3, 10, 11, 14, 12, 8, 9, 13}  # never dropped by the frame cap

API_NAMES = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
    17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics", 22: "InitProducerId",
    23: "OffsetForLeaderEpoch", 32: "DescribeConfigs", 36: "SaslAuthenticate",
    42: "DeleteGroups", 47: "OffsetDelete", 60: "DescribeCluster",
    68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe",
    71: "GetTelemetrySubscriptions", 72: "PushTelemetry",
}

# scenario -> (library, client_id, extra options)
SCENARIOS = {
    "kafka-python": ("kafka-python", "golden-kafka-python", {"api_version": [2, 3]}),
    # Without api_version kafka-python opens with ApiVersions v4; the mock's v3+ answer is
    # malformed, so the client never bootstraps.  Kept for its real ApiVersions v4 request.
    "kafka-python-negotiated": ("kafka-python", "golden-kafka-python",
                                {"may_fail": True, "bootstrap_timeout_ms": 8000}),
    "aiokafka": ("aiokafka", "golden-aiokafka", {}),
    "confluent": ("confluent-kafka", "golden-confluent", {}),
    "confluent-static": ("confluent-kafka", "golden-confluent", {"group_instance_id": STATIC_INSTANCE_ID}),
}


# ----------------------------------------------------------------------------------------------
# Client sessions (run in a child process: `capture_golden.py drive SCENARIO --bootstrap ...`)
# ----------------------------------------------------------------------------------------------

def _expected_total(assigned):
    return RECORDS_PER_PARTITION * len(assigned)


def drive_kafka_python(bootstrap, client_id, opts, seconds):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.structs import OffsetAndMetadata

    kw = dict(bootstrap_servers=bootstrap, group_id=GROUP, client_id=client_id,
              auto_offset_reset="earliest", enable_auto_commit=False,
              session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
              max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
              partition_assignment_strategy=(RangePartitionAssignor, RoundRobinPartitionAssignor))
    if opts.get("api_version"):
        kw["api_version"] = tuple(opts["api_version"])
    if opts.get("bootstrap_timeout_ms"):
        kw["bootstrap_timeout_ms"] = opts["bootstrap_timeout_ms"]
    report = {}
    deadline = time.monotonic() + seconds
    c = KafkaConsumer(**kw)
    try:
        c.subscribe([TOPIC])
        consumed = {}
        while time.monotonic() < deadline:
            for tp, recs in c.poll(timeout_ms=300).items():
                for r in recs:
                    consumed[tp.partition] = max(consumed.get(tp.partition, -1), r.offset)
            assigned = sorted(tp.partition for tp in c.assignment())
            if assigned and sum(v + 1 for v in consumed.values()) >= _expected_total(assigned):
                break
        linger = time.monotonic() + 2.5  # let a couple of heartbeats through
        while time.monotonic() < min(linger, deadline):
            c.poll(timeout_ms=300)
        assigned = sorted(tp.partition for tp in c.assignment())
        offsets = {TopicPartition(TOPIC, p): OffsetAndMetadata(EXPLICIT_COMMIT_OFFSET, COMMIT_METADATA, -1)
                   for p in assigned}
        c.commit(offsets)
        c.commit()  # consumed positions, empty metadata
        committed = {p: c.committed(TopicPartition(TOPIC, p)) for p in assigned}
        report.update(assigned=assigned, consumed=consumed, committed=committed,
                      commits=[{"offset": EXPLICIT_COMMIT_OFFSET, "metadata": COMMIT_METADATA},
                               {"offset": RECORDS_PER_PARTITION, "metadata": ""}])
    finally:
        c.close()
    return report


def drive_aiokafka(bootstrap, client_id, opts, seconds):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    async def session():
        report = {}
        deadline = time.monotonic() + seconds
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP, client_id=client_id,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=SESSION_TIMEOUT_MS,
                             heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                             max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
                             rebalance_timeout_ms=MAX_POLL_INTERVAL_MS,
                             partition_assignment_strategy=(RoundRobinPartitionAssignor,))
        await asyncio.wait_for(c.start(), timeout=seconds)
        try:
            c.subscribe([TOPIC])
            consumed = {}
            while time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=300)
                for tp, recs in batch.items():
                    for r in recs:
                        consumed[tp.partition] = max(consumed.get(tp.partition, -1), r.offset)
                assigned = sorted(tp.partition for tp in c.assignment())
                if assigned and sum(v + 1 for v in consumed.values()) >= _expected_total(assigned):
                    break
            linger = time.monotonic() + 2.5
            while time.monotonic() < min(linger, deadline):
                await c.getmany(timeout_ms=300)
            assigned = sorted(tp.partition for tp in c.assignment())
            await c.commit({TopicPartition(TOPIC, p): (EXPLICIT_COMMIT_OFFSET, COMMIT_METADATA)
                            for p in assigned})
            await c.commit()
            committed = {p: await c.committed(TopicPartition(TOPIC, p)) for p in assigned}
            report.update(assigned=assigned, consumed=consumed, committed=committed,
                          commits=[{"offset": EXPLICIT_COMMIT_OFFSET, "metadata": COMMIT_METADATA},
                                   {"offset": RECORDS_PER_PARTITION, "metadata": ""}])
        finally:
            await asyncio.wait_for(c.stop(), timeout=15)
        return report

    return asyncio.run(session())


def drive_confluent(bootstrap, client_id, opts, seconds):
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    conf = {"bootstrap.servers": bootstrap, "group.id": GROUP, "client.id": client_id,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "partition.assignment.strategy": ",".join(ASSIGNORS)}
    if opts.get("group_instance_id"):
        conf["group.instance.id"] = opts["group_instance_id"]
    report = {}
    deadline = time.monotonic() + seconds
    c = Consumer(conf)
    try:
        c.subscribe([TOPIC])
        consumed = {}
        while time.monotonic() < deadline:
            m = c.poll(0.3)
            if m is not None and not m.error():
                consumed[m.partition()] = max(consumed.get(m.partition(), -1), m.offset())
            assigned = sorted(tp.partition for tp in c.assignment())
            if assigned and sum(v + 1 for v in consumed.values()) >= _expected_total(assigned):
                break
        linger = time.monotonic() + 2.5
        while time.monotonic() < min(linger, deadline):
            c.poll(0.3)
        assigned = sorted(tp.partition for tp in c.assignment())
        c.commit(offsets=[TopicPartition(TOPIC, p, EXPLICIT_COMMIT_OFFSET, COMMIT_METADATA)
                          for p in assigned], asynchronous=False)
        commits = [{"offset": EXPLICIT_COMMIT_OFFSET, "metadata": COMMIT_METADATA}]
        try:
            c.commit(asynchronous=False)  # stored (consumed) offsets
            commits.append({"offset": RECORDS_PER_PARTITION, "metadata": ""})
        except KafkaException as e:  # _NO_OFFSET: nothing new to commit
            report["second_commit"] = str(e)
        res = c.committed([TopicPartition(TOPIC, p) for p in assigned], timeout=10)
        report.update(assigned=assigned, consumed=consumed,
                      committed={tp.partition: tp.offset for tp in res}, commits=commits)
    finally:
        c.close()
    return report


def library_versions(lib):
    if lib == "confluent-kafka":
        import confluent_kafka
        return {"client_version": confluent_kafka.__version__,
                "librdkafka_version": confluent_kafka.libversion()[0]}
    mod = __import__({"kafka-python": "kafka", "aiokafka": "aiokafka"}[lib])
    return {"client_version": mod.__version__}


DRIVERS = {"kafka-python": drive_kafka_python, "aiokafka": drive_aiokafka,
           "confluent-kafka": drive_confluent}


def drive_main(argv):
    ap = argparse.ArgumentParser(prog="capture_golden.py drive")
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--seconds", type=float, default=30)
    a = ap.parse_args(argv)
    lib, client_id, opts = SCENARIOS[a.scenario]
    report = library_versions(lib)
    try:
        report.update(DRIVERS[lib](a.bootstrap, client_id, opts, a.seconds))
        report["ok"] = True
    except Exception as e:  # report, don't hide: the orchestrator prints it
        report.update(ok=False, error="%s: %s" % (type(e).__name__, e))
    print(json.dumps(report, default=str), flush=True)


# ----------------------------------------------------------------------------------------------
# Capturing proxy
# ----------------------------------------------------------------------------------------------

class CaptureProxy:
    """Forwards bytes unchanged between clients and one upstream; records frames."""

    def __init__(self, upstream_host, upstream_port):
        self.upstream = (upstream_host, upstream_port)
        self.frames = []          # one dict per request, in arrival order
        self.orphans = []         # responses whose correlation id matched no pending request
        self._seq = itertools.count()
        self._conn_ids = itertools.count(1)
        self._writers = set()
        self.server = None

    async def start(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self):
        if self.server:
            self.server.close()
        for w in list(self._writers):
            w.close()
        if self.server:
            await asyncio.wait_for(self.server.wait_closed(), timeout=5)

    @staticmethod
    async def _read_frame(reader):
        try:
            head = await reader.readexactly(4)
        except asyncio.IncompleteReadError:
            return None, None
        (size,) = struct.unpack(">i", head)
        if size < 0 or size > MAX_FRAME:
            raise ValueError("bad frame size %d" % size)
        return head, await reader.readexactly(size)

    async def _handle(self, c_reader, c_writer):
        conn = next(self._conn_ids)
        try:
            u_reader, u_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 5)
        except (TimeoutError, OSError):
            c_writer.close()
            return
        self._writers.update((c_writer, u_writer))
        pending = {}

        async def requests():
            while True:
                head, body = await self._read_frame(c_reader)
                if head is None:
                    return
                rec = {"seq": next(self._seq), "conn": conn, "t": time.monotonic(),
                       "size": len(body), "request": body, "response": None}
                if len(body) >= 8:
                    pending[body[4:8]] = rec
                self.frames.append(rec)
                u_writer.write(head + body)
                await u_writer.drain()

        async def responses():
            while True:
                head, body = await self._read_frame(u_reader)
                if head is None:
                    return
                rec = pending.pop(body[:4], None)
                if rec is None:
                    self.orphans.append((conn, body))
                else:
                    rec["response"] = body
                    rec["response_size"] = len(body)
                c_writer.write(head + body)
                await c_writer.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(responses())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (c_writer, u_writer):
                w.close()
                self._writers.discard(w)


# ----------------------------------------------------------------------------------------------
# Schema-driven decoder (verification only; independent of the project's codec)
# ----------------------------------------------------------------------------------------------

class DecodeError(Exception):
    pass


def _strip_comments(text):
    out, i, n, in_str = [], 0, len(text), False
    while i < n:
        ch = text[i]
        if in_str:
            out.append(ch)
            if ch == "\\":
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
            out.append(ch)
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _in_range(spec, v):
    if spec is None or spec == "none":
        return False
    if spec.endswith("+"):
        return v >= int(spec[:-1])
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo) <= v <= int(hi)
    return v == int(spec)


def snake(name):
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    s = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", s)
    return s.lower()


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, n):
        if n < 0 or self.p + n > len(self.d):
            raise DecodeError("need %d bytes at %d, have %d" % (n, self.p, len(self.d) - self.p))
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def unpack(self, fmt):
        s = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(s))[0]

    def uvarint(self):
        shift = value = 0
        for _ in range(5):
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise DecodeError("uvarint too long")


_PRIMS = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q", "uint16": ">H",
          "float64": ">d", "bool": ">?"}


class Schema:
    def __init__(self, path):
        with open(path) as f:
            self.j = json.loads(_strip_comments(f.read()))
        self.common = {s["name"]: s["fields"] for s in self.j.get("commonStructs", [])}

    def decode(self, data, version, flexible=None):
        if flexible is None:
            flexible = _in_range(self.j.get("flexibleVersions"), version)
        r = Reader(data)
        out = self._struct(r, self.j["fields"], version, flexible)
        return out, r.p

    def _struct(self, r, fields, v, flex):
        out, tagged = {}, {}
        for f in fields:
            if not _in_range(f["versions"], v):
                continue
            if flex and _in_range(f.get("taggedVersions"), v):
                tagged[f["tag"]] = f
                continue
            out[snake(f["name"])] = self._field(r, f, v, flex)
        if flex:
            for _ in range(r.uvarint()):
                tag, size = r.uvarint(), r.uvarint()
                raw = r.take(size)
                f = tagged.get(tag)
                if f is None:
                    out.setdefault("_unknown_tags", {})[tag] = raw.hex()
                    continue
                sub = Reader(raw)
                out[snake(f["name"])] = self._field(sub, f, v, flex)
                if sub.p != size:
                    raise DecodeError("tagged field %s: %d of %d bytes used" % (f["name"], sub.p, size))
        return out

    def _field(self, r, f, v, flex):
        flex = flex and not f.get("flexibleVersions") == "none"
        nullable = _in_range(f.get("nullableVersions"), v)
        t = f["type"]
        if t.startswith("[]"):
            n = (r.uvarint() - 1) if flex else r.unpack(">i")
            if n < 0:
                if not nullable:
                    raise DecodeError("null array %s" % f["name"])
                return None
            et = t[2:]
            if et in _PRIMS or et in ("string", "bytes", "uuid"):
                return [self._value(r, et, dict(f, nullableVersions=None), v, flex) for _ in range(n)]
            sub = f.get("fields") or self.common[et]
            return [self._struct(r, sub, v, flex) for _ in range(n)]
        if "fields" in f or t in self.common:
            return self._struct(r, f.get("fields") or self.common[t], v, flex)
        return self._value(r, t, f, v, flex)

    def _value(self, r, t, f, v, flex):
        nullable = _in_range(f.get("nullableVersions"), v)
        if t in _PRIMS:
            return r.unpack(_PRIMS[t])
        if t == "uuid":
            return r.take(16).hex()
        if t in ("string", "bytes", "records"):
            if flex:
                n = r.uvarint() - 1
            else:
                n = r.unpack(">h" if t == "string" else ">i")
            if n < 0:
                if not nullable:
                    raise DecodeError("null %s %s" % (t, f["name"]))
                return None
            raw = r.take(n)
            if t == "string":
                try:
                    return raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DecodeError(str(e)) from None
            return raw.hex()
        raise DecodeError("unknown type %s" % t)


class Spec:
    def __init__(self, spec_dir):
        self.dir = spec_dir
        self.flexible_from, self.max_version = {}, {}
        with open(os.path.join(spec_dir, "api_keys.tsv")) as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        hdr = rows[0]
        for row in rows[1:]:
            d = dict(zip(hdr, row, strict=False))
            ff = d["first_flexible_version"]
            self.flexible_from[int(d["api_key"])] = None if ff == "none" else int(ff)
            self.max_version[int(d["api_key"])] = int(d["max_version"])
            API_NAMES.setdefault(int(d["api_key"]), d["name"])
        self._schemas = {}
        for fn in os.listdir(os.path.join(spec_dir, "messages")):
            if fn.endswith(".json"):
                s = Schema(os.path.join(spec_dir, "messages", fn))
                if "apiKey" in s.j:
                    self._schemas[(s.j["apiKey"], s.j["type"])] = s
                else:
                    self._schemas[s.j["name"]] = s

    def flexible(self, api_key, version):
        ff = self.flexible_from.get(api_key)
        return ff is not None and version >= ff

    def request_header_version(self, api_key, version):
        return 2 if self.flexible(api_key, version) else 1

    def response_header_version(self, api_key, version):
        if api_key == 18:
            return 0
        return 1 if self.flexible(api_key, version) else 0

    def schema(self, api_key, kind):
        return self._schemas.get((api_key, kind))

    def header_schema(self, kind):
        return self._schemas["RequestHeader" if kind == "request" else "ResponseHeader"]


def parse_request_header(frame):
    """api_key, api_version, correlation_id, client_id (int16-length string, nullable)."""
    if len(frame) < 10:
        raise DecodeError("request header too short")
    api_key, api_version, corr, clen = struct.unpack(">hhih", frame[:10])
    client_id = None
    if clen >= 0:
        if 10 + clen > len(frame):
            raise DecodeError("client id overruns frame")
        client_id = frame[10:10 + clen].decode("utf-8")
    return api_key, api_version, corr, client_id, 10 + max(clen, 0)


def decode_frame(spec, frame, kind, api_key, api_version):
    """Decode header + body; returns (header, body or None, note). Raises DecodeError."""
    hv = (spec.request_header_version if kind == "request" else spec.response_header_version)(
        api_key, api_version)
    header, used = spec.header_schema(kind).decode(frame, hv, flexible=hv >= (2 if kind == "request" else 1))
    schema = spec.schema(api_key, kind)
    if schema is None:
        return header, None, "no schema for api %d in kafka-spec" % api_key
    if api_version > spec.max_version.get(api_key, -1):
        return header, None, "version beyond kafka-spec (max v%d)" % spec.max_version.get(api_key, -1)
    ver = api_version
    body, n = schema.decode(frame[used:], ver)
    if used + n != len(frame):
        raise DecodeError("%d trailing bytes" % (len(frame) - used - n))
    return header, body, None


def matches(expect, actual):
    """dict: every expected key present and matching; list: same length, elementwise."""
    if isinstance(expect, dict):
        return isinstance(actual, dict) and all(k in actual and matches(v, actual[k])
                                                 for k, v in expect.items())
    if isinstance(expect, list):
        return (isinstance(actual, list) and len(expect) == len(actual)
                and all(matches(e, a) for e, a in zip(expect, actual, strict=True)))
    return expect == actual


# ----------------------------------------------------------------------------------------------
# Expected values, from how each scenario drove its client
# ----------------------------------------------------------------------------------------------

def request_expect(api_key, ver, body, ctx):
    """Known request fields.  `body` (decoded) is used only to pick which of the known
    alternatives this frame is (e.g. which commit, list order as sent); every value
    written here comes from the scenario, and a frame that disagrees is reported."""
    e = {}
    inst = ctx["group_instance_id"]
    if api_key == 10:  # FindCoordinator
        if ver >= 4:
            e.update(key_type=0, coordinator_keys=[GROUP])
        else:
            e["key"] = GROUP
            if ver >= 1:
                e["key_type"] = 0
    elif api_key == 11:  # JoinGroup
        if ctx["first_join"]:  # a fresh consumer joins without a member id
            e["member_id"] = ""
        e.update(group_id=GROUP, session_timeout_ms=SESSION_TIMEOUT_MS, protocol_type="consumer",
                 protocols=[{"name": n} for n in ctx["assignors"]])
        if ver >= 1:
            e["rebalance_timeout_ms"] = MAX_POLL_INTERVAL_MS
        if ver >= 5:
            e["group_instance_id"] = inst
    elif api_key == 14:  # SyncGroup
        e["group_id"] = GROUP
        if ver >= 3:
            e["group_instance_id"] = inst
        if ver >= 5:
            e.update(protocol_type="consumer", protocol_name=ctx["assignors"][0])
    elif api_key == 12:  # Heartbeat
        e["group_id"] = GROUP
        if ver >= 3:
            e["group_instance_id"] = inst
    elif api_key == 13:  # LeaveGroup
        e["group_id"] = GROUP
        if ver >= 3:
            e["members"] = [{"group_instance_id": inst}]
    elif api_key == 8:  # OffsetCommit
        e["group_id"] = GROUP
        if ver >= 7:
            e["group_instance_id"] = inst
        # Which of the two known commits is this?  Pick by metadata; values come from the plan.
        parts = [p["partition_index"] for t in (body or {}).get("topics") or [] for p in t["partitions"]]
        metas = {p.get("committed_metadata") for t in (body or {}).get("topics") or []
                 for p in t["partitions"]}
        first = ctx["commit_metadata"] in metas
        commit = ctx["commits"][0] if first else ctx["commits"][-1]
        meta = ctx["commit_metadata"] if first else commit["metadata"]
        if sorted(parts) == ctx["assigned"]:  # listed in the order sent
            e["topics"] = [{"name": TOPIC, "partitions": [
                {"partition_index": p, "committed_offset": commit["offset"],
                 "committed_metadata": meta} for p in parts]}]
    elif api_key == 9:  # OffsetFetch
        if ver >= 8:
            e["groups"] = [{"group_id": GROUP, "topics": [{"name": TOPIC}]}]
        else:
            e.update(group_id=GROUP, topics=[{"name": TOPIC}])
    elif api_key == 3:  # Metadata: either all topics (null / empty) or our topic
        names = [t.get("name") for t in (body or {}).get("topics") or []]
        if names:
            e["topics"] = [{"name": TOPIC}]
    elif api_key == 2:  # ListOffsets: no committed offsets yet, auto.offset.reset=earliest (-2)
        parts = [p["partition_index"] for t in (body or {}).get("topics") or [] for p in t["partitions"]]
        e["topics"] = [{"name": TOPIC}]
        if ver >= 1 and set(parts) <= set(ctx["assigned"]):
            e["topics"][0]["partitions"] = [{"partition_index": p, "timestamp": -2} for p in parts]
    elif api_key == 1:  # Fetch
        if ver < 15:
            e["replica_id"] = -1
        if ver < 13:
            e["topics"] = [{"topic": TOPIC}]
    elif api_key == 18 and ver >= 3:
        e.update(client_software_name=ctx["software_name"],
                 client_software_version=ctx["software_version"])
    return e


def response_expect(api_key, ver, body, ctx, request_body):
    e = {}
    port = ctx["port"]
    if api_key == 18:
        e["error_code"] = 0
    elif api_key == 10:
        if ver >= 4:
            e["coordinators"] = [{"key": GROUP, "node_id": 1, "host": "127.0.0.1", "port": port,
                                  "error_code": 0}]
        else:
            e.update(error_code=0, node_id=1, host="127.0.0.1", port=port)
    elif api_key == 3:
        e["brokers"] = [{"node_id": 1, "host": "127.0.0.1", "port": port}]
        if (request_body or {}).get("topics"):
            e["topics"] = [{"error_code": 0, "name": TOPIC,
                            "partitions": [{"error_code": 0} for _ in range(PARTITIONS)]}]
    elif api_key == 11:
        # (the mock does not answer a dynamic member's first v4+ join with MEMBER_ID_REQUIRED)
        e.update(error_code=0, protocol_name=ctx["assignors"][0])
        if ver >= 7:
            e["protocol_type"] = "consumer"
    elif api_key in (12, 13, 14):
        e["error_code"] = 0
    elif api_key == 8:
        e["topics"] = [{"name": TOPIC, "partitions": [{"error_code": 0} for _ in ctx["assigned"]]}]
    elif api_key == 9:  # OffsetFetch: nothing committed yet, or the last commit (offset 3, "")
        def parts_of(topics):
            return [p["partition_index"] for t in topics or [] for p in t["partitions"]]
        topics = ((body or {}).get("groups") or [{}])[0].get("topics") if ver >= 8 else (body or {}).get("topics")
        parts = parts_of(topics)
        if ctx["commits_before"] >= len(ctx["commits"]):
            last = ctx["commits"][-1]
            want = [{"partition_index": p, "committed_offset": last["offset"], "metadata": last["metadata"],
                     "error_code": 0} for p in parts]
        elif ctx["commits_before"] == 0:
            want = [{"partition_index": p, "committed_offset": -1, "error_code": 0} for p in parts]
        else:
            want = None
        if want is not None and set(parts) <= set(ctx["assigned"]):
            t = [{"name": TOPIC, "partitions": want}]
            if ver >= 8:
                e["groups"] = [{"group_id": GROUP, "error_code": 0, "topics": t}]
            else:
                e["topics"] = t
                if ver >= 2:
                    e["error_code"] = 0
    elif api_key == 2 and ver >= 1:  # ListOffsets: fresh topic, log start offset 0
        parts = [p["partition_index"] for t in (body or {}).get("topics") or [] for p in t["partitions"]]
        e["topics"] = [{"name": TOPIC, "partitions": [
            {"partition_index": p, "error_code": 0, "offset": 0} for p in parts]}]
    elif api_key == 1:  # Fetch: every partition holds RECORDS_PER_PARTITION records
        parts = [p["partition_index"] for t in (body or {}).get("responses") or [] for p in t["partitions"]]
        e["responses"] = [{"partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": RECORDS_PER_PARTITION}
            for p in parts]}]
        if ver < 13:  # v13+ names the topic by id
            e["responses"][0]["topic"] = TOPIC
    return e


# ----------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------

def load_mock_module(tools_dir):
    sys.path.insert(0, tools_dir)
    try:
        import mock_cluster
    finally:
        sys.path.remove(tools_dir)
    return mock_cluster


def seed_topic(bootstrap):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "client.id": "golden-seed", "linger.ms": 0})
    for part in range(PARTITIONS):
        for i in range(RECORDS_PER_PARTITION):
            p.produce(TOPIC, key=b"k%d-%d" % (part, i), value=b"golden-%d-%d" % (part, i), partition=part)
    left = p.flush(10)
    if left:
        raise RuntimeError("seed producer: %d records not delivered" % left)


async def run_scenario(name, mock_mod, seconds):
    lib, client_id, opts = SCENARIOS[name]
    mc = mock_mod.MockCluster(1)
    proxy = None
    try:
        mc.set_initial_rebalance_delay_ms(0)
        mc.create_topic(TOPIC, PARTITIONS)
        real_host, real_port = mc.bootstrap.split(",")[0].rsplit(":", 1)
        seed_topic(mc.bootstrap)  # before the proxy exists: not captured
        proxy = CaptureProxy(real_host, int(real_port))
        port = await proxy.start()
        mc.set_advertised(1, "127.0.0.1", port)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.abspath(__file__), "drive", name,
            "--bootstrap", "127.0.0.1:%d" % port, "--seconds", str(seconds),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=seconds + 30)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            out = out + b'\n{"ok": false, "error": "driver timed out"}'
        lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.startswith("{")]
        report = json.loads(lines[-1]) if lines else {"ok": False, "error": "no report"}
        report["stderr_tail"] = err.decode("utf-8", "replace")[-2000:]
        await asyncio.sleep(0.2)  # let in-flight responses reach the proxy
    finally:
        if proxy:
            await proxy.stop()
        mc.close()
    return report, proxy.frames, port, proxy.orphans


def select_frames(frames):
    """First KEEP_PER_API_VERSION of each (api, version), plus the first OffsetFetch after the
    last OffsetCommit (it shows committed offsets); cap MAX_FRAMES keeping core APIs."""
    frames = sorted(frames, key=lambda f: f["seq"])
    commits = [f["seq"] for f in frames if struct.unpack(">h", f["request"][:2])[0] == 8]
    seen, kept, fetched_after_commit = {}, [], False
    for f in frames:
        key = struct.unpack(">hh", f["request"][:4])
        seen[key] = seen.get(key, 0) + 1
        after = key[0] == 9 and commits and f["seq"] > commits[-1] and not fetched_after_commit
        if after:
            fetched_after_commit = True
        if seen[key] <= KEEP_PER_API_VERSION or after:
            kept.append(f)
    while len(kept) > MAX_FRAMES:
        victims = [f for f in kept if struct.unpack(">h", f["request"][:2])[0] not in CORE_APIS]
        if not victims:
            break
        kept.remove(victims[-1])
    return kept


def software_name(lib):
    return {"kafka-python": "kafka-python", "aiokafka": "aiokafka",
            "confluent-kafka": "confluent-kafka-python"}[lib]


def software_version(lib, report):
    if lib == "confluent-kafka":
        return "%s-rdkafka-%s" % (report.get("client_version"), report.get("librdkafka_version"))
    return report.get("client_version")


def write_scenario(spec, name, report, frames, port, out_dir, problems):
    lib, client_id, opts = SCENARIOS[name]
    ctx = {"port": port, "assigned": report.get("assigned") or [], "commits": report.get("commits") or [{}],
           "group_instance_id": opts.get("group_instance_id"), "software_name": software_name(lib),
           "assignors": AIOKAFKA_ASSIGNORS if lib == "aiokafka" else ASSIGNORS,
           # confluent-kafka-python sends TopicPartition metadata with its C string's NUL
           "commit_metadata": COMMIT_METADATA + ("\x00" if lib == "confluent-kafka" else "")}
    version = report.get("client_version")
    if lib == "confluent-kafka" and report.get("librdkafka_version"):
        version = "%s (librdkafka %s)" % (version, report["librdkafka_version"])
    sdir = os.path.join(out_dir, name)
    if os.path.isdir(sdir):
        shutil.rmtree(sdir)
    os.makedirs(sdir)
    entries = []
    mine = [f for f in frames if parse_request_header(f["request"])[3] == client_id]
    others = len(frames) - len(mine)
    if others:
        problems.append("%s: %d frames with another client id ignored" % (name, others))
    join_seqs = [f["seq"] for f in mine if parse_request_header(f["request"])[0] == 11]
    commit_seqs = [f["seq"] for f in mine
                   if parse_request_header(f["request"])[0] == 8 and f["response"] is not None]
    ctx["software_version"] = software_version(lib, report)
    for n, f in enumerate(select_frames(mine), start=1):
        api_key, ver, corr, cid, _ = parse_request_header(f["request"])
        ctx["first_join"] = bool(join_seqs) and f["seq"] == join_seqs[0]
        ctx["commits_before"] = sum(1 for q in commit_seqs if q < f["seq"])
        assert f["size"] == len(f["request"])
        api = API_NAMES.get(api_key, "Api%d" % api_key)
        base = "%03d_%s_v%d" % (n, api, ver)
        rq_body = None
        for direction in ("request", "response"):
            raw = f[direction]
            if raw is None:
                if direction == "response":
                    problems.append("%s %s: no response captured" % (name, base))
                continue
            if direction == "response" and api_key == 1 and len(raw) > MAX_FETCH_RESPONSE:
                continue
            fn = base + (".bin" if direction == "request" else ".response.bin")
            entry = {"file": "%s/%s" % (name, fn), "client": lib, "client_version": version,
                     "scenario": name, "direction": direction, "api_key": api_key, "api_name": api,
                     "api_version": ver, "correlation_id": corr, "client_id": cid,
                     "header_version": (spec.request_header_version if direction == "request"
                                        else spec.response_header_version)(api_key, ver),
                     "size": len(raw), "spec_max_version": spec.max_version.get(api_key),
                     "beyond_spec": ver > spec.max_version.get(api_key, -1)}
            if direction == "response":
                (rcorr,) = struct.unpack(">i", raw[:4])
                if rcorr != corr:
                    problems.append("%s: correlation id mismatch %d != %d" % (fn, rcorr, corr))
            try:
                header, body, note = decode_frame(spec, raw, direction, api_key, ver)
                entry["decoded_by_capture_tool"] = body is not None
                if note:
                    entry["note"] = note
            except DecodeError as e:
                if direction == "response":  # a mock defect: not a fixture
                    problems.append("%s/%s: mock response does not decode (%s), not saved: %s"
                                    % (name, fn, e, raw.hex()[:120]))
                    continue
                raise RuntimeError("%s/%s: client request does not decode: %s" % (name, fn, e)) from None
            if direction == "request":
                rq_body = body
                expect = request_expect(api_key, ver, body, ctx)
            else:
                expect = response_expect(api_key, ver, body, ctx, rq_body)
            entry["expect"] = expect
            if body is not None and not matches(expect, body):
                problems.append("%s/%s: expect %s but decoded %s" % (name, fn, json.dumps(expect),
                                                                   json.dumps(body)[:600]))
            with open(os.path.join(sdir, fn), "wb") as fh:
                fh.write(raw)
            entries.append(entry)
    return entries


def sanity_check(out_dir, entries, spec):
    """Re-read every written file: header parses and size matches the manifest."""
    bad = []
    for e in entries:
        with open(os.path.join(out_dir, e["file"]), "rb") as fh:
            raw = fh.read()
        if len(raw) != e["size"]:
            bad.append("%s: size %d != %d" % (e["file"], len(raw), e["size"]))
        if e["direction"] == "request":
            k, v, c, cid, _ = parse_request_header(raw)
            if (k, v, c, cid) != (e["api_key"], e["api_version"], e["correlation_id"], e["client_id"]):
                bad.append("%s: header mismatch" % e["file"])
        else:
            if struct.unpack(">i", raw[:4])[0] != e["correlation_id"]:
                bad.append("%s: response correlation id mismatch" % e["file"])
    return bad


async def main_async(a):
    spec = Spec(os.path.join(a.shared, "kafka-spec"))
    mock_mod = load_mock_module(os.path.join(a.shared, "tools"))
    out_dir = os.path.abspath(a.out)
    manifest_path = os.path.join(out_dir, "manifest.json")
    entries = []
    if os.path.exists(manifest_path) and a.scenario:
        with open(manifest_path) as fh:  # keep other scenarios' entries on a partial re-run
            entries = [e for e in json.load(fh) if e.get("scenario") not in a.scenario]
    problems, summary = [], {}
    for name in a.scenario or list(SCENARIOS):
        t0 = time.monotonic()
        report, frames, port, orphans = await run_scenario(name, mock_mod, a.seconds)
        dt = time.monotonic() - t0
        if orphans:
            problems.append("%s: %d responses without a matching request" % (name, len(orphans)))
        if not report.get("ok"):
            tail = "" if SCENARIOS[name][2].get("may_fail") else report.get("stderr_tail", "")[-800:]
            problems.append("%s: client failed: %s\n%s" % (name, report.get("error"), tail))
        print("== %s: %d frames captured in %.1fs, report=%s" % (
            name, len(frames), dt, json.dumps({k: v for k, v in report.items() if k != "stderr_tail"})),
            flush=True)
        if a.dry_run:
            for f in frames:
                k, v, c, cid, _ = parse_request_header(f["request"])
                print("   conn%d %-28s v%-2d corr=%-4d %s resp=%s" % (
                    f["conn"], API_NAMES.get(k, k), v, c, cid,
                    None if f["response"] is None else len(f["response"])))
            continue
        if not report.get("ok") and not (a.keep_failed or SCENARIOS[name][2].get("may_fail")):
            continue
        new = write_scenario(spec, name, report, frames, port, out_dir, problems)
        entries.extend(new)
        summary[name] = sorted({(e["api_name"], e["api_version"]) for e in new})
    if not a.dry_run:
        entries.sort(key=lambda e: e["file"])
        os.makedirs(out_dir, exist_ok=True)
        with open(manifest_path, "w") as fh:
            json.dump(entries, fh, indent=1, sort_keys=True)
            fh.write("\n")
        problems.extend(sanity_check(out_dir, entries, spec))
        for name, pairs in summary.items():
            print("%s: %s" % (name, ", ".join("%s v%d" % p for p in pairs)))
    for p in problems:
        print("PROBLEM: " + p, file=sys.stderr)
    hard = [p for p in problems if ("client failed" in p and not any(
        p.startswith(n + ":") and SCENARIOS[n][2].get("may_fail") for n in SCENARIOS))
        or ": expect " in p or "mismatch" in p]
    return 1 if hard else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        return drive_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                    help="run only these (repeatable); default all")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--shared", default=SHARED, help="path to shared/ (kafka-spec, tools)")
    ap.add_argument("--seconds", type=float, default=30, help="time budget for one client session")
    ap.add_argument("--dry-run", action="store_true", help="print what was captured, write nothing")
    ap.add_argument("--keep-failed", action="store_true", help="write frames of a failed session too")
    a = ap.parse_args()
    return asyncio.run(main_async(a))


if __name__ == "__main__":
    sys.exit(main())
