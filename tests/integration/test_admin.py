"""``herd groups ...`` as a subprocess against a real daemon with real kafka-python members.

Every command, its ``--output json`` form, and its error paths (one line on stderr, exit 2, no
traceback). Offsets written by reset-offsets are checked with an independent OffsetFetch.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

import pytest

from protocol import messages as m
from tests.support.daemon import REPO, Daemon
from tests.support.kafka import RawClient

kafka = pytest.importorskip("kafka")
from kafka import KafkaConsumer, TopicPartition  # noqa: E402
from kafka.structs import OffsetAndMetadata  # noqa: E402

pytestmark = pytest.mark.integration

ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
ENV.pop("HERD_BOOTSTRAP", None)
ENV.pop("HERD_HTTP", None)
ENV.pop("HERD_DATA_BOOTSTRAP", None)


# ---- the daemon and the command ----------------------------------------------------------------

@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    data = tmp_path_factory.mktemp("admin") / "data"
    with Daemon(data, "--metrics-port", "0", "--min-session-timeout-ms", "500",
                "--topic", "t:3", "--topic", "u:2", "--no-auto-create-topics") as d:
        d.http = f"127.0.0.1:{_metrics_port(d)}"
        yield d


def _metrics_port(d: Daemon) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in d.logs().splitlines():
            if '"metrics listening"' in line:
                return json.loads(line)["port"]
        time.sleep(0.02)
    raise AssertionError("the daemon did not log its metrics port")


def run(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "coordinator", "groups", *map(str, args)], capture_output=True,
                       text=True, cwd=str(REPO), env=env or ENV, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def ok(d, *args, **kw) -> str:
    r = run(*args, "--bootstrap-server", d.bootstrap, **kw)
    assert r.returncode == 0, r.stderr
    return r.stdout


def history(d, *args) -> str:
    r = run("history", *args, "--http", d.http)
    assert r.returncode == 0, r.stderr
    return r.stdout


def js(d, *args) -> dict:
    return json.loads(ok(d, *args, "--output", "json"))


def fails(d, *args, bootstrap=True, **kw) -> str:
    """The command exits 2 with exactly one line on stderr; returns that line."""
    extra = ["--bootstrap-server", d.bootstrap] if bootstrap else []
    r = run(*args, *extra, **kw)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error: "), r.stderr
    return lines[0][len("herd: error: "):]


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def assert_aligned(text: str) -> None:
    """Every column starts where its header does."""
    head, *rows = text.splitlines()
    starts = [i for i, ch in enumerate(head) if ch != " " and (i == 0 or head[i - 1] == " ")]
    for row in rows:
        for i in starts:
            assert row[i] != " " and (i == 0 or row[i - 1] == " "), (head, row)


# ---- members and independent checks -------------------------------------------------------------

class Member:
    """A kafka-python consumer polling on its own thread; every call runs on that thread."""

    def __init__(self, d: Daemon, group: str, client_id: str, topics=("t",), session_timeout_ms=10_000):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.consumer = KafkaConsumer(*topics, bootstrap_servers=d.bootstrap, group_id=group,
                                      client_id=client_id, session_timeout_ms=session_timeout_ms,
                                      heartbeat_interval_ms=300, enable_auto_commit=False,
                                      auto_offset_reset="earliest")
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"member-{client_id}")
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            while True:
                try:
                    fn, fut = self.calls.get_nowait()
                except queue.Empty:
                    break
                try:
                    fut.set_result(fn(self.consumer))
                except Exception as exc:  # handed to the caller
                    fut.set_exception(exc)
            self.consumer.poll(timeout_ms=50)

    def call(self, fn, timeout=15):
        fut: Future = Future()
        self.calls.put((fn, fut))
        return fut.result(timeout)

    def assignment(self) -> set:
        return {(tp.topic, tp.partition) for tp in self.call(lambda c: c.assignment())}

    def commit(self, offsets: dict, metadata: str = "") -> None:
        self.call(lambda c: c.commit({TopicPartition(t, p): OffsetAndMetadata(o, metadata, -1)
                                      for (t, p), o in offsets.items()}))

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(15)
        self.consumer.close()  # LeaveGroup


def describe_raw(d: Daemon, group: str):
    with RawClient(d.address) as c:
        return c.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0]


def wait_for(pred, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_stable(d: Daemon, group: str, members: list[Member]):
    """Stable with exactly these members, every one holding an assignment, and still so 0.3 s
    later (kafka-python's leader may rejoin once right after the first assignment)."""
    def settled():
        g = describe_raw(d, group)
        if g.group_state != "Stable" or len(g.members) != len(members):
            return False
        if not all(mem.assignment() for mem in members):
            return False
        time.sleep(0.3)
        g2 = describe_raw(d, group)
        return g2.group_state == "Stable" and {x.member_id for x in g2.members} == {x.member_id for x in g.members}
    wait_for(settled, f"group {group} stable with {len(members)} members")


def wait_state(d: Daemon, group: str, state: str):
    wait_for(lambda: describe_raw(d, group).group_state == state, f"group {group} in state {state}")


def fetch_offsets(d: Daemon, group: str) -> dict:
    with RawClient(d.address) as c:
        r = c.call(m.OffsetFetchRequest(group_id=group, topics=None), 7)
    assert r.error_code == 0
    return {(t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions
            if p.committed_offset >= 0}


def commit_raw(d: Daemon, group: str, offsets: dict) -> None:
    """A standalone (generation -1) commit: leaves an Empty group holding offsets."""
    by_topic: dict = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(m.OffsetCommitRequestPartition(partition_index=p, committed_offset=o))
    with RawClient(d.address) as c:
        r = c.call(m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                         topics=[m.OffsetCommitRequestTopic(t, ps) for t, ps in by_topic.items()]), 7)
    assert all(p.error_code == 0 for t in r.topics for p in t.partitions)


@pytest.fixture
def members():
    started: list[Member] = []
    yield started
    for mem in started:
        if not mem.stopping.is_set():
            mem.close()


# ---- list ------------------------------------------------------------------------------------------

def test_list(herd, members):
    a = Member(herd, "list-stable", "c-list")
    members.append(a)
    wait_stable(herd, "list-stable", [a])
    commit_raw(herd, "list-empty", {("t", 0): 1})

    names = ok(herd, "list").split()
    assert "list-stable" in names and "list-empty" in names
    rows = {r[0]: r[1] for r in table(ok(herd, "list", "--state"))[1:]}
    assert table(ok(herd, "list", "--state"))[0] == ["GROUP", "STATE"]
    assert rows["list-stable"] == "Stable" and rows["list-empty"] == "Empty"

    stable = js(herd, "list", "--state", "stable")["groups"]  # case-insensitive, as Kafka's tool
    assert {"group": "list-stable", "protocol_type": "consumer", "state": "Stable"} in stable
    assert all(g["state"] == "Stable" for g in stable)
    both = {g["group"] for g in js(herd, "list", "--state", "Empty", "Stable")["groups"]}
    assert {"list-stable", "list-empty"} <= both
    everything = js(herd, "list")["groups"]
    assert set(everything[0]) == {"group", "protocol_type", "state"}

    assert fails(herd, "list", "--state", "Sleeping").startswith("unknown group state 'Sleeping'")


# ---- describe --------------------------------------------------------------------------------------

def test_describe_partitions_members_and_state(herd, members):
    g = "desc"
    a = Member(herd, g, "client-a", topics=("t", "u"))
    b = Member(herd, g, "client-b", topics=("t", "u"))
    members += [a, b]
    wait_stable(herd, g, [a, b])
    owned = {mem.consumer.config["client_id"]: mem.assignment() for mem in (a, b)}
    assert owned["client-a"] | owned["client-b"] == {("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)}
    # the committer owns its partitions: commit 0 on one (lag 0 against herd's empty log), 7 on the others
    mine = sorted(owned["client-a"])
    offsets = {tp: (0 if i == 0 else 7) for i, tp in enumerate(mine)}
    a.commit(offsets, metadata="m")

    text = ok(herd, "describe", g)
    rows = table(text)
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                       "HOST", "CLIENT-ID"]
    assert_aligned(text)
    assert len(rows) == 1 + 5
    by_tp = {(r[1], int(r[2])): r for r in rows[1:]}
    for tp, r in by_tp.items():
        owner = "client-a" if tp in owned["client-a"] else "client-b"
        assert r[0] == g and r[8] == owner and r[7] == "/127.0.0.1"
        assert r[4] == "0"  # herd holds no data: log end 0
        if tp in offsets:
            assert r[3] == str(offsets[tp])
            assert r[5] == ("0" if offsets[tp] == 0 else "-")  # LOG-END < CURRENT: unknown, not negative
        else:
            assert r[3] == "-" and r[5] == "-"

    doc = js(herd, "describe", g)
    (info,) = doc["groups"]
    assert set(info) == {"group", "state", "protocol_type", "assignment_strategy", "coordinator", "member_count",
                         "members", "partitions"}
    assert info["group"] == g and info["state"] == "Stable" and info["protocol_type"] == "consumer"
    assert info["assignment_strategy"] in ("range", "roundrobin") and info["member_count"] == 2
    assert info["coordinator"] == {"id": 0, "host": "127.0.0.1", "port": herd.port}
    parts = {(p["topic"], p["partition"]): p for p in info["partitions"]}
    assert set(parts) == owned["client-a"] | owned["client-b"]
    for tp, p in parts.items():
        assert set(p) == {"topic", "partition", "current_offset", "log_end_offset", "lag", "consumer_id",
                          "group_instance_id", "host", "client_id"}
        assert p["current_offset"] == offsets.get(tp)
        assert p["log_end_offset"] == 0
        assert p["lag"] == (0 if offsets.get(tp) == 0 else None)
        assert p["client_id"] == ("client-a" if tp in owned["client-a"] else "client-b")
    by_client = {x["client_id"]: x for x in info["members"]}
    for cid, tps in owned.items():
        mem = by_client[cid]
        assert mem["partitions"] == len(tps) and mem["host"] == "/127.0.0.1"
        assert {(a_["topic"], p) for a_ in mem["assignment"] for p in a_["partitions"]} == tps
        assert all(parts[tp]["consumer_id"] == mem["consumer_id"] for tp in tps)

    rows = table(ok(herd, "describe", g, "--members"))
    assert rows[0] == ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    assert sorted((r[4], int(r[5])) for r in rows[1:]) == sorted((c, len(t)) for c, t in owned.items())
    verbose = ok(herd, "describe", g, "--members", "--verbose")
    assert verbose.splitlines()[0].split()[-1] == "ASSIGNMENT"
    for line in verbose.splitlines()[1:]:
        cid = "client-a" if "client-a" in line else "client-b"
        for topic in ("t", "u"):
            ps = sorted(p for t, p in owned[cid] if t == topic)
            if ps:
                assert f"{topic}({','.join(map(str, ps))})" in line

    rows = table(ok(herd, "describe", g, "--state"))
    assert rows[0] == ["GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]
    assert rows[1] == [g, herd.bootstrap, "(0)", info["assignment_strategy"], "Stable", "2"]

    # several groups at once, as kafka-consumer-groups.sh --group a --group b
    commit_raw(herd, "desc-other", {("u", 1): 3})
    doc = js(herd, "describe", g, "--group", "desc-other")
    assert [x["group"] for x in doc["groups"]] == [g, "desc-other"]
    assert {g_["group"] for g_ in js(herd, "describe", "--all-groups")["groups"]} >= {g, "desc-other"}


def test_describe_an_empty_group_and_errors(herd):
    commit_raw(herd, "desc-empty", {("t", 1): 4})
    r = run("describe", "desc-empty", "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 0
    assert r.stderr.strip() == "Consumer group 'desc-empty' has no active members."
    rows = table(r.stdout)
    assert rows[1] == ["desc-empty", "t", "1", "4", "0", "-", "-", "-", "-"]
    (info,) = js(herd, "describe", "desc-empty")["groups"]
    assert info["state"] == "Empty" and info["members"] == [] and info["partitions"][0]["consumer_id"] is None

    assert fails(herd, "describe", "no-such-group") == "Consumer group 'no-such-group' does not exist."
    r = run("describe", "desc-empty", "no-such-group", "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 2 and "desc-empty" in r.stdout  # the others are still shown
    assert r.stderr.splitlines()[-1] == "herd: error: Consumer group 'no-such-group' does not exist."
    assert fails(herd, "describe") == "which group? give GROUP (or --group GROUP, or --all-groups)"
    assert fails(herd, "describe", "x", "--verbose") == "--verbose goes with --members"
    assert "not allowed with argument" in fails(herd, "describe", "x", "--members", "--state")


# ---- offsets ---------------------------------------------------------------------------------------

def test_offsets(herd, members):
    a = Member(herd, "offs", "c-offs")
    members.append(a)
    wait_stable(herd, "offs", [a])
    a.commit({("t", 0): 11, ("t", 2): 12}, metadata="batch-9")
    rows = table(ok(herd, "offsets", "offs"))
    assert rows == [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LEADER-EPOCH", "METADATA"],
                    ["offs", "t", "0", "11", "-", "batch-9"], ["offs", "t", "2", "12", "-", "batch-9"]]
    doc = js(herd, "offsets", "offs")
    assert doc == {"group": "offs", "state": "Stable", "offsets": [
        {"topic": "t", "partition": 0, "offset": 11, "leader_epoch": None, "metadata": "batch-9"},
        {"topic": "t", "partition": 2, "offset": 12, "leader_epoch": None, "metadata": "batch-9"}]}
    assert fails(herd, "offsets", "offs-nope") == "Consumer group 'offs-nope' does not exist."


# ---- reset-offsets ---------------------------------------------------------------------------------

def test_reset_offsets_refuses_an_active_group(herd, members):
    a = Member(herd, "reset-active", "c-ra")
    members.append(a)
    wait_stable(herd, "reset-active", [a])
    a.commit({("t", 0): 5})
    msg = fails(herd, "reset-offsets", "reset-active", "--all-topics", "--to-earliest", "--execute")
    assert msg == ("Assignments can only be reset if the group 'reset-active' is inactive, but the current "
                   "state is Stable.")
    assert fetch_offsets(herd, "reset-active") == {("t", 0): 5}


def test_reset_offsets_dry_run_and_execute(herd, members):
    g = "reset"
    a = Member(herd, g, "c-reset", topics=("t", "u"))
    members.append(a)
    wait_stable(herd, g, [a])
    a.commit({("t", 0): 5, ("t", 1): 6, ("t", 2): 7, ("u", 0): 8})
    a.close()  # LeaveGroup: the group is Empty and keeps its offsets
    wait_state(herd, g, "Empty")
    before = fetch_offsets(herd, g)
    assert before == {("t", 0): 5, ("t", 1): 6, ("t", 2): 7, ("u", 0): 8}

    # the default is a dry run: the plan is printed, nothing changes
    r = run("reset-offsets", g, "--all-topics", "--to-earliest", "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 0
    assert table(r.stdout) == [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
                               [g, "t", "0", "5", "0"], [g, "t", "1", "6", "0"], [g, "t", "2", "7", "0"],
                               [g, "u", "0", "8", "0"]]
    assert "Dry run" in r.stderr
    doc = js(herd, "reset-offsets", g, "--topic", "t:1", "--to-offset", "3", "--dry-run")
    assert doc == {"executed": False, "groups": [{"group": g, "state": "Empty", "partitions": [
        {"topic": "t", "partition": 1, "current_offset": 6, "new_offset": 0}]}]}  # clamped to the log end
    assert fetch_offsets(herd, g) == before

    # --execute commits the plan
    doc = js(herd, "reset-offsets", g, "--topic", "t:0,2", "--to-offset", "42", "--no-clamp", "--execute")
    assert doc["executed"] is True
    assert [(p["partition"], p["current_offset"], p["new_offset"], p["error"])
            for p in doc["groups"][0]["partitions"]] == [(0, 5, 42, None), (2, 7, 42, None)]
    assert fetch_offsets(herd, g) == {**before, ("t", 0): 42, ("t", 2): 42}

    doc = js(herd, "reset-offsets", g, "--topic", "t", "--shift-by", "-2", "--no-clamp", "--execute")
    assert [p["new_offset"] for p in doc["groups"][0]["partitions"]] == [40, 4, 40]
    assert fetch_offsets(herd, g) == {("t", 0): 40, ("t", 1): 4, ("t", 2): 40, ("u", 0): 8}

    # clamped (as Kafka) without --no-clamp: herd's log end is 0; a warning says so
    r = run("reset-offsets", g, "--topic", "u:0", "--shift-by", "1", "--execute", "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 0 and "warning: u-0: offset 9 is outside the log range [0, 0]; using 0" in r.stderr
    assert "Dry run" not in r.stderr

    ok(herd, "reset-offsets", g, "--all-topics", "--to-latest", "--execute")
    assert fetch_offsets(herd, g) == {("t", 0): 0, ("t", 1): 0, ("t", 2): 0, ("u", 0): 0}

    for spec in (["--to-datetime", "2024-05-01T12:00:00.000"], ["--to-datetime", "2024-05-01T12:00:00Z"],
                 ["--by-duration", "PT1H30M"], ["--to-current"], ["--to-earliest"]):
        doc = js(herd, "reset-offsets", g, "--topic", "t:0", *spec, "--execute")
        assert doc["groups"][0]["partitions"][0]["new_offset"] == 0, spec

    # a group that does not exist yet: the reset creates its offsets (as Kafka)
    ok(herd, "reset-offsets", "reset-new", "--topic", "u:1", "--to-offset", "9", "--no-clamp", "--execute")
    assert fetch_offsets(herd, "reset-new") == {("u", 1): 9}


def test_reset_offsets_errors(herd):
    commit_raw(herd, "reset-err", {("t", 0): 5})
    base = ["reset-offsets", "reset-err"]
    assert fails(herd, *base, "--topic", "nosuch", "--to-earliest") == "topic 'nosuch' does not exist"
    assert fails(herd, *base, "--topic", "t:x", "--to-earliest") == (
        "invalid --topic 't:x': partitions are numbers (TOPIC:0,1,2)")
    assert fails(herd, *base, "--topic", "t:1", "--shift-by", "1") == (
        "cannot shift the offset of t-1: group 'reset-err' has no committed offset for it")
    assert fails(herd, *base, "--topic", "t", "--to-datetime", "yesterday").startswith("invalid --to-datetime")
    assert fails(herd, *base, "--topic", "t", "--by-duration", "1h").startswith("invalid --by-duration")
    assert "one of the arguments --to-earliest" in fails(herd, *base, "--topic", "t")
    assert "one of the arguments --topic --all-topics is required" in fails(herd, *base, "--to-earliest")
    assert "not allowed with argument" in fails(herd, *base, "--all-topics", "--to-earliest", "--to-latest")
    assert "not allowed with argument" in fails(herd, *base, "--all-topics", "--to-earliest", "--dry-run",
                                                "--execute")
    assert "not an integer" in fails(herd, *base, "--all-topics", "--to-offset", "ten")
    assert fetch_offsets(herd, "reset-err") == {("t", 0): 5}


# ---- delete / delete-offsets ------------------------------------------------------------------------

def test_delete(herd, members):
    a = Member(herd, "del", "c-del")
    members.append(a)
    wait_stable(herd, "del", [a])
    a.commit({("t", 0): 1})
    assert fails(herd, "delete", "--group", "del") == (
        "Group 'del' could not be deleted: the group is not empty (it has active members).")
    assert describe_raw(herd, "del").group_state == "Stable"
    a.close()
    wait_state(herd, "del", "Empty")
    assert ok(herd, "delete", "--group", "del") == "Deletion of requested consumer groups ('del') was successful.\n"
    assert fails(herd, "describe", "del") == "Consumer group 'del' does not exist."
    assert fetch_offsets(herd, "del") == {}

    commit_raw(herd, "del-2", {("t", 0): 1})
    commit_raw(herd, "del-3", {("t", 0): 1})
    assert js(herd, "delete", "--group", "del-2", "--group", "del-3") == {"groups": [
        {"group": "del-2", "deleted": True, "error": None}, {"group": "del-3", "deleted": True, "error": None}]}
    r = run("delete", "--group", "del-none", "--bootstrap-server", herd.bootstrap, "--output", "json")
    assert r.returncode == 2
    assert json.loads(r.stdout) == {"groups": [{"group": "del-none", "deleted": False, "error": "GROUP_ID_NOT_FOUND"}]}
    assert r.stderr.strip() == ("herd: error: Group 'del-none' could not be deleted: Consumer group 'del-none' "
                                "does not exist.")
    assert "the following arguments are required: --group" in fails(herd, "delete")


def test_delete_offsets(herd, members):
    g = "deloffs"
    commit_raw(herd, g, {("t", 0): 1, ("t", 1): 2, ("u", 0): 3, ("u", 1): 4})
    rows = table(ok(herd, "delete-offsets", "--group", g, "--topic", "u"))
    assert rows == [["TOPIC", "PARTITION", "STATUS"], ["u", "0", "Successful"], ["u", "1", "Successful"]]
    assert js(herd, "delete-offsets", "--group", g, "--topic", "t:1") == {"group": g, "partitions": [
        {"topic": "t", "partition": 1, "deleted": True, "error": None}]}
    assert fetch_offsets(herd, g) == {("t", 0): 1}

    # a member subscribed to t: its offsets stay
    a = Member(herd, g, "c-deloffs")
    members.append(a)
    wait_stable(herd, g, [a])
    r = run("delete-offsets", "--group", g, "--topic", "t:0", "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 2
    assert table(r.stdout)[1] == ["t", "0", "Error:", "GROUP_SUBSCRIBED_TO_TOPIC"]
    assert r.stderr.strip() == ("herd: error: could not delete the offset of t-0 for group 'deloffs': the group "
                                "is subscribed to the topic")
    assert fetch_offsets(herd, g) == {("t", 0): 1}
    assert fails(herd, "delete-offsets", "--group", "deloffs-none", "--topic", "t:0") == (
        "Consumer group 'deloffs-none' does not exist.")


# ---- history ---------------------------------------------------------------------------------------

KILLABLE_MEMBER = r"""
import sys
from kafka import KafkaConsumer
bootstrap, group, client_id = sys.argv[1:4]
c = KafkaConsumer("t", bootstrap_servers=bootstrap, group_id=group, client_id=client_id,
                  session_timeout_ms=1000, heartbeat_interval_ms=200, enable_auto_commit=False)
said = False
while True:
    c.poll(timeout_ms=100)
    if c.assignment() and not said:
        print("assigned", flush=True)
        said = True
"""


def test_history_tells_why_the_group_rebalanced(herd, members):
    g = "hist"
    a = Member(herd, g, "steady")
    members.append(a)
    wait_stable(herd, g, [a])
    b = Member(herd, g, "visitor")
    members.append(b)
    wait_stable(herd, g, [a, b])
    b.close()
    wait_stable(herd, g, [a])
    proc = subprocess.Popen([sys.executable, "-c", KILLABLE_MEMBER, herd.bootstrap, g, "crasher"],
                            stdout=subprocess.DEVNULL, env=ENV)
    try:
        def crasher_in():
            d = describe_raw(herd, g)
            return d.group_state == "Stable" and {x.client_id for x in d.members} == {"steady", "crasher"}
        wait_for(crasher_in, "the crasher in the group")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # its session (1 s) expires; the steady member rejoins alone
        wait_for(lambda: any(e["reason"] == "session_expired" and e["outcome"] == "stable"
                             for e in json.loads(history(herd, g, "--output", "json"))),
                 "a session_expired rebalance", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    hist = json.loads(history(herd, g, "--output", "json"))
    reasons = [e["reason"] for e in hist]
    firsts = [reasons.index(r) for r in ("initial", "member_joined", "member_left", "session_expired")]
    assert firsts == sorted(firsts), reasons  # in the order they happened
    joined = [e for e in hist if e["reason"] == "member_joined"]
    assert joined[0]["trigger"]["client_id"] == "visitor" and joined[0]["trigger"]["client_host"] == "/127.0.0.1"
    expired = next(e for e in hist if e["reason"] == "session_expired")
    assert "crasher" in expired["detail"] and "stopped heartbeating" in expired["detail"]
    assert expired["members"] == 1 and expired["protocol"] == "range"
    assert [a_["client_id"] for a_ in expired["awaited"] if a_["outcome"] == "rejoined"] == ["steady"]

    text = history(herd, g)
    lines = text.splitlines()
    assert lines[0].startswith(f"Group '{g}': {len(hist)} rebalances recorded, oldest first")
    assert lines[1].startswith("  reasons: ") and "session_expired x1" in lines[1]
    assert "member_left x1" in lines[1] and "initial x1" in lines[1]
    assert sum(1 for line in lines if line.startswith("generation ")) == len(hist)
    exp_head = next(line for line in lines if line.startswith("generation ") and " session_expired " in line)
    assert exp_head.endswith(f"stable after {expired['duration_ms']} ms")
    assert "  why        member " in text and "(client 'crasher' from /127.0.0.1) stopped heartbeating" in text
    assert "  trigger    visitor@/127.0.0.1 [" in text
    assert "steady@/127.0.0.1 [" in text and ": rejoined after " in text
    assert "  phases     preparing " in text and "  result     protocol range, 1 member" in text

    # errors: unknown group (404), nothing listening, no address
    assert fails(herd, "history", "hist-none", "--http", herd.http, bootstrap=False) == (
        "Consumer group 'hist-none' does not exist.")
    assert fails(herd, "history", g, "--http", "127.0.0.1:1", bootstrap=False) == (
        "cannot connect to 127.0.0.1:1: Connection refused")
    assert fails(herd, "history", g, bootstrap=False).startswith("history reads herd's HTTP endpoint: give --http")
    env = {**ENV, "HERD_HTTP": herd.http}
    r = run("history", g, env=env)
    assert r.returncode == 0 and r.stdout == text


# ---- connection problems and arguments ---------------------------------------------------------------

@pytest.mark.parametrize("args", [["list"], ["describe", "g"], ["offsets", "g"], ["delete", "--group", "g"],
                                  ["reset-offsets", "g", "--all-topics", "--to-earliest"],
                                  ["delete-offsets", "--group", "g", "--topic", "t"]])
def test_unreachable_bootstrap(args):
    r = run(*args, "--bootstrap-server", "127.0.0.1:1", "--timeout", "5")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "herd: error: cannot connect to 127.0.0.1:1: Connection refused\n"


def test_bootstrap_from_the_environment_and_several_servers(herd):
    commit_raw(herd, "env-group", {("t", 0): 1})
    r = run("list", env={**ENV, "HERD_BOOTSTRAP": herd.bootstrap})
    assert r.returncode == 0 and "env-group" in r.stdout.split()
    r = run("list", "--bootstrap-server", f"127.0.0.1:1,{herd.bootstrap}")  # the first is down
    assert r.returncode == 0 and "env-group" in r.stdout.split()
    r = run("list", "--bootstrap-server", "127.0.0.1:1,127.0.0.1:2", "--timeout", "5")
    assert r.returncode == 2 and r.stderr.startswith("herd: error: cannot connect to any bootstrap server: ")
    # log-end offsets come from --data-bootstrap-server when given
    r = run("describe", "env-group", "--bootstrap-server", herd.bootstrap, "--data-bootstrap-server", "127.0.0.1:1")
    assert r.returncode == 2 and r.stderr == "herd: error: cannot connect to 127.0.0.1:1: Connection refused\n"
    doc = js(herd, "describe", "env-group", "--data-bootstrap-server", herd.bootstrap)
    assert doc["groups"][0]["partitions"][0]["log_end_offset"] == 0


def test_a_server_that_never_answers_times_out():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        r = run("describe", "g", "--bootstrap-server", f"127.0.0.1:{port}", "--timeout", "0.5")
        took = time.monotonic() - t0
    assert r.returncode == 2
    assert r.stderr == f"herd: error: timed out after 0.5s waiting for 127.0.0.1:{port} (ApiVersions)\n"
    assert took < 10


@pytest.mark.parametrize("args, message", [
    (["list", "--bootstrap-server", "nohostport:"], "invalid --bootstrap-server 'nohostport:': expected HOST:PORT"),
    (["list", "--bootstrap-server", "h:99999"], "invalid --bootstrap-server 'h:99999': expected HOST:PORT"),
    (["list", "--timeout", "0"], "must be between 0 and 86400 seconds"),
    (["list", "--output", "yaml"], "invalid choice: 'yaml'"),
    (["describe", "g", "--all-groups"], "give group names or --all-groups, not both"),
    (["delete-offsets", "--group", "g"], "the following arguments are required: --topic"),
    (["history", "g", "--http", "127.0.0.1:port"], "invalid --http"),
])
def test_invalid_arguments(args, message):
    r = run(*args)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error: ") and message in lines[0], r.stderr
