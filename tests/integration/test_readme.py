"""The code blocks of README.md and docs/*.md, run as written against a real herd, so that they
cannot rot.

A block a user runs is marked, in the README or in the docs/ page it moved to, by the line
``<!-- readme-test: NAME -->`` right above its opening fence; the tests here take the blocks by name from
the documents (tests/support/docblocks.py; never a copy) and run them: "Try it" as a new user would
(`make run` in one shell, the rest in a second bash with its background jobs, in order), and the
thin client's poll/commit loop as a program, twice at once so that a rebalance meets its commits.
The only changes are the addresses: herd gets free ports through HERD_PORT / HERD_BOOTSTRAP (the
documented variables), and the literal ports of the text (9092, 9404) are replaced by the free ones.
Waits a user would make by watching ("three seconds later") are made here by asking `herd groups`
until the group is there. Every other block is listed in NOT_RUN, with why: a new block must be
marked or listed. The cluster recipe's blocks (docs/cluster.md) are run by
tests/cluster/test_local_recipe.py.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from client.spark import group_offsets
from tests.support.docblocks import FENCE, MARKED, REPO, Shell, block, documents, named_blocks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# files whose blocks are not commands at all
NOT_RUN_FILES = {"architecture.md": "diagrams of the code's layers and paths"}

# The first line of every block that is not run, and why.
NOT_RUN = {
    "# /etc/herd/http-auth: printf %s 'SECRET' | sha256sum gives a hash (these two hash admin and password)":
        "an example credentials file: tests/coordinator/ops/test_httpauth.py parses this block and checks its hashes",
    "from client import KafkaGroupConsumer":
        "the README's short form of docs/client.md's thin-client-kafka block, which is run against a real "
        "Kafka broker (tests/integration/test_kafka_group_consumer.py); its addresses are placeholders",
    "make run     # start herd on 127.0.0.1:9092 with data in ./herd-data (Ctrl-C stops it)":
        "the two commands: `make run` is run by the try-it test (and tests/test_make.py), `make test` is this suite",
    "herd serve --host 127.0.0.1 --port 9092 --data-dir ./herd-data [--port-file FILE] [--config FILE.toml]":
        "a synopsis (optional parts in brackets); each flag is tested in tests/coordinator/test_config.py",
    "printf 'alice:alice-secret\\nspark:another-secret\\n' > users && chmod 600 users":
        "needs a server certificate; TLS and SASL are tested in tests/integration/test_security.py",
    'GroupConsumer("SASL_SSL://herd:9093", "my-group", security_protocol="SASL_SSL",':
        "needs a SASL_SSL herd; tested in tests/integration/test_client_security.py",
    "from client import TopicPartition":
        "a fragment of a Spark job (spark, process, sizes); GroupJob is tested in tests/spark",
    "from client.spark import BatchProgressCommitter, ensure_topic, with_source_position":
        "a fragment of a Spark streaming query; tested in tests/spark/test_streaming.py",
    "zip -qr herd-client.zip client protocol          # from a herd checkout":
        "spark-submit to a YARN cluster",
    "herd groups list            [--state [STATE ...]] [--type [classic|consumer ...]]": "a synopsis of herd groups",
    "$ herd groups describe billing": "sample output",
    "herd groups reset-offsets --all-groups --all-topics --to-earliest --export > plan.csv   # a dry run":
        "reset-offsets and --from-file are tested in tests/integration/test_admin.py",
    "$ herd groups history billing --http 127.0.0.1:9404": "sample output",
    "$ herd groups describe audit --http 127.0.0.1:9404": "sample output",
    "# /etc/herd/data-cluster.properties":
        "needs a SASL_SSL Kafka; the file is read by protocol.client_properties (tests/admin/test_command_config.py, "
        "tests/console/test_datacluster.py)",
    "herd serve --metrics-port 9404 \\":
        "needs a Kafka cluster; herd with a data cluster is tested in tests/console/test_lag_data_cluster.py",
    "pyproject.toml  Makefile  README.md  Dockerfile  docker-compose.yml  .ci/run": "the layout",
    "location /herd/ {": "an nginx configuration; the console's relative URLs are tested in tests/console",
    "[Service]": "a systemd unit; the notify protocol is tested in tests/coordinator/ops/test_notify.py",
    "livenessProbe:   {httpGet: {path: /healthz, port: 9404}, periodSeconds: 10, timeoutSeconds: 2}":
        "Kubernetes probes; /healthz and /readyz are tested in tests/integration/test_metrics.py",
    "printf 'admin:admin-pw\\nalice:alice-pw\\nbob:bob-pw\\n' > users && chmod 600 users":
        "herd serve in the foreground, then the admin's commands (and kafka-acls.sh, not on PATH); the same "
        "herd acls commands run in tests/integration/test_authorization.py, kafka-acls in "
        "tests/conformance/test_kafka_acls.py",
    "export HERD_STORE='postgresql://herd:SECRET@db.example:5432/herd'   # the environment: not seen in ps":
        "needs a PostgreSQL on other machines; herd serve --store is tested in tests/cluster/test_serve.py "
        "(and docs/cluster.md's local recipe by tests/cluster/test_local_recipe.py)",
    "herd serve --topic orders:6 --metrics-port 9404 --data-bootstrap-server kafka-1:9092,kafka-2:9092":
        "needs a Kafka cluster; herd with a data cluster is tested in tests/console/test_lag_data_cluster.py, "
        "describe --data-bootstrap-server in tests/integration/test_admin.py",
    "# fuzz_decoder.py -- PYTHONPATH=<repo> /tmp/atheris-venv/bin/python fuzz_decoder.py -max_total_time=1200 corpus/":
        "coverage-guided fuzzing with atheris for 20 minutes in a throwaway venv; the suite's bounded version is "
        "tests/protocol/test_fuzz_decoder.py",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_env(**extra) -> dict:
    """A user's shell: no virtualenv on PATH (so `herd` comes from activating it), no make state."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VIRTUAL_ENV", "PYTHONPATH")
           and not k.startswith("HERD_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not Path(p, "herd").exists())
    env.update(extra)
    return env


def test_every_block_is_run_or_says_why_not():
    marked, unmarked = set(), []
    for path in documents():
        text = path.read_text()
        if path.name in NOT_RUN_FILES:
            continue
        marked |= {body for _, _, body in MARKED.findall(text)}
        unmarked += [body.splitlines()[0].strip() for _, body in FENCE.findall(text) if body not in marked]
    assert sorted(set(unmarked) - set(NOT_RUN)) == [], "blocks neither marked readme-test nor in NOT_RUN"
    assert sorted(set(NOT_RUN) - set(unmarked)) == [], "NOT_RUN lists blocks the documents no longer have"
    names = named_blocks()
    assert set(names) >= {"try-serve", "try-members", "try-describe", "try-kill", "try-after", "thin-client",
                          "cluster-pgbin", "cluster-local-pg", "cluster-local-nodes", "cluster-local-stop"}
    # every marked block is run by a test: these here, the cluster-* ones by tests/cluster/test_local_recipe.py
    recipe = (REPO / "tests" / "cluster" / "test_local_recipe.py").read_text()
    for name in names:
        assert name.startswith(("try-", "thin-client")) or f'"{name}"' in recipe, name


def herd_json(env, *args) -> dict:
    herd = str(Path(sys.executable).with_name("herd"))
    out = subprocess.run([herd, "groups", *args, "--output", "json"], env=env, capture_output=True,
                         text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr}


def wait_for(what: str, check, timeout: float = 45.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout}s for {what}")
        time.sleep(0.3)


def group_state(env, group: str) -> dict:
    got = herd_json(env, "describe", group, "--state")
    return (got.get("groups") or [{}])[0]


@pytest.fixture
def make_run(tmp_path):
    """The try-serve block in its own "terminal": `make run ...` on free ports; Ctrl-C at the end."""
    port, metrics = free_port(), free_port()
    command = block("try-serve", p9404=metrics).strip()
    assert "\n" not in command
    log = tmp_path / "make-run.log"
    env = user_env(HERD_PORT=str(port), HERD_DATA_DIR=str(tmp_path / "herd-data"))
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", command], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"`{command}` exited:\n{log.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for("make run to serve", ready, timeout=120)
        yield port, metrics
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_try_it_runs_as_written(make_run, tmp_path):
    port, metrics = make_run
    env = user_env(HERD_BOOTSTRAP=f"127.0.0.1:{port}")
    shell = Shell(env, tmp_path / "try-it.transcript")
    try:
        out = shell.run(block("try-members"))
        assert not any("not found" in line for line in out), out

        def stable(n):
            g = group_state(env, "demo")
            parts = g.get("partitions", [])
            return (g.get("state") == "Stable" and g.get("member_count") == n and len(parts) == 6
                    and all(p["current_offset"] for p in parts)) and g

        g = wait_for("three members, every partition committed", lambda: stable(3))
        assert sorted(m["client_id"] for m in g["members"]) == ["member-1", "member-2", "member-3"]
        assert sorted(m["partitions"] for m in g["members"]) == [2, 2, 2]

        out = shell.run(block("try-describe"))
        rows = [line.split() for line in out if line.startswith("demo ")]
        partitions = [r for r in rows if r[1] == "orders"]
        assert sorted(int(r[2]) for r in partitions) == list(range(6))
        assert all(int(r[3]) >= 10 for r in partitions)  # CURRENT-OFFSET: committed
        assert {r[-1] for r in partitions} == {"member-1", "member-2", "member-3"}
        assert len([r for r in rows if r[1].startswith("member-")]) == 3  # --members

        shell.run(block("try-kill"))
        g = wait_for("two members after member-1 left", lambda: stable(2))
        assert sorted(m["client_id"] for m in g["members"]) == ["member-2", "member-3"]

        out = shell.run(block("try-after", p9404=metrics))
        assert len([line for line in out if line.startswith("demo ") and " member-" in line]) == 2
        assert any("reasons: initial x1, member_left x1" in line for line in out), out
        assert any("member_left" in line and line.startswith("generation 1 -> 2") for line in out), out
        assert any("result     protocol range, 2 members" in line for line in out), out

        # "To finish, `kill %2 %3`": the two leave, and the group ends Empty
        shell.run("kill %2 %3\nwait")
        assert wait_for("an empty group", lambda: group_state(env, "demo").get("state") == "Empty", 30)
        said = "\n".join(shell.transcript)
        for n in (1, 2, 3):
            assert re.search(rf"^member-{n}: assigned orders-\d, orders-\d \(generation 1\)$", said, re.M), said
            assert f"member-{n}: leaving the group" in said
        assert re.search(r"^member-[23]: assigned orders-\d, orders-\d, orders-\d \(generation 2\)$", said, re.M)
        assert "Traceback" not in said and "WARNING" not in said, said
        offsets = group_offsets(f"127.0.0.1:{port}", "demo", "orders")
        assert len(offsets) == 6 and all(o >= 10 for o in offsets.values()), offsets
    finally:
        shell.close()


def test_the_thin_client_loop_runs_as_written_and_survives_a_rebalance(tmp_path):
    from tools.daemon import Daemon

    with Daemon(tmp_path / "data", "--topic", "orders:6", initial_rebalance_delay_ms=0) as d:
        program = tmp_path / "loop.py"
        program.write_text(block("thin-client").replace("127.0.0.1:9092", d.bootstrap))
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        procs = []
        try:
            with open(logs[0], "wb") as out:
                procs.append(subprocess.Popen([sys.executable, str(program)], stdout=out, stderr=subprocess.STDOUT,
                                              cwd=tmp_path))

            def committed(group="my-group"):
                return group_offsets(d.bootstrap, group, "orders")

            first = wait_for("the first member's commits", lambda: len(committed()) == 6 and committed())
            # a second member joins: the first is mid-loop, its commits meet the rebalance
            with open(logs[1], "wb") as out:
                procs.append(subprocess.Popen([sys.executable, str(program)], stdout=out, stderr=subprocess.STDOUT,
                                              cwd=tmp_path))

            def both_working():
                g = group_state({**os.environ, "HERD_BOOTSTRAP": d.bootstrap}, "my-group")
                return (g.get("state") == "Stable" and g.get("member_count") == 2
                        and sorted(m["partitions"] for m in g["members"]) == [3, 3])

            wait_for("two members with 3 partitions each", both_working)
            before = committed()
            wait_for("both members committing after the rebalance",
                     lambda: all(committed()[tp] > before[tp] for tp in before), timeout=60)
            assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
            assert all(committed()[tp] >= first[tp] for tp in first)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)  # Ctrl-C: the program leaves the group
            codes = []
            for p in procs:
                try:
                    codes.append(p.wait(30))
                except subprocess.TimeoutExpired:
                    p.kill()
                    codes.append(p.wait(10))
        output = [log.read_text(errors="replace") for log in logs]
        assert codes == [0, 0], output
        assert not any("Traceback" in o for o in output), output


def test_a_user_shell_has_no_herd_until_the_venv_is_activated():
    # what the try-it test relies on to show that activating the venv is what puts herd on PATH
    env = user_env()
    assert shutil.which("herd", path=env["PATH"]) is None
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", ". .venv/bin/activate && command -v herd"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == str(REPO / ".venv" / "bin" / "herd")
