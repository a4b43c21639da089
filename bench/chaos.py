"""Crash durability: SIGKILL the daemon at random moments under a commit load; nothing acknowledged
may be lost, nothing may be invented.

``python -m bench.chaos [--quick] [--cycles 20] [--groups 64] [--writers 4] [--seed N]``

Writers (threads, one connection each, the raw protocol) send OffsetCommit with generation -1 into
member-less groups: each writer owns a disjoint set of groups, so every (group, topic, partition)
key has one writer and strictly increasing offsets. Before a request leaves, every value in it is
recorded as SENT; when its response says error 0 for a partition, that value is recorded as
ACKNOWLEDGED. The metadata of each commit is ``"<offset>"``, so a stored offset carrying another
offset's metadata would show up too.

One cycle: start herd on the same data dir, verify, let the writers run for a random 0.3-1.2 s,
SIGKILL the daemon's process group (no shutdown code runs). Verify, after every restart, for every
key: the committed offset is >= the last acknowledged one (else LOST) and is a value that was
sent, with its own metadata (else INVENTED). The last cycle stops herd with SIGTERM instead and
verifies once more.

Prints one JSON line: cycles, requests/commits sent and acknowledged, commits lost (must be 0),
values invented (must be 0), restart times, and the ``log.tail_truncated`` events seen.

SIGKILL ends the process, not the machine: the page cache survives, so this proves that herd
answers only after its write reached the kernel and that replay finds it. Power loss (writes that
never left the page cache) is covered in-process by ``tests/coordinator/store/test_log.py`` (fsync
ordering, fault injection), not here.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from bench import _util as U
from protocol import messages as m
from tools.rawclient import RawClient

TOPICS = ("orders", "clicks", "payments")


class Ledger:
    """What the writers sent and what herd acknowledged, per (group, topic, partition)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent: dict[tuple, set[int]] = {}
        self.acked: dict[tuple, int] = {}
        self.requests_sent = 0
        self.requests_acked = 0
        self.commits_sent = 0
        self.commits_acked = 0
        self.errors: dict[int, int] = {}
        self.disconnects = 0


class Writer(threading.Thread):
    def __init__(self, idx: int, groups: list[str], partitions: int, ledger: Ledger, rng: random.Random,
                 control: Control):
        super().__init__(name=f"chaos-writer-{idx}", daemon=True)
        self.idx = idx
        self.groups = groups
        self.partitions = partitions
        self.ledger = ledger
        self.rng = rng
        self.control = control
        self.next_offset: dict[tuple, int] = {}
        self.error: BaseException | None = None

    def run(self):
        try:
            self._run()
        except BaseException as exc:  # reported by the driver
            self.error = exc

    def _run(self):
        ctl = self.control
        conn = None
        while not ctl.stop.is_set():
            if not ctl.running.wait(0.05):
                if conn is not None:
                    conn.close()
                    conn = None
                continue
            try:
                if conn is None:
                    conn = RawClient(ctl.address, client_id=f"chaos-{self.idx}", timeout=5.0)
                self._commit_once(conn)
            except (OSError, ConnectionError):
                # the daemon died (or is dying): the in-flight request's fate is unknown
                with self.ledger.lock:
                    self.ledger.disconnects += 1
                if conn is not None:
                    conn.close()
                    conn = None
                ctl.running.clear()  # wait for the driver to restart and verify
                ctl.wait_generation_change(self)
        if conn is not None:
            conn.close()

    def _commit_once(self, conn: RawClient):
        rng = self.rng
        group = rng.choice(self.groups)
        version = rng.randint(2, 9)
        topics = []
        values = []
        for name in rng.sample(TOPICS, rng.randint(1, len(TOPICS))):
            parts = []
            for p in rng.sample(range(self.partitions), rng.randint(1, self.partitions)):
                key = (group, name, p)
                off = self.next_offset.get(key, rng.randint(0, 1000)) + rng.randint(1, 50)
                self.next_offset[key] = off
                values.append((key, off))
                parts.append(m.OffsetCommitRequestPartition(partition_index=p, committed_offset=off,
                                                            committed_metadata=str(off)))
            topics.append(m.OffsetCommitRequestTopic(name=name, partitions=parts))
        req = m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                    retention_time_ms=-1, topics=topics)
        led = self.ledger
        with led.lock:  # recorded BEFORE it can reach herd
            for key, off in values:
                led.sent.setdefault(key, set()).add(off)
            led.requests_sent += 1
            led.commits_sent += len(values)
        resp = conn.call(req, version)
        sent = dict(values)
        with led.lock:
            led.requests_acked += 1
            for t in resp.topics:
                for p in t.partitions:
                    key = (group, t.name, p.partition_index)
                    if p.error_code == 0:
                        led.acked[key] = sent[key]
                        led.commits_acked += 1
                    else:
                        led.errors[p.error_code] = led.errors.get(p.error_code, 0) + 1


class Control:
    def __init__(self):
        self.running = threading.Event()
        self.stop = threading.Event()
        self.address = None
        self.generation = 0
        self.cond = threading.Condition()

    def resume(self, address):
        with self.cond:
            self.address = address
            self.generation += 1
            self.cond.notify_all()
        self.running.set()

    def wait_generation_change(self, writer):
        with self.cond:
            gen = self.generation
            while self.generation == gen and not self.stop.is_set():
                self.cond.wait(0.1)


def verify(address, ledger: Ledger, groups: list[str]) -> dict:
    """OffsetFetch every group; compare with the ledger. Writers must be paused."""
    with ledger.lock:
        acked = dict(ledger.acked)
        sent = {k: set(v) for k, v in ledger.sent.items()}
    fetched: dict[tuple, tuple[int, str]] = {}
    with RawClient(address, client_id="chaos-verify", timeout=10.0) as c:
        for i in range(0, len(groups), 16):
            batch = groups[i:i + 16]
            resp = c.call(m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=g, topics=None)
                                                       for g in batch]), 8)
            for g in resp.groups:
                if g.error_code != 0:
                    raise AssertionError(f"OffsetFetch of {g.group_id} failed with error {g.error_code}")
                for t in g.topics:
                    for p in t.partitions:
                        if p.error_code != 0:
                            raise AssertionError(f"OffsetFetch {g.group_id}/{t.name}/{p.partition_index}: "
                                                 f"error {p.error_code}")
                        if p.committed_offset >= 0:
                            key = (g.group_id, t.name, p.partition_index)
                            fetched[key] = (p.committed_offset, p.metadata)
    lost = []
    invented = []
    for key, off in acked.items():
        got = fetched.get(key)
        if got is None or got[0] < off:
            lost.append({"key": list(key), "acknowledged": off, "committed": None if got is None else got[0]})
    for key, (off, meta) in fetched.items():
        if off not in sent.get(key, ()) or meta != str(off):
            invented.append({"key": list(key), "committed": off, "metadata": meta})
    return {"keys_checked": len(acked), "keys_fetched": len(fetched), "lost": lost, "invented": invented}


class ChaosHerd(U.Herd):
    """The bench daemon wrapper plus a hard kill of its process group (it runs in its own session)."""

    def kill_hard(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self.stop()  # closes the log handle; nothing left to signal


def run(cycles: int = 20, *, groups: int = 64, writers: int = 4, partitions: int = 4,
        kill_after=(0.3, 1.2), seed: int | None = None, data_dir=None, offsets_partitions: int = 50,
        progress=None, fsync: str = "always") -> dict:
    """Run ``cycles`` kill/restart cycles; return the result (see the module docstring)."""
    if seed is None:
        seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    import tempfile
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="herd-chaos-", dir=U.default_tmp_root())
        data_dir = Path(tmp.name) / "data"
    data_dir = Path(data_dir)
    group_names = [f"chaos-{i:03d}" for i in range(groups)]
    ledger = Ledger()
    control = Control()
    threads = [Writer(i, group_names[i::writers], partitions, ledger, random.Random(rng.random()), control)
               for i in range(writers)]
    herd = ChaosHerd(data_dir=data_dir, topics=(), fsync=fsync,
                     extra_args=["--offsets-partitions", str(offsets_partitions)])
    result = {"bench": "chaos", "seed": seed, "cycles": 0, "cycles_asked": cycles, "groups": groups,
              "writers": writers, "partitions_per_topic": partitions, "topics": len(TOPICS),
              "fsync": fsync, "data_fs": U.filesystem_of(data_dir.parent if data_dir.parent.exists()
                                                             else U.default_tmp_root())}
    restart_s = []
    lost_total = []
    invented_total = []
    started = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for cycle in range(cycles + 1):
            t0 = time.perf_counter()
            herd.start()
            restart_s.append(time.perf_counter() - t0)
            check = verify(herd.address, ledger, group_names)
            lost_total += [dict(x, cycle=cycle) for x in check["lost"]]
            invented_total += [dict(x, cycle=cycle) for x in check["invented"]]
            if progress:
                progress(f"cycle {cycle}: restart {restart_s[-1]:.2f}s, "
                         f"{check['keys_checked']} keys checked, "
                         f"{len(check['lost'])} lost, {len(check['invented'])} invented, "
                         f"{ledger.commits_acked} commits acknowledged so far")
            if cycle == cycles:
                break
            control.resume(herd.address)
            time.sleep(rng.uniform(*kill_after))
            herd.kill_hard()
            control.running.clear()
            result["cycles"] = cycle + 1
            for t in threads:
                if t.error is not None:
                    raise RuntimeError(f"{t.name} failed: {t.error!r}") from t.error
        # a clean stop at the end: SIGTERM flushes and exits 0; nothing lost either
        control.running.clear()
        time.sleep(0.1)
        code = herd.stop()
        herd.start()
        check = verify(herd.address, ledger, group_names)
        lost_total += [dict(x, cycle="after-sigterm") for x in check["lost"]]
        invented_total += [dict(x, cycle="after-sigterm") for x in check["invented"]]
        result["sigterm_exit_code"] = code
        herd_log = herd.logs()
    finally:
        control.stop.set()
        control.running.clear()
        for t in threads:
            t.join(10)
        herd.stop()
        if tmp is not None:
            tmp.cleanup()
    truncations = sum(1 for line in herd_log.splitlines() if '"log.tail_truncated"' in line)
    result.update({
        "seconds": time.perf_counter() - started,
        "requests_sent": ledger.requests_sent,
        "requests_acknowledged": ledger.requests_acked,
        "commits_sent": ledger.commits_sent,
        "commits_acknowledged": ledger.commits_acked,
        "keys": len(ledger.acked),
        "commits_lost": len(lost_total),
        "values_invented": len(invented_total),
        "commit_errors": {str(k): v for k, v in sorted(ledger.errors.items())},
        "disconnects": ledger.disconnects,
        "restart_seconds": U.percentiles(restart_s, (50, 99)),
        "log_tail_truncations": truncations,
        "lost_examples": lost_total[:10],
        "invented_examples": invented_total[:10],
    })
    return result


def build_parser():
    ap = U.arg_parser("bench.chaos", __doc__.split("\n")[0], "3 cycles")
    ap.add_argument("--cycles", type=int, default=None, help="kill/restart cycles (default 20)")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    ap.add_argument("--kill-after", default="0.3,1.2", help="min,max seconds of load before each SIGKILL")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--fsync", choices=("always", "interval"), default="always",
                    help="herd's fsync mode (interval: acknowledged once written to the OS; a SIGKILL loses nothing)")
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={"cycles": (3, 20)})
    cycles = args.cycles
    lo, hi = (float(x) for x in args.kill_after.split(","))
    res = run(cycles, groups=args.groups, writers=args.writers, partitions=args.partitions,
              kill_after=(lo, hi), seed=args.seed, progress=lambda s: print(s, file=sys.stderr, flush=True),
              fsync=args.fsync)
    res["environment"] = U.environment()
    U.emit(res)
    if res["commits_lost"] or res["values_invented"]:
        raise SystemExit(f"chaos: {res['commits_lost']} acknowledged commits lost, "
                         f"{res['values_invented']} values invented")


if __name__ == "__main__":
    main(sys.argv[1:])
