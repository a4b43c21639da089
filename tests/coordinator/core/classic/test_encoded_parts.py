"""The big answers of a classic group built from parts each member keeps encoded (issue 31 item 4,
coordinator/core/classic/encoded.py): the leader's JoinGroup answer and the GroupMetadata record
are byte for byte what a fresh encode of the same content gives, at every JoinGroup version, and a
member's cached part follows its subscription when it rejoins with other metadata."""
import pytest

from coordinator.core import records
from coordinator.core.classic import encoded
from protocol.messages import GroupMetadataValue, GroupMetadataValueMemberMetadata, JoinGroupResponse
from tests.coordinator.core.test_group_harness import JOIN, Harness

SUB_A = b"\x00\x01\x00\x00\x00\x01\x00\x01a\xff\xff\xff\xff"
SUB_B = b"\x00\x01\x00\x00\x00\x02\x00\x01a\x00\x01b\xff\xff\xff\xff"


def fresh_join_bytes(resp, version: int) -> bytes:
    """The same answer as a plain JoinGroupResponse, encoded member by member."""
    plain = JoinGroupResponse(**{f: getattr(resp, f) for f in JoinGroupResponse.FIELDS})
    plain.members = list(resp.members)
    return plain.encode(version)


def fresh_record(group) -> bytes:
    members = [GroupMetadataValueMemberMetadata(
        member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
        client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms, session_timeout=m.session_timeout_ms,
        subscription=m.metadata(group.protocol_name), assignment=m.assignment) for m in group.members.values()]
    return records.group_metadata_value(GroupMetadataValue(
        protocol_type=group.protocol_type or "", generation=group.generation, protocol=group.protocol_name,
        leader=group.leader_id if members else None,
        current_state_timestamp=-1 if group.state_wall_ms is None else group.state_wall_ms, members=members))


def leader_answer(h: Harness, gid: str):
    """The leader's JoinGroup answer of the last completed join phase."""
    g = h.group(gid)
    for token, resp in reversed(list(h.replies.items())):
        if token[0] == JOIN and resp.error_code == 0 and resp.member_id == g.leader_id and resp.members:
            return token, resp
    raise AssertionError("no leader answer")


@pytest.mark.parametrize("version", list(range(0, 10)))
def test_the_leaders_answer_is_the_bytes_of_a_fresh_encode_at_every_version(version):
    h = Harness()
    mids, _gen = h.form_group("g", 3, instance=None)
    g = h.group("g")
    leader = g.leader_id
    # the leader rejoins (a rebalance), then the others: every answer at ``version``
    h.join("g", leader, version=version)
    for mid in mids:
        if mid != leader:
            h.join("g", mid, version=version)
    assert h.state("g") == "CompletingRebalance"
    _token, resp = leader_answer(h, "g")
    assert isinstance(resp, encoded.LeaderJoinResponse) and resp.parts is not None
    assert len(resp.members) == 3
    assert resp.encode(version) == fresh_join_bytes(resp, version)
    # the cached parts serve the next rebalance too, still the same bytes
    h.join("g", leader, version=version)
    for mid in mids:
        if mid != leader:
            h.join("g", mid, version=version)
    _token, resp2 = leader_answer(h, "g")
    assert resp2 is not resp and resp2.encode(version) == fresh_join_bytes(resp2, version)


def test_a_rejoin_with_new_metadata_changes_the_members_cached_part():
    h = Harness()
    mids, gen = h.form_group("g", 3, protocols=[("range", SUB_A)])
    g = h.group("g")
    m = g.members[mids[1]]
    before = m.join_enc
    assert before is not None and before[4] == (("range", SUB_A),)
    # member 1 rejoins with another subscription: a rebalance; everyone rejoins
    h.join("g", mids[1], protocols=[("range", SUB_B)])
    for mid in mids:
        if mid != mids[1]:
            h.join("g", mid, protocols=[("range", SUB_A)])
    _token, resp = leader_answer(h, "g")
    by_id = {x.member_id: x.metadata for x in resp.members}
    assert by_id[mids[1]] == SUB_B and by_id[mids[0]] == SUB_A
    assert resp.encode(5) == fresh_join_bytes(resp, 5)
    assert m.join_enc is not before and m.join_enc[4] == (("range", SUB_B),)


def test_the_group_record_is_the_bytes_of_a_fresh_encode_and_follows_changes():
    h = Harness()
    mids, gen = h.form_group("g", 4, protocols=[("range", SUB_A)])
    g = h.group("g")
    value = h.writes[-1][2]
    assert value == fresh_record(g)
    assert records.decode_value(records.GROUP_METADATA, value).members[2].assignment == mids[2].encode()
    # a subscription change, a new generation, new assignments: the record follows
    h.join("g", mids[0], protocols=[("range", SUB_B)])
    for mid in mids[1:]:
        h.join("g", mid, protocols=[("range", SUB_A)])
    g = h.group("g")
    leader = g.leader_id
    h.sync("g", g.generation, leader, {mid: b"new-" + mid.encode() for mid in mids})
    value = h.writes[-1][2]
    assert value == fresh_record(g)
    decoded = records.decode_value(records.GROUP_METADATA, value)
    subs = {mm.member_id: mm.subscription for mm in decoded.members}
    assert subs[mids[0]] == SUB_B and subs[mids[1]] == SUB_A
    assert {mm.member_id: mm.assignment for mm in decoded.members}[mids[3]] == b"new-" + mids[3].encode()


def test_a_changed_member_field_is_never_served_from_a_stale_part():
    h = Harness()
    mids, _gen = h.form_group("g", 2)
    g = h.group("g")
    m = g.members[mids[0]]
    head = encoded.record_member_head(m, g.protocol_name)
    assert encoded.record_member_head(m, g.protocol_name) is head  # cached
    m.session_timeout_ms += 1000
    head2 = encoded.record_member_head(m, g.protocol_name)
    assert head2 != head
    members, parts = encoded.join_members(g, 9)
    m.protocols = [(n, meta + b"x") for n, meta in m.protocols]
    members2, parts2 = encoded.join_members(g, 9)
    assert members2[0].metadata == members[0].metadata + b"x" and parts2[0] != parts[0]
    assert parts2[1] == parts[1]


def test_a_member_s_parts_are_encoded_when_it_joins_and_reused_by_the_answer_and_the_record():
    h = Harness()
    mids, gen = h.form_group("g", 3, version=9)
    g = h.group("g")
    m = g.members[mids[2]]
    join_part, record_part = m.join_enc, m.record_enc
    assert join_part is not None and join_part[0] == 9 and record_part is not None
    # the next rebalance (same subscriptions) reuses them: the same encoded bytes (the join part
    # now checked against the rejoin's protocols list), the same record part
    for mid in mids:
        h.join("g", mid, version=9)
    _token, resp = leader_answer(h, "g")
    assert m.join_enc[5] is join_part[5] and m.join_enc[6] is m.protocols and m.record_enc is record_part
    assert resp.encode(9) == fresh_join_bytes(resp, 9)
    g = h.group("g")
    h.sync("g", g.generation, g.leader_id, {mid: mid.encode() for mid in mids}, version=5)
    assert m.record_enc is record_part and h.writes[-1][2] == fresh_record(g)


def test_a_member_s_protocols_cannot_change_in_place_only_be_replaced_and_then_are_encoded_again():
    h = Harness()
    mids, _gen = h.form_group("g", 2)
    g = h.group("g")
    m = g.members[mids[1]]
    _members, parts = encoded.join_members(g, 5)
    head = encoded.record_member_head(m, g.protocol_name)
    name, meta = m.protocols[0]
    with pytest.raises(TypeError):  # the cached parts check the protocols by identity first
        m.protocols[0] = (name, meta + b"y")
    g.update_member(m, [(name, meta + b"y")], m.rebalance_timeout_ms, m.session_timeout_ms)
    members2, parts2 = encoded.join_members(g, 5)
    assert members2[1].metadata == meta + b"y" and parts2[1] != parts[1]
    assert encoded.record_member_head(m, g.protocol_name) != head
