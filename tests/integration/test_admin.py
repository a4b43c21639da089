"""``herd groups ...`` as a subprocess against a real daemon with real kafka-python members.

Every command, its ``--output json`` form, and its error paths (one line on stderr, exit 2, no
traceback). Offsets written by reset-offsets are checked with an independent OffsetFetch.
"""
from __future__ import annotations

import datetime as dt
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
from tools.daemon import REPO, Daemon
from tools.rawclient import RawClient

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.integration

ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
for _name in ("HERD_BOOTSTRAP", "HERD_HTTP", "HERD_DATA_BOOTSTRAP"):
    ENV.pop(_name, None)


@pytest.fixture(scope="module", autouse=True)
def _bytecode_cache(tmp_path_factory):
    """Each command is a fresh interpreter: let them share compiled bytecode (outside the tree)
    instead of compiling the generated codec every time when PYTHONDONTWRITEBYTECODE is set."""
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    ENV["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    yield


# ---- the daemon and the command ----------------------------------------------------------------

@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    data = tmp_path_factory.mktemp("admin") / "data"
    with Daemon(data, "--metrics-port", "0", "--min-session-timeout-ms", "500",
                "--topic", "t:3", "--topic", "u:2", "--no-auto-create-topics") as d:
        d.http = f"127.0.0.1:{d.wait_metrics_port()}"
        yield d


def run(*args, env=None, timeout=30) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "herd_cli", "groups", *map(str, args)], capture_output=True,
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
    """A confluent-kafka (librdkafka) consumer polled on its own thread, which runs every call on
    it (a call from another thread while poll() runs can wait forever). kafka-python 3.0.12 was
    tried first: a poll that times out while its SyncGroup is in flight can leave it with no
    assignment and no heartbeat for good, so its session expires under the test."""

    def __init__(self, d: Daemon, group: str, client_id: str, topics=("t",), session_timeout_ms=10_000):
        self.client_id = client_id
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": d.bootstrap, "group.id": group, "client.id": client_id,
            "enable.auto.commit": False, "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": 300, "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.subscribe(list(topics))
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
            self.consumer.poll(0.05)

    def call(self, fn, timeout=15):
        fut: Future = Future()
        self.calls.put((fn, fut))
        return fut.result(timeout)

    def assignment(self) -> set:
        return {(tp.topic, tp.partition) for tp in self.call(lambda c: c.assignment())}

    def commit(self, offsets: dict) -> None:
        tps = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        self.call(lambda c: c.commit(offsets=tps, asynchronous=False))

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
    seen = []

    def settled():
        g = describe_raw(d, group)
        assigned = [mem.assignment() for mem in members]
        seen[:] = [g.group_state, [(x.client_id, x.member_id) for x in g.members], assigned]
        if g.group_state != "Stable" or len(g.members) != len(members) or not all(assigned):
            return False
        time.sleep(0.3)
        g2 = describe_raw(d, group)
        same = {x.member_id for x in g2.members} == {x.member_id for x in g.members}
        return g2.group_state == "Stable" and same
    try:
        wait_for(settled, f"group {group} stable with {len(members)} members")
    except AssertionError:
        raise AssertionError(f"group {group} not stable with {len(members)} members: "
                             f"last seen {seen}") from None


def wait_state(d: Daemon, group: str, state: str):
    wait_for(lambda: describe_raw(d, group).group_state == state, f"group {group} in state {state}")


def fetch_offsets(d: Daemon, group: str) -> dict:
    with RawClient(d.address) as c:
        r = c.call(m.OffsetFetchRequest(group_id=group, topics=None), 7)
    assert r.error_code == 0
    return {(t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions
            if p.committed_offset >= 0}


def commit_raw(d: Daemon, group: str, offsets: dict, metadata: str = "") -> None:
    """A standalone (generation -1) commit: leaves an Empty group holding offsets."""
    by_topic: dict = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(m.OffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_metadata=metadata))
    with RawClient(d.address) as c:
        topics = [m.OffsetCommitRequestTopic(t, ps) for t, ps in by_topic.items()]
        r = c.call(m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                         topics=topics), 7)
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
    assert {"group": "list-stable", "protocol_type": "consumer", "state": "Stable", "type": "classic"} in stable
    assert all(g["state"] == "Stable" for g in stable)
    both = {g["group"] for g in js(herd, "list", "--state", "Empty", "Stable")["groups"]}
    assert {"list-stable", "list-empty"} <= both
    everything = js(herd, "list")["groups"]
    assert set(everything[0]) == {"group", "protocol_type", "state", "type"}

    assert fails(herd, "list", "--state", "Sleeping").startswith("unknown group state 'Sleeping'")


# ---- describe --------------------------------------------------------------------------------------

def test_describe_partitions_members_and_state(herd, members):
    g = "desc"
    a = Member(herd, g, "client-a", topics=("t", "u"))
    b = Member(herd, g, "client-b", topics=("t", "u"))
    members += [a, b]
    wait_stable(herd, g, [a, b])
    owned = {mem.client_id: mem.assignment() for mem in (a, b)}
    assert owned["client-a"] | owned["client-b"] == {("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)}
    # the committer owns its partitions: commit 0 on one, 7 on the others
    mine = sorted(owned["client-a"])
    offsets = {tp: (0 if i == 0 else 7) for i, tp in enumerate(mine)}
    a.commit(offsets)

    text = ok(herd, "describe", g)
    rows = table(text)
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                       "CONSUMER-ID", "HOST", "CLIENT-ID"]
    assert_aligned(text)
    assert len(rows) == 1 + 5
    by_tp = {(r[1], int(r[2])): r for r in rows[1:]}
    for tp, r in by_tp.items():
        owner = "client-a" if tp in owned["client-a"] else "client-b"
        assert r[0] == g and r[8] == owner and r[7] == "/127.0.0.1"
        assert r[4] == "-" and r[5] == "-"  # herd holds no records: log end and lag unknown, even at 0
        assert r[3] == (str(offsets[tp]) if tp in offsets else "-")

    doc = js(herd, "describe", g)
    (info,) = doc["groups"]
    assert set(info) == {"group", "type", "state", "protocol_type", "assignment_strategy", "coordinator",
                         "member_count", "members", "partitions"}
    assert info["group"] == g and info["state"] == "Stable" and info["protocol_type"] == "consumer"
    assert info["type"] == "classic"
    assert info["assignment_strategy"] in ("range", "roundrobin") and info["member_count"] == 2
    assert info["coordinator"] == {"id": 0, "host": "127.0.0.1", "port": herd.port}
    parts = {(p["topic"], p["partition"]): p for p in info["partitions"]}
    assert set(parts) == owned["client-a"] | owned["client-b"]
    for tp, p in parts.items():
        assert set(p) == {"topic", "partition", "current_offset", "log_end_offset", "lag", "consumer_id",
                          "group_instance_id", "host", "client_id", "commit_age_seconds", "lag_seconds"}
        assert p["current_offset"] == offsets.get(tp)
        assert p["log_end_offset"] is None and p["lag"] is None
        # commit times and time lag are herd's own view: only with --http
        assert p["commit_age_seconds"] is None and p["lag_seconds"] is None
        assert p["client_id"] == ("client-a" if tp in owned["client-a"] else "client-b")
    by_client = {x["client_id"]: x for x in info["members"]}
    for cid, tps in owned.items():
        mem = by_client[cid]
        assert mem["partitions"] == len(tps) and mem["host"] == "/127.0.0.1"
        assert {(a_["topic"], p) for a_ in mem["assignment"] for p in a_["partitions"]} == tps
        assert all(parts[tp]["consumer_id"] == mem["consumer_id"] for tp in tps)

    # Kafka's columns: GROUP-INSTANCE-ID only when a member has one (none here)
    rows = table(ok(herd, "describe", g, "--members"))
    assert rows[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    assert sorted((r[3], int(r[4])) for r in rows[1:]) == sorted((c, len(t)) for c, t in owned.items())
    # --verbose: Kafka 4's columns, the assignment as topic:0,1;topic:2, "-" for KIP-848's epochs
    verbose = table(ok(herd, "describe", g, "--members", "--verbose"))
    assert verbose[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "CURRENT-EPOCH",
                          "CURRENT-ASSIGNMENT", "TARGET-EPOCH", "TARGET-ASSIGNMENT"]
    for row in verbose[1:]:
        topics = sorted({t for t, _ in owned[row[3]]})
        want = ";".join(f"{t}:{','.join(str(p) for tt, p in sorted(owned[row[3]]) if tt == t)}" for t in topics)
        assert row[5:] == ["-", want or "-", "-", "-"]

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
    assert rows[1] == ["desc-empty", "t", "1", "4", "-", "-", "-", "-", "-"]
    (info,) = js(herd, "describe", "desc-empty")["groups"]
    assert info["state"] == "Empty" and info["members"] == [] and info["partitions"][0]["consumer_id"] is None

    commit_raw(herd, "desc-empty2", {("t", 2): 5})
    r = run("describe", "desc-empty", "desc-empty2", "--members", "--bootstrap-server", herd.bootstrap)
    # as Kafka's tool: the header of each (memberless) group, one blank line between the two
    header = "GROUP  CONSUMER-ID  HOST  CLIENT-ID  #PARTITIONS"
    assert r.returncode == 0 and r.stdout == f"{header}\n\n{header}\n"
    assert r.stderr.count("has no active members") == 2
    r = run("describe", "desc-empty", "desc-empty2", "--bootstrap-server", herd.bootstrap)
    assert r.stdout.count("\n\n") == 1 and not r.stdout.startswith("\n")  # one blank line between tables

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
    a.commit({("t", 0): 11, ("t", 2): 12})
    rows = table(ok(herd, "offsets", "offs"))
    assert rows == [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LEADER-EPOCH", "METADATA"],
                    ["offs", "t", "0", "11", "-", "-"], ["offs", "t", "2", "12", "-", "-"]]
    doc = js(herd, "offsets", "offs")
    assert doc == {"group": "offs", "state": "Stable", "offsets": [
        {"topic": "t", "partition": 0, "offset": 11, "leader_epoch": None, "metadata": ""},
        {"topic": "t", "partition": 2, "offset": 12, "leader_epoch": None, "metadata": ""}]}
    assert fails(herd, "offsets", "offs-nope") == "Consumer group 'offs-nope' does not exist."

    # metadata is shown as text; what a terminal would interpret is escaped (JSON keeps it as is)
    commit_raw(herd, "offs-meta", {("u", 1): 3}, metadata="batch-9\x1b[31m")
    assert table(ok(herd, "offsets", "offs-meta"))[1] == ["offs-meta", "u", "1", "3", "-", "batch-9\\x1b[31m"]
    assert js(herd, "offsets", "offs-meta")["offsets"][0]["metadata"] == "batch-9\x1b[31m"


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
    assert table(r.stdout) == [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],  # Kafka's columns
                               [g, "t", "0", "0"], [g, "t", "1", "0"], [g, "t", "2", "0"], [g, "u", "0", "0"]]
    assert "Dry run" in r.stderr
    doc = js(herd, "reset-offsets", g, "--topic", "t:1", "--to-offset", "3", "--dry-run")
    assert doc == {"executed": False, "groups": [{"group": g, "state": "Empty", "error": None, "committed": False,
                                                  "partitions": [{"topic": "t", "partition": 1,
                                                                  "current_offset": 6, "new_offset": 3}]}]}
    assert fetch_offsets(herd, g) == before

    # --execute commits the plan
    doc = js(herd, "reset-offsets", g, "--topic", "t:0,2", "--to-offset", "42", "--no-clamp", "--execute")
    assert doc["executed"] is True and doc["groups"][0]["committed"] is True
    assert [(p["partition"], p["current_offset"], p["new_offset"], p["error"])
            for p in doc["groups"][0]["partitions"]] == [(0, 5, 42, None), (2, 7, 42, None)]
    assert fetch_offsets(herd, g) == {**before, ("t", 0): 42, ("t", 2): 42}

    doc = js(herd, "reset-offsets", g, "--topic", "t", "--shift-by", "-2", "--no-clamp", "--execute")
    assert [p["new_offset"] for p in doc["groups"][0]["partitions"]] == [40, 4, 40]
    assert fetch_offsets(herd, g) == {("t", 0): 40, ("t", 1): 4, ("t", 2): 40, ("u", 0): 8}

    for spec in (["--to-current"], ["--to-earliest"]):
        doc = js(herd, "reset-offsets", g, "--topic", "t:0", *spec)
        assert doc["groups"][0]["partitions"][0]["new_offset"] == (40 if spec == ["--to-current"] else 0)
    ok(herd, "reset-offsets", g, "--all-topics", "--to-earliest", "--execute")
    assert fetch_offsets(herd, g) == {("t", 0): 0, ("t", 1): 0, ("t", 2): 0, ("u", 0): 0}

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
    assert fails(herd, *base, "--topic", "t", "--to-datetime", "noon").startswith("invalid --to-datetime")
    assert fails(herd, *base, "--topic", "t", "--by-duration", "1h").startswith("invalid --by-duration")
    assert "one of the arguments --to-earliest" in fails(herd, *base, "--topic", "t")
    assert "one of the arguments --topic --all-topics is required" in fails(herd, *base, "--to-earliest")
    assert "not allowed with argument" in fails(herd, *base, "--all-topics", "--to-earliest", "--to-latest")
    assert "not allowed with argument" in fails(herd, *base, "--all-topics", "--to-earliest", "--dry-run",
                                                "--execute")
    assert "not an integer" in fails(herd, *base, "--all-topics", "--to-offset", "ten")
    assert fails(herd, *base, "--all-topics", "--to-offset", "-5", "--no-clamp", "--execute") == (
        "cannot reset t-0 to offset -5: offsets are not negative")
    assert fails(herd, *base, "--all-topics", "--shift-by", str(2**63 - 1), "--no-clamp", "--execute") == (
        f"cannot reset t-0 to offset {2**63 + 4}: offsets are at most {2**63 - 1}")
    assert fetch_offsets(herd, "reset-err") == {("t", 0): 5}


def test_reset_offsets_without_a_data_cluster_never_takes_herd_s_empty_logs_for_real_ones(herd):
    """herd holds no records: what needs a log end is refused, and nothing is clamped to [0, 0]."""
    g = "reset-noends"
    commit_raw(herd, g, {("t", 0): 1000, ("t", 1): 1000})
    hint = (f"which {herd.bootstrap} does not have: it holds no records (a coordinator like herd); give "
            "--data-bootstrap-server, the Kafka cluster that holds the partitions")
    for spec, needs in ((["--to-latest"], "the log-end offsets"),
                        (["--to-datetime", "2024-05-01T12:00:00Z"], "the records' timestamps"),
                        (["--by-duration", "PT1H"], "the records' timestamps")):
        for data in ([], ["--data-bootstrap-server", herd.bootstrap]):  # herd as the data cluster: the same
            assert fails(herd, "reset-offsets", g, "--topic", "t", *spec, "--execute", *data) == (
                f"{spec[0]} needs {needs}, {hint}")
    # --to-current keeps the committed offsets, but has no log end for a partition without one
    assert fails(herd, "reset-offsets", g, "--topic", "t", "--to-current", "--execute") == (
        f"--to-current needs the log-end offset of t-2 (group '{g}' has no committed offset for it), {hint}")
    assert fetch_offsets(herd, g) == {("t", 0): 1000, ("t", 1): 1000}

    # --to-offset and --shift-by are not clamped to a range nobody knows
    r = run("reset-offsets", g, "--topic", "t:0,1", "--to-offset", "5000", "--execute",
            "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"warning: {herd.bootstrap} holds no records, so the log range is unknown: offsets are "
                        "not clamped to it (give --data-bootstrap-server to clamp them)\n")
    assert fetch_offsets(herd, g) == {("t", 0): 5000, ("t", 1): 5000}
    ok(herd, "reset-offsets", g, "--topic", "t:0", "--shift-by", "10", "--execute")
    ok(herd, "reset-offsets", g, "--topic", "t:0,1", "--to-current", "--execute")
    assert fetch_offsets(herd, g) == {("t", 0): 5010, ("t", 1): 5000}


def test_reset_offsets_checks_that_the_partitions_exist(herd):
    g = "reset-parts"
    commit_raw(herd, g, {("t", 0): 3})
    assert fails(herd, "reset-offsets", g, "--topic", "t:1,7", "--topic", "u:2", "--to-offset", "5", "--no-clamp",
                 "--execute") == 'The partitions "t-7,u-2" do not exist'
    assert fetch_offsets(herd, g) == {("t", 0): 3}
    # a topic no cluster knows: herd keeps offsets for any topic, and a warning says they were not checked
    r = run("reset-offsets", g, "--topic", "elsewhere:0,5", "--to-offset", "9", "--no-clamp", "--execute",
            "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 0, r.stderr
    assert r.stderr == (f"warning: topic 'elsewhere' does not exist on {herd.bootstrap}: its partitions are not "
                        "checked\n")
    assert fetch_offsets(herd, g) == {("t", 0): 3, ("elsewhere", 0): 9, ("elsewhere", 5): 9}


def test_reset_offsets_of_several_groups_resets_the_inactive_ones_and_reports_the_others(herd, members):
    a = Member(herd, "multi-b", "c-multi")
    members.append(a)
    wait_stable(herd, "multi-b", [a])
    a.commit({("t", 0): 5})
    commit_raw(herd, "multi-a", {("t", 0): 7})
    commit_raw(herd, "multi-c", {("t", 1): 8})
    names = ["multi-a", "multi-b", "multi-c"]
    before = {g: fetch_offsets(herd, g) for g in names}
    refused = "Assignments can only be reset if the group 'multi-b' is inactive, but the current state is Stable."

    # a dry run shows the plan of the inactive groups and reports the active one
    r = run("reset-offsets", *names, "--all-topics", "--to-offset", "1", "--no-clamp",
            "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 2
    assert table(r.stdout) == [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                               ["multi-a", "t", "0", "1"], ["multi-c", "t", "1", "1"]]
    assert r.stderr.splitlines() == ["Dry run: nothing was committed. Add --execute to commit these offsets.",
                                     f"herd: error: {refused}"]
    assert {g: fetch_offsets(herd, g) for g in names} == before

    # --execute commits the inactive groups; the JSON tells each group's state, outcome and error
    r = run("reset-offsets", *names, "--all-topics", "--to-offset", "1", "--no-clamp", "--execute",
            "--output", "json", "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 2 and r.stderr == f"herd: error: {refused}\n"
    doc = json.loads(r.stdout)
    assert doc["executed"] is True
    assert [(x["group"], x["state"], x["committed"], x["error"]) for x in doc["groups"]] == [
        ("multi-a", "Empty", True, None), ("multi-b", "Stable", False, refused), ("multi-c", "Empty", True, None)]
    assert doc["groups"][1]["partitions"] == []
    assert {g: fetch_offsets(herd, g) for g in names} == {
        "multi-a": {("t", 0): 1}, "multi-b": {("t", 0): 5}, "multi-c": {("t", 1): 1}}

    # several refused: one line each, then how many
    r = run("reset-offsets", "multi-b", "multi-a", "--topic", "t:1", "--shift-by", "1", "--execute",
            "--bootstrap-server", herd.bootstrap)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        refused, "cannot shift the offset of t-1: group 'multi-a' has no committed offset for it",
        "herd: error: 2 of 2 groups were not reset: 'multi-b', 'multi-a'"]


def test_a_deadline_while_committing_several_groups_tells_what_was_reset(herd):
    names = ["stall-a", "stall-b", "stall-c"]
    for g in names:
        commit_raw(herd, g, {("t", 0): 5})
    proxy = StallingProxy(herd.address, "stall-b")
    try:
        r = run("reset-offsets", *names, "--topic", "t:0", "--to-offset", "1", "--no-clamp", "--execute",
                "--output", "json", "--timeout", "3", "--bootstrap-server", proxy.address)
    finally:
        proxy.close()
    assert r.returncode == 2
    assert r.stderr == (f"herd: error: timed out after 3s waiting for {proxy.address} (OffsetCommit); "
                        "reset: 'stall-a'; unknown whether 'stall-b' was reset; not reset: 'stall-c'\n")
    doc = json.loads(r.stdout)
    assert [(x["group"], x["committed"]) for x in doc["groups"]] == [
        ("stall-a", True), ("stall-b", None), ("stall-c", False)]
    assert doc["groups"][2]["error"] == "not committed: the command stopped at group 'stall-b'"
    assert [fetch_offsets(herd, g) for g in names] == [{("t", 0): 1}, {("t", 0): 5}, {("t", 0): 5}]


def test_reset_offsets_export_and_from_file(herd, tmp_path):
    commit_raw(herd, "csv-a", {("t", 0): 5, ("t", 1): 6})
    commit_raw(herd, "csv-b", {("u", 0): 7})
    shift = ["--all-topics", "--shift-by", "2", "--no-clamp", "--export"]
    # as Kafka's tool: TOPIC,PARTITION,OFFSET for the one group named, else GROUP first
    assert ok(herd, "reset-offsets", "csv-a", *shift) == "t,0,7\nt,1,8\n"
    both = ok(herd, "reset-offsets", "csv-a", "--group", "csv-b", *shift)
    assert both == "csv-a,t,0,7\ncsv-a,t,1,8\ncsv-b,u,0,9\n"
    assert fetch_offsets(herd, "csv-a") == {("t", 0): 5, ("t", 1): 6}  # --export alone is a dry run

    plan = tmp_path / "plan.csv"
    plan.write_text(both)
    ok(herd, "reset-offsets", "--from-file", plan, "--execute")  # no group named: the file's groups
    assert fetch_offsets(herd, "csv-a") == {("t", 0): 7, ("t", 1): 8}
    assert fetch_offsets(herd, "csv-b") == {("u", 0): 9}
    one = tmp_path / "one.csv"
    one.write_text("t,1,3\n\n")
    doc = js(herd, "reset-offsets", "csv-a", "--from-file", one, "--no-clamp", "--execute")
    assert [(p["topic"], p["partition"], p["current_offset"], p["new_offset"])
            for p in doc["groups"][0]["partitions"]] == [("t", 1, 8, 3)]
    assert fetch_offsets(herd, "csv-a") == {("t", 0): 7, ("t", 1): 3}

    assert fails(herd, "reset-offsets", "--from-file", one) == (  # issue 24, snag 7: ask for the group
        f"--from-file {one} line 1 has no group column (TOPIC,PARTITION,OFFSET): name the one group it is for "
        f"with --group GROUP")
    assert fails(herd, "reset-offsets", "csv-c", "--from-file", plan) == (
        f"No reset plan for group 'csv-c' found in {plan}.")
    bad = tmp_path / "bad.csv"
    bad.write_text("csv-a,t,9,1\n")
    assert fails(herd, "reset-offsets", "--from-file", bad) == 'The partitions "t-9" do not exist'
    bad.write_text("csv-a,t,0,-1\n")
    assert fails(herd, "reset-offsets", "--from-file", bad).startswith(f"invalid --from-file {bad} line 1: ")
    assert fails(herd, "reset-offsets", "--from-file", tmp_path / "nope.csv") == (
        f"cannot read --from-file {tmp_path / 'nope.csv'}: No such file or directory")
    assert fails(herd, "reset-offsets", "csv-a", "--from-file", plan, "--topic", "t") == (
        "--from-file takes the partitions from the file: no --topic or --all-topics")
    assert fails(herd, "reset-offsets", "csv-a", "--all-topics", "--to-earliest", "--export", "--output",
                 "json") == "--export prints CSV: it does not go with --output json"
    assert fetch_offsets(herd, "csv-a") == {("t", 0): 7, ("t", 1): 3}


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
    assert ok(herd, "delete", "--group", "del") == (
        "Deletion of requested consumer groups ('del') was successful.\n")
    assert fails(herd, "describe", "del") == "Consumer group 'del' does not exist."
    assert fetch_offsets(herd, "del") == {}

    commit_raw(herd, "del-2", {("t", 0): 1})
    commit_raw(herd, "del-3", {("t", 0): 1})
    assert js(herd, "delete", "--group", "del-2", "--group", "del-3") == {"groups": [
        {"group": "del-2", "deleted": True, "error": None},
        {"group": "del-3", "deleted": True, "error": None}]}
    r = run("delete", "--group", "del-none", "--bootstrap-server", herd.bootstrap, "--output", "json")
    assert r.returncode == 2
    assert json.loads(r.stdout) == {"groups": [
        {"group": "del-none", "deleted": False, "error": "GROUP_ID_NOT_FOUND"}]}
    assert r.stderr.strip() == ("herd: error: Group 'del-none' could not be deleted: Consumer group "
                                "'del-none' does not exist.")
    assert "the following arguments are required: --group" in fails(herd, "delete")


def test_delete_offsets(herd, members):
    g = "deloffs"
    commit_raw(herd, g, {("t", 0): 1, ("t", 1): 2, ("u", 0): 3, ("u", 1): 4})
    out = ok(herd, "delete-offsets", "--group", g, "--topic", "u")
    assert out.splitlines()[0] == f"Request succeeded for deleting offsets from group {g}."  # as Kafka's tool
    assert table(out)[1:] == [["TOPIC", "PARTITION", "STATUS"], ["u", "0", "Successful"], ["u", "1", "Successful"]]
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
    assert r.stderr.strip() == ("herd: error: could not delete the offset of t-0 for group 'deloffs': "
                                "the group is subscribed to the topic")
    assert fetch_offsets(herd, g) == {("t", 0): 1}
    assert fails(herd, "delete-offsets", "--group", "deloffs-none", "--topic", "t:0") == (
        "Consumer group 'deloffs-none' does not exist.")


# ---- history ---------------------------------------------------------------------------------------

KILLABLE_MEMBER = r"""
import sys
import confluent_kafka
bootstrap, group, client_id = sys.argv[1:4]
c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                              "enable.auto.commit": False, "session.timeout.ms": 1000,
                              "heartbeat.interval.ms": 200})
c.subscribe(["t"])
while True:
    c.poll(0.1)
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
    trigger = joined[0]["trigger"]
    assert trigger["client_id"] == "visitor" and trigger["client_host"] == "/127.0.0.1"
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
    assert "  why        member " in text
    assert "(client 'crasher' from /127.0.0.1) stopped heartbeating" in text
    assert "  trigger    visitor@/127.0.0.1 [" in text
    assert "steady@/127.0.0.1 [" in text and ": rejoined after " in text
    assert "  phases     preparing " in text and "  result     protocol range, 1 member" in text

    # errors: unknown group (404), nothing listening, no address
    assert fails(herd, "history", "hist-none", "--http", herd.http, bootstrap=False) == (
        "Consumer group 'hist-none' does not exist.")
    assert fails(herd, "history", g, "--http", "127.0.0.1:1", bootstrap=False) == (
        "cannot connect to 127.0.0.1:1: Connection refused")
    assert fails(herd, "history", g, bootstrap=False).startswith(
        "history reads herd's HTTP endpoint: give --http")
    # the Kafka port given as --http (issue 33: "Remote end closed connection without response")
    kafka_port = herd.bootstrap
    for command in (["history", g], ["describe", g, "--bootstrap-server", herd.bootstrap]):
        assert fails(herd, *command, "--http", kafka_port, bootstrap=False) == (
            f"{kafka_port} is not herd's HTTP port (--http must be the --metrics-port of herd serve, "
            "not its Kafka port): it closed the connection without an HTTP answer")
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
    r = run("describe", "env-group", "--bootstrap-server", herd.bootstrap,
            "--data-bootstrap-server", "127.0.0.1:1")
    assert r.returncode == 2
    assert r.stderr == "herd: error: cannot connect to 127.0.0.1:1: Connection refused\n"
    doc = js(herd, "describe", "env-group", "--data-bootstrap-server", herd.bootstrap)
    assert doc["groups"][0]["partitions"][0]["log_end_offset"] is None  # herd as data: still unknown


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


def test_a_server_that_is_not_kafka():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]

        def answer():
            conn, _ = srv.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        t = threading.Thread(target=answer, daemon=True)
        t.start()
        r = run("list", "--bootstrap-server", f"127.0.0.1:{port}", "--timeout", "5")
        t.join(5)
    assert r.returncode == 2
    assert r.stderr == (f"herd: error: 127.0.0.1:{port} sent a ApiVersions response of 1213486160 bytes: "
                        "is it a Kafka server?\n")


@pytest.mark.parametrize("args, message", [
    (["list", "--bootstrap-server", "nohostport:"],
     "invalid --bootstrap-server 'nohostport:': expected HOST:PORT"),
    (["list", "--bootstrap-server", "h:99999"], "invalid --bootstrap-server 'h:99999': expected HOST:PORT"),
    (["list", "--timeout", "0"], "must be more than 0 and at most 86400 seconds"),
    (["list", "--output", "yaml"], "invalid choice: 'yaml'"),
    (["describe", "g", "--all-groups"], "give group names or --all-groups, not both"),
    (["delete-offsets", "--group", "g"], "the following arguments are required: --topic"),
    (["history", "g", "--http", "127.0.0.1:port"], "invalid --http"),
    ([], "the following arguments are required: COMMAND"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["list", "--bogus"], "unrecognized arguments: --bogus"),
    (["describe", "g", "--topic", "t"], "unrecognized arguments: --topic t"),
    (["reset-offsets", "g", "--all-topics", "--to-offset", "99999999999999999999"],
     "argument --to-offset: out of range: 99999999999999999999 (offsets are 64-bit, at most 9223372036854775807)"),
    (["reset-offsets", "g", "--all-topics", "--shift-by", "-9223372036854775809"], "argument --shift-by: out of range"),
])
def test_invalid_arguments(args, message):
    r = run(*args)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error: ") and message in lines[0], r.stderr


# ---- the pure parts, without a daemon ------------------------------------------------------------

def _who(mid, client, instance=None):
    return {"member_id": mid, "group_instance_id": instance, "client_id": client, "client_host": "/10.0.0.9"}


def test_render_history_of_every_kind_of_entry():
    from admin.history import render_history
    hist = [
        {"generation": 7, "previous_generation": 6, "reason": "member_joined", "detail": "member b joined",
         "trigger": _who("b", "cb"), "client_reason": None, "initial": False, "outcome": "stable",
         "protocol": "range", "members": 2, "started_wall_ms": 0, "ended_wall_ms": 40, "duration_ms": 40,
         "phases": {"preparing_ms": 30, "completing_ms": 10},
         "awaited": [{**_who("a", "ca"), "rejoined_after_ms": 30, "outcome": "rejoined"}],
         "slowest_member": {"member_id": "a", "rejoined_after_ms": 30},
         "joined": [{**_who("b", "cb"), "joined_after_ms": 0}], "removed": [],
         "sync": [{"member_id": "a", "synced_after_ms": 10}, {"member_id": "b", "synced_after_ms": None}],
         "stall": {"stall_ms": 15_000, "stall_ended_wall_ms": 0, "when": "after", "started_after_stall_ms": 20}},
        {"generation": 8, "previous_generation": 7, "reason": "member_left", "detail": "LeaveGroup for a, b",
         "trigger": {"member_ids": ["a", "b"]}, "client_reason": "shutting down", "initial": False,
         "outcome": "empty", "protocol": None, "members": 0, "started_wall_ms": 1_000, "ended_wall_ms": 1_000,
         "duration_ms": 0, "phases": {"preparing_ms": 0, "completing_ms": 0}, "awaited": [],
         "slowest_member": None, "joined": [], "removed": [{"member_id": "a", "why": "left", "after_ms": 0}],
         "sync": []},
        {"generation": None, "previous_generation": 8, "reason": "static_member_replaced", "detail": "d",
         "trigger": _who("s2", "cs", "inst-1"), "client_reason": None, "initial": True,
         "outcome": "in_progress", "protocol": None, "members": None, "started_wall_ms": 2_000,
         "ended_wall_ms": None, "duration_ms": 5_000,
         "phases": {"preparing_ms": 5_000, "completing_ms": None},
         "awaited": [{**_who("s2", "cs", "inst-1"), "rejoined_after_ms": 4_000, "outcome": None,
                      "replaced_member_id": "s1"},
                     {**_who("x", "cx"), "rejoined_after_ms": None, "outcome": None}],
         "slowest_member": {"member_id": "s2", "rejoined_after_ms": 4_000}, "joined": [], "removed": [],
         "sync": []},
    ]
    text = "\n".join(render_history("g", hist))
    assert text.splitlines()[:3] == [
        "Group 'g': 3 rebalances recorded, oldest first (times UTC).",
        "  reasons: member_joined x1, member_left x1, static_member_replaced x1",
        "  slowest to rejoin: cs@/10.0.0.9 (instance inst-1) [s2] after 4000 ms (generation None)"]
    assert "generation 6 -> 7  1970-01-01 00:00:00.000  member_joined  stable after 40 ms" in text
    assert "  waited for ca@/10.0.0.9 [a]: rejoined after 30 ms" in text
    assert ("  phases     preparing 30 ms, completing 10 ms; slowest SyncGroup 10 ms from ca@/10.0.0.9 [a]"
            in text)
    # the members that left are named from earlier entries
    assert "  trigger    ca@/10.0.0.9 [a]\n  trigger    cb@/10.0.0.9 [b]\n  waited for nobody" in text
    assert "  client     shutting down" in text and "  removed    ca@/10.0.0.9 [a]: left after 0 ms" in text
    assert "  result     protocol -, 0 members" in text
    assert "  stall      started 20 ms after herd stalled 15000 ms" in text
    assert text.count("  stall ") == 1  # entries without a stall (or from an older herd) say nothing
    assert ("generation 8 -> ?  1970-01-01 00:00:02.000  static_member_replaced  in_progress for 5000 ms"
            in text)
    assert "rejoined after 4000 ms (replacing s1)" in text and "cx@/10.0.0.9 [x]: did not rejoin" in text
    assert render_history("g", []) == ["Group 'g': no rebalances recorded."]


def test_durations_datetimes_servers_and_cells():
    from admin.errors import CliError
    from admin.output import _cell
    from admin.reset import parse_datetime, parse_duration
    from admin.session import parse_servers
    assert parse_duration("PT1H30M") == 5400 and parse_duration("P1DT2S") == 86402
    assert parse_duration("pt0.5s") == 0.5
    for bad in ("P", "PT", "1H", "P1H", "PT1D"):
        with pytest.raises(CliError):
            parse_duration(bad)
    assert parse_datetime("1970-01-01T00:00:01Z") == 1000
    assert parse_datetime("1970-01-01T02:00:00.500+02:00") == 500
    assert parse_servers("a:1, b:2,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]
    assert parse_servers("host") == [("host", 9092)]
    assert _cell(None) == "-" and _cell("") == "-" and _cell(0) == "0"
    assert _cell("a b\x1b[0m\u200b") == "a b\\x1b[0m\\u200b"


# ---- an older broker: every API capped at a low version --------------------------------------------

class _LoopbackServer:
    """A TCP server on a free loopback port; each connection is served by ``_serve`` in a thread."""

    def __init__(self):
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.port = self.srv.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.srv.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        raise NotImplementedError


class OldBrokerProxy(_LoopbackServer):
    """Forwards to herd, but advertises (and so gets) only old versions of each API, answers a too
    new ApiVersions with UNSUPPORTED_VERSION as Kafka does, and points Metadata/FindCoordinator at
    itself. One request at a time per connection, as the admin tool sends them."""

    CAPS = {18: 2, 3: 1, 10: 2, 16: 2, 15: 0, 9: 3, 2: 0, 8: 2, 42: 0, 47: 0}

    def __init__(self, target):
        self.target = target
        self.seen: list[tuple[int, int]] = []
        super().__init__()

    @staticmethod
    def _frame(sock):
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        size = int.from_bytes(head, "big")
        body = b""
        while len(body) < size:
            chunk = sock.recv(size - len(body))
            if not chunk:
                return None
            body += chunk
        return body

    def _serve(self, client):
        from protocol.framing import frame
        from protocol.headers import decode_request_header, encode_response_header
        upstream = socket.create_connection(self.target, timeout=10)
        try:
            while True:
                req = self._frame(client)
                if req is None:
                    return
                header, _ = decode_request_header(req)
                key, version, cid = header.api_key, header.api_version, header.correlation_id
                self.seen.append((key, version))
                if key == 18 and version > self.CAPS[18]:
                    body = m.ApiVersionsResponse(error_code=35, api_keys=[
                        m.ApiVersionsResponseApiVersion(18, 0, self.CAPS[18])]).encode(0)
                    client.sendall(frame(encode_response_header(cid, 18, 0) + body))
                    continue
                assert version <= self.CAPS.get(key, 99), (key, version)
                if self.hold(key, version, req):  # never answered: the client gives up at its deadline
                    self._frame(client)
                    return
                upstream.sendall(frame(req))
                resp = self._frame(upstream)
                client.sendall(frame(self._rewrite(key, version, cid, resp)))
        except OSError:
            return
        finally:
            upstream.close()
            client.close()

    def hold(self, key, version, req) -> bool:
        return False

    def _rewrite(self, key, version, cid, data):
        from protocol.headers import decode_response_header, encode_response_header
        if key not in (18, 3, 10):
            return data
        _, pos = decode_response_header(data, key, version)
        resp = m.RESPONSES[key].decode(data, version, pos)
        if key == 18:
            resp.api_keys = [m.ApiVersionsResponseApiVersion(k.api_key, k.min_version,
                                                             min(k.max_version, self.CAPS.get(k.api_key, 99)))
                             for k in resp.api_keys]
        elif key == 3:
            for b in resp.brokers:
                b.host, b.port = "127.0.0.1", self.port
        else:
            resp.host, resp.port = "127.0.0.1", self.port
        return encode_response_header(cid, key, version) + resp.encode(version)


def test_an_old_broker_gets_old_versions(herd, members):
    proxy = OldBrokerProxy(herd.address)
    try:
        a = Member(herd, "old-broker", "c-old", topics=("t", "u"))
        members.append(a)
        wait_stable(herd, "old-broker", [a])
        a.commit({("t", 0): 3, ("u", 1): 4})

        def on_proxy(*args):
            r = run(*args, "--bootstrap-server", proxy.address)
            assert r.returncode == 0, r.stderr
            return r.stdout
        assert on_proxy("describe", "old-broker") == ok(herd, "describe", "old-broker")
        rows = {r[0]: r[1] for r in table(on_proxy("list", "--state"))[1:]}
        assert rows["old-broker"] == "Stable"  # ListGroups v2 has no state: DescribeGroups tells
        assert on_proxy("offsets", "old-broker") == ok(herd, "offsets", "old-broker")
        a.close()
        wait_state(herd, "old-broker", "Empty")
        on_proxy("reset-offsets", "old-broker", "--all-topics", "--to-earliest", "--execute")
        assert fetch_offsets(herd, "old-broker") == {("t", 0): 0, ("u", 1): 0}
        on_proxy("delete-offsets", "--group", "old-broker", "--topic", "u")
        on_proxy("delete", "--group", "old-broker")
        assert fetch_offsets(herd, "old-broker") == {}
        used = {}
        for key, version in proxy.seen:
            used.setdefault(key, set()).add(version)
        assert used[18] == {4, 2}  # asked at v4, told v0-2, asked again at v2
        for key in (3, 10, 16, 15, 9, 2, 8, 42, 47):
            assert used[key] == {OldBrokerProxy.CAPS[key]}, (key, used[key])
    finally:
        proxy.close()


class StallingProxy(OldBrokerProxy):
    """Forwards to herd at every version, but never answers the OffsetCommit of one group."""

    CAPS = {18: m.ApiVersionsRequest.MAX_VERSION, 10: 3}  # FindCoordinator: one host to rewrite

    def __init__(self, target, group: str):
        self.group = group
        super().__init__(target)

    def hold(self, key, version, req) -> bool:
        from protocol.headers import decode_request_header
        if key != m.OffsetCommitRequest.API_KEY:
            return False
        _, pos = decode_request_header(req)
        return m.OffsetCommitRequest.decode(req, version, pos).group_id == self.group


# ---- a data cluster that holds records ------------------------------------------------------------

class DataCluster(_LoopbackServer):
    """A one-broker cluster holding records, as a Kafka broker answers about them: it advertises the
    APIs of a server that stores logs, and answers Metadata and ListOffsets from ``topics``:
    {topic: [(log start, log end, timestamps of the records from the log start), ...]}."""

    LOG_APIS = {0: (3, 8), 21: (0, 2), 23: (0, 4), 34: (0, 2), 35: (0, 4)}  # Produce, DeleteRecords, ...

    def __init__(self, topics: dict[str, list[tuple[int, int, list[int]]]]):
        self.topics = topics
        super().__init__()

    def _serve(self, client):
        from protocol.framing import frame
        from protocol.headers import decode_request_header, encode_response_header
        with client:
            while (req := OldBrokerProxy._frame(client)) is not None:
                header, pos = decode_request_header(req)
                key, version = header.api_key, header.api_version
                body = getattr(self, f"_api{key}")(m.REQUESTS[key].decode(req, version, pos))
                client.sendall(frame(encode_response_header(header.correlation_id, key, version)
                                     + body.encode(version)))

    def _api18(self, req):  # ApiVersions
        apis = {**{c.API_KEY: (c.MIN_VERSION, c.MAX_VERSION) for c in (
            m.ApiVersionsRequest, m.MetadataRequest, m.ListOffsetsRequest, m.FetchRequest)}, **self.LOG_APIS}
        return m.ApiVersionsResponse(api_keys=[m.ApiVersionsResponseApiVersion(k, lo, hi)
                                               for k, (lo, hi) in sorted(apis.items())])

    def _api3(self, req):  # Metadata
        names = list(self.topics) if req.topics is None else [t.name for t in req.topics]
        topics = []
        for name in names:
            parts = self.topics.get(name)
            if parts is None:
                topics.append(m.MetadataResponseTopic(error_code=3, name=name))
                continue
            topics.append(m.MetadataResponseTopic(name=name, partitions=[
                m.MetadataResponsePartition(partition_index=p, leader_id=1, leader_epoch=0, replica_nodes=[1],
                                            isr_nodes=[1], offline_replicas=[]) for p in range(len(parts))]))
        return m.MetadataResponse(brokers=[m.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=self.port)],
                                  cluster_id="data", controller_id=1, topics=topics)

    def _api2(self, req):  # ListOffsets
        resp = m.ListOffsetsResponse()
        for rt in req.topics:
            out = m.ListOffsetsResponseListOffsetsTopicResponse(name=rt.name)
            resp.topics.append(out)
            parts = self.topics.get(rt.name, [])
            for rp in rt.partitions:
                pr = m.ListOffsetsResponseListOffsetsPartitionResponse(partition_index=rp.partition_index)
                out.partitions.append(pr)
                if not 0 <= rp.partition_index < len(parts):
                    pr.error_code = 3
                    continue
                start, end, stamps = parts[rp.partition_index]
                if rp.timestamp == -1:
                    pr.offset = end
                elif rp.timestamp == -2:
                    pr.offset = start
                else:  # the first record at or after the time; none: -1
                    pr.offset = next((start + i for i, ts in enumerate(stamps) if ts >= rp.timestamp), -1)
        return resp

    def _api1(self, req):  # Fetch: the whole log as one uncompressed v2 batch (it holds the offset asked)
        resp = m.FetchResponse(responses=[])
        for rt in req.topics:
            out = m.FetchResponseFetchableTopicResponse(topic=rt.topic, partitions=[])
            resp.responses.append(out)
            for rp in rt.partitions:
                start, end, stamps = self.topics[rt.topic][rp.partition]
                pd = m.FetchResponsePartitionData(partition_index=rp.partition, high_watermark=end,
                                                  aborted_transactions=[])
                if start <= rp.fetch_offset < end:
                    pd.records = _batch(start, stamps)
                out.partitions.append(pd)
        return resp


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _batch(base: int, stamps: list[int]) -> bytes:
    """One uncompressed record batch (magic 2, CreateTime), a value of one byte per record."""
    import struct

    records = bytearray()
    for i, ts in enumerate(stamps):
        body = b"\x00" + _zigzag(ts - stamps[0]) + _zigzag(i) + _zigzag(-1) + _zigzag(1) + b"x" + _zigzag(0)
        records += _zigzag(len(body)) + body
    tail = struct.pack(">hiqqqhii", 0, len(stamps) - 1, stamps[0], max(stamps), -1, -1, -1, len(stamps)) + records
    return struct.pack(">qiiBI", base, 4 + 1 + 4 + len(tail), 0, 2, 0) + tail


def test_herd_is_known_to_hold_no_records():
    from admin.session import holds_records
    from coordinator.core.versions import SUPPORTED
    assert not holds_records(SUPPORTED)  # herd advertises Fetch and Produce, but no API of a log store
    kafka = {**SUPPORTED, **DataCluster.LOG_APIS}
    assert holds_records(kafka)
    assert not holds_records({k: v for k, v in kafka.items() if k != m.FetchRequest.API_KEY})


def test_describe_and_reset_against_a_data_cluster_that_holds_records(herd):
    t0 = 1_700_000_000_000
    data = DataCluster({"t": [(10, 100, [t0 + 1000 * i for i in range(90)]),  # a record a second from t0
                              (0, 50, [t0 - 1000] * 50),  # every record older than t0
                              (0, 0, [])]})
    g = "with-data"
    commit_raw(herd, g, {("t", 0): 40, ("t", 1): 60})
    at = ["--bootstrap-server", herd.bootstrap, "--data-bootstrap-server", data.address]

    def cli(*args):
        r = run(*args, *at)
        assert r.returncode == 0, r.stderr
        return r

    try:
        rows = table(cli("describe", g).stdout)
        assert [r[1:6] for r in rows[1:]] == [["t", "0", "40", "100", "60"],
                                             ["t", "1", "60", "50", "-"]]  # log end below: lag unknown
        # LAG-SECONDS: how old the record at the committed offset is (t-0's offset 40: t0 + 30 s)
        assert rows[0][6] == "LAG-SECONDS" and rows[2][6] == "-"
        expected = (time.time() * 1000 - (t0 + 30_000)) / 1000
        assert abs(float(rows[1][6]) - expected) < 60
        doc = json.loads(cli("describe", g, "--output", "json").stdout)
        assert abs(doc["groups"][0]["partitions"][0]["lag_seconds"] - expected) < 60

        def plan(*args):
            r = cli("reset-offsets", g, *args, "--output", "json")
            notes = r.stderr.removesuffix("Dry run: nothing was committed. Add --execute to commit these offsets.\n")
            return [p["new_offset"] for p in json.loads(r.stdout)["groups"][0]["partitions"]], notes
        assert plan("--topic", "t", "--to-latest") == ([100, 50, 0], "")
        assert plan("--topic", "t", "--to-earliest") == ([10, 0, 0], "")
        assert plan("--topic", "t", "--to-current") == ([40, 60, 0], "")
        # clamped to the log range, as Kafka
        assert plan("--topic", "t:0,1", "--to-offset", "70") == ([70, 50], (
            "warning: t-1: offset 70 is outside the log range [0, 50]; using 50 (--no-clamp keeps 70)\n"))
        assert plan("--topic", "t:0", "--shift-by", "-35") == ([10], (
            "warning: t-0: offset 5 is outside the log range [10, 100]; using 10 (--no-clamp keeps 5)\n"))
        # by time: the first record at or after it; none (t-1, t-2): the log end, with Kafka's warning
        when = dt.datetime.fromtimestamp((t0 + 5000) / 1000, dt.UTC).isoformat()
        assert plan("--topic", "t", "--to-datetime", when) == ([15, 50, 0], (
            "warning: Partition 1 from topic t is empty. Falling back to latest known offset.\n"
            "warning: Partition 2 from topic t is empty. Falling back to latest known offset.\n"))
        assert plan("--topic", "t:0", "--by-duration", "PT1S")[0] == [100]

        # the partitions are those of the data cluster
        r = run("reset-offsets", g, "--topic", "t:3", "--to-earliest", "--execute", *at)
        assert r.returncode == 2 and r.stderr == 'herd: error: The partitions "t-3" do not exist\n'
        cli("reset-offsets", g, "--topic", "t:0", "--to-latest", "--execute")
        assert fetch_offsets(herd, g) == {("t", 0): 100, ("t", 1): 60}
    finally:
        data.close()


def test_describe_with_herds_http_port_adds_the_commit_age(herd):
    g = "aged"
    commit_raw(herd, g, {("t", 0): 3, ("t", 1): 4})
    time.sleep(0.3)
    text = ok(herd, "describe", g, "--http", herd.http)
    rows = table(text)
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "LAG-SECONDS",
                       "COMMIT-AGE", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    assert_aligned(text)
    for r in rows[1:]:
        assert r[4:7] == ["-", "-", "-"]  # herd has no data cluster here: no log end, no lag, no time lag
        assert 0.2 <= float(r[7]) < 60
    doc = json.loads(ok(herd, "describe", g, "--http", herd.http, "--output", "json"))
    ages = [p["commit_age_seconds"] for p in doc["groups"][0]["partitions"]]
    assert all(0.2 <= a < 60 for a in ages) and all(p["lag_seconds"] is None for p in doc["groups"][0]["partitions"])
    r = run("describe", g, "--bootstrap-server", herd.bootstrap, "--http", "127.0.0.1:1")
    assert r.returncode == 2 and r.stderr == "herd: error: cannot connect to 127.0.0.1:1: Connection refused\n"
