"""KafkaGroupConsumer against a real Kafka broker (the data cluster, the reference fixture's broker)
and a real herd daemon coordinating the group (issue 29).

herd runs with ``--data-bootstrap-server`` pointing at the broker and ``--topic`` naming each
topic with the broker's partition count, so the tests hold whether herd takes the counts from the
data cluster or from its flags. Member processes are ``tools.kafka_member`` (their traces are
ordered by CLOCK_MONOTONIC, shared by every process of the machine).
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict

import pytest

from tools.daemon import REPO, Daemon

pytestmark = [pytest.mark.integration, pytest.mark.reference, pytest.mark.slow]

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is a test extra (pip install -e '.[test]')")

RUN = uuid.uuid4().hex[:6]
TOPICS = {f"kgc-main-{RUN}": 6, f"kgc-reset-{RUN}": 2, f"kgc-api-{RUN}": 3, f"kgc-down-{RUN}": 2,
          f"kgc-docs-{RUN}": 2, f"kgc-stream-{RUN}": 2}
MAIN, RESET, API, DOWN, DOCS, STREAM = TOPICS
FAST = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 500}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from tools.kafka_broker import KafkaBroker

    with KafkaBroker(tmp_path_factory.mktemp("kafka-data")) as b:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic(t, n, 1) for t, n in TOPICS.items()]).values():
            f.result(30)
        yield b


@pytest.fixture(scope="module")
def herd(broker, tmp_path_factory):
    port = _free_port()
    args = ["--port", str(port), "--data-bootstrap-server", broker.bootstrap, "--min-session-timeout-ms", "1000"]
    for t, n in TOPICS.items():
        args += ["--topic", f"{t}:{n}"]
    with Daemon(tmp_path_factory.mktemp("herd-kgc") / "data", *args, initial_rebalance_delay_ms=0) as d:
        yield d


def produce(bootstrap, topic, start, count, partitions=None):
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(start, start + count):
        kw = {"partition": i % partitions} if partitions else {}
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, **kw)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def ends(bootstrap, topic, n):
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "ends-probe"})
    try:
        return {p: c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)[1] for p in range(n)}
    finally:
        c.close()


def drain(consumer, want, timeout=30.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += consumer.poll(0.5)
    return out


def test_reads_from_committed_offsets_and_the_api_works(broker, herd):
    from client import KafkaGroupConsumer, Record, TopicPartition

    produce(broker.bootstrap, API, 0, 300, partitions=3)
    group = f"api-{RUN}"
    tp0 = TopicPartition(API, 0)
    with KafkaGroupConsumer(herd.bootstrap, group, broker.bootstrap, auto_offset_reset="earliest",
                            enable_auto_commit=False, max_poll_records=50, **{k.replace(".", "_"): v
                                                                               for k, v in FAST.items()}) as c:
        c.subscribe([API])
        first = drain(c, 1)
        assert first and isinstance(first[0], Record) and len(first) <= 50
        rest = drain(c, 300 - len(first))
        got = first + rest
        assert len(got) == 300 and len({(r.partition, r.offset) for r in got}) == 300
        assert all(r.value == b"v" + r.key[1:] and r.timestamp_ms > 0 for r in got)
        assert c.assignment() == {TopicPartition(API, p) for p in range(3)}
        assert c.position(tp0) == 100
        assert c.committed([tp0])[tp0] is None  # auto-commit is off
        c.commit({tp0: 40})
        assert c.committed([tp0])[tp0].offset == 40
        c.commit()  # the consumed positions
        assert {tp.partition: om.offset for tp, om in c.committed(c.assignment()).items()} == {0: 100, 1: 100, 2: 100}
        done = []
        c.commit({tp0: 99}, sync=False, callback=lambda offsets, err: done.append(err))
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            c.poll(0.1)
        assert done == [None] and c.committed([tp0])[tp0].offset == 99
        # seek back: the next records of partition 0 start there
        c.seek(tp0, 90)
        again = drain(c, 10)
        assert [r.offset for r in again if r.partition == 0][:10] == list(range(90, 100))
        # pause: no records of a paused partition, until resume
        c.pause([tp0])
        produce(broker.bootstrap, API, 300, 30, partitions=3)
        got = drain(c, 20, timeout=10)
        assert {r.partition for r in got} == {1, 2} and c.paused() == {tp0}
        c.resume([tp0])
        got = drain(c, 10, timeout=10)
        assert [r.offset for r in got if r.partition == 0] == list(range(100, 110))
        # librdkafka's messages as they are, positions moving the same way
        produce(broker.bootstrap, API, 330, 3, partitions=3)
        msgs = []
        deadline = time.monotonic() + 10
        while len(msgs) < 3 and time.monotonic() < deadline:
            msgs += c.poll_messages(0.5)
        assert sorted((m.partition(), m.offset()) for m in msgs) == [(0, 110), (1, 110), (2, 110)]
        assert all(c.position(TopicPartition(API, p)) == 111 for p in range(3))
    # a new member of the same group starts from the committed offsets
    with KafkaGroupConsumer(herd.bootstrap, group, broker.bootstrap, {"auto.offset.reset": "earliest", **FAST}) as c2:
        c2.subscribe(API)
        got = drain(c2, 21, timeout=20)
        firsts = {}
        for r in got:
            firsts.setdefault(r.partition, r.offset)
        assert firsts == {0: 99, 1: 100, 2: 100}


def test_the_docs_example_runs(broker, herd, tmp_path):
    """docs/client.md's "With data in Kafka" block, run as written (only the addresses and the topic
    name changed) against the broker and herd."""
    from client import GroupConsumer, TopicPartition
    from tests.support.docblocks import block

    produce(broker.bootstrap, DOCS, 0, 20, partitions=2)
    program = tmp_path / "example.py"
    program.write_text(block("thin-client-kafka").replace("127.0.0.1:9092", herd.bootstrap)
                       .replace("127.0.0.1:19092", broker.bootstrap).replace('"orders"', f'"{DOCS}"')
                       .replace('"billing"', f'"docs-{RUN}"'))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    assert len(lines) >= 10 and all(line[2].startswith("b'k") for line in lines)
    with GroupConsumer(herd.bootstrap, f"docs-{RUN}") as g:
        committed = g.committed([TopicPartition(DOCS, p) for p in range(2)])
    assert sum(om.offset for om in committed.values() if om is not None) >= 10


def test_streaming_starting_offsets_from_herd(broker, herd):
    """Spark's startingOffsets from herd: committed partitions from OffsetFetch, the others from
    herd's ListOffsets, which herd answers from the data cluster."""
    import json

    from client import GroupConsumer, TopicPartition
    from client.spark import list_offsets, starting_offsets_json

    produce(broker.bootstrap, STREAM, 1000, 40, partitions=2)
    broker_ends = ends(broker.bootstrap, STREAM, 2)
    herd_ends = list_offsets(herd.bootstrap, [TopicPartition(STREAM, p) for p in range(2)], "latest")
    if {tp.partition: off for tp, off in herd_ends.items()} != broker_ends:
        pytest.skip(f"this herd answers ListOffsets as an empty log ({herd_ends}), not from the data cluster "
                    "(issue 29 item 2: the datacatalog branch)")
    group = f"stream-{RUN}"
    with GroupConsumer(herd.bootstrap, group) as g:
        g.commit({TopicPartition(STREAM, 0): 7})
    got = json.loads(starting_offsets_json(herd.bootstrap, group, STREAM, default="latest", resolve=True))
    assert got == {STREAM: {"0": 7, "1": broker_ends[1]}}


def test_auto_offset_reset_earliest_and_latest(broker, herd):
    from client import KafkaGroupConsumer, TopicPartition

    produce(broker.bootstrap, RESET, 0, 100, partitions=2)
    with KafkaGroupConsumer(herd.bootstrap, f"early-{RUN}", broker.bootstrap,
                            {"auto.offset.reset": "earliest", **FAST}) as c:
        c.subscribe([RESET])
        got = drain(c, 100)
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(2) for o in range(50)]
    with KafkaGroupConsumer(herd.bootstrap, f"late-{RUN}", broker.bootstrap, FAST) as c:  # latest: the default
        c.subscribe([RESET])
        deadline = time.monotonic() + 20
        while len(c.assignment()) < 2 and time.monotonic() < deadline:
            assert c.poll(0.2) == []  # nothing older than the assignment
        assert c.position(TopicPartition(RESET, 0)) == 50  # resolved against the data cluster
        produce(broker.bootstrap, RESET, 100, 10, partitions=2)
        got = drain(c, 10)
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(2) for o in range(50, 55)]
        c.commit()
        assert {tp.partition: om.offset for tp, om in c.committed(c.assignment()).items()} == {0: 55, 1: 55}


class Members:
    """Member processes (tools.kafka_member) and their traces."""

    def __init__(self, tmp_path, herd, broker, group, topic):
        self.tmp, self.herd, self.broker, self.group, self.topic = tmp_path, herd, broker, group, topic
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: dict[str, int] = {}

    def start(self, name):
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "tools.kafka_member", "--mode", "herd", "--herd", self.herd.bootstrap,
               "--kafka", self.broker.bootstrap, "--group", self.group, "--topic", self.topic,
               "--trace", str(self.tmp / f"{name}.trace"), "--session-ms", "3000", "--heartbeat-ms", "500",
               "--auto-commit-ms", "200", "--max-poll-records", "200"]
        self.procs[name] = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=open(self.tmp / f"{name}.out", "wb"),
                                            stderr=subprocess.STDOUT)

    def stop(self, name):
        p = self.procs[name]
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, (self.tmp / f"{name}.out").read_text()

    def kill(self, name):
        p = self.procs[name]
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        self.killed[name] = time.monotonic_ns()

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def traces(self) -> dict[str, list[list[str]]]:
        out = {}
        for name in self.procs:
            path = self.tmp / f"{name}.trace"
            out[name] = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
        return out

    def wait_assigned(self, name, timeout=60.0):
        """Until ``name`` has been assigned partitions (so that the next records are shared)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(ev[0] == "A" and len(ev) > 2 for ev in self.traces()[name]):
                return
            time.sleep(0.1)
        pytest.fail(f"member {name} got no partitions within {timeout}s")

    def delivered(self) -> set:
        seen = set()
        for lines in self.traces().values():
            for ev in lines:
                if ev[0] == "D":
                    p, first, last = int(ev[2]), int(ev[3]), int(ev[4])
                    seen.update((p, o) for o in range(first, last + 1))
        return seen

    def wait_delivered(self, want: set, timeout=90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            missing = want - self.delivered()
            if not missing:
                return
            for name, p in self.procs.items():
                if name not in self.killed and p.poll() not in (None, 0):
                    pytest.fail(f"member {name} exited {p.returncode}:\n{(self.tmp / f'{name}.out').read_text()}")
            time.sleep(0.3)
        pytest.fail(f"{len(missing)} records not delivered within {timeout}s, e.g. {sorted(missing)[:5]}")


def check_traces(traces: dict, killed: dict, partitions: int):
    """Ownership intervals per partition never overlap between members, every delivery lies inside
    its member's interval, and no member's offsets of a partition go backwards or skip within one."""
    intervals = defaultdict(list)  # p -> [(start, end, member)]
    for name, lines in traces.items():
        owned: dict[int, int] = {}
        end_of_life = killed.get(name)
        for ev in lines:
            kind, ns = ev[0], int(ev[1])
            if kind == "A":
                for p in map(int, filter(None, ev[2].split(",") if len(ev) > 2 else [])):
                    assert p not in owned, f"{name} assigned {p} twice"
                    owned[p] = ns
            elif kind in "RL":
                for p in map(int, filter(None, ev[2].split(",") if len(ev) > 2 else [])):
                    intervals[p].append((owned.pop(p), ns, name))
            elif kind == "D":
                p = int(ev[2])
                assert p in owned, f"{name} returned records of partition {p} it did not own: {ev}"
                assert int(ev[4]) - int(ev[3]) + 1 == int(ev[5]), ev
            elif kind == "X":
                pytest.fail(f"{name}: offsets of partition {ev[2]} went from {ev[4]} to {ev[3]}")
            elif kind == "C":
                assert not owned, f"{name} closed still owning {owned}"
        for p, start in owned.items():  # the killed member (or one still running: none here)
            assert end_of_life is not None, f"{name} still owns {p} with no revocation"
            intervals[p].append((start, end_of_life, name))
    for p, spans in intervals.items():
        spans.sort()
        for (_s1, e1, m1), (s2, _e2, m2) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, f"partition {p} owned by {m1} and {m2} at once ({m1} until {e1}, {m2} from {s2})"
    assert set(intervals) <= set(range(partitions))


def test_three_members_across_join_leave_kill_and_herd_restart(broker, herd, tmp_path):
    """30,000 records, 6 partitions: every record delivered at least once, no partition's records
    handed to two members at once, offsets never backwards (committed ones included)."""
    from client import GroupConsumer, TopicPartition

    group = f"main-{RUN}"
    n_parts, per_phase = TOPICS[MAIN], 5000
    tps = [TopicPartition(MAIN, p) for p in range(n_parts)]
    m = Members(tmp_path, herd, broker, group, MAIN)
    committed_seen: dict = defaultdict(list)
    watcher = GroupConsumer(herd.bootstrap, group, request_timeout_ms=5000, default_api_timeout_ms=5000)

    def sample_commits():
        try:
            for tp, om in watcher.committed(tps, timeout_s=3).items():
                if om is not None:
                    committed_seen[tp.partition].append(om.offset)
        except Exception:  # herd restarting
            pass

    produced = 0

    def phase(action):
        nonlocal produced
        action()
        produce(broker.bootstrap, MAIN, produced, per_phase)
        produced += per_phase
        want = {(p, o) for p, end in ends(broker.bootstrap, MAIN, n_parts).items() for o in range(end)}
        assert len(want) == produced
        m.wait_delivered(want)
        sample_commits()

    try:
        phase(lambda: (m.start("a"), m.start("b"), m.wait_assigned("a"), m.wait_assigned("b")))
        phase(lambda: (m.start("c"), m.wait_assigned("c")))          # a join
        phase(lambda: m.stop("b"))           # a leave (LeaveGroup, commit, revocation)
        phase(lambda: m.kill("a"))           # a SIGKILL: its partitions move after the session timeout
        phase(herd.restart)                  # herd restarts on its data (same port)
        phase(lambda: (m.start("d"), m.wait_assigned("d")))          # another join after the restart
        deadline = time.monotonic() + 30
        end = ends(broker.bootstrap, MAIN, n_parts)
        while time.monotonic() < deadline:  # auto-commit catches up with the last records
            sample_commits()
            if all(committed_seen[p] and committed_seen[p][-1] == end[p] for p in range(n_parts)):
                break
            time.sleep(0.3)
    finally:
        m.stop_all()
        watcher.close(5)
    traces = m.traces()
    check_traces(traces, m.killed, n_parts)
    delivered = [ev for lines in traces.values() for ev in lines if ev[0] == "D"]
    total = sum(int(ev[5]) for ev in delivered)
    assert len(m.delivered()) == produced == 30000
    for name in "abcd":  # every member took part
        assert any(ev[0] == "D" for ev in traces[name]), f"member {name} returned no records"
    a_parts = {int(p) for ev in traces["a"] if ev[0] == "A" for p in ev[2].split(",") if len(ev) > 2 and p}
    taken_over = {int(p) for n in "cd" for ev in traces[n] if ev[0] == "A" and len(ev) > 2
                  and int(ev[1]) > m.killed["a"] for p in ev[2].split(",") if p}
    assert a_parts & taken_over, "the SIGKILLed member's partitions never moved"
    assert total >= produced  # duplicates: what a SIGKILLed member returned after its last commit
    for p, seq in committed_seen.items():
        assert seq == sorted(seq), f"partition {p}: committed offsets went backwards: {seq}"
        assert seq[-1] == end[p]


def test_data_cluster_down_midway_and_back(broker, herd, caplog):
    """The broker stops: poll returns nothing and a WARNING names the data cluster's address; herd
    keeps the group (commits still work). The broker comes back: the records flow again."""
    from client import KafkaGroupConsumer

    caplog.set_level(logging.WARNING, logger="herd.client")
    produce(broker.bootstrap, DOWN, 0, 200, partitions=2)
    with KafkaGroupConsumer(herd.bootstrap, f"down-{RUN}", broker.bootstrap,
                            {"auto.offset.reset": "earliest", **FAST}) as c:
        c.subscribe([DOWN])
        assert len(drain(c, 200)) == 200
        generation = c.generation()
        broker.stop()
        try:
            deadline = time.monotonic() + 30
            warned = []
            while not warned and time.monotonic() < deadline:
                assert c.poll(0.5) == []
                warned = [r for r in caplog.records if r.levelno == logging.WARNING
                          and broker.bootstrap in r.getMessage() and r.name == "herd.client.kafka"]
            assert warned, "no WARNING naming the data cluster"
            for _ in range(6):  # herd keeps serving the group through the outage
                assert c.poll(0.5) == []
            assert c.group_state()["stable"] and c.generation() == generation
            c.commit()
        finally:
            broker.restart()
        produce(broker.bootstrap, DOWN, 200, 100, partitions=2)
        got = drain(c, 100, timeout=60)
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(2) for o in range(100, 150)]
        assert c.generation() == generation

