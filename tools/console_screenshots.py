"""The console screenshots of docs/operating.md: ``make screenshots`` (``python -m tools.console_screenshots DIR``).

Starts a real herd daemon, makes real groups with the thin client (members that join, commit and
leave, a member-less writer, a group that empties), opens the console in headless Chromium and
writes ``DIR/console-groups.png`` and ``DIR/console-group.png``.

The lag in the pictures comes from a *simulated* data cluster: the daemon runs with a log-end source
whose partitions grow at fixed rates (``--serve-demo``: ``coordinator.ops.console.make_source`` is
replaced in that process only). Everything else -- groups, members, commits, rebalances, the page --
is the real thing.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RATES = {"orders": 40.0, "payments": 6.0, "clicks": 900.0}  # records per second, per partition


class DemoSource:
    """Log ends growing linearly since a start an hour ago (so older commits have a lag)."""

    def __init__(self):
        self.t0 = float(os.environ["HERD_DEMO_T0"])

    async def fetch(self, partitions):
        dt = time.time() - self.t0
        return {(t, p): int(RATES.get(t, 1.0) * dt * (1 + 0.1 * p)) for t, p in partitions}


def serve_demo(argv: list[str]) -> int:
    from coordinator import cli
    from coordinator.ops import console

    console.make_source = lambda config: DemoSource()
    return cli.main(["serve", *argv])


T0 = time.time() - 3600  # the simulated partitions started growing an hour ago


def end_at(topic: str, partition: int, seconds_ago: float) -> int:
    """The simulated log end ``seconds_ago`` seconds ago."""
    dt = time.time() - T0 - seconds_ago
    return max(0, int(RATES[topic] * dt * (1 + 0.1 * partition)))


def main(out_dir: str) -> int:
    sys.path.insert(0, str(REPO))
    from tools import console_scenario as sc
    from tools.browser import Browser

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="herd-shots-"))
    port_file = tmp / "port"
    log = open(tmp / "herd.log", "wb")
    cmd = [sys.executable, "-m", "tools.console_screenshots", "--serve-demo", "--host", "127.0.0.1", "--port", "0",
           "--data-dir", str(tmp / "data"), "--port-file", str(port_file), "--metrics-port", "0",
           "--initial-rebalance-delay-ms", "0", "--min-session-timeout-ms", "500", "--log-format", "json",
           "--topic", "orders:4", "--topic", "payments:2", "--topic", "clicks:6",
           "--data-bootstrap-server", "demo:9092", "--lag-refresh-interval-ms", "1000"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HERD_DEMO_T0": repr(T0)})
    members = []
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"herd did not start:\n{(tmp / 'herd.log').read_text()}")
            time.sleep(0.05)
        bootstrap = f"127.0.0.1:{int(port_file.read_text())}"

        class D:  # what scenario.metrics_port reads
            @staticmethod
            def logs():
                return (tmp / "herd.log").read_text()

        mport = sc.metrics_port(D)

        def group(name, n, topic, behind_s, clients=None):
            cs = [sc.member(bootstrap, name, (clients or [f"{name}-{i + 1}" for i in range(n)])[i], (topic,))
                  for i in range(n)]
            parts = {"orders": 4, "payments": 2, "clicks": 6}[topic]
            sc.poll_until(cs, lambda: sc.stable(cs, parts))
            for c in cs:
                c.commit({tp: end_at(tp.topic, tp.partition, behind_s + 3 * tp.partition) for tp in c.assignment()})
            members.extend(cs)
            return cs

        billing = group("billing", 3, "orders", 2)
        group("fraud-detector", 2, "payments", 0.5)
        group("clickstream-sessionizer", 3, "clicks", 45)
        group("search-indexer", 1, "orders", 8)
        # a member leaves billing (the timeline shows it), then comes back
        billing[2].close(timeout_s=5)
        members.remove(billing[2])
        sc.poll_until(billing[:2], lambda: sc.stable(billing[:2], 4))
        back = sc.member(bootstrap, "billing", "billing-3", ("orders",))
        members.append(back)
        sc.poll_until(billing[:2] + [back], lambda: sc.stable(billing[:2] + [back], 4))
        for c in billing[:2] + [back]:
            c.commit({tp: end_at("orders", tp.partition, 1.5) for tp in c.assignment()})
        # an Empty group falling behind, and member-less writers (Spark jobs)
        reports = group("nightly-reports", 1, "orders", 1800)
        reports[0].close(timeout_s=5)
        members.remove(reports[0])
        sc.commit_standalone(bootstrap, "spark-etl-orders",
                             {("orders", p): end_at("orders", p, 300 + 20 * p) for p in range(4)})
        sc.commit_standalone(bootstrap, "audit-archiver",
                             {("payments", p): end_at("payments", p, 7200) for p in range(2)})

        stop = threading.Event()

        def keep_polling():
            while not stop.is_set():
                for c in list(members):
                    c.poll(0.02)

        t = threading.Thread(target=keep_polling, daemon=True)
        t.start()
        time.sleep(4)  # a few log-end samples: time lag by interpolation
        with Browser() as b:
            b.call("viewport", width=1360, height=640)
            b.goto(f"http://127.0.0.1:{mport}/")
            b.wait_for("document.querySelectorAll('tr.group-row').length >= 7")
            b.call("click", selector="th[data-sort=lag_seconds]")
            b.wait_for("document.querySelector('th[data-sort=lag_seconds]').classList.contains('sorted')")
            time.sleep(0.3)
            b.call("screenshot", path=str(out / "console-groups.png"))
            b.call("viewport", width=1360, height=1000)
            b.goto(f"http://127.0.0.1:{mport}/#/group/billing")
            b.wait_for("document.querySelectorAll('li.rebalance').length >= 3 && "
                       "document.querySelectorAll('tr.member-row').length === 3")
            time.sleep(0.3)
            b.call("screenshot", path=str(out / "console-group.png"), fullPage=True)
        stop.set()
        t.join(5)
    finally:
        for c in members:
            try:
                c.close(timeout_s=5)
            except Exception:
                pass
        proc.terminate()
        proc.wait(20)
        log.close()
    print(f"wrote {out / 'console-groups.png'} and {out / 'console-group.png'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-demo":
        sys.exit(serve_demo(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default="docs")
    sys.exit(main(ap.parse_args().out_dir))
