"""``herd groups reset-offsets --from-file``: reading the plan (no server needed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from admin.errors import CliError
from admin.reset import read_reset_plan

REPO = Path(__file__).resolve().parents[2]


def test_a_one_group_plan_reads_for_the_group_named(tmp_path):
    plan = tmp_path / "plan.csv"
    plan.write_text("orders,0,5\norders,1,7\n")
    assert read_reset_plan(str(plan), "billing") == {"billing": {("orders", 0): 5, ("orders", 1): 7}}


def test_a_one_group_plan_without_a_group_named_asks_for_the_group(tmp_path):
    # issue 24, snag 7: this said "expected GROUP,TOPIC,PARTITION,OFFSET", as if the file were wrong
    plan = tmp_path / "plan.csv"
    plan.write_text("orders,0,5\n")
    with pytest.raises(CliError, match=r"line 1 has no group column \(TOPIC,PARTITION,OFFSET\): name the one "
                                       r"group it is for with --group GROUP"):
        read_reset_plan(str(plan), None)


def test_a_row_of_another_shape_still_names_both_formats(tmp_path):
    plan = tmp_path / "plan.csv"
    plan.write_text("orders,0\n")
    with pytest.raises(CliError, match=r"line 1: expected TOPIC,PARTITION,OFFSET or GROUP,TOPIC,PARTITION,OFFSET$"):
        read_reset_plan(str(plan), "billing")
    with pytest.raises(CliError, match=r"line 1: expected GROUP,TOPIC,PARTITION,OFFSET$"):
        read_reset_plan(str(plan), None)


@pytest.mark.parametrize("groups", [[], ["--group", "a", "--group", "b"], ["--all-groups"]])
def test_the_command_says_to_name_the_group_in_one_line(tmp_path, groups):
    plan = tmp_path / "plan.csv"
    plan.write_text("orders,0,5\norders,1,7\n")
    r = subprocess.run([sys.executable, "-m", "herd_cli", "groups", "reset-offsets", *groups, "--from-file", str(plan),
                        "--bootstrap-server", "127.0.0.1:1", "--timeout", "5"],
                       capture_output=True, text=True, timeout=60, cwd=str(REPO))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"herd: error: --from-file {plan} line 1 has no group column (TOPIC,PARTITION,OFFSET): "
                        f"name the one group it is for with --group GROUP\n")
