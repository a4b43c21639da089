"""`make test` on a fresh clone: no ../shared beside it (a user's clone has none). Every test that
needs a file from ../shared skips, naming the file, instead of failing (issue 33: one such test
asserted the file existed and failed a fresh clone's run)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# the test files that use ../shared (the check below finds any new one)
NEED_SHARED = [
    "tests/console/test_lag_data_cluster.py",
    "tests/integration/test_client_mock_cluster.py",
    "tests/protocol/test_errors.py",
    "tests/protocol/test_vectors.py",
    "tests/protocol/test_generated_fresh.py",
]
SHARED_PATH = re.compile(r"""/\s*["']shared["']|["']shared["']\s*/|\.\./shared/(?:tools|kafka-spec)/\w""")


def test_every_test_that_reads_shared_takes_it_from_the_support_module():
    users = set()
    for path in REPO.joinpath("tests").rglob("*.py"):
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(errors="replace")
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        if rel in ("tests/support/shared.py", "tests/test_fresh_clone.py"):
            continue
        if "tests.support.shared" in text:
            users.add(rel)
        elif SHARED_PATH.search(code.split('"""', 2)[-1]):  # after the module docstring
            raise AssertionError(f"{rel} builds a ../shared path itself: use tests.support.shared "
                                 "(require_shared skips on a fresh clone)")
    assert users - {"tests/protocol/conftest.py"} == set(NEED_SHARED), users


def test_without_shared_those_tests_skip_and_say_why(tmp_path):
    empty = tmp_path / "no-shared"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HERD_KAFKA_SPEC", "PYTEST_ADDOPTS")}
    env["HERD_SHARED_DIR"] = str(empty)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "not reference",
                          *NEED_SHARED], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert not re.search(r"\d+ (failed|errors?)\b", text), text
    for rel in ("tools/mock_cluster.py", "kafka-spec/errors.tsv", "kafka-spec/vectors/primitive_encodings.tsv",
                "kafka-spec/messages"):
        assert f"../shared/{rel} is absent" in text, (rel, text)
    skipped = re.findall(r"^SKIPPED \[(\d+)\] (\S+):\d+: (.*)$", text, re.M)
    assert skipped and all("../shared/" in reason for _, _, reason in skipped), text
    # the librdkafka mock test of the lag page skips; its test file has nothing else unskipped here
    assert any(f.endswith("test_lag_data_cluster.py") for _, f, _ in skipped), text
