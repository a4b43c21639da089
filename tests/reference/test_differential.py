# ruff: noqa: E501 (EXPECTED holds whole answers)
"""herd against a real Kafka broker: every script in scripts.py run on both, answers compared
field by field (tests/reference/differential.py says what is normalised).

A script whose answers differ must have an entry in EXPECTED: the id of its paragraph in
docs/compatibility.md ("KD-n": a known difference, to fix in herd; "OP-n": different on purpose)
and the exact differences, (path, herd's value, Kafka's value). The test checks the difference is
still exactly that: a fix in herd makes it fail, and the entry (and the doc's paragraph) go.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.reference.differential import describe
from tests.reference.scripts import SCRIPTS

pytestmark = pytest.mark.reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"

EXPECTED: dict[str, tuple[str, list]] = {
    'commit_unknown_topic_and_partition': ('OP-1', [
        ('[0]partition past the end.topics[0].partitions[1].error_code', 0, 3),
        ('[1]unknown topic.topics[0].partitions[0].error_code', 0, 3),
        ('[2]fetch all.groups[0].topics[len]', 2, 1),
        ('[2]fetch all.groups[0].topics[0].name', 'no-such-topic-<run>', 't-<run>'),
    ]),
    'find_coordinator_transactions': ('OP-4', [
        ('[0]txn v3.error_code', 42, 0),
        ('[0]txn v3.error_message', 'herd coordinates consumer groups only (key type 1, transactions, is not supported)', 'NONE'),
        ('[1]txn v4.coordinators[0].error_code', 42, 0),
        ('[1]txn v4.coordinators[0].error_message', 'herd coordinates consumer groups only (key type 1, transactions, is not supported)', ''),
    ]),
    'offset_commit_v0': ('OP-2', [
        ('[0]commit v0', {'topics': [{'name': 't-<run>', 'partitions': [{'partition_index': 0, 'error_code': 0}, {'partition_index': 1, 'error_code': 0}]}]}, '<connection closed>'),
        ('[1]fetch v5.topics[0].partitions[0].committed_offset', 10, -1),
        ('[1]fetch v5.topics[0].partitions[1].committed_offset', 11, -1),
        ('[2]describe.groups[0].group_state', 'Empty', 'Dead'),
    ]),
    'offset_commit_v1': ('OP-2', [
        ('[0]commit v1', {'topics': [{'name': 't-<run>', 'partitions': [{'partition_index': 0, 'error_code': 0}, {'partition_index': 1, 'error_code': 0}]}]}, '<connection closed>'),
        ('[1]fetch v5.topics[0].partitions[0].committed_offset', 10, -1),
        ('[1]fetch v5.topics[0].partitions[0].metadata', 'm', ''),
        ('[1]fetch v5.topics[0].partitions[1].committed_offset', 11, -1),
        ('[1]fetch v5.topics[0].partitions[1].metadata', 'm', ''),
        ('[2]describe.groups[0].group_state', 'Empty', 'Dead'),
    ]),
    'offset_delete_empty_group': ('OP-1', [
        ('[1]offset delete.topics[0].partitions[1].error_code', 0, 3),
    ]),
    'offset_fetch_v0': ('OP-2', [
        ('[1]fetch v0', {'topics': [{'name': 't-<run>', 'partitions': [{'partition_index': 0, 'committed_offset': 5, 'committed_leader_epoch': -1, 'metadata': 'meta', 'error_code': 0}, {'partition_index': 1, 'committed_offset': 6, 'committed_leader_epoch': -1, 'metadata': 'meta', 'error_code': 0}, {'partition_index': 2, 'committed_offset': -1, 'committed_leader_epoch': -1, 'metadata': '', 'error_code': 0}]}], 'error_code': 0, 'groups': []}, '<connection closed>'),
    ]),
    'static_member_restart_at_group_max_size': ('OP-5', [
        ('[2]inst-0 restarts.error_code', 0, 81),
        ('[2]inst-0 restarts.generation_id', 4, -1),
        ('[2]inst-0 restarts.protocol_type', 'consumer', None),
        ('[2]inst-0 restarts.protocol_name', 'range', None),
        ('[2]inst-0 restarts.leader', 'inst-0-#5', ''),
        ('[2]inst-0 restarts.skip_assignment', True, False),
        ('[2]inst-0 restarts.member_id', 'inst-0-#5', ''),
        ('[2]inst-0 restarts.members[len]', 4, 0),
    ]),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script(differential, name):
    h, k, diffs = differential(SCRIPTS[name])
    if name not in EXPECTED:
        assert not diffs, f"{name}: herd and Kafka differ:\n{describe(diffs)}"
        return
    doc_id, expected = EXPECTED[name]
    assert diffs == expected, (
        f"{name}: the difference documented as {doc_id} in docs/compatibility.md changed "
        f"(fixed? then remove the entry and the doc's paragraph). Now:\n{describe(diffs)}")


def test_every_expected_difference_is_documented():
    ids = set(re.findall(r"<a id=\"((?:KD|OP)-\d+)\"></a>", DOC.read_text()))
    missing = {name: doc_id for name, (doc_id, _) in EXPECTED.items() if doc_id not in ids}
    assert not missing, f"EXPECTED entries without their paragraph in {DOC}: {missing}"
    assert set(EXPECTED) <= set(SCRIPTS)


def test_at_least_forty_scripts():
    assert len(SCRIPTS) >= 40
