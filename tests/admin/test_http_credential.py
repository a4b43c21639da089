"""The credential ``herd groups --http`` sends to a port with ``http_auth_file`` (admin.history.http_credential)."""
from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from admin.errors import CliError
from admin.history import _http_base, http_credential


def args(token=None, user=None):
    return SimpleNamespace(http_token=token, http_user=user)


def basic(header: str) -> str:
    scheme, _, cred = header.partition(" ")
    assert scheme == "Basic"
    return base64.b64decode(cred).decode()


def test_nothing_given_sends_nothing():
    assert http_credential(args(), {}) is None


def test_a_token_from_the_flag_or_the_environment():
    assert http_credential(args(token="t0k"), {}) == "Bearer t0k"
    assert http_credential(args(), {"HERD_HTTP_TOKEN": "env-t"}) == "Bearer env-t"
    assert http_credential(args(token="flag"), {"HERD_HTTP_TOKEN": "env"}) == "Bearer flag"  # the flag wins


def test_a_user_with_the_password_from_the_environment_or_a_prompt():
    assert basic(http_credential(args(user="ops"), {"HERD_HTTP_PASSWORD": "p:w"})) == "ops:p:w"
    assert basic(http_credential(args(), {"HERD_HTTP_USER": "ops", "HERD_HTTP_PASSWORD": "x"})) == "ops:x"
    asked = []
    header = http_credential(args(user="ops"), {}, prompt=lambda text: asked.append(text) or "typed")
    assert basic(header) == "ops:typed" and "ops" in asked[0]


def test_mistakes_are_one_line():
    with pytest.raises(CliError, match="not both"):
        http_credential(args(token="t", user="u"), {})
    with pytest.raises(CliError, match="HERD_HTTP_PASSWORD"):
        http_credential(args(user="u"), {})  # no terminal here (pytest captures stdin)
    with pytest.raises(CliError, match="cannot hold ':'"):
        http_credential(args(user="a:b"), {"HERD_HTTP_PASSWORD": "x"})
    with pytest.raises(CliError, match="line break"):
        http_credential(args(token="a\r\nX-Evil: 1"), {})


def test_the_base_carries_the_header():
    base = _http_base("127.0.0.1:9100", "history", args(token="t"))
    assert base == "http://127.0.0.1:9100" and base.authorization == "Bearer t"
    assert _http_base("127.0.0.1:9100").authorization is None
