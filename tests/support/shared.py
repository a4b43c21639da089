"""``../shared``: the Kafka spec checkout and tools (librdkafka's mock cluster) that sit beside the
development checkout. A user's fresh clone has none of it, so every test that needs a file from it
takes the path from here and skips, naming the file, when it is absent (``make test`` must pass on
a fresh clone).

The folder is looked for beside the checkout and beside each of its parents (a git worktree sits
one or more levels deeper than the main checkout). ``HERD_SHARED_DIR`` names it instead (an empty
or missing directory: as on a fresh clone).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path | None:
    """The ``shared`` folder beside this checkout, or None on a fresh clone."""
    named = os.environ.get("HERD_SHARED_DIR")
    if named is not None:
        return Path(named) if named and Path(named).is_dir() else None
    for parent in REPO.parents:
        if (parent / "shared").is_dir():
            return parent / "shared"
    return None


def shared_path(*parts: str) -> Path:
    """``shared/<parts>`` (a path that may not exist: check with :func:`shared_missing`)."""
    root = shared_dir()
    return (root if root is not None else REPO.parent / "shared").joinpath(*parts)


def shared_missing(*parts: str) -> str | None:
    """The skip reason when ``shared/<parts>`` is absent, else None."""
    if shared_path(*parts).exists():
        return None
    rel = "/".join(parts)
    return (f"../shared/{rel} is absent (a fresh clone has no ../shared beside it; "
            f"this test needs it)")


def require_shared(*parts: str) -> Path:
    """``shared/<parts>``; skips the calling test, saying which file is missing, when it is absent."""
    reason = shared_missing(*parts)
    if reason is not None:
        pytest.skip(reason)
    return shared_path(*parts)
