"""The HTTP port's credential (``http_auth_file``) on a real daemon: every path but /healthz and
/readyz answers 401 without a matching bearer token or basic-auth user, and the refusals are counted
in ``herd_http_auth_failures_total``; a bad file is one line at start."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import subprocess
import sys

import pytest

from tests.integration.test_metrics import _metrics_port
from tools.daemon import REPO, Daemon

pytestmark = pytest.mark.integration

TOKEN = "prom-Token-1"
USER, PASSWORD = "ops", "correct horse:battery"


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    base = tmp_path_factory.mktemp("httpauth")
    auth = base / "http-auth"
    auth.write_text(f"# scrapers\nbearer {_sha(TOKEN)}\nbasic {USER} {_sha(PASSWORD)}  # the console\n")
    with Daemon(base / "data", "--metrics-port", "0", "--http-auth-file", str(auth), "--topic", "t:1") as d:
        d.metrics_port = _metrics_port(d)
        yield d


def get(d: Daemon, path: str, authorization: str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.metrics_port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": authorization} if authorization else {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _failures(d: Daemon) -> int:
    status, _, body = get(d, "/metrics", f"Bearer {TOKEN}")
    assert status == 200
    return int(re.search(rb"^herd_http_auth_failures_total (\d+)$", body, re.M).group(1))


@pytest.mark.parametrize("path", ["/metrics", "/groups", "/", "/console/app.js", "/api/groups", "/nowhere"])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Bearer {_sha(TOKEN)}", _basic(USER, "wrong"),
                                           _basic("nobody", PASSWORD), f"Basic {TOKEN}"])
def test_refused_without_a_matching_credential(herd, path, authorization):
    before = _failures(herd)
    status, headers, body = get(herd, path, authorization)
    assert status == 401, body
    assert headers["www-authenticate"] == 'Basic realm="herd"'
    assert headers["x-content-type-options"] == "nosniff" and "content-security-policy" in headers
    assert b"herd_" not in body and b"group" not in body
    assert _failures(herd) == before + 1


@pytest.mark.parametrize("authorization", [f"Bearer {TOKEN}", _basic(USER, PASSWORD)])
def test_a_matching_credential_is_served(herd, authorization):
    status, _, body = get(herd, "/metrics", authorization)
    assert status == 200 and b"herd_http_auth_failures_total" in body
    status, headers, body = get(herd, "/groups", authorization)
    assert status == 200 and headers["content-type"] == "application/json" and body.startswith(b"[")
    status, headers, _ = get(herd, "/", authorization)
    assert status == 200 and headers["content-type"].startswith("text/html")


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_checks_stay_open(herd, path):
    before = _failures(herd)
    status, _, body = get(herd, path)
    assert status == 200 and body in (b"ok\n", b"ready\n")
    assert get(herd, path, "Bearer wrong")[0] == 200
    assert _failures(herd) == before


def test_without_the_setting_nothing_is_asked(tmp_path):
    with Daemon(tmp_path / "data", "--metrics-port", "0") as d:
        d.metrics_port = _metrics_port(d)
        status, _, body = get(d, "/metrics")
        assert status == 200 and b"herd_http_auth_failures_total" not in body


@pytest.mark.parametrize("content,expect", [
    (None, "http_auth_file {path}: no such file"),
    ("bearer s3cret\n", "http_auth_file {path} line 1: not a SHA-256 hex digest"),
    ("# nothing\n", "http_auth_file {path} lists no credential"),
])
def test_a_bad_file_is_one_line(tmp_path, content, expect):
    path = tmp_path / "http-auth"
    if content is not None:
        path.write_text(content)
    cmd = [sys.executable, "-m", "coordinator", "serve", "--port", "0", "--metrics-port", "0",
           "--data-dir", str(tmp_path / "d"), "--http-auth-file", str(path)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(REPO), env=env)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and expect.format(path=path) in lines[0], r.stderr


# ---- herd groups --http against a port with http_auth_file ---------------------------------------

def _cli(d: Daemon, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    base["PYTHONPATH"] = str(REPO)
    r = subprocess.run([sys.executable, "-m", "herd_cli", "groups", *args], capture_output=True, text=True,
                       timeout=60, cwd=str(REPO), env={**base, **(env or {})}, stdin=subprocess.DEVNULL)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _one_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error: "), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def committed(herd):
    """A group with a committed offset (a standalone commit), so describe and history find it."""
    from protocol import messages as m
    from tools.rawclient import RawClient

    with RawClient(herd.address) as c:
        r = c.call(m.OffsetCommitRequest(group_id="g1", generation_id_or_member_epoch=-1, member_id="", topics=[
            m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(partition_index=0, committed_offset=5)])]),
            7)
    assert r.topics[0].partitions[0].error_code == 0
    return "g1"


def test_the_cli_without_a_credential_gets_one_line(herd, committed):
    http = f"127.0.0.1:{herd.metrics_port}"
    line = _one_error(_cli(herd, "history", committed, "--http", http))
    assert "asks for a credential (HTTP 401" in line and "--http-token" in line and "HERD_HTTP_PASSWORD" in line
    line = _one_error(_cli(herd, "describe", committed, "--bootstrap-server", herd.bootstrap, "--http", http))
    assert "asks for a credential (HTTP 401" in line


@pytest.mark.parametrize("args,env", [
    (["--http-token", TOKEN], {}),
    ([], {"HERD_HTTP_TOKEN": TOKEN}),
    (["--http-user", USER], {"HERD_HTTP_PASSWORD": PASSWORD}),
    ([], {"HERD_HTTP_USER": USER, "HERD_HTTP_PASSWORD": PASSWORD}),
])
def test_the_cli_sends_a_token_or_a_user(herd, committed, args, env):
    http = f"127.0.0.1:{herd.metrics_port}"
    r = _cli(herd, "history", committed, "--http", http, "--output", "json", *args, env=env)
    assert r.returncode == 0 and r.stdout.strip().startswith("["), r.stderr
    r = _cli(herd, "describe", committed, "--bootstrap-server", herd.bootstrap, "--http", http, "--output", "json",
             *args, env=env)
    assert r.returncode == 0, r.stderr
    rows = [p for g in json.loads(r.stdout)["groups"] for p in g["partitions"]]
    assert rows and rows[0]["commit_age_seconds"] is not None, r.stdout  # herd's view, read with the credential


@pytest.mark.parametrize("args,env,expect", [
    (["--http-token", "wrong"], {}, "refused the credential (HTTP 401)"),
    (["--http-user", USER], {"HERD_HTTP_PASSWORD": "wrong"}, "refused the credential (HTTP 401)"),
    (["--http-user", USER], {}, "set HERD_HTTP_PASSWORD"),
    (["--http-user", USER, "--http-token", TOKEN], {}, "not both"),
])
def test_the_cli_s_credential_mistakes_are_one_line(herd, committed, args, env, expect):
    http = f"127.0.0.1:{herd.metrics_port}"
    line = _one_error(_cli(herd, "history", committed, "--http", http, *args, env=env))
    assert expect in line and PASSWORD not in line and TOKEN not in line
