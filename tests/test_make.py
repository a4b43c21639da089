"""`make run` as the README describes it: HOST / PORT / DATA_DIR on make's command line become flags,
otherwise herd's own defaults and the HERD_* environment apply (flags beat the environment, so the
Makefile must not pass a flag nobody asked for), and ARGS carries any other `herd serve` flag."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from client.spark import partitions_for

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES") and not k.startswith("HERD_")}
    env.update(extra)
    return env


def serve_line(*make_args: str, **env) -> str:
    """The `herd serve` command `make run` would run (make -n prints without running)."""
    out = subprocess.run(["make", "-n", "--no-print-directory", "run", *make_args], cwd=REPO,
                         env=make_env(**env), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if " serve" in ln and "herd" in ln]
    return line.split(" serve", 1)[1].split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_run_passes_only_what_is_given_on_its_command_line():
    assert serve_line() == []  # herd's defaults: 127.0.0.1:9092, ./herd-data
    # the environment (HERD_PORT, or a PORT a platform sets) is herd's to read, not a flag
    assert serve_line(HERD_PORT="19093", PORT="3000", HOST="0.0.0.0") == []
    assert serve_line("HOST=0.0.0.0", "PORT=19092", "DATA_DIR=/var/lib/herd") == [
        "--host", "'0.0.0.0'", "--port", "'19092'", "--data-dir", "'/var/lib/herd'"]
    assert serve_line("PORT=19092", "ARGS=--topic orders:6 --metrics-port 9404") == [
        "--port", "'19092'", "--topic", "orders:6", "--metrics-port", "9404"]


@pytest.mark.integration  # make run starts a real daemon
def test_make_run_binds_the_port_of_herd_port_and_creates_the_args_topic(tmp_path):
    port = free_port()
    log = tmp_path / "make-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["make", "--no-print-directory", "run", "ARGS=--topic orders:6"], cwd=REPO,
                                env=make_env(HERD_PORT=str(port), HERD_DATA_DIR=str(tmp_path / "data")),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"make run did not listen on {port}:\n{log.read_text(errors='replace')}")
                time.sleep(0.1)
        assert len(partitions_for(f"127.0.0.1:{port}", "orders")) == 6
        assert (tmp_path / "data").is_dir()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: make and herd both get it
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def fake_venv(root: Path) -> Path:
    """A venv whose python does nothing and whose herd prints its arguments: the real Makefile's run
    recipe, run for real, without installing anything."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "herd").write_text('#!/bin/sh\necho "herd-args:$*"\n')
    for exe in ("python", "herd"):
        (bin_dir / exe).chmod(0o755)
    (root / ".installed-run").touch()  # newer than pyproject.toml: nothing to install
    return root


@pytest.mark.parametrize("make_args, env, said", [
    ((), {}, ["make run: herd listens on port 9092 (herd's default)"]),
    # issue 33: `PORT=19196 make run` listened on 9092 without a word
    ((), {"PORT": "19196"}, [
        "make run: PORT=19196 in the environment is not used: give it as make run PORT=19196 or set HERD_PORT=19196",
        "make run: herd listens on port 9092 (herd's default)"]),
    (("PORT=19196",), {}, ["make run: herd listens on port 19196 (PORT on make's command line)"]),
    ((), {"HERD_PORT": "19197", "DATA_DIR": "/tmp/x"}, [
        "make run: DATA_DIR=/tmp/x in the environment is not used: give it as make run DATA_DIR=/tmp/x or set "
        "HERD_DATA_DIR=/tmp/x",
        "make run: herd listens on port 19197 (HERD_PORT)"]),
    (("ARGS=--config herd.toml",), {}, [
        "make run: herd listens on port 9092 (herd's default unless the --config file sets port)"]),
    (("ARGS=--port 19198 --port-file p",), {}, [
        "make run: herd listens on port as ARGS says (--port 19198 --port-file p)"]),
    (("ARGS=--port-file p",), {}, ["make run: herd listens on port 9092 (herd's default)"]),
])
def test_make_run_says_which_port_and_that_an_environment_port_is_not_used(tmp_path, make_args, env, said):
    venv = fake_venv(tmp_path / "venv")
    out = subprocess.run(["make", "--no-print-directory", "-s", "run", f"VENV={venv}", *make_args], cwd=REPO,
                         env=make_env(**env), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == said
    assert out.stdout.startswith("herd-args:serve")
