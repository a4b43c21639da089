"""decode(encode(x)) == x for generated values of EVERY (message, version) in SCHEMA: requests,
responses, headers, consumer-protocol blobs and the __consumer_offsets record structs.

Values come from hypothesis strategies built from SCHEMA (conftest ``Strategies``). Fields a
version lacks are given random values when they are ignorable (the encoder must drop them) and
their defaults otherwise; the expectation is ``construct_codec.project``: absent fields at their
defaults, unknown tagged fields kept only in flexible versions.
"""
from hypothesis import given, settings
from hypothesis import strategies as st

from tools import construct_codec as cc


@settings(settings.get_profile("herd-protocol"))
@given(data=st.data())
def test_roundtrip(kit, msg_version, data):
    name, v = msg_version
    value = data.draw(kit.strategy(name, v), label="value")
    obj = kit.to_obj(name, value)
    encoded = obj.encode(v)
    assert obj.encode(v) == encoded, "encode is not deterministic"
    back, end = kit.cls(name).decode_from(encoded, 0, v)
    assert end == len(encoded)
    assert kit.to_plain(back) == cc.project(name, v, value)
    assert back.encode(v) == encoded


def test_roundtrip_rich_and_sparse(kit, msg_version):
    """Deterministic companions: every present field non-default (with unknown tagged fields in
    every struct), and every nullable field null."""
    name, v = msg_version
    for value in (kit.rich(name, v), kit.sparse(name, v)):
        encoded = kit.to_obj(name, value).encode(v)
        back, end = kit.cls(name).decode_from(encoded, 0, v)
        assert end == len(encoded)
        assert kit.to_plain(back) == cc.project(name, v, value)
        assert back.encode(v) == encoded


def test_every_pair_is_covered(kit):
    """The parametrization covers every message kind and every version of each."""
    kinds = {}
    for name, _v in kit.pairs:
        kinds.setdefault(kit.cls(name).TYPE, set()).add(name)
    assert set(kinds) == {"request", "response", "header", "data"}
    assert {"RequestHeader", "ResponseHeader"} <= kinds["header"]
    assert {"ConsumerProtocolSubscription", "ConsumerProtocolAssignment", "OffsetCommitKey",
            "OffsetCommitValue", "GroupMetadataValue"} <= kinds["data"]
    for name in {n for n, _ in kit.pairs}:
        cls = kit.cls(name)
        assert [v for n, v in kit.pairs if n == name] == list(range(cls.MIN_VERSION, cls.MAX_VERSION + 1))
    assert len(kit.pairs) >= 300
