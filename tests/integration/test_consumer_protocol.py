"""KIP-848 against a real daemon: unmodified confluent-kafka consumers with
``group.protocol=consumer`` (librdkafka's ConsumerGroupHeartbeat v1), over loopback TCP.

The daemon runs with small consumer-group timeouts (session 4 s, heartbeat interval 250 ms,
through herd's ``group_consumer_*`` settings) so that the tests stay short. In-process members are
polled round-robin from one thread; every on_assign/on_revoke is recorded with its time, and an
ownership table is checked on each one: no partition is ever owned by two members.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tools.daemon import REPO, Daemon

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

pytestmark = pytest.mark.integration

SESSION_MS = 4000
HEARTBEAT_MS = 250
PARTITIONS = 12


def _daemon_args():
    return ["--topic", f"t:{PARTITIONS}", "--topic", "k:6", "--topic", "s:6", "--topic", "c:4", "--topic", "r:6",
            "--group-consumer-session-timeout-ms", str(SESSION_MS),
            "--group-consumer-min-session-timeout-ms", "1000",
            "--group-consumer-heartbeat-interval-ms", str(HEARTBEAT_MS),
            "--group-consumer-min-heartbeat-interval-ms", "100"]


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("kip848") / "data", *_daemon_args(), "--metrics-port", "0") as d:
        yield d


def _http_get(d: Daemon, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{d.wait_metrics_port()}{path}", timeout=10) as r:
        return r.read().decode()


def consumer_config(bootstrap, group, **extra):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "enable.auto.commit": False, "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000,
            "reconnect.backoff.max.ms": 500}
    conf.update(extra)
    return conf


class Members:
    """In-process consumer-protocol members of one group, polled from this thread."""

    def __init__(self, bootstrap, group, topic):
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.consumers: dict[str, ck.Consumer] = {}
        self.owned: dict[str, set[int]] = {}
        self.events: list[tuple[float, str, str, list[int]]] = []  # (time, member, assign|revoke, partitions)
        self.foreign: dict[str, set[int]] = {}  # partitions of members outside this process

    def add(self, name, **extra):
        c = ck.Consumer(consumer_config(self.bootstrap, self.group, **{"client.id": name, **extra}))
        self.owned[name] = set()

        def on_assign(_c, parts, name=name):
            ps = [p.partition for p in parts]
            self.events.append((time.monotonic(), name, "assign", ps))
            for p in ps:
                for other, owned in list(self.owned.items()) + list(self.foreign.items()):
                    assert other == name or p not in owned, \
                        f"partition {p} assigned to {name} while {other} owns it: {self.events}"
            self.owned[name].update(ps)

        def on_revoke(_c, parts, name=name):
            ps = [p.partition for p in parts]
            self.events.append((time.monotonic(), name, "revoke", ps))
            self.owned[name].difference_update(ps)

        c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        self.consumers[name] = c
        return c

    def close(self, name):
        self.consumers.pop(name).close()
        self.owned.pop(name, None)

    def poll(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for c in list(self.consumers.values()):
                c.poll(0.02)

    def union(self):
        out = set()
        for ps in self.owned.values():
            out |= ps
        return out

    def wait(self, cond, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.poll(0.1)
            if cond():
                return time.monotonic()
        raise AssertionError(f"timed out waiting for {what}: owned={self.owned} events={self.events[-20:]}")

    def balanced(self, n_parts):
        sizes = sorted(len(ps) for ps in self.owned.values())
        return self.union() == set(range(n_parts)) and sum(sizes) == n_parts and sizes[-1] - sizes[0] <= 1

    def close_all(self):
        for name in list(self.consumers):
            self.close(name)


def test_members_converge_a_fourth_joins_without_double_ownership_and_a_leaver_is_replaced_fast(herd):
    ms = Members(herd.bootstrap, "g-converge", "t")
    try:
        for i in range(3):
            ms.add(f"m{i}")
        ms.wait(lambda: ms.balanced(PARTITIONS) and all(len(p) == 4 for p in ms.owned.values()), 30,
                "three members with 4 partitions each")
        ms.add("m3")  # revoke before assign: the ownership check runs on every callback
        ms.wait(lambda: ms.balanced(PARTITIONS) and len(ms.owned["m3"]) == 3, 30, "four members with 3 each")
        before = {n: set(p) for n, p in ms.owned.items()}
        # the uniform assignor is sticky: each old member gave up one partition, kept the rest
        assert all(len(before[n]) == 3 for n in before)
        # m1 leaves (close: a leave heartbeat): the others take its partitions within a heartbeat
        # interval or two, far below the session timeout
        left = set(ms.owned["m1"])
        t0 = time.monotonic()
        ms.close("m1")
        t1 = ms.wait(lambda: ms.balanced(PARTITIONS), 20, "the leaver's partitions taken")
        took = t1 - t0
        print(f"partitions of a leaving member taken over in {took * 1000:.0f} ms "
              f"(heartbeat interval {HEARTBEAT_MS} ms)")
        assert took < SESSION_MS / 1000 / 2, took  # not waiting for its session to expire
        for n in ms.owned:  # nobody lost what it had: only the leaver's partitions moved
            assert before[n] <= ms.owned[n]
        assert set().union(*(ms.owned[n] - before[n] for n in ms.owned)) == left
    finally:
        ms.close_all()


_MEMBER = textwrap.dedent("""
    import sys, time
    import confluent_kafka as ck
    conf = {"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "group.protocol": "consumer",
            "client.id": "victim", "enable.auto.commit": False}
    c = ck.Consumer(conf)
    def on_assign(_c, parts):
        print("ASSIGN", ",".join(str(p.partition) for p in parts), flush=True)
    c.subscribe([sys.argv[3]], on_assign=on_assign)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        c.poll(0.05)
""")


def test_a_sigkilled_member_is_replaced_after_the_session_timeout(herd, tmp_path):
    script = tmp_path / "member.py"
    script.write_text(_MEMBER)
    ms = Members(herd.bootstrap, "g-kill", "k")
    proc = subprocess.Popen([sys.executable, str(script), herd.bootstrap, "g-kill", "k"], stdout=subprocess.PIPE,
                            text=True, cwd=str(REPO))
    try:
        ms.add("a")
        ms.add("b")
        # the victim takes part: the three split the 6 partitions 2/2/2
        ms.wait(lambda: len(ms.union()) == 4 and all(len(p) == 2 for p in ms.owned.values()), 30,
                "three members 2/2/2")
        ms.foreign["victim"] = set(range(6)) - ms.union()
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        ms.foreign.clear()  # its partitions are free only once the coordinator fenced it
        t1 = ms.wait(lambda: ms.balanced(6), SESSION_MS / 1000 + 20, "the killed member's partitions taken")
        took = t1 - t0
        print(f"partitions of a SIGKILLed member taken over after {took * 1000:.0f} ms "
              f"(session timeout {SESSION_MS} ms)")
        assert took >= SESSION_MS / 1000 - 1.0, took  # not before its session could expire
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        ms.close_all()


def test_commit_and_fetch_with_member_epochs_read_back_by_a_classic_client(herd):
    ms = Members(herd.bootstrap, "g-commit", "c")
    try:
        c = ms.add("only")
        ms.wait(lambda: ms.owned["only"] == {0, 1, 2, 3}, 30, "the member owns every partition")
        c.commit(offsets=[TopicPartition("c", p, 100 + p) for p in range(4)], asynchronous=False)
        got = c.committed([TopicPartition("c", p) for p in range(4)], timeout=10)
        assert [(tp.partition, tp.offset, tp.error) for tp in got] == [(p, 100 + p, None) for p in range(4)]
        # the commit carried the member's epoch: another epoch is refused, the right one accepted
        from protocol import messages as m
        from tools.rawclient import RawClient

        def raw_commit(epoch):
            with RawClient(herd.address) as rc:
                r = rc.call(m.OffsetCommitRequest(group_id="g-commit", generation_id_or_member_epoch=epoch,
                                                  member_id=c.memberid(), topics=[m.OffsetCommitRequestTopic(
                                                      "c", [m.OffsetCommitRequestPartition(0, 100)])]), 9)
            return r.topics[0].partitions[0].error_code

        admin = AdminClient({"bootstrap.servers": herd.bootstrap})
        epoch = admin.describe_consumer_groups(["g-commit"], request_timeout=10)["g-commit"].result(15)
        assert [mm.member_id for mm in epoch.members] == [c.memberid()]
        from protocol import errors as E
        with RawClient(herd.address) as rc:
            described = rc.call(m.ConsumerGroupDescribeRequest(group_ids=["g-commit"]), 0)
        [member] = described.groups[0].members
        assert member.member_id == c.memberid() and member.member_epoch > 0
        assert raw_commit(member.member_epoch + 1000) == E.STALE_MEMBER_EPOCH
        assert raw_commit(member.member_epoch) == E.NONE
        # a classic kafka-python client reads them back (OffsetFetch without joining)
        import kafka

        kc = kafka.KafkaConsumer(bootstrap_servers=herd.bootstrap, group_id="g-commit",
                                 enable_auto_commit=False)
        try:
            assert [kc.committed(kafka.TopicPartition("c", p)) for p in range(4)] == [100, 101, 102, 103]
        finally:
            kc.close()
    finally:
        ms.close_all()


def test_admin_client_describes_and_lists_a_consumer_group(herd):
    ms = Members(herd.bootstrap, "g-admin", "t")
    try:
        ms.add("x")
        ms.add("y")
        ms.wait(lambda: ms.balanced(PARTITIONS) and all(ms.owned.values()), 30, "two members")
        admin = AdminClient({"bootstrap.servers": herd.bootstrap})
        desc = admin.describe_consumer_groups(["g-admin"], request_timeout=10)["g-admin"].result(15)
        assert desc.type == ck.ConsumerGroupType.CONSUMER
        assert str(desc.state).endswith("STABLE")
        assert sorted(m.client_id for m in desc.members) == ["x", "y"]
        by_client = {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in desc.members}
        assert by_client == {"x": ms.owned["x"], "y": ms.owned["y"]}
        listed = admin.list_consumer_groups(types={ck.ConsumerGroupType.CONSUMER}, request_timeout=10).result(15)
        ids = {g.group_id: g.type for g in listed.valid}
        assert ids.get("g-admin") == ck.ConsumerGroupType.CONSUMER
        classic = admin.list_consumer_groups(types={ck.ConsumerGroupType.CLASSIC}, request_timeout=10).result(15)
        assert "g-admin" not in {g.group_id for g in classic.valid}
    finally:
        ms.close_all()


def test_a_static_member_restarts_and_gets_its_partitions_back(herd):
    ms = Members(herd.bootstrap, "g-static", "s")
    try:
        ms.add("a", **{"group.instance.id": "inst-a"})
        ms.add("b", **{"group.instance.id": "inst-b"})
        ms.wait(lambda: ms.balanced(6) and all(len(p) == 3 for p in ms.owned.values()), 30, "3/3")
        a_before, b_before = set(ms.owned["a"]), set(ms.owned["b"])
        n_events = len(ms.events)
        ms.close("a")  # a static member's close: a temporary leave (epoch -2), partitions kept
        ms.poll(1.0)  # b keeps heartbeating: nothing of a's moves to it
        assert ms.owned["b"] == b_before
        ms.add("a", **{"group.instance.id": "inst-a"})
        ms.wait(lambda: ms.owned.get("a") == a_before, 20, "a's partitions back")
        assert ms.owned["b"] == b_before
        assert not [e for e in ms.events[n_events:] if e[1] == "b"]  # b never moved
    finally:
        ms.close_all()


def test_herd_restarted_mid_group_and_the_group_resumes(tmp_path):
    d = Daemon(tmp_path / "data", *_daemon_args())
    with d:
        ms = Members(d.bootstrap, "g-restart", "r")
        try:
            ms.add("a")
            ms.add("b")
            ms.wait(lambda: ms.balanced(6) and all(len(p) == 3 for p in ms.owned.values()), 30, "3/3")
            admin = AdminClient({"bootstrap.servers": d.bootstrap})
            before = admin.describe_consumer_groups(["g-restart"], request_timeout=10)["g-restart"].result(15)
            ids_before = sorted(m.member_id for m in before.members)
            owned_before = {n: set(p) for n, p in ms.owned.items()}
            d.extra_args += ["--port", str(d.port)]  # the members reconnect to the same address
            d.restart()
            admin = AdminClient({"bootstrap.servers": d.bootstrap})
            after = None
            end = time.monotonic() + 20
            while time.monotonic() < end:
                ms.poll(0.5)  # the members reconnect and heartbeat with the epochs they had
                try:
                    after = admin.describe_consumer_groups(["g-restart"], request_timeout=2)["g-restart"].result(5)
                except ck.KafkaException:
                    continue
                if str(after.state).endswith("STABLE"):
                    break
            assert after is not None and str(after.state).endswith("STABLE"), after
            assert sorted(m.member_id for m in after.members) == ids_before  # the same members, replayed
            assert ms.owned == owned_before  # nobody lost or gained a partition
            ms.add("c")  # and it goes on: a newcomer gets its share
            ms.wait(lambda: ms.balanced(6) and len(ms.owned["c"]) == 2, 30, "a third member after the restart")
        finally:
            ms.close_all()
    assert "Traceback" not in d.logs()



def test_metrics_count_consumer_heartbeats_and_the_flight_recorder_says_why_epochs_moved(herd):
    import json

    def heartbeats():
        for line in _http_get(herd, "/metrics").splitlines():
            if line.startswith("herd_consumer_heartbeats_total "):
                return float(line.split()[1])
        raise AssertionError("no herd_consumer_heartbeats_total")

    first = heartbeats()
    ms = Members(herd.bootstrap, "g-metrics", "c")
    try:
        ms.add("p")
        ms.wait(lambda: ms.owned["p"] == {0, 1, 2, 3}, 30, "one member")
        ms.add("q")
        ms.wait(lambda: ms.balanced(4) and len(ms.owned["q"]) == 2, 30, "two members")
        ms.poll(3 * HEARTBEAT_MS / 1000)
        assert heartbeats() >= first + 6  # joins and a few heartbeats each
        text = _http_get(herd, "/metrics")
        assert 'herd_consumer_groups{state="Stable"}' in text
        history = json.loads(_http_get(herd, "/groups/g-metrics/history"))
        reasons = [e["reason"] for e in history]
        assert sum("joined" in r for r in reasons) == 2, history
        epochs = [e["group_epoch"] for e in history]
        assert epochs == sorted(epochs) and epochs[-1] >= 2
        assert all(e["wall_ms"] > 0 for e in history)
        groups = {g["group_id"]: g for g in json.loads(_http_get(herd, "/groups"))}
        assert groups["g-metrics"]["type"] == "consumer" and groups["g-metrics"]["members"] == 2
        # herd groups history renders it
        from tests.integration.test_admin import run

        r = run("history", "g-metrics", "--http", f"127.0.0.1:{herd.wait_metrics_port()}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("Consumer group 'g-metrics':") and r.stdout.count("joined") == 2
        assert f"group epoch {epochs[-1]}" in r.stdout
    finally:
        ms.close_all()


def test_herd_groups_shows_the_type_member_epochs_and_target_vs_current_assignment(herd):
    from tests.integration.test_admin import js, ok, table

    ms = Members(herd.bootstrap, "g-cli", "k")
    try:
        ms.add("e")
        ms.add("f")
        ms.wait(lambda: ms.balanced(6) and all(len(p) == 3 for p in ms.owned.values()), 30, "two members 3/3")
        ms.poll(2 * HEARTBEAT_MS / 1000)
        # list: the type column, and the type filter (ListGroups v5)
        rows = {r[0]: r[1:] for r in table(ok(herd, "list", "--state", "--type"))[1:]}
        assert rows["g-cli"] == ["Stable", "consumer"]
        consumer_only = {g["group"] for g in js(herd, "list", "--type", "consumer")["groups"]}
        classic_only = {g["group"] for g in js(herd, "list", "--type", "classic")["groups"]}
        assert "g-cli" in consumer_only and "g-cli" not in classic_only
        # describe: ConsumerGroupDescribe's view
        (info,) = js(herd, "describe", "g-cli")["groups"]
        assert info["type"] == "consumer" and info["state"] == "Stable" and info["assignment_strategy"] == "uniform"
        assert info["group_epoch"] == info["target_assignment_epoch"] >= 2
        by_client = {mm["client_id"]: mm for mm in info["members"]}
        assert set(by_client) == {"e", "f"}
        for name, mm in by_client.items():
            assert mm["member_epoch"] == info["target_assignment_epoch"]  # reconciled
            assert mm["assignment"] == mm["target_assignment"] == [{"topic": "k", "partitions": sorted(ms.owned[name])}]
        text = ok(herd, "describe", "g-cli", "--members", "--verbose")
        head, *rest = table(text)
        # no static member: no GROUP-INSTANCE-ID column, as Kafka's tool
        assert head == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                        "CURRENT-EPOCH", "CURRENT-ASSIGNMENT", "TARGET-EPOCH", "TARGET-ASSIGNMENT"]
        assert len(rest) == 2 and all(r[5] == str(info["group_epoch"]) == r[7] for r in rest)
        assert all(r[6] == r[8] and r[6].startswith("k:") for r in rest)  # reconciled: current == target
        state = table(ok(herd, "describe", "g-cli", "--state"))
        assert state[0][-3:] == ["GROUP-EPOCH", "TARGET-ASSIGNMENT-EPOCH", "#MEMBERS"] and state[1][-1] == "2"
    finally:
        ms.close_all()
