"""Summarise py-spy ``--format raw`` output (collapsed stacks: ``f1 (file:line);f2 (...) COUNT``).

``python -m bench._profile FILE [--top 25]`` prints the top functions by self and by inclusive
samples. :func:`summarize` returns the same as a dict for the JSON results.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _short(path: str) -> str:
    for marker in ("/work/main/", "site-packages/", "lib/python3."):
        i = path.find(marker)
        if i >= 0:
            path = path[i + len(marker) :]
            if marker == "lib/python3.":
                path = "stdlib/" + path.split("/", 1)[-1]
            break
    return path


def _key(frame: str, with_line: bool = False) -> str:
    mt = _FRAME.match(frame.strip())
    if not mt:
        return frame.strip()
    where = _short(mt.group("file"))
    if with_line and mt.group("line"):
        where += f":{mt.group('line')}"
    return f"{mt.group('func')} ({where})"


def load(path) -> list[tuple[list[str], int]]:
    stacks = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            try:
                n = int(count)
            except ValueError:
                continue
            stacks.append((stack.split(";"), n))
    return stacks


# Native (--native) samples include threads parked in a wait: drop them, like py-spy's default.
_IDLE_MARKERS = (
    "PyThread_acquire_lock_timed",
    "epoll_pwait",
    "epoll_wait",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "sem_wait",
    "sem_timedwait",
    "select (",
    "poll (libc",
)


def _idle(frames: list[str]) -> bool:
    leafish = ";".join(frames[-12:])
    return any(m in leafish for m in _IDLE_MARKERS) and "fsync" not in leafish


def summarize(path, top: int = 25, lines_top: int = 15, drop_idle: bool = True) -> dict:
    stacks = load(path)
    idle = 0
    if drop_idle:
        kept = []
        for frames, n in stacks:
            if _idle(frames):
                idle += n
            else:
                kept.append((frames, n))
        stacks = kept
    total = sum(n for _, n in stacks)
    self_c: Counter = Counter()
    self_lines: Counter = Counter()
    incl: Counter = Counter()
    for frames, n in stacks:
        if not frames:
            continue
        self_c[_key(frames[-1])] += n
        self_lines[_key(frames[-1], True)] += n
        for k in {_key(f) for f in frames}:
            incl[k] += n

    def pct(c: Counter, k: int):
        return [[name, round(100.0 * v / total, 1)] for name, v in c.most_common(k)] if total else []

    return {
        "samples": total,
        "idle_samples_dropped": idle,
        "self_pct": pct(self_c, top),
        "inclusive_pct": pct(incl, top),
        "self_lines_pct": pct(self_lines, lines_top),
    }


def render(summary: dict, title: str = "") -> str:
    out = [f"== {title} ({summary['samples']} samples)"]
    out.append("  self%  function")
    out += [f"  {p:5.1f}  {name}" for name, p in summary["self_pct"]]
    out.append("  incl%  function")
    out += [f"  {p:5.1f}  {name}" for name, p in summary["inclusive_pct"]]
    return "\n".join(out)


def cli(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench._profile")
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    print(render(summarize(args.file, args.top), args.file))
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
