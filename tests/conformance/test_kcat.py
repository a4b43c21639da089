"""kcat (the Debian package: librdkafka from the system, usually older than confluent-kafka's
bundled copy) against the real herd daemon: metadata listing (-L) and the balanced consumer group
mode (-G), including a clean exit on SIGTERM/SIGINT that leaves the group.

kcat prints no generation, so each member's assignment comes from its own rebalance lines on stderr
("% Group g rebalanced (memberid m): assigned: t [0], t [1]") and is checked against herd's view
(DescribeGroups through kafka-python). Any librdkafka log line at warning level or worse fails the
test. kcat is installed by `make conformance-deps` (apt-get, as root); without it these tests fail
and say how to install it.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from tests.conformance.harness import HEARTBEAT_MS, SESSION_MS, all_partitions, create_topic, herd_warnings, wait_until

pytestmark = pytest.mark.conformance

JOIN_TIMEOUT = 30.0
# Eager: "% Group g rebalanced (memberid m): assigned: t [0], t [1]" (or "revoked: ...");
# cooperative: "% Group g rebalanced: incremental assignment of 2 partition(s) (memberid m,
# COOPERATIVE rebalance protocol): t [0], t [1]" (or "incremental revoke of ...").
EAGER_RE = re.compile(r"^% Group (\S+) rebalanced \(memberid (\S+)\): (assigned|revoked): ?(.*)$")
COOPERATIVE_RE = re.compile(r"^% Group (\S+) rebalanced: incremental (assignment|revoke) of \d+ "
                            r"partition\(s\) \(memberid (\S+), COOPERATIVE rebalance protocol\): ?(.*)$")
PARTITION_RE = re.compile(r"(\S+) \[(\d+)\]")
EOF_RE = re.compile(r"^% Reached end of topic (\S+) \[(\d+)\] at offset (\d+)")
# librdkafka log lines: "%<syslog level>|<ts>|<FAC>|<name>| msg"; 0-4 are emergency..warning.
BAD_LOG_RE = re.compile(r"^%[0-4]\||^% ERROR")

_printed_version = False


def require_kcat() -> None:
    """Each test's first line: without kcat the test fails (not skips) and says how to install."""
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed: run `make conformance-deps` as root, or "
                    "`apt-get install kcat` (Debian/Ubuntu package kcat)", pytrace=False)


@pytest.fixture(autouse=True)
def kcat_version(capsys):
    """Print `kcat -V` once: the Debian kcat links the system librdkafka, whose version differs
    from the one bundled with confluent-kafka."""
    global _printed_version
    if shutil.which("kcat") is None:
        return None
    out = subprocess.run(["kcat", "-V"], capture_output=True, text=True, timeout=10).stdout
    version = next((line.strip() for line in out.splitlines() if line.startswith("Version")), out)
    if not _printed_version:
        _printed_version = True
        with capsys.disabled():
            print(f"\n[kcat -V: {version}] ", end="")
    return version


class Kcat:
    """One `kcat -G` balanced consumer; its rebalance lines are parsed from stderr."""

    def __init__(self, tmp_path, bootstrap: str, group: str, topics: list[str], name: str,
                 *config: str):
        self.name = name
        self.stdout_path = tmp_path / f"kcat-{name}.stdout"
        self._stdout = open(self.stdout_path, "ab")
        cmd = ["kcat", "-b", bootstrap, "-G", group,
               "-X", f"client.id={name}",
               "-X", f"session.timeout.ms={SESSION_MS}",
               "-X", f"heartbeat.interval.ms={HEARTBEAT_MS}",
               "-X", "fetch.wait.max.ms=100",
               *(arg for kv in config for arg in ("-X", kv)),
               *topics]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._stdout,
                                     stderr=subprocess.PIPE)
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stderr:
            with self._lock:
                self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    def stderr(self) -> list[str]:
        with self._lock:
            return [line for _, line in self.lines]

    def rebalances(self) -> list[tuple[str, str, set]]:
        """[(member_id, kind, {(topic, p)})] in order; kind is "assigned"/"revoked" (eager: the
        whole assignment) or "added"/"removed" (cooperative: an increment)."""
        out = []
        for line in self.stderr():
            if m := EAGER_RE.match(line):
                member, kind = m.group(2), m.group(3)
            elif m := COOPERATIVE_RE.match(line):
                member, kind = m.group(3), {"assignment": "added", "revoke": "removed"}[m.group(2)]
            else:
                continue
            out.append((member, kind, {(t, int(p)) for t, p in PARTITION_RE.findall(m.group(4))}))
        return out

    def member_id(self) -> str | None:
        rb = self.rebalances()
        return rb[-1][0] if rb else None

    def partitions(self) -> set:
        """The current assignment, replayed from the rebalance lines."""
        owned: set = set()
        for _, kind, parts in self.rebalances():
            if kind == "assigned":
                owned = set(parts)
            elif kind == "added":
                owned |= parts
            else:
                owned -= parts
        return owned

    def revoked_since(self, n: int) -> set:
        """Partitions revoked after the first n rebalance lines."""
        return {tp for _, kind, parts in self.rebalances()[n:] if kind in ("revoked", "removed")
                for tp in parts}

    def at_end(self) -> set:
        return {(m.group(1), int(m.group(2))) for m in map(EOF_RE.match, self.stderr()) if m}

    def problems(self) -> list[str]:
        return [line for line in self.stderr() if BAD_LOG_RE.match(line)]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> str:
        return (f"{self.name}(alive={self.alive()}, member={self.member_id()}): "
                f"{sorted(self.partitions())}")

    def signal(self, sig, timeout: float = 15.0) -> int | None:
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(5)
        return rc

    def cleanup(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stderr.close()
        self._stdout.close()


@pytest.fixture
def kcats(tmp_path):
    started: list[Kcat] = []

    def start(*args) -> Kcat:
        k = Kcat(tmp_path, *args)
        started.append(k)
        return k

    try:
        yield start
    finally:
        for k in started:
            k.cleanup()


def describe_group(bootstrap, group) -> dict:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        return admin.describe_groups([group])[group]
    finally:
        admin.close()


def herd_assignment(described) -> dict[str, set]:
    return {m["member_id"]: {(a["topic"], p) for a in m["member_assignment"]["assigned_partitions"]
                             for p in a["partitions"]}
            for m in described["members"]}


def wait_kcat_converged(bootstrap, group, ks: list[Kcat], expected: set, timeout: float) -> dict:
    """Each kcat's own view is a disjoint share of `expected`, and herd's DescribeGroups agrees
    (same member ids, same assignments, Stable)."""
    last: dict = {}

    def check():
        owned = [k.partitions() for k in ks]
        if sum(map(len, owned)) != len(expected) or set().union(*owned) != expected:
            return False
        last["described"] = d = describe_group(bootstrap, group)
        return (d["group_state"] == "Stable"
                and herd_assignment(d) == {k.member_id(): k.partitions() for k in ks})

    def why():
        tails = "\n".join(f"--- {k.name} stderr:\n" + "\n".join(k.stderr()[-15:]) for k in ks)
        return (f"kcat members to split {len(expected)} partitions: {[k.describe() for k in ks]}; "
                f"herd: {last.get('described')}\n{tails}")

    wait_until(check, timeout, why, interval=0.2)
    return last["described"]




def test_kcat_metadata_listing(herd):
    """`kcat -L` (text and -J JSON): herd as the one broker and controller, the topic with each
    partition led by it."""
    require_kcat()
    create_topic(herd.bootstrap, "kcat-meta", 3)
    create_topic(herd.bootstrap, "kcat-other", 1)
    text = subprocess.run(["kcat", "-b", herd.bootstrap, "-L"], capture_output=True, text=True,
                          timeout=30)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert " 1 brokers:\n" in out, out
    node = int(re.search(r"broker (\d+) at 127\.0\.0\.1:%d \(controller\)" % herd.port, out).group(1))
    assert re.search(r'topic "kcat-meta" with 3 partitions:', out), out
    assert re.search(r'topic "kcat-other" with 1 partitions:', out), out
    for p in range(3):
        assert f"partition {p}, leader {node}, replicas: {node}, isrs: {node}" in out, out

    js = subprocess.run(["kcat", "-b", herd.bootstrap, "-L", "-J", "-t", "kcat-meta"],
                        capture_output=True, text=True, timeout=30)
    assert js.returncode == 0, js.stderr
    md = json.loads(js.stdout)
    assert md["brokers"] == [{"id": node, "name": herd.bootstrap}]
    assert md["controllerid"] == node
    [topic] = md["topics"]
    assert topic["topic"] == "kcat-meta" and "error" not in topic, topic
    assert [(p["partition"], p["leader"], p["replicas"], p["isrs"]) for p in topic["partitions"]] == [
        (p, node, [{"id": node}], [{"id": node}]) for p in range(3)]
    assert herd_warnings(herd) == []


def test_kcat_balanced_consumers_split_and_exit_cleanly_on_signals(herd, kcats):
    """Two `kcat -G` members split a 6-partition topic (librdkafka's default range assignor) and
    reach the end of each owned partition (empty log); SIGTERM makes one leave (the other takes
    everything before a session timeout could pass); SIGINT on the last leaves the group Empty."""
    require_kcat()
    topic, group = "kcat-topic", "kcat-group"
    create_topic(herd.bootstrap, topic, 6)
    expected = all_partitions(topic, 6)
    a = kcats(herd.bootstrap, group, [topic], "kcat-a")
    b = kcats(herd.bootstrap, group, [topic], "kcat-b")

    described = wait_kcat_converged(herd.bootstrap, group, [a, b], expected, JOIN_TIMEOUT)
    assert (described["protocol_type"], described["protocol_data"]) == ("consumer", "range")
    assert sorted(m["client_id"] for m in described["members"]) == ["kcat-a", "kcat-b"]
    for k in (a, b):  # range: one contiguous block of 3 each
        ps = sorted(p for _, p in k.partitions())
        assert ps == list(range(ps[0], ps[0] + 3)), k.describe()
    # The fetch loop runs: librdkafka reports the end of every owned partition (offset 0).
    wait_until(lambda: a.at_end() >= a.partitions() and b.at_end() >= b.partitions(), 15,
               lambda: f"end-of-partition for {a.describe()} {a.at_end()}, {b.describe()} {b.at_end()}")

    # SIGTERM: kcat closes its consumer (LeaveGroup) and exits 0; b gets everything at once.
    t0 = time.monotonic()
    assert a.signal(signal.SIGTERM) == 0, "\n".join(a.stderr())
    assert a.partitions() == set(), a.describe()  # its last line revoked what it had
    described = wait_kcat_converged(herd.bootstrap, group, [b], expected, JOIN_TIMEOUT)
    leave_s = time.monotonic() - t0
    assert leave_s < SESSION_MS / 1000, f"rebalance after kcat's SIGTERM took {leave_s:.1f}s"
    assert [m["client_id"] for m in described["members"]] == ["kcat-b"]

    # SIGINT on the last member: it leaves too, and the group is Empty well before its session
    # timeout could have expired it.
    t0 = time.monotonic()
    assert b.signal(signal.SIGINT) == 0, "\n".join(b.stderr())
    described = describe_group(herd.bootstrap, group)
    assert (described["group_state"], described["members"]) == ("Empty", []), described
    assert time.monotonic() - t0 < SESSION_MS / 1000

    for k in (a, b):
        assert k.problems() == [], f"{k.name} logged: {k.problems()}"
    assert herd_warnings(herd) == []


def test_kcat_cooperative_sticky_regex_subscription(herd, kcats):
    """librdkafka's cooperative-sticky assignor (KIP-429) with a regex subscription over two
    topics: a third member joining takes partitions from the others without them losing the rest
    (incremental revoke only), and herd's view matches every member's."""
    require_kcat()
    create_topic(herd.bootstrap, "kcat-coop-a", 3)
    create_topic(herd.bootstrap, "kcat-coop-b", 3)
    create_topic(herd.bootstrap, "kcat-other", 2)  # not matched by the pattern
    group, pattern = "kcat-coop", "^kcat-coop-.*"
    expected = all_partitions("kcat-coop-a", 3) | all_partitions("kcat-coop-b", 3)

    def start(name):
        return kcats(herd.bootstrap, group, [pattern], name,
                     "partition.assignment.strategy=cooperative-sticky")

    a, b = start("coop-a"), start("coop-b")
    described = wait_kcat_converged(herd.bootstrap, group, [a, b], expected, JOIN_TIMEOUT)
    assert described["protocol_data"] == "cooperative-sticky"
    assert sorted(map(len, (a.partitions(), b.partitions()))) == [3, 3]
    before = {k.name: (k.partitions(), len(k.rebalances())) for k in (a, b)}

    c = start("coop-c")
    wait_kcat_converged(herd.bootstrap, group, [a, b, c], expected, JOIN_TIMEOUT)
    assert sorted(len(k.partitions()) for k in (a, b, c)) == [2, 2, 2]
    for k in (a, b):
        owned, n = before[k.name]
        assert k.partitions() <= owned, f"{k.name} gained partitions on a join: {k.describe()}"
        assert k.revoked_since(n) == owned - k.partitions(), f"{k.name} lost kept partitions"

    for k in (a, b, c):
        assert k.signal(signal.SIGTERM) == 0, "\n".join(k.stderr())
        assert k.problems() == [], f"{k.name} logged: {k.problems()}"
    assert describe_group(herd.bootstrap, group)["group_state"] == "Empty"
    assert herd_warnings(herd) == []
