"""A headless Chromium driven from Python: one ``node js/browser.mjs`` process (playwright-core with
Debian's /usr/bin/chromium), one JSON command per line. ``make test`` installs both."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "tests" / "console"  # its js/ (make console-deps)
JS = HERE / "js"
CHROMIUM = os.environ.get("HERD_CHROMIUM", "/usr/bin/chromium")


def missing() -> str | None:
    """Why a browser cannot start here (said by the failing test), or None."""
    if shutil.which("node") is None:
        return "node is not installed (Node.js 18+ drives the browser)"
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing: apt-get install chromium (make test does it as root)"
    if not (JS / "node_modules" / "playwright-core").is_dir():
        return f"playwright-core is missing: (cd {JS} && npm ci) (make test does it)"
    return None


class BrowserError(AssertionError):
    pass


class Browser:
    def __init__(self, timeout: float = 60.0):
        reason = missing()
        if reason:
            raise BrowserError(reason)
        self.timeout = timeout
        self.proc = subprocess.Popen(["node", str(JS / "browser.mjs")], cwd=JS, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self._stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        first = self._read()
        if first.get("value") != "ready":
            raise BrowserError(f"browser did not start: {first}")

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _read(self) -> dict:
        box: list[str] = []
        t = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(self.timeout)
        if not box or not box[0]:
            self.close()
            raise BrowserError("the browser driver stopped answering: " + "".join(self._stderr)[-2000:])
        return json.loads(box[0])

    def call(self, op: str, **kw):
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise BrowserError(f"{op} {kw}: {answer.get('error')}")
        return answer.get("value")

    def goto(self, url: str) -> None:
        self.call("goto", url=url)

    def eval(self, expr: str):
        return self.call("eval", expr=expr)

    def wait_for(self, expr: str, timeout_ms: int = 10_000):
        """Wait until the page expression is truthy; returns its value."""
        return self.call("waitFor", expr=expr, timeout=timeout_ms)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
