"""Admin clients (kafka-python KafkaAdminClient, confluent AdminClient) against herd: list,
describe, fetch the offsets of and delete groups, with Kafka's errors for deleting a non-empty
group (NON_EMPTY_GROUP) and an unknown one (GROUP_ID_NOT_FOUND)."""
from __future__ import annotations

import pytest

from tests.conformance.harness import all_partitions, create_topic, wait_converged, wait_until

pytestmark = pytest.mark.conformance

JOIN_TIMEOUT = 30.0
UNKNOWN = "no-such-group"


def _commit_standalone(bootstrap, group, topic, offsets: dict[int, int]) -> None:
    """Commit as a standalone consumer (generation -1) while the group is still Empty."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        res = c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                       asynchronous=False)
        assert all(r.error is None for r in res), res
    finally:
        c.close()


def _start_group(herd, members, group, topic):
    """A live 2-member group (kafka-python + confluent, range; one of them static) with offsets."""
    create_topic(herd.bootstrap, topic, 4)
    _commit_standalone(herd.bootstrap, group, topic, {0: 10, 3: 33})
    ms = [members.start("kafka-python", herd.bootstrap, group, [topic], "kp-admin", assignor="range"),
          members.start("confluent", herd.bootstrap, group, [topic], "ck-admin", assignor="range",
                        instance_id="ck-static")]
    wait_converged(ms, all_partitions(topic, 4), JOIN_TIMEOUT)
    return ms


def test_kafka_python_admin_client(herd, members):
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient, MemberToRemove

    group, topic = "admin-kp", "admin-kp-topic"
    ms = _start_group(herd, members, group, topic)
    admin = KafkaAdminClient(bootstrap_servers=herd.bootstrap, request_timeout_ms=10000)
    try:
        # ListGroups, with and without the KIP-518 state filter.
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed[group]["protocol_type"] == "consumer"
        assert listed[group]["group_state"] == "Stable"
        assert group in {g["group_id"] for g in admin.list_groups(states_filter=["Stable"])}
        assert group not in {g["group_id"] for g in admin.list_groups(states_filter=["Empty"])}

        # DescribeGroups: the live group in full, and an unknown group as Dead without an error.
        described = admin.describe_groups([group, UNKNOWN])
        g = described[group]
        assert (g["group_state"], g["protocol_type"], g["protocol_data"]) == ("Stable", "consumer", "range")
        assert g["error"] is None
        by_client = {m["client_id"]: m for m in g["members"]}
        assert set(by_client) == {"kp-admin", "ck-admin"}
        assert by_client["ck-admin"]["group_instance_id"] == "ck-static"
        assert by_client["kp-admin"]["group_instance_id"] is None
        assert by_client["kp-admin"]["member_id"] == ms[0].state()["member_id"]
        assigned = {(a["topic"], p) for m in g["members"]
                    for a in m["member_assignment"]["assigned_partitions"] for p in a["partitions"]}
        assert assigned == all_partitions(topic, 4)
        for m in g["members"]:
            assert m["member_metadata"]["topics"] == [topic]
            assert m["client_host"].endswith("127.0.0.1")
        dead = described[UNKNOWN]
        assert (dead["group_state"], dead["members"], dead["error"]) == ("Dead", [], None)

        # OffsetFetch: all offsets of the group, and selected partitions.
        offsets = admin.list_group_offsets({group: None})[group]
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 10, 3: 33}
        some = admin.list_group_offsets({group: [TopicPartition(topic, 3), TopicPartition(topic, 1)]})
        assert {tp.partition: om.offset for tp, om in some[group].items() if om.offset >= 0} == {3: 33}

        # DeleteGroups: refused while members are in the group; unknown group not found.
        result = dict(admin.delete_groups([group, UNKNOWN]))
        assert _error_name(result[group]) == "NonEmptyGroupError", result
        assert _error_name(result[UNKNOWN]) == "GroupIdNotFoundError", result

        # Once every member has gone (the static one is removed explicitly, as it sends no
        # LeaveGroup), the group is Empty and can be deleted with its offsets.
        for m in ms:
            assert m.stop() == 0, m.stderr_tail()
        # KIP-345 admin removal of a static member: a batched LeaveGroup (v3+) by instance id.
        removed = admin.remove_group_members(group, [MemberToRemove(group_instance_id="ck-static")])
        assert [_error_name(e) for e in removed.values()] == ["NoError"], removed
        wait_until(lambda: admin.describe_groups([group])[group]["group_state"] == "Empty", 10,
                   lambda: f"{group} to be Empty (removed: {removed}): {admin.describe_groups([group])}")
        result = dict(admin.delete_groups([group]))
        assert _error_name(result[group]) in ("OK", "NoError"), result
        assert group not in {g["group_id"] for g in admin.list_groups()}
        assert admin.describe_groups([group])[group]["group_state"] == "Dead"
        assert admin.list_group_offsets({group: None})[group] == {}
    finally:
        admin.close()


def test_kafka_python_admin_describes_thousands_of_groups_in_one_request(herd, members):
    """kafka-python's admin client sends one DescribeGroups per coordinator (as Kafka's own does,
    KIP-699): 3,000 groups and a live one, over what herd describes and encodes in one loop turn
    (2,048 members and groups), come back whole: every group once, the live one in full."""
    from kafka.admin import KafkaAdminClient

    group, topic = "admin-many", "admin-many-topic"
    ms = _start_group(herd, members, group, topic)
    admin = KafkaAdminClient(bootstrap_servers=herd.bootstrap, request_timeout_ms=10000)
    try:
        unknown = [f"admin-none-{i:04d}" for i in range(3000)]
        described = admin.describe_groups(unknown[:1500] + [group] + unknown[1500:])
        assert sorted(described) == sorted(unknown + [group])
        g = described[group]
        assert (g["group_state"], g["protocol_data"], g["error"]) == ("Stable", "range", None)
        assert {m["client_id"] for m in g["members"]} == {"kp-admin", "ck-admin"}
        assert all(described[u]["group_state"] == "Dead" and not described[u]["members"] for u in unknown)
    finally:
        admin.close()
        for mem in ms:
            mem.stop()


def _error_name(value) -> str:
    """kafka-python 3.0.12 reports delete_groups results as error class names or instances."""
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return value.__name__
    if value is None:
        return "OK"
    return type(value).__name__


def test_confluent_admin_client(herd, members):
    from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException
    from confluent_kafka.admin import AdminClient

    group, topic = "admin-ck", "admin-ck-topic"
    ms = _start_group(herd, members, group, topic)
    admin = AdminClient({"bootstrap.servers": herd.bootstrap, "log_level": 3})

    # ListGroups: all, and filtered by state.
    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert not listed.errors
    mine = [g for g in listed.valid if g.group_id == group]
    assert len(mine) == 1 and mine[0].state == ConsumerGroupState.STABLE
    assert not mine[0].is_simple_consumer_group
    stable = admin.list_consumer_groups(request_timeout=10, states={ConsumerGroupState.STABLE}).result()
    assert group in {g.group_id for g in stable.valid}
    empty = admin.list_consumer_groups(request_timeout=10, states={ConsumerGroupState.EMPTY}).result()
    assert group not in {g.group_id for g in empty.valid}

    # DescribeGroups.
    futures = admin.describe_consumer_groups([group, UNKNOWN], request_timeout=10)
    desc = futures[group].result()
    assert desc.state == ConsumerGroupState.STABLE
    assert desc.partition_assignor == "range"
    assert not desc.is_simple_consumer_group
    assert desc.coordinator.port == herd.port
    by_client = {m.client_id: m for m in desc.members}
    assert set(by_client) == {"kp-admin", "ck-admin"}
    assert by_client["ck-admin"].group_instance_id == "ck-static"
    assert by_client["ck-admin"].member_id == ms[1].state()["member_id"]
    assigned = {(tp.topic, tp.partition) for m in desc.members for tp in m.assignment.topic_partitions}
    assert assigned == all_partitions(topic, 4)
    assert futures[UNKNOWN].result().state == ConsumerGroupState.DEAD

    # OffsetFetch.
    fetched = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=10)[group].result()
    assert {tp.partition: tp.offset for tp in fetched.topic_partitions} == {0: 10, 3: 33}

    # DeleteGroups: NON_EMPTY_GROUP while it has members, GROUP_ID_NOT_FOUND when unknown.
    futures = admin.delete_consumer_groups([group, UNKNOWN], request_timeout=10)
    for gid, code in ((group, "NON_EMPTY_GROUP"), (UNKNOWN, "GROUP_ID_NOT_FOUND")):
        with pytest.raises(KafkaException) as exc:
            futures[gid].result()
        assert exc.value.args[0].name() == code, exc.value

    # Empty the group: the dynamic member leaves on close; the static member's session must
    # expire (it sends no LeaveGroup), so SIGKILL it and wait.
    assert ms[0].stop() == 0, ms[0].stderr_tail()
    ms[1].kill()
    wait_until(lambda: admin.describe_consumer_groups([group], request_timeout=10)[group].result().state
               == ConsumerGroupState.EMPTY, 15, f"{group} to become Empty after its members went")
    assert admin.delete_consumer_groups([group], request_timeout=10)[group].result() is None
    assert admin.describe_consumer_groups([group], request_timeout=10)[group].result().state \
        == ConsumerGroupState.DEAD
    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert group not in {g.group_id for g in listed.valid}
    fetched = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                request_timeout=10)[group].result()
    assert [tp for tp in fetched.topic_partitions if tp.offset >= 0] == []
