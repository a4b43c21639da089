"""The HTTP port's credential file (``http_auth_file``): parsing, and which Authorization headers it
lets in."""
from __future__ import annotations

import base64
import hashlib

import pytest

from coordinator.ops.httpauth import HttpAuth, HttpAuthError, load_http_auth


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


FILE = f"""# the HTTP port's credentials
bearer {sha("s3cret-token")}   # Prometheus
basic alice {sha("pa:ss wörd")}

bearer {sha("other").upper()}
"""


def test_parse_and_allow():
    auth = HttpAuth.parse(FILE)
    assert len(auth.bearer) == 2 and set(auth.basic) == {"alice"}
    assert auth.allows("Bearer s3cret-token")
    assert auth.allows("bearer   other ")  # the scheme is case-insensitive; upper-case hex accepted
    assert auth.allows(basic("alice", "pa:ss wörd"))  # the password may hold ':' and non-ASCII
    assert auth.allows("BASIC " + basic("alice", "pa:ss wörd").split()[1])


@pytest.mark.parametrize("header", [
    None, "", "Bearer", "Bearer wrong", "Bearer s3cret-tokenX", "Token s3cret-token", "s3cret-token",
    basic("alice", "wrong"), basic("bob", "pa:ss wörd"), basic("alice", ""),
    "Basic " + base64.b64encode(b"alice").decode(),  # no ':'
    "Basic !!!notbase64", "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),  # not UTF-8
    "Basic " + base64.b64encode(sha("s3cret-token").encode()).decode(),
    "Bearer " + sha("s3cret-token"),  # the hash itself is not the token
])
def test_refused(header):
    assert not HttpAuth.parse(FILE).allows(header)


@pytest.mark.parametrize("text,expect", [
    ("", "lists no credential"),
    ("# only a comment\n\n", "lists no credential"),
    ("bearer\n", "line 1: expected"),
    (f"bearer {sha('a')} extra\n", "line 1: 'extra' is not a principal"),
    (f"bearer {sha('a')} User:\n", "line 1: 'User:' is not a principal"),
    (f"bearer {sha('a')} User:a more\n", "line 1: expected"),
    (f"# c\nbasic {sha('a')}\n", "line 2: expected"),
    (f"token {sha('a')}\n", "line 1: expected"),
    ("bearer s3cret-token\n", "line 1: not a SHA-256 hex digest"),
    (f"bearer {sha('a')[:-1]}\n", "not a SHA-256 hex digest"),
    (f"basic alice {sha('a')}z\n", "not a SHA-256 hex digest"),
    (f"basic al:ice {sha('a')}\n", "cannot hold ':'"),
    (f"basic alice {sha('a')}\nbasic alice {sha('b')}\n", "line 2: user 'alice' listed twice"),
])
def test_bad_files(text, expect):
    with pytest.raises(HttpAuthError, match=expect):
        HttpAuth.parse(text)


def test_the_principal_of_a_request():
    auth = HttpAuth.parse(f"bearer {sha('scrape')} User:prometheus\nbearer {sha('plain')}\n"
                          f"basic alice {sha('pw')}\nbearer {sha('ops')} User:ops  # named too\n")
    assert auth.principal("Bearer scrape") == "User:prometheus"
    assert auth.principal("Bearer ops") == "User:ops"
    assert auth.principal("Bearer plain") == "User:ANONYMOUS"  # a token that names no principal
    assert auth.principal("Basic " + base64.b64encode(b"alice:pw").decode()) == "User:alice"
    assert auth.principal("Basic " + base64.b64encode(b"alice:no").decode()) is None
    assert auth.principal("Bearer nope") is None and auth.principal(None) is None
    assert auth.allows("Bearer scrape") and not auth.allows("Bearer nope")


def test_load(tmp_path):
    path = tmp_path / "auth"
    path.write_text(FILE)
    assert load_http_auth(str(path)).allows("Bearer s3cret-token")
    with pytest.raises(HttpAuthError, match=r"http_auth_file .*/missing: no such file"):
        load_http_auth(str(tmp_path / "missing"))
    with pytest.raises(HttpAuthError, match="is a directory"):
        load_http_auth(str(tmp_path))
    (tmp_path / "bin").write_bytes(b"\xff\xfe bearer")
    with pytest.raises(HttpAuthError, match="not UTF-8"):
        load_http_auth(str(tmp_path / "bin"))
    (tmp_path / "bad").write_text("bearer nope\n")
    with pytest.raises(HttpAuthError, match=r"^http_auth_file .*/bad line 1: not a SHA-256"):
        load_http_auth(str(tmp_path / "bad"))


def test_the_example_file_in_the_operating_docs_is_valid_and_says_what_it_hashes():
    """docs/operating.md's example file (a block the README test lists as not run: it is checked
    here) parses, and its two hashes are of the words its comment names."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "operating.md").read_text()
    start = text.index("# /etc/herd/http-auth:")
    block = text[start:text.index("```", start)]
    auth = HttpAuth.parse(block)
    assert auth.allows("Bearer admin") and auth.allows(basic("ops", "password"))
    assert not auth.allows("Bearer password") and not auth.allows(basic("ops", "admin"))
