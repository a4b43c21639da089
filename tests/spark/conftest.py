"""Fixtures for the PySpark tests: one local SparkSession for the whole run (start-up takes 7 s or
more), with ``local[2,4]`` so a killed task is retried, and herd daemons per module."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _java_major() -> int:
    java = shutil.which("java")
    if java is None:
        return 0
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return 0
    m = re.search(r'version "(\d+)', out)
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed (make test installs the spark extra)")
    if _java_major() < 17:
        pytest.skip("PySpark 4 needs a Java 17+ runtime on PATH (apt-get install openjdk-17-jre-headless)")
    from tools.spark_demo import spark_session

    session = spark_session("herd-tests", master="local[2,4]")
    try:
        yield session
    finally:
        session.stop()

