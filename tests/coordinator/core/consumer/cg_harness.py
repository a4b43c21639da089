"""A manual-clock harness for the consumer-group core: simulated clients that obey the protocol
(revoke what the coordinator stops listing, report what they own), a record log, and the checks
every test wants (no partition owned twice, memory equals the log replayed)."""
from __future__ import annotations

import hashlib

from coordinator.clock import ManualClock
from coordinator.core.consumer.groups import ConsumerGroupConfig, ConsumerGroups, StaticTopics
from protocol.messages import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatRequestTopicPartitions


def tid(name: str) -> bytes:
    return hashlib.md5(name.encode()).digest()


class Harness:
    def __init__(self, topics: dict[str, int] | None = None, config: ConsumerGroupConfig | None = None):
        self.clock = ManualClock()
        self.topics = StaticTopics({n: (tid(n), p) for n, p in (topics or {}).items()})
        self._ids = 0
        self.groups = ConsumerGroups(config or ConsumerGroupConfig(), self.topics, new_uuid=self._mint)
        self.log: list[tuple[bytes, bytes | None]] = []

    def _mint(self) -> str:
        self._ids += 1
        return f"minted-{self._ids}"

    @property
    def now(self) -> int:
        return self.clock.monotonic_ms()

    def set_topic(self, name: str, partitions: int) -> list:
        self.topics.topics[name] = (tid(name), partitions)
        recs = self.groups.topics_changed(self.now, self.clock.wall_ms())
        self.log.extend(recs)
        return recs

    def send(self, req, version: int = 1, client_id: str = "c", client_host: str = "/127.0.0.1"):
        recs, resp = self.groups.heartbeat(req, version, self.now, self.clock.wall_ms(), client_id, client_host)
        self.log.extend(recs)
        return resp

    def advance(self, ms: int) -> list:
        self.clock.advance(ms)
        recs = self.groups.on_timers(self.now, self.clock.wall_ms())
        self.log.extend(recs)
        return recs

    def group(self, gid: str = "g"):
        return self.groups.groups.get(gid)

    # ---- checks -------------------------------------------------------------------------------

    def replayed(self) -> ConsumerGroups:
        fresh = ConsumerGroups(self.groups.config, self.topics)
        for k, v in self.log:
            fresh.replay(k, v)
        fresh.on_loaded(self.now)
        return fresh

    def assert_replay_equivalent(self) -> None:
        fresh = self.replayed()
        assert snapshot(fresh) == snapshot(self.groups)


def snapshot(groups: ConsumerGroups) -> dict:
    out = {}
    for gid, g in groups.groups.items():
        g.settle()
        out[gid] = {
            "epoch": g.group_epoch, "assignment_epoch": g.assignment_epoch, "state": g.state,
            "metadata": dict(g.subscription_metadata), "target": dict(g.target),
            "static": dict(g.static_members), "partition_epochs": dict(g.partition_epochs),
            "members": {mid: {s: getattr(m, s) for s in m.__slots__} for mid, m in g.members.items()},
        }
    return out


class Client:
    """A consumer-protocol client that follows the rules: it owns exactly the partitions of the
    last assignment it received, and reports them in every heartbeat."""

    def __init__(self, h: Harness, member_id: str = "", group: str = "g", topics=("t",), regex=None,
                 instance_id=None, rebalance_timeout_ms: int = 30_000, assignor=None, version: int = 1):
        self.h = h
        self.group = group
        self.member_id = member_id
        self.epoch = 0
        self.topics = list(topics) if topics is not None else None
        self.regex = regex
        self.instance_id = instance_id
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.assignor = assignor
        self.version = version
        self.owned: dict[bytes, set[int]] = {}
        self.last = None
        self.stubborn = False  # never revokes: keeps what it owns whatever the coordinator says

    def _owned_wire(self):
        return [ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=t, partitions=sorted(ps))
                for t, ps in sorted(self.owned.items()) if ps]

    def join(self):
        self.epoch = 0
        self.owned = {}
        req = ConsumerGroupHeartbeatRequest(
            group_id=self.group, member_id=self.member_id, member_epoch=0, instance_id=self.instance_id,
            rebalance_timeout_ms=self.rebalance_timeout_ms, subscribed_topic_names=self.topics,
            subscribed_topic_regex=self.regex if self.version >= 1 else None, server_assignor=self.assignor,
            topic_partitions=[])
        return self._apply(self.h.send(req, self.version))

    def heartbeat(self):
        req = ConsumerGroupHeartbeatRequest(group_id=self.group, member_id=self.member_id,
                                            member_epoch=self.epoch, instance_id=self.instance_id,
                                            topic_partitions=self._owned_wire())
        return self._apply(self.h.send(req, self.version))

    def leave(self, epoch: int = -1):
        req = ConsumerGroupHeartbeatRequest(group_id=self.group, member_id=self.member_id, member_epoch=epoch,
                                            instance_id=self.instance_id)
        resp = self.h.send(req, self.version)
        if resp.error_code == 0:
            self.owned = {}
            self.epoch = epoch
        self.last = resp
        return resp

    def _apply(self, resp):
        self.last = resp
        if resp.error_code:
            return resp
        if resp.member_id:
            self.member_id = resp.member_id
        self.epoch = resp.member_epoch
        if resp.assignment is not None:
            new = {tp.topic_id: set(tp.partitions) for tp in resp.assignment.topic_partitions}
            if self.stubborn:
                for t, ps in self.owned.items():
                    new.setdefault(t, set()).update(ps)
            self.owned = new
        return resp

    def count(self) -> int:
        return sum(len(ps) for ps in self.owned.values())


def assert_never_owned_twice(clients) -> None:
    seen = {}
    for c in clients:
        for t, ps in c.owned.items():
            for p in ps:
                assert (t, p) not in seen, f"{t.hex()[:6]}/{p} owned by {seen[(t, p)]} and {c.member_id}"
                seen[(t, p)] = c.member_id


def run_rounds(h: Harness, clients, rounds: int = 20, step_ms: int = 1000) -> int:
    """Every client heartbeats once a round (in order), checking the invariant after each; returns
    the number of rounds until the group was Stable with every client at the group's epoch."""
    for r in range(rounds):
        for c in clients:
            c.heartbeat()
            assert_never_owned_twice(clients)
        h.advance(step_ms)
        g = h.group(clients[0].group)
        if g.settle() == "Stable" and all(c.epoch == g.assignment_epoch for c in clients):
            return r + 1
    raise AssertionError(f"not converged after {rounds} rounds: {h.group(clients[0].group).state}")
