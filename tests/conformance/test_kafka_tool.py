"""Kafka's own kafka-consumer-groups tool (org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
from kafka-tools 4.4.0, run in the session's JVM) against herd, and `herd groups` on the same group:
where both show a column, they must agree; where they differ, docs/compatibility.md says why."""
from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from protocol import messages as m
from tests.conformance.harness import all_partitions, create_topic, wait_converged
from tests.conformance.reference_clients import JavaMember
from tools.rawclient import RawClient

pytestmark = [pytest.mark.reference, pytest.mark.conformance]

HERD = Path(sys.executable).with_name("herd")


def table(text: str) -> list[dict]:
    """Rows of the first table in a tool's output (columns split on runs of 2+ spaces, except
    COORDINATOR (ID) whose value has one inner space)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith(("GROUP", "TOPIC")):
            header = re.split(r"\s+", ln.replace("COORDINATOR (ID)", "COORDINATOR(ID)").strip())
            rows = []
            for row in lines[i + 1:]:
                if row.startswith(("Consumer group", "warning", "Dry run", "Error")):
                    break
                row = re.sub(r"(\S+)\s+\((\d+)\)", r"\1(\2)", row)  # coordinator "host:port (id)"
                rows.append(dict(zip(header, re.split(r"\s+", row.strip()), strict=False)))
            return rows
    return []


def herd_groups(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HERD), "groups", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def group_with_member(herd, java_driver):
    tag = uuid.uuid4().hex[:6]
    group, topic = f"tool-g-{tag}", f"tool-t-{tag}"
    create_topic(herd.bootstrap, topic, 3)
    a = JavaMember(java_driver, herd.bootstrap, group, [topic], "tool")
    wait_converged([a], all_partitions(topic, 3), 60)
    assert a.commit([(topic, 0, 5, ""), (topic, 1, 6, ""), (topic, 2, 7, "")])["error"] is None
    yield group, topic, a
    a.stop()


def offsets(herd, group) -> dict:
    with RawClient(herd.address) as c:
        r = c.call(m.OffsetFetchRequest(group_id=group, topics=None), 7)
    return {(t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions}


def test_list_describe_members_state(herd, java_driver, group_with_member):
    group, topic, a = group_with_member
    boot = ["--bootstrap-server", herd.bootstrap]
    code, out, err = java_driver.tool(*boot, "--list")
    assert code == 0 and group in out.split(), (out, err)
    assert group in herd_groups("list", *boot).stdout.split()

    member_id = a.state()["member_id"]
    code, out, err = java_driver.tool(*boot, "--describe", "--group", group)
    assert code == 0, err
    kafka_rows = table(out)
    assert [(r["TOPIC"], r["PARTITION"], r["CURRENT-OFFSET"], r["CONSUMER-ID"], r["HOST"], r["CLIENT-ID"])
            for r in kafka_rows] == [(topic, str(p), str(5 + p), member_id, "/127.0.0.1", "java-" + a.id)
                                     for p in range(3)]
    # herd holds no records: Kafka's tool reads LOG-END-OFFSET 0 (an empty log) and prints a
    # negative lag; herd groups prints "-" for both (docs/compatibility.md, OP-3)
    assert {(r["LOG-END-OFFSET"], r["LAG"]) for r in kafka_rows} == {("0", str(-(5 + p))) for p in range(3)}
    herd_rows = table(herd_groups("describe", group, *boot).stdout)
    common = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "CONSUMER-ID", "HOST", "CLIENT-ID")
    assert [{k: r[k] for k in common} for r in herd_rows] == [{k: r[k] for k in common} for r in kafka_rows]
    assert {(r["LOG-END-OFFSET"], r["LAG"]) for r in herd_rows} == {("-", "-")}

    code, out, err = java_driver.tool(*boot, "--describe", "--group", group, "--members")
    assert code == 0, err
    kafka_members = table(out)
    assert kafka_members == [{"GROUP": group, "CONSUMER-ID": member_id, "HOST": "/127.0.0.1",
                              "CLIENT-ID": "java-" + a.id, "#PARTITIONS": "3"}]
    herd_members = table(herd_groups("describe", group, "--members", *boot).stdout)
    assert herd_members == kafka_members  # the same columns (no GROUP-INSTANCE-ID: no static member)

    code, out, err = java_driver.tool(*boot, "--describe", "--group", group, "--members", "--verbose")
    assert code == 0, err
    kafka_verbose = table(out)
    assert kafka_verbose[0]["CURRENT-ASSIGNMENT"] == f"{topic}:0,1,2"
    assert table(herd_groups("describe", group, "--members", "--verbose", *boot).stdout) == kafka_verbose

    code, out, err = java_driver.tool(*boot, "--describe", "--group", group, "--state")
    assert code == 0, err
    kafka_state = table(out)
    assert [(r["ASSIGNMENT-STRATEGY"], r["STATE"], r["#MEMBERS"]) for r in kafka_state] == [("range", "Stable", "1")]
    herd_state = table(herd_groups("describe", group, "--state", *boot).stdout)
    assert herd_state == kafka_state


def test_reset_offsets_dry_run_and_execute(herd, java_driver, group_with_member):
    group, topic, a = group_with_member
    boot = ["--bootstrap-server", herd.bootstrap]
    code, out, err = java_driver.tool(*boot, "--reset-offsets", "--group", group, "--topic", topic,
                                      "--to-offset", "2", "--dry-run")
    assert "can only be reset if the group" in out + err and "inactive" in out + err
    assert offsets(herd, group) == {(topic, 0): 5, (topic, 1): 6, (topic, 2): 7}
    a.stop()
    # Kafka's tool clamps a new offset to the partition's log range, which herd (no records)
    # answers as [0, 0]: --to-offset 2 plans 0 (docs/compatibility.md, OP-3)
    code, out, err = java_driver.tool(*boot, "--reset-offsets", "--group", group, "--topic", topic,
                                      "--to-offset", "2", "--dry-run")
    assert code == 0, err
    assert sorted((r["PARTITION"], r["NEW-OFFSET"]) for r in table(out)) == [("0", "0"), ("1", "0"), ("2", "0")]
    assert offsets(herd, group) == {(topic, 0): 5, (topic, 1): 6, (topic, 2): 7}, "a dry run committed"
    herd_plan = table(herd_groups("reset-offsets", group, "--topic", topic, "--to-offset", "2", *boot).stdout)
    assert sorted((r["PARTITION"], r["NEW-OFFSET"]) for r in herd_plan) == [("0", "2"), ("1", "2"), ("2", "2")]
    assert list(herd_plan[0]) == list(table(out)[0]) == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]

    # an Empty group: both tools add the same note to --state
    code, out, err = java_driver.tool(*boot, "--describe", "--group", group, "--state")
    herd_state = herd_groups("describe", group, "--state", *boot)
    assert "Consumer group '%s' has no active members." % group in err
    assert herd_state.stderr.strip() == "Consumer group '%s' has no active members." % group
    assert table(herd_state.stdout) == table(out)

    code, out, err = java_driver.tool(*boot, "--reset-offsets", "--group", group, "--topic", f"{topic}:1",
                                      "--to-earliest", "--execute")
    assert code == 0, err
    assert [(r["PARTITION"], r["NEW-OFFSET"]) for r in table(out)] == [("1", "0")]
    assert offsets(herd, group) == {(topic, 0): 5, (topic, 1): 0, (topic, 2): 7}


def test_delete_offsets_and_delete(herd, java_driver, group_with_member):
    group, topic, a = group_with_member
    boot = ["--bootstrap-server", herd.bootstrap]
    # a subscribed topic's offsets cannot be deleted while the group is active
    code, out, err = java_driver.tool(*boot, "--delete-offsets", "--group", group, "--topic", topic)
    assert "GROUP_SUBSCRIBED_TO_TOPIC" in out + err or "subscribed" in (out + err).lower(), (out, err)
    code, out, err = java_driver.tool(*boot, "--delete", "--group", group)
    assert "GroupNotEmptyException" in out + err or "not empty" in (out + err).lower(), (out, err)
    a.stop()
    code, out, err = java_driver.tool(*boot, "--delete-offsets", "--group", group, "--topic", f"{topic}:0")
    assert code == 0, err
    assert f"Request succeeded for deleting offsets from group {group}" in out
    assert [(r["TOPIC"], r["PARTITION"], r["STATUS"]) for r in table(out)] == [(topic, "0", "Successful")]
    assert offsets(herd, group) == {(topic, 1): 6, (topic, 2): 7}
    mine = herd_groups("delete-offsets", "--group", group, "--topic", f"{topic}:1", *boot)
    assert mine.returncode == 0, mine.stderr
    assert mine.stdout.splitlines()[0] == f"Request succeeded for deleting offsets from group {group}."
    assert [(r["TOPIC"], r["PARTITION"], r["STATUS"]) for r in table(mine.stdout)] == [(topic, "1", "Successful")]
    assert offsets(herd, group) == {(topic, 2): 7}
    code, out, err = java_driver.tool(*boot, "--delete", "--group", group)
    assert code == 0, err
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out
    assert offsets(herd, group) == {}
    code, out, err = java_driver.tool(*boot, "--delete", "--group", group)
    assert "GroupIdNotFoundException" in out + err
    assert group not in herd_groups("list", *boot).stdout.split()


def test_static_member_columns(herd, java_driver):
    """A static member: both tools add GROUP-INSTANCE-ID, with the same value."""
    tag = uuid.uuid4().hex[:6]
    group, topic = f"tool-s-{tag}", f"tool-st-{tag}"
    create_topic(herd.bootstrap, topic, 2)
    a = JavaMember(java_driver, herd.bootstrap, group, [topic], "tool-static", instance_id=f"inst-{tag}")
    try:
        wait_converged([a], all_partitions(topic, 2), 60)
        boot = ["--bootstrap-server", herd.bootstrap]
        code, out, err = java_driver.tool(*boot, "--describe", "--group", group, "--members", "--verbose")
        assert code == 0, err
        kafka_rows = table(out)
        assert kafka_rows[0]["GROUP-INSTANCE-ID"] == f"inst-{tag}"
        assert table(herd_groups("describe", group, "--members", "--verbose", *boot).stdout) == kafka_rows
    finally:
        a.stop()
