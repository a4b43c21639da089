"""The benchmarks' entry points: ``python -m bench --help``, each ``python -m bench.NAME --help``, and the
shared argument helpers (``bench/_util.py``): --quick and the sizes it picks."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench import __main__ as bench_main
from bench import _util as U
from tools.daemon import REPO


def test_bench_help_lists_the_benchmarks():
    r = subprocess.run([sys.executable, "-m", "bench", "--help"], capture_output=True, text=True, timeout=60,
                       cwd=str(REPO))
    assert r.returncode == 0 and r.stderr == ""
    assert "python -m bench [NAME ...]" in r.stdout
    assert " ".join(bench_main.discover()) in r.stdout and "commits" in bench_main.discover()


@pytest.mark.parametrize("name", [n for n in bench_main.discover() if n != "codec"])
def test_each_benchmark_has_help_with_its_prog_and_quick(name):
    r = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], capture_output=True, text=True,
                       timeout=60, cwd=str(REPO))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python -m bench.{name} ")
    assert "--quick" in r.stdout or name == "loadgen"


def test_sized_options_take_the_quick_or_the_full_value(monkeypatch):
    ap = U.arg_parser("bench.x", "what x measures", "small counts")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    sized = {"rounds": (1, 5), "seconds": (2.0, 30.0)}
    assert ap.prog == "python -m bench.x" and ap.description == "what x measures"
    args = U.parse(ap, ["--quick"], sized)
    assert (args.rounds, args.seconds) == (1, 2.0)
    args = U.parse(ap, ["--rounds", "7"], sized)
    assert (args.rounds, args.seconds) == (7, 30.0)  # given: kept; unset: the full size
    monkeypatch.setenv("HERD_BENCH_QUICK", "1")  # `make bench` runs main() without arguments
    assert U.parse(ap, None, sized).rounds == 1
    monkeypatch.setenv("HERD_BENCH_QUICK", "0")
    assert U.parse(ap, None, sized).rounds == 5
