"""``SubscribedTopicRegex``: which regular expressions herd accepts, and how they match.

Kafka compiles the regex with RE2/J and a topic is subscribed when the *whole* name matches
(``Pattern.matcher(topic).matches()``); a pattern that does not compile is answered with
INVALID_REGULAR_EXPRESSION. herd uses Python's ``re`` with ``fullmatch``, restricted to the part
of the syntax that RE2 and Python read the same way and that runs in linear time:

* accepted: literals and escapes, ``.``, classes ``[...]`` (with ranges and negation), ``\\d \\w
  \\s`` and their negations, anchors ``^ $ \\A \\b \\B``, alternation, groups ``(...)``, ``(?:...)``,
  ``(?P<name>...)``, flags ``(?i)`` ``(?s)`` ``(?m)`` ``(?x)`` (also scoped), and the quantifiers
  ``* + ? {n} {n,} {n,m}`` with their lazy forms;
* rejected (INVALID_REGULAR_EXPRESSION): what RE2 refuses (backreferences ``\\1`` ``(?P=name)``,
  lookahead/lookbehind, atomic groups, possessive quantifiers, conditionals), what Python refuses,
  patterns longer than :data:`MAX_REGEX_LENGTH` characters, and what a backtracking engine may run
  in exponential or high polynomial time on a 249-character topic name while RE2 runs it in linear
  time: a variable repetition nested in another (``(a+)+``, ``(a{1,9})*``), an alternation inside
  a variable repetition (``(a|aa)*``; measured: ``(?:a|a)*b`` takes 8 s on 28 characters), and more
  than :data:`MAX_VARIABLE_REPEATS` variable repetitions in all (four ``.*`` take 0.12 s on one
  249-character name, three 2 ms). The coordinator must never stall on a client's input. RE2-only
  syntax (``\\pL``, ``[[:alpha:]]``, ``\\C``, ``\\z``) is rejected too, because Python would read it
  differently or not at all.
"""
from __future__ import annotations

import re

try:  # Python 3.11+
    from re import _constants as _c
    from re import _parser as _p
except ImportError:  # pragma: no cover - older layouts
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _p  # type: ignore[no-redef]

__all__ = ["MAX_REGEX_LENGTH", "InvalidRegex", "compile_subscription", "matching"]

MAX_REGEX_LENGTH = 1024
MAX_VARIABLE_REPEATS = 3
_MAXREPEAT = _c.MAXREPEAT
_REJECTED_OPS = {
    _c.GROUPREF: "backreferences are not supported",
    _c.GROUPREF_EXISTS: "conditionals are not supported",
    _c.ASSERT: "lookahead/lookbehind is not supported",
    _c.ASSERT_NOT: "lookahead/lookbehind is not supported",
}
for _name, _why in (("ATOMIC_GROUP", "atomic groups are not supported"),
                    ("POSSESSIVE_REPEAT", "possessive quantifiers are not supported")):
    if hasattr(_c, _name):
        _REJECTED_OPS[getattr(_c, _name)] = _why
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT}
_RE2_ONLY = re.compile(r"\\[pPCz]|\[\[:")
_cache: dict[str, re.Pattern] = {}


class InvalidRegex(ValueError):
    """A SubscribedTopicRegex herd does not accept (answered with INVALID_REGULAR_EXPRESSION)."""


class _Budget:
    __slots__ = ("repeats",)

    def __init__(self) -> None:
        self.repeats = 0


def _walk(items, inside_repeat: bool, budget: _Budget) -> None:
    for op, av in items:
        why = _REJECTED_OPS.get(op)
        if why is not None:
            raise InvalidRegex(why)
        if op in _REPEATS:
            lo, hi, sub = av
            variable = hi != lo and hi > 1
            if variable:
                if inside_repeat:
                    raise InvalidRegex("a repetition nested in another repetition is not supported")
                budget.repeats += 1
                if budget.repeats > MAX_VARIABLE_REPEATS:
                    raise InvalidRegex(f"more than {MAX_VARIABLE_REPEATS} variable repetitions")
            _walk(sub, inside_repeat or variable, budget)
        elif op == _c.SUBPATTERN:
            _walk(av[-1], inside_repeat, budget)
        elif op == _c.BRANCH:
            if inside_repeat:
                raise InvalidRegex("alternation inside a repetition is not supported")
            for alt in av[1]:
                _walk(alt, inside_repeat, budget)
        elif op == _c.IN or op in (_c.LITERAL, _c.NOT_LITERAL, _c.ANY, _c.AT, _c.CATEGORY):
            continue
        elif isinstance(av, (list, tuple)):
            for sub in av:
                if isinstance(sub, _p.SubPattern):
                    _walk(sub, inside_repeat, budget)


def compile_subscription(pattern: str) -> re.Pattern:
    """The compiled pattern, or :class:`InvalidRegex` with the reason."""
    hit = _cache.get(pattern)
    if hit is not None:
        return hit
    if len(pattern) > MAX_REGEX_LENGTH:
        raise InvalidRegex(f"longer than {MAX_REGEX_LENGTH} characters")
    if _RE2_ONLY.search(pattern):
        raise InvalidRegex("RE2-only syntax (\\p, \\C, \\z, [[:class:]]) is not supported")
    try:
        parsed = _p.parse(pattern)
        _walk(parsed, False, _Budget())
        compiled = re.compile(pattern)
    except InvalidRegex:
        raise
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise InvalidRegex(str(exc)) from None
    if len(_cache) > 4096:
        _cache.clear()
    _cache[pattern] = compiled
    return compiled


def matching(pattern: str, names) -> set[str]:
    """The names the whole of which ``pattern`` matches (the pattern must be valid)."""
    rx = compile_subscription(pattern)
    return {n for n in names if rx.fullmatch(n)}
