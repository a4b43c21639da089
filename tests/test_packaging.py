"""The packaging files agree with each other: compose, Dockerfile, pyproject, CI entry point."""

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerfile_cmd() -> list[str]:
    cmds = [args for word, args in dockerfile_instructions() if word == "CMD"]
    assert cmds, "Dockerfile has no CMD"
    args = cmds[-1]  # the last CMD wins
    return json.loads(args) if args.startswith("[") else shlex.split(args)


def volume_targets(service: dict) -> dict[str, str]:
    """Mount target -> source for a compose service (short and long volume syntax)."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
        else:
            source, target = v.get("source"), v["target"]
        out[target] = source
    return out


def published_ports(service: dict) -> set[tuple[str, str]]:
    """(published, target) pairs for a compose service (short and long port syntax)."""
    out = set()
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.add((str(p.get("published")), str(p["target"])))
        else:
            parts = str(p).split("/")[0].split(":")
            out.add((parts[-2] if len(parts) > 1 else "", parts[-1]))
    return out


def test_compose_service_publishes_kafka_port(compose):
    herd = compose["services"]["herd"]
    assert ("9092", "9092") in published_ports(herd)
    assert herd.get("build") in (".", {"context": "."})
    assert herd.get("stop_signal") == "SIGTERM"


def test_compose_data_volume_is_named_and_mounted_at_data(compose):
    herd = compose["services"]["herd"]
    mounts = volume_targets(herd)
    assert mounts.get("/data") == "herd-data"
    assert "herd-data" in (compose.get("volumes") or {})


def compose_command() -> list[str] | None:
    """A working `docker compose` (v2 plugin) or `docker-compose` (v1), if this machine has one."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            ok = subprocess.run([*cmd, "version"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return cmd
    return None


def test_compose_file_is_valid_for_docker_compose():
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no docker compose / docker-compose on this machine")
    done = subprocess.run([*cmd, "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def dockerfile_env() -> dict[str, str]:
    """The image's ENV (``KEY=value`` pairs; the last instruction wins)."""
    env = {}
    for word, args in dockerfile_instructions():
        if word == "ENV":
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {args!r}: use the KEY=value form"
                env[key] = value
    return env


def image_config(extra_env: dict | None = None):
    """The settings ``herd serve`` starts with in the image: its CMD's flags, its ENV and ``extra_env``
    (what an operator adds with ``docker run -e`` or a Kubernetes ``env:``)."""
    from coordinator import cli

    cmd = dockerfile_cmd()
    assert cmd[:2] == ["herd", "serve"]
    args = cli.build_parser().parse_args(cmd[1:])
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("HERD_")]:
            mp.delenv(key)
        for key, value in {**dockerfile_env(), **(extra_env or {})}.items():
            mp.setenv(key, value)
        return cli.load_config(args)


def test_dockerfile_settings_use_the_compose_volume(compose):
    config = image_config()
    assert config.data_dir in volume_targets(compose["services"]["herd"])
    assert (config.host, config.port) == ("0.0.0.0", 9092)
    instructions = dockerfile_instructions()
    assert ("VOLUME", config.data_dir) in instructions
    exposed = {p for word, args in instructions if word == "EXPOSE" for p in args.split()}
    assert {"9092", str(config.metrics_port)} <= exposed
    assert config.metrics_host == "0.0.0.0"  # probes and Prometheus come from outside the container


@pytest.mark.parametrize("key,value,setting", [
    ("HERD_PORT", "19092", 19092), ("HERD_HOST", "127.0.0.1", "127.0.0.1"),
    ("HERD_DATA_DIR", "/var/lib/herd", "/var/lib/herd"), ("HERD_METRICS_PORT", "19404", 19404),
])
def test_an_operators_environment_variable_wins_in_the_image(key, value, setting):
    # the README: every setting is a HERD_* variable; a flag in CMD would silently override it
    assert getattr(image_config({key: value}), key[5:].lower()) == setting


def test_compose_healthcheck_asks_readyz_on_the_images_metrics_port(compose):
    test = " ".join(compose["services"]["herd"]["healthcheck"]["test"])
    assert f"127.0.0.1:{image_config().metrics_port}/readyz" in test


def requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()


def test_pyproject_declares_console_script_and_runtime_deps(pyproject):
    project = pyproject["project"]
    assert project["name"] == "herd"
    assert project["scripts"]["herd"] == "herd_cli:main"
    names = {requirement_name(r) for r in project["dependencies"]}
    assert {"uvloop", "structlog"} <= names
    for name in ("protocol", "coordinator", "client", "admin", "tools"):
        assert (ROOT / name / "__init__.py").exists()


def test_pyproject_pins_every_dependency_exactly(pyproject):
    project = pyproject["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs.extend(extra)
    loose = [r for r in reqs if not re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.]*", r)]
    assert not loose, f"not pinned with ==: {loose}"


def test_ci_entry_point_runs_make_test():
    run = ROOT / ".ci" / "run"
    text = run.read_text()
    assert text.startswith("#!") and "bash" in text.splitlines()[0]
    assert "set -euo pipefail" in text
    assert re.search(r"^\s*make test\b", text, re.M)
    assert os.access(run, os.X_OK)


def test_readme_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make run" in text and "make test" in text


def test_compose_cluster_profile_runs_postgres_and_three_nodes(compose):
    """`docker compose --profile cluster up`: PostgreSQL and three nodes, each with its own node_id and
    published port, the store URL (with its password) in the environment, never on a command line."""
    services = compose["services"]
    cluster = {name: s for name, s in services.items() if "cluster" in (s.get("profiles") or [])}
    assert set(cluster) == {"postgres", "herd1", "herd2", "herd3"}
    assert "cluster" not in (services["herd"].get("profiles") or [])  # `docker compose up` is unchanged
    ids, ports = set(), set()
    for name in ("herd1", "herd2", "herd3"):
        node = cluster[name]
        env = node["environment"]
        assert env["HERD_STORE"].startswith("postgresql://") and "@postgres:5432/" in env["HERD_STORE"]
        assert "command" not in node and node.get("stop_signal") == "SIGTERM"
        assert node["depends_on"]["postgres"]["condition"] == "service_healthy"
        ids.add(env["HERD_NODE_ID"])
        ports.add((env["HERD_PORT"], env["HERD_PORT"]))
        assert (env["HERD_PORT"], env["HERD_PORT"]) in published_ports(node)
    assert len(ids) == 3 and len(ports) == 3
