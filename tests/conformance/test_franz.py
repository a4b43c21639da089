"""franz-go (github.com/twmb/franz-go v1.22.3, tests/conformance/go) against herd: join, leave,
cooperative rebalancing, commit/fetch; and in a group with Kafka's Java client."""
from __future__ import annotations

import uuid

import pytest

from tests.conformance.harness import all_partitions, create_topic, herd_warnings, wait_converged
from tests.conformance.reference_clients import FranzMember, JavaMember

pytestmark = [pytest.mark.reference, pytest.mark.conformance]


def names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    return f"{prefix}-g-{tag}", f"{prefix}-t-{tag}"


@pytest.fixture
def franz(tmp_path):
    started = []

    def start(*args, **kw):
        f = FranzMember(tmp_path, *args, **kw)
        started.append(f)
        return f

    yield start
    for f in started:
        f.cleanup()


def test_join_commit_fetch(herd, franz):
    group, topic = names("franz-commit")
    create_topic(herd.bootstrap, topic, 3)
    a = franz(herd.bootstrap, group, [topic], "a")
    wait_converged([a], all_partitions(topic, 3), 60)
    got = a.command("committed", cmd="commit", offsets=[[topic, 0, 5], [topic, 1, 7], [topic, 2, 11]])
    assert got["error"] == "", got
    fetched = a.command("fetched", cmd="fetch")
    assert fetched.get("error_code") == 0, fetched
    assert sorted((t, p, o) for t, p, o, _ in fetched["offsets"]) == [(topic, 0, 5), (topic, 1, 7), (topic, 2, 11)]
    assert a.stop() == 0
    assert herd_warnings(herd) == []


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_join_and_leave(herd, franz, assignor):
    group, topic = names(f"franz-{assignor}")
    create_topic(herd.bootstrap, topic, 6)
    ms = []
    for i in range(3):
        ms.append(franz(herd.bootstrap, group, [topic], f"{assignor}-{i}", assignor=assignor))
        wait_converged(ms, all_partitions(topic, 6), 60)
    assert sorted(len(x.partitions()) for x in ms) == [2, 2, 2]
    assert ms[1].stop() == 0  # LeaveGroup
    rest = [ms[0], ms[2]]
    wait_converged(rest, all_partitions(topic, 6), 30)
    assert sorted(len(x.partitions()) for x in rest) == [3, 3]
    if assignor == "cooperative-sticky":
        # incremental: the members that stayed were never revoked everything, and none lost any
        for x in rest:
            evs = x.snapshot()
            assert not any(e["ev"] == "lost" for e in evs), evs
            held: set = set()
            ever = False
            for e in evs:
                if e["ev"] == "assigned":
                    held |= {tuple(p) for p in e["partitions"]}
                    ever = ever or bool(held)
                elif e["ev"] == "revoked":
                    held -= {tuple(p) for p in e["partitions"]}
                    assert held or not ever, f"{x.name} dropped to zero partitions: {evs}"
    assert herd_warnings(herd) == []


def test_franz_and_java_in_one_group(herd, franz, java_driver):
    group, topic = names("franz-java")
    create_topic(herd.bootstrap, topic, 4)
    f = franz(herd.bootstrap, group, [topic], "franz", assignor="cooperative-sticky")
    j = JavaMember(java_driver, herd.bootstrap, group, [topic], "java", assignor="cooperative-sticky")
    wait_converged([f, j], all_partitions(topic, 4), 60)
    assert sorted(len(x.partitions()) for x in (f, j)) == [2, 2]
    j.stop()
    wait_converged([f], all_partitions(topic, 4), 30)
