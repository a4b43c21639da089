"""Shared oracles for the protocol tests, all derived from ``protocol.messages.SCHEMA`` (so they run
on a clone without ../shared).

pytest runs with ``--import-mode=importlib``, so test files cannot import each other: they get the
helpers through the session fixture ``kit`` and the ``msg_version`` parameter (every (message,
version) pair in SCHEMA: requests, responses, headers, consumer-protocol blobs, records).

Values are plain data (see ``tools/construct_codec.py``): a struct is a dict holding every field
by its snake_case name, plus ``"unknown_tagged_fields"`` when it has some.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from protocol import messages  # noqa: E402
from protocol._base import _Struct  # noqa: E402
from tests.support.shared import shared_path  # noqa: E402
from tools import construct_codec as cc  # noqa: E402

SHARED_SPEC = shared_path("kafka-spec")  # may be absent (a fresh clone): check before use

# ~320 (message, version) pairs: keep examples per pair small; scale up with HERD_PROTOCOL_EXAMPLES.
_EXAMPLES = int(os.environ.get("HERD_PROTOCOL_EXAMPLES", "25"))
settings.register_profile(
    "herd-protocol",
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    print_blob=True,
)
settings.register_profile(
    "herd-protocol-light",  # for the slower (construct-interpreted) differential checks
    parent=settings.get_profile("herd-protocol"),
    max_examples=max(1, _EXAMPLES * 2 // 5),
)

PAIRS = [
    (name, v)
    for name, m in messages.SCHEMA.items()
    for v in range(m["valid"][0], m["valid"][1] + 1)
]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "codec_bugs(bugs, **xfail_kwargs): {(message, version): reason} pairs of a msg_version test "
        "that fail because of a known codec bug; they become xfails (strict unless overridden)",
    )


def pytest_generate_tests(metafunc):
    """Parametrize ``msg_version`` over every pair. ``@pytest.mark.codec_bugs({(name, v): reason})``
    turns those pairs into xfails (strict by default: fixing the codec makes them fail loudly so
    the marker gets removed)."""
    if "msg_version" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("codec_bugs")
    bugs = marker.args[0] if marker else {}
    xfail_kwargs = {"strict": True, **(marker.kwargs if marker else {})}
    params = []
    for pair in PAIRS:
        marks = [pytest.mark.xfail(reason=bugs[pair], **xfail_kwargs)] if pair in bugs else []
        params.append(pytest.param(pair, id=f"{pair[0]}-v{pair[1]}", marks=marks))
    metafunc.parametrize("msg_version", params)


# ------------------------------------------------------------------------------------------------
# schema helpers
# ------------------------------------------------------------------------------------------------

def _in(rng, v):
    return rng is not None and rng[0] <= v and (rng[1] is None or v <= rng[1])


def _is_array(f):
    return f["type"].startswith("[]")


def _elem(f):
    return f["type"][2:] if _is_array(f) else f["type"]


def _flexible(name, v):
    return _in(messages.SCHEMA[name]["flexible"], v)


def _known_tags(struct_cls):
    return {f["tag"] for f in cc.struct_fields(struct_cls) if f["tag"] is not None}


def cls_of(struct_cls: str):
    return getattr(messages, struct_cls)


# ------------------------------------------------------------------------------------------------
# plain data <-> generated objects (attribute access only; no generated encoders/decoders)
# ------------------------------------------------------------------------------------------------

def to_obj(struct_cls: str, d: dict | None):
    if d is None:
        return None
    kwargs = {}
    for f in cc.struct_fields(struct_cls):
        x = d[f["py"]]
        if "struct" in f and x is not None:
            x = [to_obj(f["struct"], e) for e in x] if _is_array(f) else to_obj(f["struct"], x)
        elif isinstance(x, list):
            x = list(x)
        kwargs[f["py"]] = x
    u = d.get(cc.UNKNOWN_TAGS)
    kwargs["unknown_tagged_fields"] = [(t, bytes(b)) for t, b in u] if u else None
    return cls_of(struct_cls)(**kwargs)


def to_plain(obj):
    if isinstance(obj, _Struct):
        out = {n: to_plain(getattr(obj, n)) for n in obj.FIELDS}
        u = obj.unknown_tagged_fields
        if u:
            out[cc.UNKNOWN_TAGS] = [(t, bytes(b)) for t, b in u]
        return out
    if isinstance(obj, list):
        return [to_plain(e) for e in obj]
    if isinstance(obj, (bytearray, memoryview)):
        return bytes(obj)
    return obj


# ------------------------------------------------------------------------------------------------
# hypothesis strategies from SCHEMA
# ------------------------------------------------------------------------------------------------

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1), "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1), "int64": (-(1 << 63), (1 << 63) - 1),
    "uint16": (0, (1 << 16) - 1), "uint32": (0, (1 << 32) - 1),
}
_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
_BYTES = st.binary(max_size=12)
_TAG_VALUE = st.one_of(st.integers(0, 40), st.integers(0, (1 << 31) - 1))


def _prim_strategy(t):
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.integers(lo, hi)
    if t == "bool":
        return st.booleans()
    if t == "uuid":
        return st.binary(min_size=16, max_size=16)
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "string":
        return _TEXT
    if t in ("bytes", "records"):
        return _BYTES
    raise AssertionError(t)


class Strategies:
    def __init__(self):
        self._cache = {}

    def message(self, name: str, v: int):
        return self.struct(name, v, _flexible(name, v))

    def struct(self, struct_cls: str, v: int, flexible: bool):
        key = (struct_cls, v, flexible)
        if key in self._cache:
            return self._cache[key]
        parts = {}
        for f in cc.struct_fields(struct_cls):
            if _in(f["versions"], v):
                parts[f["py"]] = self.field(f, v, flexible, nullable=_in(f["nullable"], v))
            elif f["ignorable"]:
                # dropped silently on encode: any value, checked to come back as the default
                parts[f["py"]] = self.field(f, v, flexible, nullable=False)
            else:
                parts[f["py"]] = st.just(cc.default_of(f))
        s = st.fixed_dictionaries(parts)
        if flexible:
            known = _known_tags(struct_cls)
            tags = st.lists(
                st.tuples(_TAG_VALUE.filter(lambda t: t not in known), st.binary(max_size=140)),
                max_size=2, unique_by=lambda p: p[0],
            ).map(lambda ts: sorted(ts))
            s = st.tuples(s, tags).map(_with_unknown)
        self._cache[key] = s
        return s

    def field(self, f, v, flexible, nullable):
        if _is_array(f):
            if "struct" in f:
                elem = self.struct(f["struct"], v, flexible)
            else:
                elem = _prim_strategy(_elem(f))
            s = st.lists(elem, max_size=2 if "struct" in f else 3)
        elif "struct" in f:
            s = self.struct(f["struct"], v, flexible)
        else:
            s = _prim_strategy(f["type"])
        return st.none() | s if nullable else s


def _with_unknown(pair):
    d, tags = pair
    if tags:
        d = dict(d)
        d[cc.UNKNOWN_TAGS] = tags
    return d


# ------------------------------------------------------------------------------------------------
# deterministic values
# ------------------------------------------------------------------------------------------------

_RICH_INT = {"int8": 7, "int16": 300, "int32": 70000, "int64": (1 << 40) + 5, "uint16": 65000,
             "uint32": 4_000_000_000}


def _rich_prim(t, py, default):
    if t in _RICH_INT:
        x = _RICH_INT[t]
        return x + 1 if x == default else x
    if t == "bool":
        return not default
    if t == "uuid":
        return bytes(range(1, 17))
    if t == "float64":
        return 1.5
    if t == "string":
        return f"h\u00e9llo-{py}"
    if t == "bytes":
        return b"\x00\x01\xfe" + py.encode()
    if t == "records":
        return b"records:" + py.encode()
    raise AssertionError(t)


def rich_struct(struct_cls: str, v: int, flexible: bool, unknown: bool = True, n: int = 2) -> dict:
    """Every field the version has set to a non-default value, arrays with two elements, and an
    unknown tagged field (multi-byte tag) in every struct of a flexible version."""
    out = {}
    for f in cc.struct_fields(struct_cls):
        if not _in(f["versions"], v):
            out[f["py"]] = cc.default_of(f)
            continue
        out[f["py"]] = _rich_field(f, v, flexible, unknown, n)
    if flexible and unknown:
        known = _known_tags(struct_cls)
        tag = next(t for t in range(300, 400) if t not in known)
        out[cc.UNKNOWN_TAGS] = [(tag, b"\xab\xcd")]
    return out


def _rich_field(f, v, flexible, unknown, n=2):
    def one(i):
        if "struct" in f:
            return rich_struct(f["struct"], v, flexible, unknown, n)
        return _rich_prim(_elem(f), f["py"] + str(i) * i, None)

    if _is_array(f):
        return [one(i) for i in range(n)]
    if "struct" in f:
        return one(0)
    return _rich_prim(f["type"], f["py"], cc.default_of(f))


def sparse_struct(struct_cls: str, v: int) -> dict:
    """Defaults everywhere, except that every nullable field the version has is null."""
    out = {}
    for f in cc.struct_fields(struct_cls):
        if _in(f["versions"], v) and _in(f["nullable"], v):
            out[f["py"]] = None
        else:
            out[f["py"]] = cc.default_of(f)
    return out


def rich_value(f) -> object:
    """A non-default value for field ``f`` (at the first version that has it)."""
    return _rich_field(f, f["versions"][0], False, False)


def rich(name: str, v: int, unknown: bool = True, n: int = 2) -> dict:
    """See rich_struct; ``n`` is the length of every array."""
    return rich_struct(name, v, _flexible(name, v), unknown, n)


def sparse(name: str, v: int) -> dict:
    return sparse_struct(name, v)


_STRATEGIES = Strategies()


@pytest.fixture(scope="session")
def kit():
    return SimpleNamespace(
        strategy=_STRATEGIES.message, rich=rich, sparse=sparse, rich_value=rich_value,
        to_obj=to_obj, to_plain=to_plain,
        cls=cls_of, flexible=_flexible, pairs=PAIRS, shared_spec=SHARED_SPEC, repo=REPO,
        fields=cc.struct_fields,
    )
