"""Fixtures for the conformance tests: a real herd daemon and child-process group members."""
from __future__ import annotations

import pytest

from tests.conformance.harness import Members
from tests.support.daemon import Daemon


@pytest.fixture
def herd(tmp_path):
    with Daemon(tmp_path / "data", initial_rebalance_delay_ms=0) as d:
        yield d


@pytest.fixture
def members(tmp_path):
    ms = Members(tmp_path)
    try:
        yield ms
    finally:
        ms.cleanup()
