"""KafkaJS (Node.js, pure JS, its own wire protocol code) against the real herd daemon.

Each member is a child `node js/member.js` process running an unmodified KafkaJS consumer: it
prints a "state" JSON line (assignment, generation, member id) on every GROUP_JOIN event, plus
everything KafkaJS logs at WARN or above; stdin commands drive commits and admin calls. The
consumers run `consumer.run()`, so their whole loop (Metadata, ListOffsets, Fetch answered with no
records, Heartbeat) talks to herd, and the test fails on any log line KafkaJS would not print
against a healthy Kafka broker.

KafkaJS 2.x notes: its only default assignor is RoundRobinAssigner; sessionTimeout must be at least
herd's group.min.session.timeout.ms (6000, as Kafka's); heartbeats are sent from the fetch loop.

KafkaJS is installed by `make conformance-deps` (npm ci in tests/conformance/js). Without `node`
these tests skip; with node but without the npm packages they fail and say how to install them.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conformance.harness import (
    HEARTBEAT_MS,
    MAX_POLL_MS,
    SESSION_MS,
    Member,
    all_partitions,
    create_topic,
    herd_warnings,
    wait_converged,
    wait_until,
)
from tools.daemon import REPO

pytestmark = pytest.mark.conformance

JS_DIR = Path(__file__).with_name("js")
MEMBER_JS = JS_DIR / "member.js"
JOIN_TIMEOUT = 30.0
KILL_MARGIN = 6.0  # see test_groups.py: the survivors rejoin on their next heartbeat after expiry
UNKNOWN = "no-such-group"

if shutil.which("node") is None:
    pytest.skip("node not installed", allow_module_level=True)

KAFKAJS_PACKAGE = JS_DIR / "node_modules" / "kafkajs" / "package.json"
_printed_version = False


def require_kafkajs() -> None:
    """Each test's first line: with node but without KafkaJS the test fails (not skips)."""
    if not KAFKAJS_PACKAGE.exists():
        pytest.fail("KafkaJS is not installed: run `make conformance-deps` "
                    f"(or `cd {JS_DIR.relative_to(REPO)} && npm ci`); needs npm", pytrace=False)


@pytest.fixture(autouse=True)
def kafkajs_version(capsys):
    """Print the KafkaJS and node versions once."""
    global _printed_version
    if not KAFKAJS_PACKAGE.exists():
        return None
    version = json.loads(KAFKAJS_PACKAGE.read_text())["version"]
    if not _printed_version:
        _printed_version = True
        node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
        with capsys.disabled():
            print(f"\n[kafkajs {version}, node {node}] ", end="")
    return version


# KafkaJS logs every error response at ERROR ("Response Heartbeat(key: 12, ...)") and the rejoin
# at WARN. During a rebalance these are the protocol working as designed; anything else is not.
# SyncGroup: members starting together (initial delay 0) form generation 1 with whoever joined
# first; the next join moves the group back to PreparingRebalance, and a SyncGroup that arrives
# then gets REBALANCE_IN_PROGRESS, as from Kafka.
EXPECTED_LOGS = [
    ("ERROR", "Connection", r"Response (Heartbeat|OffsetCommit|SyncGroup)\(", r"The group is rebalancing"),
    ("WARN", "Runner", r"The group is rebalancing, re-joining$", None),
]


# A member that was frozen past its session timeout learns it was expelled from its next heartbeat.
EXPELLED_LOGS = [
    ("ERROR", "Connection", r"Response Heartbeat\(", r"The coordinator is not aware of this member"),
    ("ERROR", "Runner", r"The coordinator is not aware of this member, re-joining the group$", None),
]


def unexpected_logs(events: list[dict], expected=tuple(EXPECTED_LOGS)) -> list[dict]:
    out = []
    for ev in events:
        if ev["ev"] in ("crash", "fatal"):
            out.append(ev)
        if ev["ev"] != "log":
            continue
        for level, namespace, message, error in expected:
            if (ev["level"] == level and ev["namespace"] == namespace and re.search(message, ev["message"])
                    and (error is None or re.search(error, str(ev["extra"].get("error"))))):
                break
        else:
            out.append(ev)
    return out


class JsMember(Member):
    """A `node member.js` child process; the harness's views (state, partitions, describe) and
    controls (stop = SIGTERM and clean disconnect, kill = SIGKILL) work unchanged."""

    def __init__(self, tmp_path: Path, bootstrap: str, name: str, *, mode: str = "consumer",
                 group: str | None = None, topics: list[str] | None = None):
        self.name = name
        self.client = "kafkajs"
        cfg = dict(mode=mode, bootstrap=bootstrap, name=name, group=group, topics=topics or [],
                   session_ms=SESSION_MS, heartbeat_ms=HEARTBEAT_MS, rebalance_ms=MAX_POLL_MS)
        self.stderr_path = tmp_path / f"member-{name}.stderr"
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(["node", str(MEMBER_JS), json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, cwd=str(JS_DIR))
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 0

    def _read(self) -> None:
        # Also keep every line in tmp_path (member-<name>.events) for post-mortems.
        with open(self.stderr_path.with_suffix(".events"), "ab", buffering=0) as log:
            for line in self.proc.stdout:
                log.write(line)
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                with self._lock:
                    self.events.append(ev)

    def call(self, op: str, timeout: float = 20.0, **fields):
        """Send one stdin command and wait for its reply: (ok, result or error)."""
        self._next_id += 1
        cid = self._next_id
        self.proc.stdin.write((json.dumps({"id": cid, "op": op, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        reply = wait_until(
            lambda: next((ev for ev in self.snapshot() if ev["ev"] == "reply" and ev["id"] == cid), None),
            timeout, lambda: f"{self.name} to answer {op}: {self.snapshot()[-5:]} {self.stderr_tail()}")
        return (reply["ok"], reply["result"] if reply["ok"] else reply["error"])

    def ok(self, op: str, **fields):
        ok, value = self.call(op, **fields)
        assert ok, f"{self.name} {op} {fields}: {value}"
        return value

    def wait_started(self, timeout: float = 15.0) -> None:
        wait_until(lambda: any(ev["ev"] == "start" for ev in self.snapshot()), timeout,
                   lambda: f"{self.name} to start: {self.snapshot()} {self.stderr_tail()}")

    def problems(self, also_expected=()) -> list[dict]:
        return unexpected_logs(self.snapshot(), (*EXPECTED_LOGS, *also_expected))

    def logged(self, pattern: str) -> bool:
        return any(ev["ev"] == "log" and re.search(pattern, ev["message"]) for ev in self.snapshot())

    def fetches(self) -> int:
        return max((ev["n"] for ev in self.snapshot() if ev["ev"] == "fetch"), default=0)


def start(members, tmp_path, bootstrap, name, **kwargs) -> JsMember:
    m = JsMember(tmp_path, bootstrap, name, **kwargs)
    members.all.append(m)  # killed at teardown with the rest
    return m


def assert_clean(ms) -> None:
    for m in ms:
        problems = m.problems()
        assert not problems, f"{m.name}: KafkaJS logged unexpected warnings/errors:\n" + "\n".join(
            json.dumps(ev) for ev in problems)




def kp_admin(bootstrap):
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)


def test_kafkajs_three_members_converge_survive_leave_and_sigkill(herd, members, tmp_path):
    """3 KafkaJS consumers split a 6-partition topic; a clean disconnect and a SIGKILL rebalance;
    the consume loop (Fetch with no records) runs throughout with nothing unexpected logged."""
    require_kafkajs()
    topic, group = "js-orders", "js-lifecycle"
    create_topic(herd.bootstrap, topic, 6)
    expected = all_partitions(topic, 6)
    ms = [start(members, tmp_path, herd.bootstrap, f"js-{i}", group=group, topics=[topic])
          for i in range(3)]

    gen1 = wait_converged(ms, expected, JOIN_TIMEOUT)
    assert all(len(m.partitions()) == 2 for m in ms), [m.describe() for m in ms]
    assert {m.state()["protocol"] for m in ms} == {"RoundRobinAssigner"}
    leaders = {m.state()["leader_id"] for m in ms}
    assert len(leaders) == 1 and leaders <= {m.state()["member_id"] for m in ms}
    # The consume loop runs: each member keeps fetching (herd answers with no records).
    counts = [m.fetches() for m in ms]
    wait_until(lambda: all(m.fetches() >= c + 3 for m, c in zip(ms, counts, strict=True)), 10,
               lambda: f"fetches to continue past {counts}: {[m.fetches() for m in ms]}")

    # Clean disconnect: LeaveGroup, so the others rebalance at once, not after a session timeout.
    leaver, ms = ms[0], ms[1:]
    t0 = time.monotonic()
    assert leaver.stop() == 0, leaver.stderr_tail()
    assert any(ev["ev"] == "closed" for ev in leaver.snapshot())
    gen2 = wait_converged(ms, expected, JOIN_TIMEOUT)
    leave_s = time.monotonic() - t0
    assert gen2 > gen1
    assert leave_s < SESSION_MS / 1000, f"rebalance after disconnect took {leave_s:.1f}s"
    assert sorted(len(m.partitions()) for m in ms) == [3, 3]

    # SIGKILL: herd expires the member after sessionTimeout and the survivor gets everything.
    victim, ms = ms[0], ms[1:]
    t0 = time.monotonic()
    victim.kill()
    gen3 = wait_converged(ms, expected, SESSION_MS / 1000 + KILL_MARGIN)
    kill_s = time.monotonic() - t0
    assert gen3 > gen2
    assert kill_s > SESSION_MS / 1000 * 0.5, f"group rebalanced {kill_s:.1f}s after the kill"
    admin = kp_admin(herd.bootstrap)
    try:
        described = admin.describe_groups([group])[group]
    finally:
        admin.close()
    assert (described["group_state"], described["protocol_data"]) == ("Stable", "RoundRobinAssigner")
    assert [mm["member_id"] for mm in described["members"]] == [ms[0].state()["member_id"]]
    assert [mm["client_id"] for mm in described["members"]] == ["js-2"]

    assert ms[0].stop() == 0, ms[0].stderr_tail()
    assert_clean([leaver, victim, *ms])
    assert herd_warnings(herd) == []


def test_kafkajs_frozen_member_is_expelled_and_rejoins(herd, members, tmp_path):
    """A KafkaJS member frozen (SIGSTOP) past its session timeout is expelled; the others
    rebalance without it. Thawed, its next heartbeat gets UNKNOWN_MEMBER_ID and it rejoins with a
    new member id, and the three converge again."""
    require_kafkajs()
    topic, group = "js-frozen", "js-frozen"
    create_topic(herd.bootstrap, topic, 6)
    expected = all_partitions(topic, 6)
    ms = [start(members, tmp_path, herd.bootstrap, f"js-f{i}", group=group, topics=[topic])
          for i in range(3)]
    gen1 = wait_converged(ms, expected, JOIN_TIMEOUT)
    frozen, others = ms[0], ms[1:]
    old_id = frozen.state()["member_id"]

    t0 = time.monotonic()
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        gen2 = wait_converged(others, expected, SESSION_MS / 1000 + KILL_MARGIN)
        assert time.monotonic() - t0 > SESSION_MS / 1000 * 0.5
        assert gen2 > gen1
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    gen3 = wait_converged(ms, expected, JOIN_TIMEOUT)
    assert gen3 > gen2
    assert frozen.state()["member_id"] != old_id
    assert frozen.logged(r"The coordinator is not aware of this member, re-joining the group")

    admin = kp_admin(herd.bootstrap)
    try:
        described = admin.describe_groups([group])[group]
    finally:
        admin.close()
    assert described["group_state"] == "Stable"
    assert sorted(mm["member_id"] for mm in described["members"]) == sorted(
        m.state()["member_id"] for m in ms)
    for m in ms:
        assert m.stop() == 0, m.stderr_tail()
    problems = frozen.problems(EXPELLED_LOGS)
    assert not problems, "the thawed member logged unexpected errors:\n" + "\n".join(map(json.dumps, problems))
    assert_clean(others)
    assert herd_warnings(herd) == []


def test_kafkajs_commit_offsets_read_back_by_kafkajs_and_kafka_python(herd, members, tmp_path):
    """consumer.commitOffsets (OffsetCommit with the member's generation) is durable and visible
    to KafkaJS admin.fetchOffsets and to kafka-python's admin client, metadata included."""
    require_kafkajs()
    from kafka import TopicPartition

    topic, group = "js-commits", "js-commits"
    create_topic(herd.bootstrap, topic, 4)
    ms = [start(members, tmp_path, herd.bootstrap, f"js-c{i}", group=group, topics=[topic])
          for i in range(2)]
    wait_converged(ms, all_partitions(topic, 4), JOIN_TIMEOUT)

    # One member commits for every partition (the broker does not check ownership; Kafka neither).
    ms[0].ok("commit", offsets=[
        {"topic": topic, "partition": 0, "offset": "42"},
        {"topic": topic, "partition": 1, "offset": "7", "metadata": "batch-7"},
        {"topic": topic, "partition": 3, "offset": "9007199254740993"},  # > 2^53: a JS Long
    ])
    # The other commits its own partitions afterwards; a later commit for partition 0 wins.
    ms[1].ok("commit", offsets=[{"topic": topic, "partition": 0, "offset": "43"}])

    admin = start(members, tmp_path, herd.bootstrap, "js-admin", mode="admin")
    admin.wait_started()
    fetched = admin.ok("fetchOffsets", args={"groupId": group, "topics": [topic]})
    assert len(fetched) == 1 and fetched[0]["topic"] == topic, fetched
    by_partition = {p["partition"]: (p["offset"], p["metadata"]) for p in fetched[0]["partitions"]}
    assert by_partition == {0: ("43", None), 1: ("7", "batch-7"), 2: ("-1", None),
                            3: ("9007199254740993", None)}, fetched

    kp = kp_admin(herd.bootstrap)
    try:
        offsets = kp.list_group_offsets({group: None})[group]
        assert {tp.partition: (om.offset, om.metadata) for tp, om in offsets.items()} == {
            0: (43, ""), 1: (7, "batch-7"), 3: (9007199254740993, "")}, offsets
        some = kp.list_group_offsets({group: [TopicPartition(topic, 1)]})[group]
        assert {tp.partition: om.offset for tp, om in some.items()} == {1: 7}
    finally:
        kp.close()

    # Committed offsets outlive the members: after both disconnect (group Empty) they remain.
    for m in ms:
        assert m.stop() == 0, m.stderr_tail()
    fetched = admin.ok("fetchOffsets", args={"groupId": group, "topics": [topic]})
    assert {p["partition"]: p["offset"] for p in fetched[0]["partitions"]}[0] == "43"
    assert admin.stop() == 0, admin.stderr_tail()
    assert_clean([*ms, admin])
    assert herd_warnings(herd) == []


def test_kafkajs_admin_list_describe_delete_groups(herd, members, tmp_path):
    """KafkaJS admin: listGroups, describeGroups (live group in full, unknown group Dead), and
    deleteGroups with Kafka's errors (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND), then for real."""
    require_kafkajs()
    topic, group = "js-admin-topic", "js-admin"
    create_topic(herd.bootstrap, topic, 4)
    ms = [start(members, tmp_path, herd.bootstrap, f"js-a{i}", group=group, topics=[topic])
          for i in range(2)]
    wait_converged(ms, all_partitions(topic, 4), JOIN_TIMEOUT)
    ms[0].ok("commit", offsets=[{"topic": topic, "partition": 2, "offset": "5"}])
    admin = start(members, tmp_path, herd.bootstrap, "js-admin", mode="admin")
    admin.wait_started()

    listed = {g["groupId"]: g for g in admin.ok("listGroups")["groups"]}
    assert listed[group]["protocolType"] == "consumer", listed

    groups = {g["groupId"]: g for g in admin.ok("describeGroups", args=[group, UNKNOWN])["groups"]}
    g = groups[group]
    assert (g["errorCode"], g["state"], g["protocolType"], g["protocol"]) == (
        0, "Stable", "consumer", "RoundRobinAssigner"), g
    assert sorted(mm["clientId"] for mm in g["members"]) == ["js-a0", "js-a1"]
    assert sorted(mm["memberId"] for mm in g["members"]) == sorted(m.state()["member_id"] for m in ms)
    assigned = set()
    for mm in g["members"]:
        assert mm["clientHost"].endswith("127.0.0.1"), mm
        assert mm["memberMetadata"]["topics"] == [topic], mm
        mine = {(t, p) for t, ps in mm["memberAssignment"]["assignment"].items() for p in ps}
        owner = next(m for m in ms if m.state()["member_id"] == mm["memberId"])
        assert mine == owner.partitions(), (mm, owner.describe())
        assigned |= mine
    assert assigned == all_partitions(topic, 4)
    dead = groups[UNKNOWN]
    assert (dead["errorCode"], dead["state"], dead["members"]) == (0, "Dead", []), dead

    # DeleteGroups: refused while members are in the group; an unknown group is not found.
    ok, err = admin.call("deleteGroups", args=[group, UNKNOWN])
    assert not ok and err["name"] == "KafkaJSDeleteGroupsError", err
    assert {e["groupId"]: e["type"] for e in err["groups"]} == {
        group: "NON_EMPTY_GROUP", UNKNOWN: "GROUP_ID_NOT_FOUND"}, err

    for m in ms:
        assert m.stop() == 0, m.stderr_tail()
    wait_until(lambda: admin.ok("describeGroups", args=[group])["groups"][0]["state"] == "Empty", 10,
               lambda: f"{group} to be Empty: {admin.ok('describeGroups', args=[group])}")
    assert group in {g["groupId"] for g in admin.ok("listGroups")["groups"]}
    assert admin.ok("deleteGroups", args=[group]) == [{"groupId": group, "errorCode": 0}]
    assert group not in {g["groupId"] for g in admin.ok("listGroups")["groups"]}
    assert admin.ok("describeGroups", args=[group])["groups"][0]["state"] == "Dead"
    fetched = admin.ok("fetchOffsets", args={"groupId": group, "topics": [topic]})
    assert {p["offset"] for p in fetched[0]["partitions"]} == {"-1"}, fetched  # offsets deleted too
    assert admin.stop() == 0, admin.stderr_tail()
    assert_clean([*ms, admin])
    assert herd_warnings(herd) == []
