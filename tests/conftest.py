"""Missing test prerequisites, each said once: what is missing, which tests it stops, what to install.

`make test` installs what it can (Java 17 and kcat with apt-get when run as root, KafkaJS with
npm ci) and warns about the rest. Here, for a run whose selected tests need a tool that is not
there: tests that fail without it (kcat, KafkaJS) fail once, the first of them with the message
and the others deselected; tests that skip without it (spark without Java, KafkaJS without
Node.js) skip as before; and the end of the run lists every missing prerequisite in one section.

The markers `make test-fast` leaves out are applied here, so a new test gets them by where it lives
or what it uses: `integration` (a real daemon process: every test under tests/integration,
conformance, reference and spark, and any test marked so by hand), `postgres` (the PostgreSQL
fixture of tests/cluster/conftest.py), `browser` (the console in chromium). A test left unmarked
that starts a daemon process fails at teardown saying to mark it `integration`.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _children_get_default_signals() -> None:
    """A run started in the background of a script (SIGINT ignored) or under nohup (SIGHUP ignored)
    passes that to every process a test starts: a Python program then never gets its
    KeyboardInterrupt on the test's Ctrl-C, and herd keeps an ignored SIGHUP ignored, as designed
    (nohup). A signal this process handles is reset to its default in a child at exec, so a
    handler that does nothing keeps this run as deaf to them as it was started and gives the
    children the defaults the tests assume."""
    import signal

    for sig in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, lambda *_: None)


_children_get_default_signals()
KAFKAJS_PACKAGE = REPO / "tests" / "conformance" / "js" / "node_modules" / "kafkajs" / "package.json"


def _java_major() -> int:
    java = shutil.which("java")
    if java is None:
        return 0
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return 0
    m = re.search(r'version "(\d+)', out)
    return int(m.group(1)) if m else 0


@dataclass
class Prerequisite:
    name: str  # what is missing
    tests: str  # which tests need it
    fix: str  # what to do
    fails: bool  # its tests fail without it (else they skip)
    missing: object  # () -> bool
    needs: object  # (item) -> bool
    items: list = field(default_factory=list)
    deselected: int = 0

    def message(self, skipped: int | None = None) -> str:
        count = len(self.items) + self.deselected if skipped is None else skipped
        tests = f"{count} {self.tests} test{'s' if count != 1 else ''}"
        if not self.fails:
            return f"{self.name}: {tests} skipped. {self.fix}"
        once = f" (said once: the other {self.deselected} are deselected)" if self.deselected else ""
        return f"{self.name}, so {tests} cannot run{once}. {self.fix}"


def _path_of(item) -> str:
    path = Path(str(item.path)).resolve()
    try:
        return path.relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


PREREQUISITES = [
    Prerequisite(
        "kcat is not installed", "kcat conformance",
        "Install it: `sudo apt-get install kcat` (Debian/Ubuntu), or run `make test` as root, which does.",
        fails=True, missing=lambda: shutil.which("kcat") is None,
        needs=lambda item: _path_of(item) == "tests/conformance/test_kcat.py"),
    Prerequisite(
        "KafkaJS is not installed", "KafkaJS conformance",
        "Install it: `make conformance-deps` (or `cd tests/conformance/js && npm ci`; needs npm).",
        fails=True, missing=lambda: shutil.which("node") is not None and not KAFKAJS_PACKAGE.exists(),
        needs=lambda item: _path_of(item) == "tests/conformance/test_kafkajs.py"),
    Prerequisite(
        "Java 17+ is not on PATH", "spark",
        "Install it: `sudo apt-get install openjdk-17-jre-headless`, or run `make test` as root, which does.",
        fails=False, missing=lambda: _java_major() < 17,
        needs=lambda item: item.get_closest_marker("spark") is not None),
]
# Without node, test_kafkajs.py skips at import (no items are collected): said at the end too.
NODE_MISSING = ("Node.js is not on PATH: the KafkaJS conformance tests are skipped. Install Node.js 18+ with npm "
                "(`sudo apt-get install nodejs npm`), then `make conformance-deps`.")


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected what the run leaves out
def pytest_collection_modifyitems(config, items):
    config._herd_missing = []
    keep, dropped = [], []
    for prereq in PREREQUISITES:
        needing = [item for item in items if prereq.needs(item)]
        if not needing or not prereq.missing():
            continue
        config._herd_missing.append(prereq)
        if prereq.fails:
            prereq.items = needing[:1]
            prereq.deselected = len(needing) - 1
            dropped.extend(needing[1:])
        else:
            prereq.items = needing
    if dropped:
        gone = set(map(id, dropped))
        keep = [item for item in items if id(item) not in gone]
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(autouse=True)
def _prerequisite_present(request):
    """The one test left for a missing prerequisite fails first thing, saying what to install."""
    for prereq in getattr(request.config, "_herd_missing", ()):
        if prereq.fails and request.node in prereq.items:
            pytest.fail(prereq.message(), pytrace=False)


def pytest_terminal_summary(terminalreporter, config):
    lines = []
    skipped = {getattr(r, "nodeid", None) for r in terminalreporter.stats.get("skipped", [])}
    for prereq in getattr(config, "_herd_missing", ()):
        if prereq.fails:
            lines.append(prereq.message())
        else:  # the tests that did skip (some of those marked may not need it)
            count = len({item.nodeid for item in prereq.items} & skipped)
            if count:
                lines.append(prereq.message(count))
    if shutil.which("node") is None and any("test_kafkajs.py" in str(getattr(r, "location", ("",))[0])
                                            for r in terminalreporter.stats.get("skipped", [])):
        lines.append(NODE_MISSING)
    if lines:
        terminalreporter.section("missing prerequisites")
        for line in lines:
            terminalreporter.line(line)


# --- markers -----------------------------------------------------------------------------------
INTEGRATION_DIRS = ("tests/integration/", "tests/conformance/", "tests/reference/", "tests/spark/")
BROWSER_FILES = ("tests/console/test_console_browser.py",)


def pytest_itemcollected(item):
    """Marks by folder and fixture, before -m selects (pytest_collection_modifyitems comes later)."""
    path = _path_of(item)
    if path.startswith(INTEGRATION_DIRS):
        item.add_marker(pytest.mark.integration)
    if "pg_server" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.postgres)
    if path in BROWSER_FILES:
        item.add_marker(pytest.mark.browser)


def _starts_daemon(args) -> bool:
    """``python -m coordinator serve`` / ``herd_cli serve`` / ``herd serve``, not ``--help``."""
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        return False
    argv = [str(a) for a in args]
    if "serve" not in argv or "--help" in argv or "-h" in argv:
        return False
    before = argv[:argv.index("serve")]
    return bool(before) and (before[-1] in ("coordinator", "herd_cli") or Path(before[-1]).name == "herd")


_current = {"item": None, "daemon": None}
_popen_init = subprocess.Popen.__init__


def _watching_init(self, args, *rest, **kwargs):
    item = _current["item"]
    if item is not None and _current["daemon"] is None and item.get_closest_marker("integration") is None \
            and _starts_daemon(args):
        _current["daemon"] = " ".join(map(str, args))
    return _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _watching_init


@pytest.fixture(autouse=True)
def _daemon_tests_are_marked(request):
    """`make test-fast` must not start daemons: a test that does is marked `integration`."""
    _current["item"], _current["daemon"] = request.node, None
    yield
    started, _current["item"], _current["daemon"] = _current["daemon"], None, None
    if started:
        pytest.fail(f"this test starts a daemon process ({started}) but is not marked integration: "
                    "add pytestmark = pytest.mark.integration (make test-fast leaves those out)", pytrace=False)
