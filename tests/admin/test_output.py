"""How `herd groups describe` prints a described group: Kafka's kafka-consumer-groups columns and
notes (measured against kafka-tools 4.4.0; docs/compatibility.md lists what still differs)."""
from __future__ import annotations

from types import SimpleNamespace

from admin.commands import _print_describe


def info(state="Stable", members=(), partitions=()):
    return {"group": "g", "state": state, "protocol_type": "consumer",
            "assignment_strategy": "range" if state == "Stable" else None,
            "coordinator": {"id": 1, "host": "127.0.0.1", "port": 9092},
            "member_count": len(members), "members": list(members), "partitions": list(partitions)}


def member(cid, instance=None, assignment=()):
    return {"consumer_id": cid, "group_instance_id": instance, "host": "/127.0.0.1", "client_id": cid[:3],
            "partitions": sum(len(ps) for _, ps in assignment),
            "assignment": [{"topic": t, "partitions": list(ps)} for t, ps in assignment]}


def show(capsys, described, members=False, verbose=False, state=False):
    _print_describe(described, SimpleNamespace(members=members, verbose=verbose, state=state))
    out, err = capsys.readouterr()
    return [line.split() for line in out.splitlines()], err


def test_members_show_group_instance_id_only_when_a_member_has_one(capsys):
    dynamic = [member("dyn-1", assignment=[("t", [0])]), member("dyn-2")]
    rows, _ = show(capsys, info(members=dynamic), members=True)
    assert rows == [["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"],
                    ["g", "dyn-1", "/127.0.0.1", "dyn", "1"], ["g", "dyn-2", "/127.0.0.1", "dyn", "0"]]
    mixed = [member("sta-1", "inst-1", [("t", [0])]), member("dyn-2")]
    rows, _ = show(capsys, info(members=mixed), members=True)
    assert rows[0] == ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
    # Kafka leaves the cell blank for a dynamic member; herd prints "-" so rows split on spaces
    assert rows[1:] == [["g", "sta-1", "inst-1", "/127.0.0.1", "sta", "1"],
                        ["g", "dyn-2", "-", "/127.0.0.1", "dyn", "0"]]


def test_members_verbose_has_kafka_4_columns_and_assignment_format(capsys):
    ms = [member("sta-1", "inst-1", [("s1", [0]), ("s2", [0, 1])]), member("dyn-2")]
    rows, _ = show(capsys, info(members=ms), members=True, verbose=True)
    assert rows == [
        ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "CURRENT-EPOCH",
         "CURRENT-ASSIGNMENT", "TARGET-EPOCH", "TARGET-ASSIGNMENT"],
        ["g", "sta-1", "inst-1", "/127.0.0.1", "sta", "3", "-", "s1:0;s2:0,1", "-", "-"],
        ["g", "dyn-2", "-", "/127.0.0.1", "dyn", "0", "-", "-", "-", "-"]]


def test_members_of_an_empty_group_print_the_header_and_the_note(capsys):
    rows, err = show(capsys, info("Empty"), members=True)
    assert rows == [["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]]
    assert err == "Consumer group 'g' has no active members.\n"


def test_state_view_has_the_same_notes_as_the_others(capsys):
    rows, err = show(capsys, info("Empty"), state=True)
    assert rows[1] == ["g", "127.0.0.1:9092", "(1)", "-", "Empty", "0"]
    assert err == "Consumer group 'g' has no active members.\n"
    _, err = show(capsys, info("PreparingRebalance", members=[member("dyn-1")]), state=True)
    assert err == "Warning: Consumer group 'g' is rebalancing.\n"
    _, err = show(capsys, info("Stable", members=[member("dyn-1")]), state=True)
    assert err == ""
