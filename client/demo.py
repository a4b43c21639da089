"""A ready-made group member, for trying herd (the README's "Try it"): each process is one member.

    python -m client.demo --group demo --topic orders --name member-1

It joins ``--group``, takes its share of ``--topic``'s partitions, "processes" 10 records a second
on each and commits its progress every second, printing what it was assigned, what it committed,
and what a rebalance did to it. SIGTERM or Ctrl-C leaves the group cleanly (herd rebalances the
others at once); SIGKILL does not, and herd waits for the member's session timeout (10 s here).

What it catches is what any member must: ``RebalanceInProgressError`` (a commit while the group is
rebalancing: poll, then go on) and ``CommitFailedError`` (the member lost its partitions: poll, and
go on from the committed offsets), ``KafkaTimeoutError`` (the coordinator did not answer in time),
and ``NoBrokersAvailableError`` (nothing reached at the bootstrap address: it keeps trying).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from client import (
    CommitFailedError,
    GroupConsumer,
    KafkaTimeoutError,
    NoBrokersAvailableError,
    RebalanceInProgressError,
    TopicPartition,
)

RECORDS_PER_STEP = 10  # "processed" per partition per step
STEP_S = 1.0
REPORT_EVERY_S = 5.0


def say(line: str) -> None:
    """One line in one write: the try-it runs three members in one terminal, and print's separate
    write of its newline (unbuffered output, PYTHONUNBUFFERED) let two members' lines run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _names(parts) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(parts)) or "nothing"


class _Printer:
    """A rebalance listener that says what happened to this member."""

    def __init__(self, name: str, consumer_ref: list):
        self.name = name
        self.consumer_ref = consumer_ref

    def on_partitions_revoked(self, revoked) -> None:
        say(f"{self.name}: revoked {_names(revoked)}")

    def on_partitions_lost(self, lost) -> None:
        say(f"{self.name}: lost {_names(lost)}")

    def on_partitions_assigned(self, added) -> None:
        consumer = self.consumer_ref[0]
        say(f"{self.name}: assigned {_names(consumer.assignment())} (generation {consumer.generation()})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-server", default=os.environ.get("HERD_BOOTSTRAP", "127.0.0.1:9092"),
                   help="HOST:PORT of herd (default $HERD_BOOTSTRAP, else 127.0.0.1:9092)")
    p.add_argument("--group", default="demo", help="the group to join (default demo)")
    p.add_argument("--topic", default="orders", help="the topic to share (default orders)")
    p.add_argument("--name", default=f"member-{os.getpid()}", help="this member's client id")
    p.add_argument("--session-timeout-ms", type=int, default=10000,
                   help="how long herd waits for a member that stopped without leaving (default 10000)")
    args = p.parse_args(argv)
    name = args.name
    logging.basicConfig(level=logging.WARNING, format=f"{name}: %(levelname)s %(message)s")

    stopping: list[int] = []

    def stop(signum, _frame):
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    try:
        consumer = GroupConsumer(args.bootstrap_server, args.group, client_id=name, enable_auto_commit=False,
                                 session_timeout_ms=args.session_timeout_ms,
                                 heartbeat_interval_ms=max(1, min(1000, args.session_timeout_ms // 3)))
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    ref = [consumer]
    positions: dict[TopicPartition, int] = {}  # the next offset to process, per assigned partition
    say(f"{name}: joining group {args.group!r} at {args.bootstrap_server} for topic {args.topic!r}")
    with consumer:
        consumer.subscribe([args.topic], listener=_Printer(name, ref))
        next_report = time.monotonic() + REPORT_EVERY_S
        while not stopping:
            try:
                assigned = consumer.poll(STEP_S)  # drives the group; returns the assignment
            except NoBrokersAvailableError as exc:
                say(f"{name}: {exc}")
                continue
            for tp in list(positions):
                if tp not in assigned:
                    del positions[tp]
            try:
                new = [tp for tp in assigned if tp not in positions]
                if new:  # where the previous owner (or an earlier run) stopped
                    for tp, om in consumer.committed(new).items():
                        positions[tp] = om.offset if om is not None and om.offset >= 0 else 0
                time.sleep(STEP_S)  # the work: RECORDS_PER_STEP records of each assigned partition
                if not assigned:
                    continue
                done = {tp: positions[tp] + RECORDS_PER_STEP for tp in assigned}
                consumer.commit(done)
                positions.update(done)
            except (RebalanceInProgressError, CommitFailedError) as exc:
                # A member joined or left: this step's work is done again by whoever gets the
                # partition (at least once). Poll to take part in the rebalance.
                say(f"{name}: commit refused ({type(exc).__name__}): polling to rejoin")
                positions.clear()
                continue
            except KafkaTimeoutError as exc:
                say(f"{name}: {exc}")
                positions.clear()
                continue
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + REPORT_EVERY_S
                say(f"{name}: committed " + ", ".join(f"{tp.topic}-{tp.partition}={off}"
                                                      for tp, off in sorted(positions.items())))
        say(f"{name}: leaving the group")
    return 0


if __name__ == "__main__":
    sys.exit(main())
