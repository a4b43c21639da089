"""Rebalance latency: 50 confluent-kafka members in one group, herd against librdkafka's mock,
and herd's classic protocol (eager, cooperative-sticky) against its KIP-848 consumer protocol.

``python -m bench.rebalance [--quick] [--members 50] [--leaves 3] [--joins 1]
[--targets herd,herd-cooperative,herd-consumer,mock]``

Targets: ``herd`` and ``mock``: the classic protocol with ``--assignor`` (eager ``range``);
``herd-cooperative``: herd, classic protocol, ``cooperative-sticky`` (incremental: only the moved
partitions are revoked); ``herd-consumer``: herd, ``group.protocol=consumer`` (KIP-848: the
server assigns, ``uniform``; herd runs with ``group_consumer_heartbeat_interval_ms`` /
``group_consumer_session_timeout_ms`` set to ``--heartbeat-interval-ms`` / ``--session-timeout-ms``,
which the consumer protocol takes from the server, not the client). Each target gets a fresh
daemon (or mock), one after the other in the same invocation.

Each member is a confluent-kafka ``Consumer`` in its own thread (``session.timeout.ms`` 10000,
``heartbeat.interval.ms`` 1000, eager ``range`` assignor) subscribed to topic ``bench`` (100
partitions) and polling continuously; its ``on_assign``/``on_revoke`` callbacks record what it holds
and when. The monitor calls an assignment *complete* when every live member holds an assignment
received after the event being timed, and together they hold all 100 partitions exactly once.

* start → first stable complete assignment: from creating the consumers to the moment the last
  member received its part of the first complete assignment (which then must hold, unchanged, for
  ``--settle`` s).
* leave → complete new assignment: one member (a different one each time) is closed (it sends
  LeaveGroup); time from the start of ``close()`` to the last survivor's ``on_assign`` of the new
  complete assignment. Repeated ``--leaves`` times (50 → 49 → 48 ...).

herd and the mock run in the same invocation, one after the other. Target (herd): leave → complete
<= heartbeat interval + 200 ms (the mock waits session timeout − 1 s for any rebalance after the
first).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from bench import _util as U

_now = time.perf_counter


class Member(threading.Thread):
    def __init__(self, idx: int, conf: dict, topic: str):
        super().__init__(name=f"member-{idx}", daemon=True)
        self.idx = idx
        self.conf = conf
        self.topic = topic
        self.lock = threading.Lock()
        # what it owns, from its callbacks applied incrementally: eager protocols revoke
        # everything and assign the whole new set, incremental ones (cooperative-sticky, KIP-848)
        # name only the partitions that move, and the same bookkeeping serves both
        self.owned: set[int] = set()
        self.changed_at = 0.0
        self.assigned_at = 0.0
        self.revoked_at = 0.0
        self.assigns = 0
        self.revokes = 0
        self.stop_requested = threading.Event()
        self.close_started = None
        self.closed_at = None
        self.error = None
        self.ready = threading.Event()

    def _on_assign(self, consumer, partitions):
        with self.lock:
            self.owned.update(p.partition for p in partitions)
            self.assigned_at = self.changed_at = _now()
            self.assigns += 1

    def _on_revoke(self, consumer, partitions):
        with self.lock:
            self.owned.difference_update(p.partition for p in partitions)
            self.revoked_at = self.changed_at = _now()
            self.revokes += 1

    def snapshot(self):
        with self.lock:
            return frozenset(self.owned), self.changed_at

    def run(self):
        from confluent_kafka import Consumer

        consumer = None
        try:
            consumer = Consumer(self.conf)
            consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                               on_lost=self._on_revoke)
            self.ready.set()
            deadline = time.monotonic() + 3600
            while not self.stop_requested.is_set() and time.monotonic() < deadline:
                consumer.poll(0.05)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            if consumer is not None:
                self.close_started = _now()
                try:
                    consumer.close()
                except Exception:
                    pass
                self.closed_at = _now()


def complete_since(members, since: float, partitions: int):
    """-> the time of the last callback, if the live members (fewer than the partitions) each own
    some partitions, together all of them exactly once, and something changed after ``since``;
    else None. (A member whose part did not change gets no callback under an incremental
    protocol: its part still counts.)"""
    seen = 0
    latest = 0.0
    union = set()
    for mb in members:
        asg, at = mb.snapshot()
        if not asg:
            return None
        seen += len(asg)
        union |= asg
        latest = max(latest, at)
    if seen != partitions or len(union) != partitions or latest < since:
        return None
    return latest


def wait_complete(members, since: float, partitions: int, timeout: float, settle: float):
    """Wait for a complete assignment received after ``since`` that then holds for ``settle`` s."""
    deadline = _now() + timeout
    while _now() < deadline:
        got = complete_since(members, since, partitions)
        if got is not None:
            counts = [mb.assigns + mb.revokes for mb in members]
            stable_until = _now() + settle
            ok = True
            while _now() < stable_until:
                time.sleep(0.01)
                if [mb.assigns + mb.revokes for mb in members] != counts:
                    ok = False
                    break
            if ok:
                return got
            continue
        time.sleep(0.002)
    return None


def _spread(xs):
    if not xs:
        return None
    return {"min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1], "count": len(xs)}


def run_target(target: str, bootstrap: str, args) -> dict:
    group = f"bench-rebalance-{target}-{int(time.time() * 1000) % 10**8}"
    if target == "herd-consumer":  # KIP-848: the timeouts and the assignor are the server's
        protocol = {"group.protocol": "consumer"}
    else:
        protocol = {
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": args.heartbeat_interval_ms,
            "partition.assignment.strategy": "cooperative-sticky" if target == "herd-cooperative" else args.assignor,
        }
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        **protocol,
        "enable.auto.commit": False,
        "auto.offset.reset": "latest",
        "socket.nagle.disable": True,
        "log_level": 3,
        "max.poll.interval.ms": 300000,
    }
    members = [
        Member(i, dict(conf, **{"client.id": f"bench-rebalance-{i}"}), args.topic)
        for i in range(args.members)
    ]
    out = {"target": target, "members": args.members, "client_protocol": protocol}
    try:
        t0 = _now()
        for mb in members:
            mb.start()
        for mb in members:
            mb.ready.wait(30)
        errs = [mb.error for mb in members if mb.error]
        if errs:
            raise RuntimeError(f"{target}: consumer failed: {errs[0]}")
        got = wait_complete(members, t0, args.topic_partitions, args.timeout, args.settle)
        out["start_to_stable_s"] = None if got is None else got - t0
        out["assigns_until_stable"] = sum(mb.assigns for mb in members)
        leaves = []
        live = list(members)
        for k in range(args.leaves if got is not None else 0):
            victim = live[(k * 7 + 3) % len(live)]
            live.remove(victim)
            victim.stop_requested.set()
            while victim.close_started is None and victim.is_alive():
                time.sleep(0.0005)
            t_leave = victim.close_started or _now()
            done = wait_complete(live, t_leave, args.topic_partitions, args.timeout, args.settle)
            victim.join(30)
            revoked = sorted(mb.revoked_at - t_leave for mb in live if mb.revoked_at >= t_leave)
            assigned = sorted(mb.assigned_at - t_leave for mb in live if mb.assigned_at >= t_leave)
            leaves.append(
                {
                    "members_after": len(live),
                    "leave_to_complete_s": None if done is None else done - t_leave,
                    "close_s": None if victim.closed_at is None else victim.closed_at - t_leave,
                    # when survivors learned of the rebalance (on_revoke) and got their part
                    "revoked_s": _spread(revoked),
                    "assigned_s": _spread(assigned),
                }
            )
            if done is None:
                break
        out["leaves"] = leaves
        joins = []
        for k in range(args.joins if got is not None and len(leaves) == args.leaves else 0):
            newcomer = Member(args.members + k, dict(conf, **{"client.id": f"bench-rebalance-new-{k}"}), args.topic)
            members.append(newcomer)
            live.append(newcomer)
            t_join = _now()
            newcomer.start()
            done = wait_complete(live, t_join, args.topic_partitions, args.timeout, args.settle)
            revoked = sorted(mb.revoked_at - t_join for mb in live if mb.revoked_at >= t_join)
            joins.append({"members_after": len(live), "join_to_complete_s": None if done is None else done - t_join,
                          "revoked_s": _spread(revoked),
                          "members_revoking": len(revoked)})
            if done is None:
                break
        out["joins"] = joins
        jvals = [x["join_to_complete_s"] for x in joins if x["join_to_complete_s"] is not None]
        out["join_to_complete_median_s"] = statistics.median(jvals) if jvals else None
        vals = [x["leave_to_complete_s"] for x in leaves if x["leave_to_complete_s"] is not None]
        out["leave_to_complete_median_s"] = statistics.median(vals) if vals else None
        out["leave_to_complete_max_s"] = max(vals) if vals else None
        out["incomplete"] = got is None or len(vals) < args.leaves or len(jvals) < args.joins
    finally:
        for mb in members:
            mb.stop_requested.set()
        for mb in members:
            mb.join(30)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.rebalance", __doc__.split("\n\n")[0], "one leave (< 60 s in all)")
    ap.add_argument("--members", type=int, default=50)
    ap.add_argument(
        "--leaves", type=int, default=None, help="members closed one after another (default 3, quick 1)"
    )
    ap.add_argument("--joins", type=int, default=1, help="members added one after another, after the leaves")
    ap.add_argument("--session-timeout-ms", type=int, default=10_000)
    ap.add_argument("--heartbeat-interval-ms", type=int, default=1_000)
    ap.add_argument("--initial-rebalance-delay-ms", type=int, default=0, help="for herd and the mock")
    ap.add_argument("--assignor", default="range")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--topic-partitions", type=int, default=100)
    ap.add_argument("--settle", type=float, default=1.0, help="a complete assignment must hold this long")
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="give up waiting for an assignment after this"
    )
    ap.add_argument("--targets", default="herd,mock",
                    help="any of herd (classic, --assignor), herd-cooperative, herd-consumer (KIP-848), mock")
    ap.add_argument("--fsync", default="always", choices=("always", "never"))
    ap.add_argument("--herd-log-level", default="info")
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={"leaves": (1, 3)})
    env = U.environment()
    topic = f"{args.topic}:{args.topic_partitions}"
    target_s = args.heartbeat_interval_ms / 1000 + 0.2
    runs = {}
    for target in [t for t in args.targets.split(",") if t]:
        if target in ("herd", "herd-cooperative", "herd-consumer"):
            hb, session = args.heartbeat_interval_ms, args.session_timeout_ms
            consumer_settings = [
                "--group-consumer-heartbeat-interval-ms", hb,
                "--group-consumer-min-heartbeat-interval-ms", min(hb, 5000),
                "--group-consumer-session-timeout-ms", session,
                "--group-consumer-min-session-timeout-ms", min(session, 45000),
                "--group-consumer-max-session-timeout-ms", max(session, 60000),
            ]
            with U.Herd(
                fsync=args.fsync,
                topics=[topic],
                initial_rebalance_delay_ms=args.initial_rebalance_delay_ms,
                log_level=args.herd_log_level,
                extra_args=consumer_settings,
            ) as herd:
                runs[target] = run_target(target, herd.bootstrap, args)
                runs[target]["herd_rebalances"] = [
                    {
                        k: e.get(k)
                        for k in (
                            "generation",
                            "members",
                            "reason",
                            "duration_ms",
                            "preparing_ms",
                            "completing_ms",
                        )
                    }
                    for e in herd.log_events("rebalance_completed")
                ]
                runs[target]["herd_malformed_fetch_closes"] = sum(
                    1 for line in herd.logs().splitlines() if "malformed FetchRequest" in line
                )
        elif target == "mock":
            with U.Mock(topics=[topic], initial_rebalance_delay_ms=args.initial_rebalance_delay_ms) as mock:
                runs[target] = run_target(target, mock.bootstrap, args)
        else:
            raise SystemExit(f"unknown target {target}")
        r = runs[target]
        print(
            f"  {target}: start→stable {r['start_to_stable_s']}, "
            f"leaves {[x['leave_to_complete_s'] for x in r['leaves']]}, "
            f"joins {[x['join_to_complete_s'] for x in r['joins']]}",
            file=sys.stderr,
            flush=True,
        )
    herd = runs.get("herd")
    result = {
        "benchmark": "rebalance",
        **env,
        "clients": U.client_versions(),
        "params": {k: v for k, v in vars(args).items()},
        "target_leave_s": target_s,
        "runs": runs,
    }
    if herd:
        result["meets_target"] = (
            not herd["incomplete"]
            and herd["leave_to_complete_max_s"] is not None
            and herd["leave_to_complete_max_s"] <= target_s
        )
    if (
        herd
        and runs.get("mock")
        and runs["mock"]["leave_to_complete_median_s"]
        and herd["leave_to_complete_median_s"]
    ):
        result["speedup_leave_mock_over_herd"] = (
            runs["mock"]["leave_to_complete_median_s"] / herd["leave_to_complete_median_s"]
        )

    def fmt(x):
        return "-" if x is None else f"{x:.3f}"

    rows = [
        [
            t,
            fmt(r["start_to_stable_s"]),
            fmt(r["leave_to_complete_median_s"]),
            fmt(r["leave_to_complete_max_s"]),
            len(r["leaves"]),
            fmt(r["join_to_complete_median_s"]),
            f"<= {target_s:.1f}" if t == "herd" else "",
            ("yes" if result.get("meets_target") else "NO") if t == "herd" else "",
        ]
        for t, r in runs.items()
    ]
    U.emit(
        result,
        f"rebalance ({args.members} confluent-kafka members)\n"
        + U.table(
            rows,
            ["server", "start→stable s", "leave→complete median s", "max s", "leaves", "join→complete median s",
             "target", "holds"],
        ),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
