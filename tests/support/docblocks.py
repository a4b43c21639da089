"""The code blocks of README.md and docs/*.md, by name, and a bash "terminal" to run them in.

A block a user runs is marked by the line ``<!-- readme-test: NAME -->`` right above its opening
fence; names are unique across the files. Tests take the blocks from the documents (never a copy):
tests/integration/test_readme.py ("Try it", the thin client, and that every other block says why
it is not run) and tests/cluster/test_local_recipe.py (the local PostgreSQL recipe).
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARKED = re.compile(r"^<!-- readme-test: (\S+) -->\n```(\w+)\n(.*?)^```", re.M | re.S)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def documents() -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def named_blocks() -> dict[str, tuple[str, str, Path]]:
    """name -> (language, body, file) of every marked block (AssertionError on a name used twice)."""
    out: dict[str, tuple[str, str, Path]] = {}
    for path in documents():
        for name, lang, body in MARKED.findall(path.read_text()):
            assert name not in out, f"readme-test block {name!r} is in {out[name][2].name} and {path.name}"
            out[name] = (lang, body, path)
    return out


def block(name: str, **ports) -> str:
    """The body of block ``name``; ``p9092=19092`` replaces the literal 9092 (whole numbers only)."""
    body = named_blocks()[name][1]
    for literal, port in ports.items():
        body = re.sub(rf"(?<!\d){re.escape(literal.removeprefix('p'))}(?!\d)", str(port), body)
    return body


class Shell:
    """One bash, fed a block at a time like a terminal; its output (background jobs included) is
    read on a thread, and each block ends with an echoed sentinel."""

    def __init__(self, env, log: Path, cwd: Path = REPO):
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.transcript: list[str] = []
        self.log = log
        threading.Thread(target=self._read, daemon=True).start()
        self.n = 0

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def run(self, commands: str, timeout: float = 60.0) -> list[str]:
        """Run the block's lines; return what was printed until they finished."""
        self.n += 1
        sentinel = f"@@readme-block-{self.n}-done"
        for line in commands.splitlines():
            self.transcript.append(f"$ {line}")
        self.proc.stdin.write(commands + f"\necho {sentinel}\n")
        self.proc.stdin.flush()
        return self.read_until(sentinel, timeout)

    def read_until(self, marker: str | None, timeout: float) -> list[str]:
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.save()
                if marker is None:
                    return out
                pytest.fail(f"the block did not finish within {timeout}s; so far:\n" + "\n".join(out))
            if line is None or (marker is not None and line == marker):
                return out
            out.append(line)
            self.transcript.append(line)

    def drain(self) -> list[str]:
        return self.read_until(None, 0.2)

    def save(self):
        self.log.write_text("\n".join(self.transcript) + "\n")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("exit\n")
                self.proc.stdin.flush()
                self.proc.wait(20)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.save()
