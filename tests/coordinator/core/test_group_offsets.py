"""OffsetCommit / OffsetFetch / OffsetDelete and KIP-211 retention."""
from coordinator.core import records
from protocol import errors as E
from protocol.messages import OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics
from tests.coordinator.core.test_group_harness import FETCH, Harness, sub

RETENTION = 60_000  # offsets_retention_minutes=1


def perr(resp):
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def offset_writes(h, since=0):
    out = []
    for _, key, value in h.writes[since:]:
        rtype, k = records.decode_key(key)
        if rtype == records.OFFSET_COMMIT:
            out.append(((k.group, k.topic, k.partition), records.decode_value(rtype, value)))
    return out


def test_member_commits_and_fetches_across_versions():
    h = Harness()
    mids, gen = h.form_group("g", 1)
    r = h.commit("g", {("t", 0): 10, ("t", 1): 11, ("u", 0): 12}, generation=gen, member_id=mids[0],
                 metadata="m")
    assert set(perr(r).values()) == {E.NONE}
    for v in (0, 1, 3, 5, 7, 8, 9):
        err, got = h.fetch("g", {"t": [0, 1, 2], "u": [0]}, version=v)
        assert err == E.NONE
        assert got == {("t", 0): (10, "m"), ("t", 1): (11, "m"), ("t", 2): (-1, ""), ("u", 0): (12, "m")}, v
    err, everything = h.fetch("g", None, version=2)
    assert everything == {("t", 0): (10, "m"), ("t", 1): (11, "m"), ("u", 0): (12, "m")}
    err, everything = h.fetch("g", None, version=8)
    assert len(everything) == 3


def test_leader_epoch_is_stored_and_returned_from_v5():
    h = Harness()
    h.commit("g", {("t", 0): 1}, version=8)  # harness commits leader epoch 7 at v6+
    resp = h.call(FETCH, 5, OffsetFetchRequest(group_id="g", topics=None))
    assert resp.topics[0].partitions[0].committed_leader_epoch == 7
    resp = h.call(FETCH, 4, OffsetFetchRequest(group_id="g", topics=None))
    assert resp.topics[0].partitions[0].committed_leader_epoch == -1


def test_commit_records_carry_wall_clock_timestamps():
    h = Harness()
    h.clock.set_wall(1_800_000_000_000)
    n = len(h.writes)
    h.commit("g", {("t", 0): 5}, metadata="x")
    ((key, value),) = offset_writes(h, n)
    assert key == ("g", "t", 0)
    got = (value.offset, value.metadata, value.commit_timestamp, value.expire_timestamp)
    assert got == (5, "x", 1_800_000_000_000, -1)
    # v1 with an explicit commit timestamp keeps it
    n = len(h.writes)
    h.commit("g", {("t", 1): 6}, version=1, commit_ts=1_234)
    ((_, value),) = offset_writes(h, n)
    assert value.commit_timestamp == 1_234


def test_generation_minus_one_commits_into_empty_or_new_groups():
    h = Harness()
    r = h.commit("spark-job", {("t", 0): 100})
    assert perr(r) == {("t", 0): E.NONE}
    (d,) = h.describe("spark-job")
    assert d.group_state == "Empty" and d.protocol_type == ""
    # a consumer group that became Empty accepts them too
    mids, gen = h.form_group("g", 1)
    h.leave("g", mids[0])
    assert h.state("g") == "Empty"
    assert perr(h.commit("g", {("t", 0): 1})) == {("t", 0): E.NONE}
    # v0 (no member id, no generation) works the same
    assert perr(h.commit("g", {("t", 0): 2}, version=0)) == {("t", 0): E.NONE}


def test_commit_validation_errors():
    h = Harness()
    mids, gen = h.form_group("g", 2)
    a, b = mids
    def err(group_id="g", **kw):
        (e,) = set(perr(h.commit(group_id, {("t", 0): 1}, **kw)).values())
        return e

    assert err() == E.UNKNOWN_MEMBER_ID  # not a member, Stable
    assert err(generation=-1, member_id=a) == E.ILLEGAL_GENERATION
    assert err(generation=gen + 1, member_id=a) == E.ILLEGAL_GENERATION
    assert err(generation=gen, member_id="x") == E.UNKNOWN_MEMBER_ID
    # unknown group with a generation: ILLEGAL_GENERATION before v9, GROUP_ID_NOT_FOUND from v9
    assert err("nope", generation=3, member_id="m", version=8) == E.ILLEGAL_GENERATION
    assert err("nope", generation=3, member_id="m", version=9) == E.GROUP_ID_NOT_FOUND
    assert h.group("nope") is None
    # PreparingRebalance: current members may commit (and it keeps their session)
    h.join("g", a, protocols=(("range", sub("t", "z")),))
    assert h.state("g") == "PreparingRebalance"
    assert err(generation=gen, member_id=b) == E.NONE
    # CompletingRebalance: REBALANCE_IN_PROGRESS
    h.join("g", b)
    assert h.state("g") == "CompletingRebalance"
    gen2 = h.group("g").generation
    assert err(generation=gen2, member_id=b) == E.REBALANCE_IN_PROGRESS


def test_commit_from_a_fenced_static_member():
    h = Harness()
    t = h.join("g", instance="i1")
    mid = h.reply(t).member_id
    h.sync("g", 1, mid, {mid: b"a"}, instance="i1")
    r = h.commit("g", {("t", 0): 1}, generation=1, member_id="old-id", instance="i1", version=7)
    assert set(perr(r).values()) == {E.FENCED_INSTANCE_ID}
    r = h.commit("g", {("t", 0): 1}, generation=1, member_id=mid, instance="i9", version=7)
    assert set(perr(r).values()) == {E.UNKNOWN_MEMBER_ID}
    r = h.commit("g", {("t", 0): 1}, generation=1, member_id=mid, instance="i1", version=7)
    assert set(perr(r).values()) == {E.NONE}


def test_offset_metadata_too_large_counts_characters():
    h = Harness(offset_metadata_max_bytes=10)
    r = h.commit("g", {("t", 0): 1}, metadata="x" * 10)
    assert perr(r) == {("t", 0): E.NONE}
    r = h.commit("g", {("t", 1): 1}, metadata="é" * 10)  # 20 bytes, 10 characters: fine
    assert perr(r) == {("t", 1): E.NONE}
    r = h.commit("g", {("t", 2): 1, ("t", 3): 1}, metadata="x" * 11)
    assert perr(r) == {("t", 2): E.OFFSET_METADATA_TOO_LARGE, ("t", 3): E.OFFSET_METADATA_TOO_LARGE}
    assert h.fetch("g", {"t": [2]})[1] == {("t", 2): (-1, "")}


def test_default_metadata_limit_is_4096():
    h = Harness()
    assert perr(h.commit("g", {("t", 0): 1}, metadata="m" * 4096)) == {("t", 0): E.NONE}
    assert perr(h.commit("g", {("t", 0): 1}, metadata="m" * 4097)) == {("t", 0): E.OFFSET_METADATA_TOO_LARGE}


def test_fetch_unknown_group_and_batched_groups():
    h = Harness(offsets_partitions=50)
    for gid in ("g1", "g2", "polygenelubricants"):
        h.commit(gid, {("t", 0): len(gid)})
    assert h.fetch("unknown", {"t": [0]}) == (E.NONE, {("t", 0): (-1, "")})
    assert h.fetch("unknown", None) == (E.NONE, {})
    req = OffsetFetchRequest(groups=[
        OffsetFetchRequestGroup("g1", None, -1, [OffsetFetchRequestTopics("t", [0, 1])]),
        OffsetFetchRequestGroup("polygenelubricants", None, -1, None),
        OffsetFetchRequestGroup("missing", None, -1, None),
        OffsetFetchRequestGroup("g2", None, -1, [OffsetFetchRequestTopics("t", [0])]),
    ], require_stable=True)
    resp = h.call(FETCH, 8, req)
    got = {g.group_id: (g.error_code, {(t.name, p.partition_index): p.committed_offset for t in g.topics
                                       for p in t.partitions}) for g in resp.groups}
    assert got == {"g1": (0, {("t", 0): 2, ("t", 1): -1}), "polygenelubricants": (0, {("t", 0): 18}),
                   "missing": (0, {}), "g2": (0, {("t", 0): 2})}
    assert len({h.gc.shard_for(g) for g in got}) > 1  # the batch really spans shards


def test_offset_delete():
    h = Harness()
    assert h.offset_delete("nope", {"t": [0]}).error_code == E.GROUP_ID_NOT_FOUND
    mids, gen = h.form_group("g", 1, protocols=(("range", sub("t")),))
    h.commit("g", {("t", 0): 1, ("old", 0): 2, ("old", 1): 3}, generation=gen, member_id=mids[0])
    r = h.offset_delete("g", {"t": [0], "old": [0, 5]})
    assert r.error_code == E.NONE
    assert perr(r) == {("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("old", 0): E.NONE, ("old", 5): E.NONE}
    assert h.fetch("g", None)[1] == {("t", 0): (1, ""), ("old", 1): (3, "")}
    # a non-consumer protocol group that is not Empty
    cm, _ = h.join_dynamic("c", ptype="connect", protocols=(("v1", b"x"),))
    assert h.state("c") == "CompletingRebalance"
    h.sync("c", 1, cm, {cm: b""})
    assert perr(h.commit("c", {("t", 0): 1}, generation=1, member_id=cm)) == {("t", 0): E.NONE}
    assert h.offset_delete("c", {"t": [0]}).error_code == E.NON_EMPTY_GROUP
    # an Empty group: everything goes
    h.leave("g", mids[0])
    r = h.offset_delete("g", {"t": [0]})
    assert perr(r) == {("t", 0): E.NONE}
    assert h.fetch("g", None)[1] == {("old", 1): (3, "")}


# ---- retention --------------------------------------------------------------------------------------

def test_offsets_expire_after_the_group_has_been_empty_for_the_retention_period():
    h = Harness(offsets_retention_minutes=1, offsets_retention_check_interval_ms=1_000)
    mids, gen = h.form_group("g", 1, session=30_000)
    h.commit("g", {("t", 0): 5}, generation=gen, member_id=mids[0])
    # Stable for twice the retention: subscribed offsets never expire
    for _ in range(4):
        h.advance(29_000)
        h.heartbeat("g", gen, mids[0])
    assert h.fetch("g", {"t": [0]})[1] == {("t", 0): (5, "")}
    h.leave("g", mids[0])
    empty_since = h.now
    h.advance(RETENTION - 1_000)
    assert h.fetch("g", {"t": [0]})[1] == {("t", 0): (5, "")}
    n = len(h.writes)
    h.advance(1_000)
    assert h.now - empty_since == RETENTION
    assert h.fetch("g", {"t": [0]})[1] == {("t", 0): (-1, "")}
    # tombstones: the offset, then the group (no offsets left)
    kinds = [(records.decode_key(k)[0], v is None) for _, k, v in h.writes[n:]]
    assert kinds == [(records.OFFSET_COMMIT, True), (records.GROUP_METADATA, True)]
    assert h.group("g") is None
    assert h.describe("g")[0].group_state == "Dead"


def test_unsubscribed_topics_expire_in_a_stable_consumer_group():
    h = Harness(offsets_retention_minutes=1, offsets_retention_check_interval_ms=1_000)
    mids, gen = h.form_group("g", 1, session=30_000, protocols=(("range", sub("t")),))
    h.commit("g", {("t", 0): 1, ("gone", 0): 2}, generation=gen, member_id=mids[0])
    for _ in range(3):
        h.advance(25_000)
        h.heartbeat("g", gen, mids[0])
    assert h.state("g") == "Stable"
    assert h.fetch("g", None)[1] == {("t", 0): (1, "")}  # "gone" expired 60 s after its commit


def test_no_expiry_while_rebalancing():
    h = Harness(offsets_retention_minutes=1, offsets_retention_check_interval_ms=1_000)
    mids, gen = h.form_group("g", 2, session=100_000, rebalance=200_000, protocols=(("range", sub("t")),))
    h.commit("g", {("gone", 0): 2}, generation=gen, member_id=mids[0])
    h.join("g", mids[0], session=100_000, rebalance=200_000, protocols=(("range", sub("t", "x")),))
    assert h.state("g") == "PreparingRebalance"
    h.advance(90_000)
    h.heartbeat("g", gen, mids[1])
    assert h.fetch("g", None)[1] == {("gone", 0): (2, "")}


def test_simple_group_offsets_expire_from_their_commit_time():
    h = Harness(offsets_retention_minutes=1, offsets_retention_check_interval_ms=1_000)
    h.commit("s", {("t", 0): 1})
    h.advance(30_000)
    h.commit("s", {("t", 1): 2})
    h.advance(30_000)
    assert h.fetch("s", None)[1] == {("t", 1): (2, "")}
    h.advance(30_000)
    assert h.fetch("s", None)[1] == {}
    assert h.group("s") is None


def test_per_offset_expire_timestamp_v2_to_v4():
    h = Harness(offsets_retention_minutes=10, offsets_retention_check_interval_ms=1_000)
    n = len(h.writes)
    r = h.commit("s", {("t", 0): 1}, version=2, retention=5_000)
    assert perr(r) == {("t", 0): E.NONE}
    h.commit("s", {("t", 1): 1}, version=4, retention=-1)  # -1: the broker default
    ((_, v1), (_, v3)) = offset_writes(h, n)
    assert v1.expire_timestamp == h.clock.wall_ms() + 5_000
    assert v3.expire_timestamp == -1
    raw_values = [v for _, k, v in h.writes[n:]]
    assert raw_values[0][:2] == b"\x00\x01" and raw_values[1][:2] == b"\x00\x03"
    h.advance(4_999)
    assert ("t", 0) in h.fetch("s", None)[1]
    h.advance(1_000)
    assert h.fetch("s", None)[1] == {("t", 1): (1, "")}


def test_empty_group_without_offsets_is_deleted_at_the_next_retention_check():
    h = Harness(offsets_retention_check_interval_ms=1_000)
    mids, gen = h.form_group("g", 1)
    h.leave("g", mids[0])
    assert h.state("g") == "Empty"
    h.advance(1_000)
    assert h.group("g") is None


def test_metadata_that_cannot_fit_a_record_string_is_too_large_whatever_the_limit():
    h = Harness(offset_metadata_max_bytes=100_000)
    assert perr(h.commit("g", {("t", 0): 1}, metadata="m" * 32767)) == {("t", 0): E.NONE}
    assert perr(h.commit("g", {("t", 1): 1}, metadata="m" * 32768)) == {("t", 1): E.OFFSET_METADATA_TOO_LARGE}
    # 10,000 characters of 4 bytes each: within the character limit, 40,000 bytes on disk
    assert perr(h.commit("g", {("t", 2): 1}, metadata="😀" * 10_000)) == {("t", 2): E.OFFSET_METADATA_TOO_LARGE}
    assert h.fetch("g", {"t": [0]})[1] == {("t", 0): (1, "m" * 32767)}


def test_commit_answers_name_every_partition_index_including_large_and_negative_ones():
    """The "committed" answers of small partition indexes are shared objects; any index gets its own
    answer with its own number, and one commit's answer is not changed by the next one's."""
    h = Harness()
    parts = [0, 1, 1023, 1024, 70_000, 2**31 - 1, -1]
    first = h.commit("s", {("t", p): 5 for p in parts})
    assert perr(first) == {("t", p): E.NONE for p in parts}
    too_long = "x" * 5000  # OFFSET_METADATA_TOO_LARGE for every partition of this one
    second = h.commit("s", {("t", p): 6 for p in parts}, metadata=too_long)
    assert perr(second) == {("t", p): E.OFFSET_METADATA_TOO_LARGE for p in parts}
    assert perr(first) == {("t", p): E.NONE for p in parts}
    for v in (0, 8, 9):
        body = first.encode(v)
        assert perr(type(first).decode(body, v)) == {("t", p): E.NONE for p in parts}
