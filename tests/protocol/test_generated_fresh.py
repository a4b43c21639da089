"""The committed generated codec matches what tools/genproto.py writes from ../shared/kafka-spec."""
import difflib
import os
from pathlib import Path

import pytest

from tests.support.shared import shared_missing, shared_path
from tools import genproto

SPEC = Path(os.environ["HERD_KAFKA_SPEC"]) if "HERD_KAFKA_SPEC" in os.environ else shared_path("kafka-spec")
COMMITTED = genproto.REPO / "protocol"


def _first_difference(committed: str, fresh: str) -> str:
    diff = difflib.unified_diff(committed.splitlines(), fresh.splitlines(), "committed", "regenerated",
                                n=1, lineterm="")
    return "\n".join(list(diff)[:40])


def test_generated_files_are_fresh(tmp_path, capsys):
    if not (SPEC / "messages").is_dir():
        pytest.skip(f"no Kafka schemas at {SPEC}/messages" if "HERD_KAFKA_SPEC" in os.environ
                    else shared_missing("kafka-spec", "messages"))
    assert genproto.main(["--spec", str(SPEC), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    for name in ("messages.py", "errors.py"):
        committed = (COMMITTED / name).read_bytes()
        fresh = (tmp_path / name).read_bytes()
        assert fresh == committed, (
            f"protocol/{name} is stale: run `python -m tools.genproto`\n"
            + _first_difference(committed.decode(), fresh.decode()))
