"""Churn soak: members of several groups join, leave, crash and restart at random while a checker
polls herd and asserts the group invariants continuously.

``python -m bench.soak [--quick] [--seconds 600] [--groups 6] [--seed N] [--no-real-clients]``

Members (kinds, mixed in every group):

* ``raw-thread`` — a raw-protocol member (:class:`RawMember`) on a thread of this process. It
  joins (MEMBER_ID_REQUIRED dance, range assignment when it leads, SyncGroup), heartbeats,
  commits its partitions' offsets, and at random leaves (LeaveGroup) or "crashes" (closes its
  socket without a word: what the coordinator sees of a SIGKILLed process).
* ``raw-proc`` — the same member in a child process (``python -m bench.soak --member JSON``),
  SIGKILLed for real; some are static members (``group.instance.id``) that are restarted under
  the same instance id after a kill.
* ``confluent`` — an unmodified confluent-kafka (librdkafka) consumer in a child process
  (``tools/member.py``): SIGTERM closes it (LeaveGroup), SIGKILL crashes it.

Offsets committed by raw members are microseconds since the epoch at the time of the commit, so
across all members of a group every commit carries a higher value than any earlier one: a
committed offset that goes down is herd's fault (no client ever commits a lower value).

Invariants, checked every ``--poll-ms`` with DescribeGroups + OffsetFetch on one connection:

1. in every Stable group each partition of the subscribed topics is assigned to exactly one member
   (member assignments decoded with ``protocol.consumer.decode_assignment``);
2. no group stays in PreparingRebalance (or CompletingRebalance) for longer than its rebalance
   timeout + session timeout (+ the poll interval and a small slack); each continuous stay in one
   of these states is measured;
3. committed offsets never go backwards.

Prints one JSON line: parameters, member starts/kills/leaves by kind, polls, Stable observations
checked, the longest stay seen in each rebalancing state against its bound, offsets checked,
commits acknowledged, and ``violations`` (must be empty).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from protocol import errors as E
from protocol import messages as m
from protocol.consumer import decode_assignment, decode_subscription, encode_assignment, encode_subscription

REPO = Path(__file__).resolve().parents[1]
MEMBER_SCRIPT = REPO / "tools" / "member.py"
TOPICS = {"soak-a": 6, "soak-b": 4}

RETRIABLE = {E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR}


def _client():
    from tools.rawclient import RawClient
    return RawClient


# ---- a raw-protocol group member -----------------------------------------------------------------

class MemberGone(Exception):
    """The member was fenced or told to stop."""


def range_assign(members: list[tuple[str, list[str]]], partitions: dict[str, int]) -> dict[str, dict]:
    """Kafka's RangeAssignor: per topic, members sorted by id take contiguous ranges."""
    out: dict[str, dict[str, list[int]]] = {mid: {} for mid, _ in members}
    for topic, count in sorted(partitions.items()):
        subs = sorted(mid for mid, topics in members if topic in topics)
        if not subs:
            continue
        per, extra = divmod(count, len(subs))
        start = 0
        for i, mid in enumerate(subs):
            n = per + (1 if i < extra else 0)
            if n:
                out[mid][topic] = list(range(start, start + n))
            start += n
    return out


def encode_plan(plan: dict[str, list[int]]) -> bytes:
    return encode_assignment(m.ConsumerProtocolAssignment(assigned_partitions=[
        m.ConsumerProtocolAssignmentTopicPartition(topic=t, partitions=ps) for t, ps in sorted(plan.items())]), 1)


class RawMember:
    """A blocking, single-connection consumer-group member on the raw protocol.

    ``join()`` runs a whole rebalance (JoinGroup v5 with the MEMBER_ID_REQUIRED retry, the range
    assignment when this member leads, SyncGroup v3); ``heartbeat()``, ``commit()`` and ``leave()``
    are one request each. ``run()`` is the life of a soak member."""

    def __init__(self, address, group: str, topics: dict[str, int], *, name: str = "raw-member",
                 session_ms: int = 3000, rebalance_ms: int = 4000, heartbeat_ms: int = 300,
                 instance_id: str | None = None, commit_ms: int = 500):
        self.address = address
        self.group = group
        self.topics = dict(topics)
        self.name = name
        self.session_ms = session_ms
        self.rebalance_ms = rebalance_ms
        self.heartbeat_ms = heartbeat_ms
        self.commit_ms = commit_ms
        self.instance_id = instance_id
        self.member_id = ""
        self.generation = -1
        self.assignment: dict[str, list[int]] = {}
        self.joins = 0
        self.commits_acked = 0
        self.errors: dict[int, int] = {}
        self.on_join = None  # called with the member after every completed join
        self.on_error = None  # called with (what, error code) for unexpected errors
        self.conn = _client()(address, client_id=name, timeout=rebalance_ms / 1000 + 10)
        self.subscription = encode_subscription(m.ConsumerProtocolSubscription(topics=sorted(self.topics)), 1)

    def _count(self, code: int, what: str = "") -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        if self.on_error is not None:
            self.on_error(what, code)

    def join(self, deadline: float | None = None) -> int:
        """Join (or rejoin) until Stable with an assignment; returns the generation."""
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no stable generation before the deadline")
            r = self.conn.call(m.JoinGroupRequest(
                group_id=self.group, session_timeout_ms=self.session_ms, rebalance_timeout_ms=self.rebalance_ms,
                member_id=self.member_id, group_instance_id=self.instance_id, protocol_type="consumer",
                protocols=[m.JoinGroupRequestProtocol(name="range", metadata=self.subscription)]), 5)
            if r.error_code == E.MEMBER_ID_REQUIRED:
                self.member_id = r.member_id
                continue
            if r.error_code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                continue
            if r.error_code == E.FENCED_INSTANCE_ID:
                raise MemberGone(f"{self.name}: fenced")
            if r.error_code in RETRIABLE or r.error_code == E.REBALANCE_IN_PROGRESS:
                self._count(r.error_code)
                time.sleep(0.1)
                continue
            if r.error_code != 0:
                raise RuntimeError(f"{self.name}: JoinGroup error {r.error_code}")
            self.joins += 1
            self.member_id = r.member_id
            self.generation = r.generation_id
            assignments = []
            if r.leader == r.member_id:
                subs = []
                for mem in r.members:
                    try:
                        _, sub = decode_subscription(mem.metadata)
                        subs.append((mem.member_id, list(sub.topics)))
                    except Exception:
                        subs.append((mem.member_id, []))
                plan = range_assign(subs, self.topics)
                assignments = [m.SyncGroupRequestAssignment(member_id=mid, assignment=encode_plan(p))
                               for mid, p in plan.items()]
            s = self.conn.call(m.SyncGroupRequest(
                group_id=self.group, generation_id=self.generation, member_id=self.member_id,
                group_instance_id=self.instance_id, protocol_type="consumer", protocol_name=r.protocol_name,
                assignments=assignments), 3)
            if s.error_code in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION) or s.error_code in RETRIABLE:
                self._count(s.error_code)
                continue
            if s.error_code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                continue
            if s.error_code == E.FENCED_INSTANCE_ID:
                raise MemberGone(f"{self.name}: fenced")
            if s.error_code != 0:
                raise RuntimeError(f"{self.name}: SyncGroup error {s.error_code}")
            _, asg = decode_assignment(s.assignment)
            self.assignment = {tp.topic: list(tp.partitions) for tp in asg.assigned_partitions}
            if self.on_join is not None:
                self.on_join(self)
            return self.generation

    def heartbeat(self) -> int:
        r = self.conn.call(m.HeartbeatRequest(group_id=self.group, generation_id=self.generation,
                                              member_id=self.member_id, group_instance_id=self.instance_id), 4)
        return r.error_code

    def commit(self, offset: int | None = None) -> int:
        """Commit ``offset`` (default: µs since the epoch) for every assigned partition; -> the first
        error (0 if all succeeded)."""
        if not any(self.assignment.values()):
            return 0
        off = offset if offset is not None else time.time_ns() // 1000
        req = m.OffsetCommitRequest(
            group_id=self.group, generation_id_or_member_epoch=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, topics=[
                m.OffsetCommitRequestTopic(name=t, partitions=[
                    m.OffsetCommitRequestPartition(partition_index=p, committed_offset=off, committed_metadata="")
                    for p in ps]) for t, ps in sorted(self.assignment.items()) if ps])
        r = self.conn.call(req, 8)
        first = 0
        for t in r.topics:
            for p in t.partitions:
                if p.error_code == 0:
                    self.commits_acked += 1
                elif not first:
                    first = p.error_code
        return first

    def leave(self) -> None:
        try:
            self.conn.call(m.LeaveGroupRequest(group_id=self.group, members=[
                m.LeaveGroupRequestMemberIdentity(member_id=self.member_id, group_instance_id=self.instance_id)]), 3)
        except (OSError, ConnectionError):
            pass

    def close(self) -> None:
        self.conn.close()

    def run(self, stop: threading.Event, until: float | None = None, leave: bool = True) -> None:
        """Join, then heartbeat and commit until ``stop`` is set or ``until`` (monotonic) passes;
        rejoin whenever herd asks. ``leave``: send LeaveGroup at the end (else just close)."""
        try:
            self.join()
            next_commit = time.monotonic() + random.uniform(0, self.commit_ms / 1000)
            while not stop.is_set() and (until is None or time.monotonic() < until):
                stop.wait(self.heartbeat_ms / 1000)
                code = self.heartbeat()
                what = "heartbeat"
                if code == 0 and time.monotonic() >= next_commit:
                    code = self.commit()
                    what = "commit"
                    next_commit = time.monotonic() + self.commit_ms / 1000
                if code and self.on_error is not None:
                    self.on_error(what, code)
                if code in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION):
                    self.join()
                elif code == E.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                    self.join()
                elif code == E.FENCED_INSTANCE_ID:
                    raise MemberGone(f"{self.name}: fenced")
                elif code:
                    self.errors[code] = self.errors.get(code, 0) + 1
            if leave:
                self.leave()
        finally:
            self.close()


def member_main(cfg: dict) -> None:
    """A raw member as a child process: runs until SIGTERM (leaves) or SIGKILL; exits if stdin
    closes (the soak died)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin():
        try:
            while sys.stdin.buffer.read(1):
                pass
        except (OSError, ValueError):
            pass
        os._exit(3)

    threading.Thread(target=watch_stdin, daemon=True).start()
    member = RawMember(tuple(cfg["address"]), cfg["group"], cfg["topics"], name=cfg["name"],
                       session_ms=cfg["session_ms"], rebalance_ms=cfg["rebalance_ms"],
                       heartbeat_ms=cfg["heartbeat_ms"], instance_id=cfg.get("instance_id"))
    if cfg.get("events"):  # JSON lines on stdout for a watching parent
        def say(ev: str, **kw):
            print(json.dumps({"ev": ev, "t": time.monotonic(), **kw}), flush=True)

        member.on_join = lambda mem: say("joined", generation=mem.generation, member_id=mem.member_id,
                                         assignment=mem.assignment)
        member.on_error = lambda what, code: say("error", what=what, code=code)
    try:
        member.run(stop)
    except MemberGone:
        pass
    if cfg.get("events"):
        print(json.dumps({"ev": "exit", "joins": member.joins, "commits": member.commits_acked,
                          "errors": member.errors}), flush=True)


# ---- the checker -------------------------------------------------------------------------------

REBALANCING = ("PreparingRebalance", "CompletingRebalance")


class Checker(threading.Thread):
    """Polls DescribeGroups and OffsetFetch for every group; records invariant violations."""

    def __init__(self, address, groups: list[str], topics: dict[str, int], bound_ms: dict[str, int],
                 poll_ms: int = 100, history_url: str | None = None):
        super().__init__(name="soak-checker", daemon=True)
        self.history_url = history_url  # herd's flight recorder (metrics endpoint), for diagnostics
        self.rebalances: dict[tuple[str, int], dict] = {}
        self.address = address
        self.groups = groups
        self.topics = topics
        self.bound_ms = bound_ms
        self.poll_ms = poll_ms
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.violations: list[dict] = []
        self.polls = 0
        self.stable_checked = 0
        self.offsets_checked = 0
        self.state: dict[str, tuple[str, float]] = {}  # group -> (state, since)
        self.longest: dict[str, float] = {s: 0.0 for s in REBALANCING}
        self.flagged: set[tuple[str, float]] = set()
        self.offsets: dict[tuple, int] = {}
        self.states_seen: dict[str, int] = {}
        self.error: BaseException | None = None

    def violate(self, kind: str, **detail) -> None:
        with self.lock:
            if len(self.violations) < 200:
                self.violations.append({"kind": kind, "t": round(time.monotonic(), 3), **detail})

    def run(self):
        try:
            with _client()(self.address, client_id="soak-checker", timeout=10) as c:
                last_history = time.monotonic()
                while not self.stop.wait(self.poll_ms / 1000):
                    self.poll(c)
                    if self.history_url and time.monotonic() - last_history > 2:
                        self.poll_history()
                        last_history = time.monotonic()
                if self.history_url:
                    self.poll_history()
        except BaseException as exc:
            self.error = exc

    def poll(self, c) -> None:
        now = time.monotonic()
        d = c.call(m.DescribeGroupsRequest(groups=self.groups), 5)
        for g in d.groups:
            self.check_group(g, now)
        f = c.call(m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=g, topics=None)
                                                for g in self.groups]), 8)
        for g in f.groups:
            if g.error_code:
                self.violate("offset_fetch_error", group=g.group_id, error=g.error_code)
                continue
            for t in g.topics:
                for p in t.partitions:
                    if p.committed_offset < 0:
                        continue
                    key = (g.group_id, t.name, p.partition_index)
                    last = self.offsets.get(key)
                    self.offsets_checked += 1
                    if last is not None and p.committed_offset < last:
                        self.violate("offset_went_backwards", key=list(key), before=last,
                                     now=p.committed_offset)
                    if last is None or p.committed_offset > last:
                        self.offsets[key] = p.committed_offset
        self.polls += 1

    def poll_history(self) -> None:
        """Collect finished rebalances from herd's flight recorder (its own account of the phases)."""
        import urllib.request
        for group in self.groups:
            try:
                with urllib.request.urlopen(f"{self.history_url}/groups/{group}/history", timeout=5) as r:
                    hist = json.loads(r.read())
            except OSError:
                continue
            for rb in hist if isinstance(hist, list) else hist.get("history", []):
                if rb.get("outcome") not in (None, "in_progress"):
                    self.rebalances[(group, rb.get("generation"), rb.get("started_wall_ms"))] = rb

    def recorder_summary(self) -> dict:
        prep = [rb["phases"]["preparing_ms"] for rb in self.rebalances.values()
                if rb["phases"]["preparing_ms"] is not None]
        comp = [rb["phases"]["completing_ms"] for rb in self.rebalances.values()
                if rb["phases"]["completing_ms"] is not None]
        outcomes: dict[str, int] = {}
        for rb in self.rebalances.values():
            outcomes[rb["outcome"]] = outcomes.get(rb["outcome"], 0) + 1
        return {"rebalances": len(self.rebalances), "outcomes": outcomes,
                "max_preparing_ms": max(prep, default=None), "max_completing_ms": max(comp, default=None)}

    def check_group(self, g, now: float) -> None:
        if g.error_code:
            self.violate("describe_error", group=g.group_id, error=g.error_code)
            return
        state = g.group_state
        self.states_seen[state] = self.states_seen.get(state, 0) + 1
        prev = self.state.get(g.group_id)
        since = prev[1] if prev is not None and prev[0] == state else now
        self.state[g.group_id] = (state, since)
        if state in REBALANCING:
            stayed = now - since
            self.longest[state] = max(self.longest[state], stayed)
            bound = self.bound_ms[g.group_id] / 1000
            if stayed > bound and (g.group_id, since) not in self.flagged:
                self.flagged.add((g.group_id, since))
                self.violate("stuck_rebalancing", group=g.group_id, state=state, seconds=round(stayed, 3),
                             bound_s=bound, members=len(g.members))
        if state == "Stable" and g.protocol_type == "consumer":
            self.check_stable(g)

    def check_stable(self, g) -> None:
        owners: dict[tuple[str, int], list[str]] = {}
        subscribed: set[str] = set()
        for mem in g.members:
            try:
                _, sub = decode_subscription(mem.member_metadata)
                subscribed.update(sub.topics)
                _, asg = decode_assignment(mem.member_assignment)
            except Exception as exc:
                self.violate("undecodable_member_data", group=g.group_id, member=mem.member_id, error=str(exc))
                return
            for tp in asg.assigned_partitions:
                for p in tp.partitions:
                    owners.setdefault((tp.topic, p), []).append(mem.member_id)
        self.stable_checked += 1
        dup = {f"{t}-{p}": ms for (t, p), ms in owners.items() if len(ms) > 1}
        if dup:
            self.violate("partition_assigned_twice", group=g.group_id, partitions=dup)
        want = {(t, p) for t in subscribed if t in self.topics for p in range(self.topics[t])}
        missing = sorted(f"{t}-{p}" for t, p in want - set(owners))
        if g.members and missing:
            self.violate("partition_unassigned", group=g.group_id, partitions=missing, members=len(g.members))


# ---- the churn -----------------------------------------------------------------------------------

class Member:
    """One member of the soak, whatever its kind."""

    def __init__(self, kind: str, group: str, name: str, handle, instance_id: str | None = None):
        self.kind = kind
        self.group = group
        self.name = name
        self.handle = handle  # (thread, stop event, RawMember) or Popen
        self.instance_id = instance_id
        self.started = time.monotonic()

    def alive(self) -> bool:
        if self.kind == "raw-thread":
            return self.handle[0].is_alive()
        return self.handle.poll() is None

    def leave(self) -> None:
        if self.kind == "raw-thread":
            self.handle[1].set()
        elif self.alive():
            self.handle.send_signal(signal.SIGTERM)

    def crash(self) -> None:
        if self.kind == "raw-thread":
            _thread, stop, member = self.handle
            member.crashed = True
            try:  # the connection ends without a LeaveGroup; the thread's next call fails
                member.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            stop.set()
        elif self.alive():
            self.handle.send_signal(signal.SIGKILL)

    def reap(self) -> None:
        if self.kind == "raw-thread":
            self.handle[0].join(0.1)
        else:
            try:
                self.handle.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
            if self.handle.poll() is not None:
                for f in (self.handle.stdin, self.handle.stdout):
                    try:
                        f.close()
                    except (OSError, AttributeError):
                        pass


class Soak:
    def __init__(self, address, bootstrap: str, *, groups: int, seconds: float, seed: int,
                 real_clients: bool = True, session_ms: int = 3000, rebalance_ms: int = 4000,
                 heartbeat_ms: int = 300, min_members: int = 1, max_members: int = 4,
                 action_every: float = 0.5, poll_ms: int = 100, log_dir: Path | None = None,
                 kinds: dict[str, float] | None = None, history_url: str | None = None):
        self.address = address
        self.bootstrap = bootstrap
        self.group_names = [f"soak-{i}" for i in range(groups)]
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.seed = seed
        self.session_ms = session_ms
        self.rebalance_ms = rebalance_ms
        self.heartbeat_ms = heartbeat_ms
        self.min_members = min_members
        self.max_members = max_members
        self.action_every = action_every
        self.poll_ms = poll_ms
        self.log_dir = log_dir
        self.kinds = kinds or ({"raw-thread": 0.5, "raw-proc": 0.25, "confluent": 0.25} if real_clients
                               else {"raw-thread": 0.65, "raw-proc": 0.35})
        self.members: list[Member] = []
        self.counts: dict[str, dict[str, int]] = {}
        self.seq = 0
        self.thread_errors: list[str] = []
        self.lock = threading.Lock()
        self.raw_commits = 0
        self.raw_joins = 0
        slack_ms = 1500 + 2 * poll_ms
        self.bound_ms = {g: rebalance_ms + session_ms + slack_ms for g in self.group_names}
        self.checker = Checker(address, self.group_names, TOPICS, self.bound_ms, poll_ms, history_url)

    def _count(self, kind: str, what: str) -> None:
        self.counts.setdefault(kind, {}).setdefault(what, 0)
        self.counts[kind][what] += 1

    def start_member(self, group: str, kind: str | None = None, instance_id: str | None = None) -> Member:
        if kind is None:
            kinds, weights = zip(*self.kinds.items(), strict=True)
            kind = self.rng.choices(kinds, weights)[0]
        self.seq += 1
        name = f"{kind}-{group}-{self.seq}"
        if kind == "raw-proc" and instance_id is None and self.rng.random() < 0.3:
            instance_id = f"static-{group}-{self.seq}"
        if kind == "raw-thread":
            stop = threading.Event()
            rm = RawMember(self.address, group, TOPICS, name=name, session_ms=self.session_ms,
                           rebalance_ms=self.rebalance_ms, heartbeat_ms=self.heartbeat_ms)
            rm.crashed = False

            def life(rm=rm, stop=stop):
                try:
                    rm.run(stop, leave=True)
                except MemberGone:
                    pass
                except (OSError, ConnectionError, ValueError):
                    if not getattr(rm, "crashed", False):
                        self.thread_errors.append(f"{rm.name}: connection failed")
                except BaseException as exc:
                    if not getattr(rm, "crashed", False):
                        self.thread_errors.append(f"{rm.name}: {type(exc).__name__}: {exc}")
                finally:
                    with self.lock:
                        self.raw_commits += rm.commits_acked
                        self.raw_joins += rm.joins

            t = threading.Thread(target=life, name=name, daemon=True)
            t.start()
            handle = (t, stop, rm)
        else:
            env = dict(os.environ)
            env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
            if kind == "raw-proc":
                cfg = {"address": list(self.address), "group": group, "topics": TOPICS, "name": name,
                       "session_ms": self.session_ms, "rebalance_ms": self.rebalance_ms,
                       "heartbeat_ms": self.heartbeat_ms, "instance_id": instance_id}
                cmd = [sys.executable, "-m", "bench.soak", "--member", json.dumps(cfg)]
            else:
                cfg = {"client": kind, "bootstrap": self.bootstrap, "group": group, "topics": sorted(TOPICS),
                       "name": name, "session_ms": self.session_ms, "heartbeat_ms": self.heartbeat_ms,
                       "max_poll_ms": self.rebalance_ms, "assignor": "range"}
                cmd = [sys.executable, str(MEMBER_SCRIPT), json.dumps(cfg)]
            stderr = subprocess.DEVNULL
            if self.log_dir is not None:
                stderr = open(self.log_dir / f"{name}.stderr", "ab")
            handle = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr,
                                      cwd=str(REPO), env=env, start_new_session=True)
            if stderr is not subprocess.DEVNULL:
                stderr.close()
        member = Member(kind, group, name, handle, instance_id)
        self.members.append(member)
        self._count(kind, "started")
        return member

    def step(self) -> None:
        rng = self.rng
        for mem in [x for x in self.members if not x.alive()]:
            mem.reap()
            self.members.remove(mem)
        for group in self.group_names:
            live = [x for x in self.members if x.group == group]
            while len(live) < self.min_members:
                live.append(self.start_member(group))
        group = rng.choice(self.group_names)
        live = [x for x in self.members if x.group == group and time.monotonic() - x.started > 1.0]
        roll = rng.random()
        if roll < 0.4 and len([x for x in self.members if x.group == group]) < self.max_members:
            self.start_member(group)
        elif live and roll < 0.7:
            victim = rng.choice(live)
            victim.crash()
            self._count(victim.kind, "crashed")
            if victim.instance_id is not None:  # a static member comes back under the same id
                victim.reap()
                self.start_member(group, victim.kind, instance_id=victim.instance_id)
                self._count(victim.kind, "restarted_static")
        elif live:
            victim = rng.choice(live)
            victim.leave()
            self._count(victim.kind, "left")

    def run(self) -> dict:
        started = time.monotonic()
        self.checker.start()
        try:
            for group in self.group_names:
                self.start_member(group, "raw-thread")
            deadline = started + self.seconds
            while time.monotonic() < deadline:
                self.step()
                if self.checker.error is not None:
                    raise RuntimeError(f"checker failed: {self.checker.error!r}") from self.checker.error
                time.sleep(self.rng.uniform(0.5, 1.5) * self.action_every)
            # wind down: everyone leaves; every group must settle
            for mem in self.members:
                mem.leave()
            exit_deadline = time.monotonic() + 20
            while time.monotonic() < exit_deadline and any(x.alive() for x in self.members):
                time.sleep(0.1)
            # members crashed shortly before the end stay in their group until their session times
            # out, and a rebalance waits for them up to the rebalance timeout: allow the bound
            settle_deadline = time.monotonic() + max(self.bound_ms.values()) / 1000
            while time.monotonic() < settle_deadline:
                time.sleep(2 * self.poll_ms / 1000 + 0.05)
                if all(s in ("Empty", "Dead") for s, _ in self.checker.state.values()):
                    break
        finally:
            for mem in self.members:
                if mem.alive():
                    mem.crash()
                mem.reap()
            self.checker.stop.set()
            self.checker.join(15)
        final = {g: s for g, (s, _) in self.checker.state.items()}
        unsettled = {g: s for g, s in final.items() if s not in ("Empty", "Dead")}
        if unsettled:
            self.checker.violate("not_settled_after_everyone_left", groups=unsettled)
        c = self.checker
        return {
            "seconds": round(time.monotonic() - started, 1),
            "groups": len(self.group_names), "seed": self.seed,
            "session_ms": self.session_ms, "rebalance_ms": self.rebalance_ms,
            "members": self.counts,
            "raw_member_joins": self.raw_joins, "raw_member_commits_acknowledged": self.raw_commits,
            "polls": c.polls, "stable_observations_checked": c.stable_checked,
            "states_seen": c.states_seen,
            "longest_stay_s": {k: round(v, 3) for k, v in c.longest.items()},
            "bound_s": max(self.bound_ms.values()) / 1000,
            "flight_recorder": c.recorder_summary() if c.history_url else None,
            "offset_observations_checked": c.offsets_checked, "offset_keys": len(c.offsets),
            "final_states": final,
            "member_thread_errors": self.thread_errors[:20],
            "violations": c.violations,
        }


HERD_ARGS = ["--min-session-timeout-ms", "1000", "--metrics-port", "0", "--rebalance-history-size", "1000"]


def metrics_url(herd) -> str | None:
    """The flight recorder's base URL, from the daemon's "metrics listening" log line."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in herd.logs().splitlines():
            if '"metrics listening"' in line:
                ev = json.loads(line)
                return f"http://127.0.0.1:{ev['port']}"
        time.sleep(0.05)
    return None


def build_parser():
    from bench import _util as U

    ap = U.arg_parser("bench.soak", __doc__.split("\n")[0], "60 s")
    ap.add_argument("--seconds", type=float, default=None, help="default 600")
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--max-members", type=int, default=4, help="per group")
    ap.add_argument("--session-ms", type=int, default=3000)
    ap.add_argument("--rebalance-ms", type=int, default=4000)
    ap.add_argument("--action-every", type=float, default=0.4, help="mean seconds between churn actions")
    ap.add_argument("--no-real-clients", action="store_true", help="raw-protocol members only")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--member", metavar="JSON", help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    from bench import _util as U
    args = U.parse(build_parser(), argv, sized={"seconds": (60.0, 600.0)})
    if args.member:
        member_main(json.loads(args.member))
        return None
    seconds = args.seconds
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    with U.Herd(topics=[f"{t}:{n}" for t, n in TOPICS.items()], extra_args=HERD_ARGS) as herd:
        soak = Soak(("127.0.0.1", herd.port), herd.bootstrap, groups=args.groups, seconds=seconds, seed=seed,
                    real_clients=not args.no_real_clients, session_ms=args.session_ms,
                    rebalance_ms=args.rebalance_ms, max_members=args.max_members, action_every=args.action_every,
                    history_url=metrics_url(herd))
        res = soak.run()
        res["herd_alive"] = herd.proc.poll() is None
        res["herd_rss_mb"] = round(U.proc_rss_bytes(herd.pid) / 1e6, 1) if res["herd_alive"] else None
    res = {"bench": "soak", **res, "environment": U.environment(), "clients": U.client_versions()}
    U.emit(res)
    if res["violations"]:
        raise SystemExit(f"soak: {len(res['violations'])} invariant violations")


if __name__ == "__main__":
    main(sys.argv[1:])
