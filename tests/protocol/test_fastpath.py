"""protocol.fastpath against the generated codec: the edge's hand-written bytes are exactly what the
generated classes read and write (issue 28: byte-level matching next to the codec)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import errors as E
from protocol import fastpath
from protocol import messages as m
from protocol.headers import encode_request_header, encode_response_header, read_request_header

CGHB = m.ConsumerGroupHeartbeatRequest
ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda s: 0 < len(s.encode()) < 127)


def request_frame(request, version: int) -> tuple[bytes, int]:
    """A request frame's bytes after the size, and where its body starts."""
    out = bytearray()
    encode_request_header(out, request.API_KEY, version, 7, "client")
    request.encode_into(out, version)
    frame = bytes(out)
    return frame, read_request_header(frame)[-1]


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("code", [E.NONE, E.REBALANCE_IN_PROGRESS, E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION])
def test_heartbeat_tail_is_the_generated_header_tail_and_body(version, code):
    header = encode_response_header(7, m.HeartbeatRequest.API_KEY, version)[4:]  # after the correlation id
    assert fastpath.heartbeat_tail(version, code) == header + m.HeartbeatResponse(error_code=code).encode(version)
    assert fastpath.encode_heartbeat_body(version, code) == m.HeartbeatResponse(error_code=code).encode(version)


def test_header_tails_follow_the_response_header_versions():
    tails = fastpath.header_tails({m.HeartbeatRequest.API_KEY: (0, 4), CGHB.API_KEY: (0, 1), 18: (0, 4)})
    for key, versions in tails.items():
        for v, tail in enumerate(versions):
            assert tail == encode_response_header(1, key, v)[4:]
    assert tails[18] == (b"",) * 5  # ApiVersions: header v0 always


@given(group=ids, member=ids, epoch=st.integers(1, 2**31 - 1), version=st.sampled_from([0, 1]),
       interval=st.integers(0, 2**31 - 1))
def test_a_steady_consumer_heartbeat_is_recognised_and_answered_as_the_codec_would(group, member, epoch, version,
                                                                                   interval):
    frame, pos = request_frame(CGHB(group_id=group, member_id=member, member_epoch=epoch), version)
    parsed = fastpath.parse_steady_consumer_heartbeat(frame, pos, version)
    assert parsed is not None
    assert parsed[:3] == (group, member, epoch)
    answer = fastpath.steady_consumer_heartbeat_answer(frame, parsed[3], epoch, interval)
    expected = encode_response_header(7, CGHB.API_KEY, version)[4:] + m.ConsumerGroupHeartbeatResponse(
        member_id=member, member_epoch=epoch, heartbeat_interval_ms=interval).encode(version)
    assert answer == expected


@pytest.mark.parametrize("version", [0, 1])
@pytest.mark.parametrize("change", [
    {"member_epoch": 0},  # a join
    {"member_epoch": -1},  # a leave
    {"member_epoch": -2},  # a static leave
    {"instance_id": "i"},
    {"rack_id": "r"},
    {"rebalance_timeout_ms": 30000},
    {"subscribed_topic_names": ["t"]},
    {"server_assignor": "uniform"},
    {"topic_partitions": []},  # an acknowledgement of an empty assignment
    {"topic_partitions": [m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=b"\x01" * 16, partitions=[0])]},
    {"group_id": ""},
    {"member_id": "x" * 200},
])
def test_anything_but_a_steady_heartbeat_takes_the_full_path(version, change):
    fields = dict(group_id="g", member_id="m", member_epoch=5)
    fields.update(change)
    frame, pos = request_frame(CGHB(**fields), version)
    assert fastpath.parse_steady_consumer_heartbeat(frame, pos, version) is None


def test_a_regex_subscription_at_v1_takes_the_full_path():
    frame, pos = request_frame(CGHB(group_id="g", member_id="m", member_epoch=5, subscribed_topic_regex="t.*"), 1)
    assert fastpath.parse_steady_consumer_heartbeat(frame, pos, 1) is None


@given(st.binary(max_size=80), st.sampled_from([0, 1]))
def test_arbitrary_bytes_never_raise(junk, version):
    result = fastpath.parse_steady_consumer_heartbeat(junk, 0, version)
    if result is not None:  # whatever it accepts, the generated decoder reads the same way
        decoded, end = CGHB.decode_from(junk, 0, version)
        assert end == len(junk)
        assert (decoded.group_id, decoded.member_id, decoded.member_epoch) == result[:3]


# ---- OffsetCommit's answer ------------------------------------------------------------------------

OCR = m.OffsetCommitResponse
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=30)
commit_answers = st.builds(
    OCR, throttle_time_ms=st.integers(0, 2**31 - 1),
    topics=st.lists(st.builds(m.OffsetCommitResponseTopic, name=names, partitions=st.lists(st.builds(
        m.OffsetCommitResponsePartition, partition_index=st.integers(-2**31, 2**31 - 1),
        error_code=st.sampled_from([E.NONE, E.OFFSET_METADATA_TOO_LARGE, E.STALE_MEMBER_EPOCH,
                                    E.UNKNOWN_TOPIC_OR_PARTITION, E.ILLEGAL_GENERATION, -1, 32767])),
        max_size=140)), max_size=4))


@given(response=commit_answers, version=st.integers(0, OCR.MAX_VERSION))
def test_an_offset_commit_answer_is_encoded_as_the_codec_would(response, version):
    assert fastpath.encode_offset_commit_response(response, version) == response.encode(version)


def test_an_offset_commit_answer_of_many_topics_uses_a_long_varint():
    topics = [m.OffsetCommitResponseTopic(f"t{i}", [m.OffsetCommitResponsePartition(p, 0) for p in range(130)])
              for i in range(130)]
    response = OCR(topics=topics)
    for version in (0, 3, 8, 9):
        assert fastpath.encode_offset_commit_response(response, version) == response.encode(version)


@pytest.mark.parametrize("change", ["response_tags", "topic_tags", "partition_tags", "null_name", "long_name",
                                    "null_partitions", "index_out_of_range"])
def test_an_offset_commit_answer_the_shortcut_does_not_know_goes_the_generic_way(change):
    part = m.OffsetCommitResponsePartition(0, 0)
    topic = m.OffsetCommitResponseTopic("t", [part])
    response = OCR(topics=[topic])
    if change == "response_tags":
        response.unknown_tagged_fields = [(5, b"x")]
    elif change == "topic_tags":
        topic.unknown_tagged_fields = [(5, b"x")]
    elif change == "partition_tags":
        part.unknown_tagged_fields = [(5, b"x")]
    elif change == "null_name":
        topic.name = None
    elif change == "long_name":
        topic.name = "x" * 0x8000
    elif change == "null_partitions":
        topic.partitions = None
    else:
        part.partition_index = 2**31
    assert fastpath.encode_offset_commit_response(response, 9) is None


# ---- OffsetCommit's request -----------------------------------------------------------------------

OCQ = m.OffsetCommitRequest
short = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
commit_partitions = st.builds(
    m.OffsetCommitRequestPartition, partition_index=st.integers(-2**31, 2**31 - 1),
    committed_offset=st.integers(-2**63, 2**63 - 1), committed_leader_epoch=st.integers(-2**31, 2**31 - 1),
    committed_metadata=st.one_of(st.none(), short, st.text(min_size=100, max_size=300)))
commit_requests = st.builds(
    OCQ, group_id=st.one_of(short, st.text(min_size=120, max_size=200)),
    generation_id_or_member_epoch=st.integers(-2**31, 2**31 - 1),
    member_id=st.one_of(short, st.text(min_size=120, max_size=200)), group_instance_id=st.one_of(st.none(), short),
    topics=st.lists(st.builds(m.OffsetCommitRequestTopic, name=short,
                              partitions=st.lists(commit_partitions, max_size=20)), max_size=4))


def _usual(request: OCQ) -> bool:
    """Every string and array short enough for one length byte."""
    fits = lambda s: s is None or len(s.encode()) < 127  # noqa: E731
    return (fits(request.group_id) and fits(request.member_id) and fits(request.group_instance_id)
            and len(request.topics) < 127 and all(
                fits(t.name) and len(t.partitions) < 127 and all(fits(p.committed_metadata) for p in t.partitions)
                for t in request.topics))


@given(request=commit_requests, version=st.sampled_from([8, 9]))
def test_an_offset_commit_request_is_read_as_the_codec_reads_it(request, version):
    frame, pos = request_frame(request, version)
    generated, end = OCQ.decode_from(frame, pos, version)
    assert end == len(frame)
    fast = fastpath.decode_offset_commit_request(frame, pos, version)
    if _usual(request):
        assert fast == generated
    else:
        assert fast is None or fast == generated


@given(request=commit_requests, version=st.sampled_from([8, 9]), data=st.data())
def test_a_cut_or_padded_offset_commit_request_is_left_to_the_codec(request, version, data):
    frame, pos = request_frame(request, version)
    cut = data.draw(st.integers(pos, len(frame) - 1))
    assert fastpath.decode_offset_commit_request(frame[:cut], pos, version) is None
    assert fastpath.decode_offset_commit_request(frame + b"\x00", pos, version) is None


def test_offset_commit_requests_the_shortcut_does_not_read():
    part = m.OffsetCommitRequestPartition(0, 5, -1, -1, "")
    plain = OCQ(group_id="g", generation_id_or_member_epoch=1, member_id="m",
                topics=[m.OffsetCommitRequestTopic("t", [part])])
    for version in range(8):  # the non-flexible versions
        frame, pos = request_frame(plain, version)
        assert fastpath.decode_offset_commit_request(frame, pos, version) is None
    for tagged in (plain, plain.topics[0], part):
        tagged.unknown_tagged_fields = [(3, b"x")]
        frame, pos = request_frame(plain, 9)
        assert fastpath.decode_offset_commit_request(frame, pos, 9) is None
        assert OCQ.decode_from(frame, pos, 9)[0] == plain
        tagged.unknown_tagged_fields = None
    frame, pos = request_frame(plain, 9)
    bad = bytearray(frame)
    bad[pos + 1] = 0xFF  # the group id is not UTF-8
    assert fastpath.decode_offset_commit_request(bytes(bad), pos, 9) is None
    assert fastpath.decode_offset_commit_request(frame, pos, 9) == plain


# ---- SyncGroup's request --------------------------------------------------------------------------

SGQ = m.SyncGroupRequest
sync_requests = st.builds(
    SGQ, group_id=st.one_of(short, st.text(min_size=120, max_size=200)), generation_id=st.integers(-2**31, 2**31 - 1),
    member_id=st.one_of(short, st.text(min_size=120, max_size=200)), group_instance_id=st.one_of(st.none(), short),
    protocol_type=st.one_of(st.none(), short), protocol_name=st.one_of(st.none(), short),
    assignments=st.lists(st.builds(m.SyncGroupRequestAssignment, member_id=st.one_of(short, st.text(min_size=127,
                                                                                                  max_size=140)),
                                   assignment=st.binary(max_size=300)), max_size=200))


def _usual_sync(request: SGQ, version: int) -> bool:
    fits = lambda s: s is None or len(s.encode()) < 127  # noqa: E731
    return (fits(request.group_id) and fits(request.member_id) and fits(request.group_instance_id)
            and (version < 5 or (fits(request.protocol_type) and fits(request.protocol_name)))
            and all(fits(a.member_id) for a in request.assignments))


@given(request=sync_requests, version=st.sampled_from([4, 5]))
def test_a_sync_group_request_is_read_as_the_codec_reads_it(request, version):
    frame, pos = request_frame(request, version)
    generated, end = SGQ.decode_from(frame, pos, version)
    assert end == len(frame)
    fast = fastpath.decode_sync_group_request(frame, pos, version)
    if _usual_sync(request, version):
        assert fast == generated
    else:
        assert fast is None or fast == generated


@given(request=sync_requests, version=st.sampled_from([4, 5]), data=st.data())
def test_a_cut_or_padded_sync_group_request_is_left_to_the_codec(request, version, data):
    frame, pos = request_frame(request, version)
    cut = data.draw(st.integers(pos, len(frame) - 1))
    assert fastpath.decode_sync_group_request(frame[:cut], pos, version) is None
    assert fastpath.decode_sync_group_request(frame + b"\x00", pos, version) is None


def test_a_leader_s_sync_of_thousands_of_members_is_read_and_others_are_left_to_the_codec():
    many = SGQ(group_id="big", generation_id=3, member_id="m0", protocol_type="consumer", protocol_name="range",
               assignments=[m.SyncGroupRequestAssignment(f"m{i}", bytes(200 + i % 50)) for i in range(5000)])
    frame, pos = request_frame(many, 5)
    assert fastpath.decode_sync_group_request(frame, pos, 5) == many  # multi-byte array and bytes lengths
    for version in range(4):  # the non-flexible versions
        frame, pos = request_frame(many, version)
        assert fastpath.decode_sync_group_request(frame, pos, version) is None
    small = SGQ(group_id="g", generation_id=1, member_id="m", assignments=[m.SyncGroupRequestAssignment("m", b"a")])
    for tagged in (small, small.assignments[0]):
        tagged.unknown_tagged_fields = [(3, b"x")]
        frame, pos = request_frame(small, 5)
        assert fastpath.decode_sync_group_request(frame, pos, 5) is None
        assert SGQ.decode_from(frame, pos, 5)[0] == small
        tagged.unknown_tagged_fields = None
    frame, pos = request_frame(small, 5)
    bad = bytearray(frame)
    bad[pos + 1] = 0xFF  # the group id is not UTF-8
    assert fastpath.decode_sync_group_request(bytes(bad), pos, 5) is None


# ---- ConsumerGroupHeartbeat: steady, or rebalance work (edge/turns.py makes the latter wait) -------

@given(group=ids, member=ids, epoch=st.integers(-2**31, 2**31 - 1), version=st.sampled_from([0, 1]),
       client=st.one_of(st.just(""), ids), reports=st.booleans())
def test_a_consumer_heartbeat_s_epoch_and_kind_are_read_from_its_frame(group, member, epoch, version, client,
                                                                      reports):
    owned = [m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=b"\x01" * 16, partitions=[0])] if reports \
        else None
    req = m.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch,
                                          topic_partitions=owned)
    out = bytearray()
    encode_request_header(out, req.API_KEY, version, 7, client)
    req.encode_into(out, version)
    frame = bytes(out)
    assert fastpath.consumer_heartbeat_epoch(frame)[0] == epoch
    steady = epoch > 0 and not reports
    assert fastpath.consumer_heartbeat_is_rebalance_work(frame) is (not steady)
    pos = read_request_header(frame)[-1]
    assert (fastpath.parse_steady_consumer_heartbeat(frame, pos, version) is not None) is steady
    for cut in (4, 10, len(frame) // 2):
        got = fastpath.consumer_heartbeat_epoch(frame[:cut])
        assert got is None or got[0] == epoch


def test_a_consumer_heartbeat_of_an_unusual_shape_is_not_told_apart():
    req = m.ConsumerGroupHeartbeatRequest(group_id="g" * 200, member_id="m", member_epoch=0)
    frame, _pos = request_frame(req, 0)
    assert fastpath.consumer_heartbeat_epoch(frame) is None  # a group id of 200 bytes
    assert not fastpath.consumer_heartbeat_is_rebalance_work(frame)
    assert fastpath.consumer_heartbeat_epoch(b"\x00\x44") is None


_described_member = st.builds(
    m.DescribeGroupsResponseDescribedGroupMember, member_id=st.text(max_size=8),
    group_instance_id=st.one_of(st.none(), st.text(max_size=4)), client_id=st.text(max_size=6),
    client_host=st.text(max_size=6), member_metadata=st.binary(max_size=6), member_assignment=st.binary(max_size=6))
_described_group = st.builds(
    m.DescribeGroupsResponseDescribedGroup, error_code=st.sampled_from([0, 16, 69]), group_id=st.text(max_size=8),
    group_state=st.sampled_from(["Stable", "Dead", "PreparingRebalance"]), protocol_type=st.just("consumer"),
    protocol_data=st.text(max_size=5), members=st.lists(_described_member, max_size=4),
    authorized_operations=st.integers(-2**31, 2**31 - 1))


@given(groups=st.lists(_described_group, max_size=8), cuts=st.lists(st.integers(0, 8), max_size=3),
       version=st.integers(0, 5), throttle=st.integers(0, 1000))
def test_a_describe_groups_answer_encoded_in_parts_is_the_codecs(groups, cuts, version, throttle):
    """The edge encodes a big DescribeGroups answer a part per loop turn: head, the parts, tail
    are byte for byte the generated encoder's answer, wherever it is cut."""
    for g in groups:  # what the older versions cannot carry, as herd leaves it for them
        if version < 3:
            g.authorized_operations = -2**31
        if version < 4:
            for mem in g.members:
                mem.group_instance_id = None
    whole = m.DescribeGroupsResponse(throttle_time_ms=throttle if version >= 1 else 0, groups=groups).encode(version)
    head, tail = fastpath.list_answer_frame(m.DescribeGroupsResponse, len(groups), version,
                                            throttle if version >= 1 else 0)
    bounds = sorted({0, len(groups), *(min(c, len(groups)) for c in cuts)})
    parts = b"".join(fastpath.encode_list_entries(m.DescribeGroupsResponse, groups[a:b], version)
                     for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    assert head + parts + tail == whole


def test_a_describe_groups_answer_of_over_127_groups_has_a_longer_count():
    groups = [m.DescribeGroupsResponseDescribedGroup(group_id=f"g{i}", group_state="Dead") for i in range(300)]
    for version in range(6):
        whole = m.DescribeGroupsResponse(groups=groups).encode(version)
        head, tail = fastpath.list_answer_frame(m.DescribeGroupsResponse, 300, version)
        assert head + fastpath.encode_list_entries(m.DescribeGroupsResponse, groups[:200], version) \
            + fastpath.encode_list_entries(m.DescribeGroupsResponse, groups[200:], version) + tail == whole


def test_a_consumer_group_describe_answer_encoded_in_parts_is_the_codecs():
    groups = [m.ConsumerGroupDescribeResponseDescribedGroup(
        group_id=f"g{i}", group_state="Stable", group_epoch=i, assignment_epoch=i, assignor_name="uniform",
        members=[m.ConsumerGroupDescribeResponseMember(
            member_id=f"m{i}-{k}", member_epoch=i, client_id="c", client_host="/h", subscribed_topic_names=["t"],
            assignment=m.ConsumerGroupDescribeResponseAssignment(topic_partitions=[
                m.ConsumerGroupDescribeResponseTopicPartitions(topic_id=(i + 1).to_bytes(16, "big"), topic_name="t",
                                                               partitions=[k])]))
            for k in range(i % 3)]) for i in range(200)]
    for cut in (0, 1, 130, 199, 200):
        whole = m.ConsumerGroupDescribeResponse(throttle_time_ms=7, groups=groups).encode(0)
        head, tail = fastpath.list_answer_frame(m.ConsumerGroupDescribeResponse, 200, 0, 7)
        parts = fastpath.encode_list_entries(m.ConsumerGroupDescribeResponse, groups[:cut], 0) \
            + fastpath.encode_list_entries(m.ConsumerGroupDescribeResponse, groups[cut:], 0)
        assert head + parts + tail == whole
