"""A scripted broker for the pure ConsumerCoordinator: a manual clock, no sockets, no sleeps."""

from __future__ import annotations

import random

from client.config import parse_config
from client.coordinator import (
    BOOTSTRAP,
    COORDINATOR,
    Connect,
    ConsumerCoordinator,
    Disconnect,
    Emit,
    Reply,
    Send,
    Stop,
)
from client.types import TopicPartition
from protocol import messages as m
from protocol.client_connection import CLIENT_VERSIONS
from protocol.consumer import (
    Assignment,
    Subscription,
    TopicPartitions,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

ALL_VERSIONS = {k: hi for k, (lo, hi) in CLIENT_VERSIONS.items()}


def tp(topic, partition):
    return TopicPartition(topic, partition)


def tps(topic, *partitions):
    return frozenset(TopicPartition(topic, p) for p in partitions)


def assignment_blob(parts, version=3, user_data=None):
    by = {}
    for t, p in sorted(parts):
        by.setdefault(t, []).append(p)
    return encode_assignment(
        Assignment(
            assigned_partitions=[TopicPartitions(topic=t, partitions=ps) for t, ps in by.items()],
            user_data=user_data,
        ),
        version,
    )


def subscription_blob(topics, owned=(), generation=-1, version=3, user_data=None):
    by = {}
    for t, p in sorted(owned):
        by.setdefault(t, []).append(p)
    from protocol.consumer import SubscriptionTopicPartitions

    return encode_subscription(
        Subscription(
            topics=list(topics),
            user_data=user_data,
            owned_partitions=[SubscriptionTopicPartitions(topic=t, partitions=ps) for t, ps in by.items()],
            generation_id=generation,
        ),
        version,
    )


class Harness:
    def __init__(self, versions=None, **config):
        defaults = dict(
            session_timeout_ms=10000,
            heartbeat_interval_ms=3000,
            max_poll_interval_ms=300000,
            retry_backoff_ms=100,
            retry_backoff_max_ms=1000,
            request_timeout_ms=30000,
        )
        defaults.update(config)
        self.cfg = parse_config("b1:9092,b2:9093", defaults.pop("group_id", "g"), **defaults)
        self.now = 100.0
        self.core = ConsumerCoordinator(self.cfg, self.now, rng=random.Random(7))
        self.versions = dict(ALL_VERSIONS if versions is None else versions)
        self.sends: list[Send] = []
        self.events: list = []
        self.replies: list[Reply] = []
        self.connects: list[Connect] = []
        self.disconnects: list[Disconnect] = []
        self.stopped = False

    # -- driving -------------------------------------------------------------------------------
    def pump(self):
        for a in self.core.take_actions():
            if isinstance(a, Send):
                self.sends.append(a)
            elif isinstance(a, Emit):
                self.events.append(a.event)
            elif isinstance(a, Reply):
                self.replies.append(a)
            elif isinstance(a, Connect):
                self.connects.append(a)
            elif isinstance(a, Disconnect):
                self.disconnects.append(a)
                # The network fails whatever was in flight on a dropped connection.
                for s in [s for s in self.sends if s.conn == a.conn]:
                    self.sends.remove(s)
            elif isinstance(a, Stop):
                self.stopped = True
        return self

    def tick(self, dt=0.0):
        self.now += dt
        self.core.tick(self.now)
        return self.pump()

    def call(self, method, *args, **kw):
        getattr(self.core, method)(*args, now=self.now, **kw)
        return self.pump()

    def live(self, seconds, step=1.0, poll=True):
        """Let time pass in steps, answering heartbeats OK (and polling, as a healthy user does)."""
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + step)
            if poll:
                self.core.poll(self.now)
            self.core.tick(self.now)
            self.pump()
            for hb in self.pending(m.HeartbeatRequest):
                self.sends.remove(hb)
                self.respond(hb, m.HeartbeatResponse())
        return self

    def connected(self, conn):
        assert any(c.conn == conn for c in self.connects), f"no Connect for {conn}: {self.connects}"
        self.connects = [c for c in self.connects if c.conn != conn]
        self.core.on_connected(conn, self.versions, self.now)
        return self.pump()

    def disconnected(self, conn, reason="test"):
        for s in [s for s in self.sends if s.conn == conn]:
            self.sends.remove(s)
        self.core.on_disconnected(conn, self.now, reason)
        return self.pump()

    def take(self, cls, conn=None) -> Send:
        for s in self.sends:
            if isinstance(s.request, cls) and (conn is None or s.conn == conn):
                self.sends.remove(s)
                return s
        raise AssertionError(
            f"no {cls.__name__} sent; pending: {[type(s.request).__name__ for s in self.sends]}"
        )

    def pending(self, cls) -> list:
        return [s for s in self.sends if isinstance(s.request, cls)]

    def respond(self, send: Send, response):
        self.core.on_response(send.conn, send.tag, response, self.now)
        return self.pump()

    def take_events(self, cls=None):
        out = [e for e in self.events if cls is None or isinstance(e, cls)]
        self.events = [e for e in self.events if not (cls is None or isinstance(e, cls))]
        return out

    def take_replies(self):
        out, self.replies = self.replies, []
        return out

    # -- scripted flows ------------------------------------------------------------------------
    def find_coordinator(self, host="c1", port=9092, node=1):
        if any(c.conn == BOOTSTRAP for c in self.connects):
            self.connected(BOOTSTRAP)
        s = self.take(m.FindCoordinatorRequest, BOOTSTRAP)
        self.respond(
            s,
            m.FindCoordinatorResponse(
                node_id=node,
                host=host,
                port=port,
                coordinators=[
                    m.FindCoordinatorResponseCoordinator(
                        key=self.cfg.group_id, node_id=node, host=host, port=port
                    )
                ],
            ),
        )
        for _ in range(50):  # the reconnect backoff may apply
            if any(c.conn == COORDINATOR and (c.host, c.port) == (host, port) for c in self.connects):
                break
            self.tick(0.05)
        assert any(c.conn == COORDINATOR and (c.host, c.port) == (host, port) for c in self.connects)
        return self.connected(COORDINATOR)

    def join_response(self, member="m1", generation=1, leader=None, members=None, protocol=None, error=0):
        protocol = protocol or self.core.assignors[0].name
        leader = member if leader is None else leader
        return m.JoinGroupResponse(
            error_code=error,
            generation_id=generation,
            protocol_type="consumer",
            protocol_name=protocol,
            leader=leader,
            member_id=member,
            members=members or [],
        )

    def answer_join(self, **kw):
        s = self.take(m.JoinGroupRequest)
        return self.respond(s, self.join_response(**kw)), s

    def answer_sync(self, parts, error=0):
        s = self.take(m.SyncGroupRequest)
        self.respond(
            s,
            m.SyncGroupResponse(
                error_code=error,
                protocol_type="consumer",
                protocol_name=self.core.protocol_name,
                assignment=assignment_blob(parts) if not error else b"",
            ),
        )
        return s

    def join_as_follower(self, parts, member="m1", generation=1):
        self.answer_join(member=member, generation=generation, leader="someone-else")
        self.answer_sync(parts)
        return self

    def first_join_fails(self, code, topics=("t",)):
        """Subscribe, find the coordinator, and answer the first JoinGroup with error ``code``."""
        self.call("subscribe", list(topics))
        self.find_coordinator()
        return self.respond(self.take(m.JoinGroupRequest), self.join_response(error=code, member=""))

    def stable_member(self, topics=("t",), parts=(), member="m1", generation=1):
        self.call("subscribe", list(topics))
        self.find_coordinator()
        self.join_as_follower(parts, member=member, generation=generation)
        assert self.core.state.value == "stable"
        return self


def metadata_response(counts: dict):
    return m.MetadataResponse(
        topics=[
            m.MetadataResponseTopic(
                name=t, partitions=[m.MetadataResponsePartition(partition_index=i) for i in range(n)]
            )
            for t, n in counts.items()
        ]
    )


def member_meta(member_id, protocol_blob, instance=None):
    return m.JoinGroupResponseMember(member_id=member_id, group_instance_id=instance, metadata=protocol_blob)


def decode_join_subscription(join_send: Send, name=None):
    req = join_send.request
    proto = req.protocols[0] if name is None else next(p for p in req.protocols if p.name == name)
    return decode_subscription(proto.metadata)


def requests_in(data: bytes):
    """The (header, request) pairs a client connection wrote in ``data``."""
    from protocol.framing import FrameDecoder
    from protocol.headers import decode_request_header

    out = []
    for payload in FrameDecoder().feed(data):
        header, pos = decode_request_header(payload)
        out.append((header, m.REQUESTS[header.api_key].decode(payload, header.api_version, pos)))
    return out
