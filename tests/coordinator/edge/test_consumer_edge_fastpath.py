"""The edge's steady-state ConsumerGroupHeartbeat (``Connection.consumer_heartbeat_steady``)
against the full dispatch: the same scenario of requests is played on two daemons' worth of
objects (a manual clock each), one with the fast path and one with every ConsumerGroupHeartbeat
dispatched, and everything a client or the group can see must be identical: every answer's bytes
in order (errors included), connections closed, the session deadlines, the group's state and
epochs. The fast path must also have been taken (otherwise the comparison proves nothing)."""
from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from coordinator.clock import ManualClock
from coordinator.config import Config
from coordinator.core.catalog import Catalog
from coordinator.core.consumer.groups import SESSION
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.partitioning import shard_for
from coordinator.edge.server import Connection, Server
from coordinator.runtime import Runtime
from coordinator.store.filelog import LogStore
from protocol import errors as E
from protocol import messages as m
from protocol.headers import encode_request_header
from tests.coordinator.edge.test_server_fastpath import FakeTransport, answers, decode, run, turns, until

CG = m.ConsumerGroupHeartbeatRequest
TP = m.ConsumerGroupHeartbeatRequestTopicPartitions
GID = "cg-fast"
MEMBERS = ("member-a-0123456789abcd", "member-b-0123456789abcd")


def raw(request, version: int, cid: int, client_id: str) -> bytes:
    out = bytearray(b"\x00\x00\x00\x00")
    encode_request_header(out, request.API_KEY, version, cid, client_id)
    request.encode_into(out, version)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


class Daemon:
    def __init__(self, tmp: Path, fast: bool):
        self.clock = ManualClock(1_000_000)
        self.config = Config(data_dir=str(tmp), fsync="never", offsets_partitions=4, initial_rebalance_delay_ms=0,
                             topics=(("t", 6),))
        self.store = LogStore(tmp, self.config.offsets_partitions, fsync="never")
        self.fast = fast
        self.dispatched = 0  # ConsumerGroupHeartbeats that reached Runtime.dispatch
        self.cid = 0

    async def __aenter__(self):
        self.store.open(latest_only=True)
        self.groups = GroupCoordinator(self.config.group_config(), node_id=0)
        self.runtime = Runtime(self.config, self.groups, Catalog(self.config, node_id=0), self.store,
                               clock=self.clock)
        self.server = Server(self.config, self.runtime)
        self.server.loop = asyncio.get_running_loop()
        self.server.cg_fast = self.fast
        self.runtime.replay({})
        self.runtime.start(self.server.loop)
        dispatch = self.runtime.dispatch

        def counting(token, api_key, *a):
            self.dispatched += api_key == CG.API_KEY
            return dispatch(token, api_key, *a)

        self.runtime.dispatch = counting
        return self

    async def __aexit__(self, *exc):
        self.runtime.shutdown()
        self.store.close()

    def connect(self) -> tuple[Connection, FakeTransport]:
        tr = FakeTransport()
        conn = Connection(self.server)
        tr.protocol = conn
        conn.connection_made(tr)
        return conn, tr

    async def send(self, link, requests, client_id: str = "fast-test", cut: int = 0) -> list[bytes]:
        """Send ``[(request, version)]`` in ONE read on ``link``; -> the answers' bytes. ``cut``:
        drop that many bytes of the last frame's end (keeping its size prefix: malformed)."""
        conn, tr = link
        tr.data.clear()
        frames = []
        for req, version in requests:
            self.cid += 1
            frames.append(raw(req, version, self.cid, client_id))
        if cut:
            last = frames[-1]
            frames[-1] = struct.pack(">i", len(last) - 4 - cut) + last[4:-cut]
        conn.data_received(b"".join(frames))
        want = len(frames) - (1 if cut else 0)
        await turns()
        await until(lambda: len(answers(bytes(tr.data))) >= want or tr.aborted, tr)
        await turns()
        return answers(bytes(tr.data))

    def view(self) -> dict:
        """What the group looks like: state, epochs, each member's epoch and session deadline."""
        shard = self.groups.shards[shard_for(GID, self.config.offsets_partitions)]
        group = shard.consumer.groups.get(GID)
        if group is None:
            return {}
        return {"state": group.state, "epochs": (group.group_epoch, group.assignment_epoch),
                "members": {mid: (mm.member_epoch, mm.state, mm.client_id,
                                  shard.timers.deadline((SESSION, GID, mid)))
                            for mid, mm in sorted(group.members.items())}}


def acked(resp) -> list:
    return [TP(topic_id=tp.topic_id, partitions=sorted(tp.partitions)) for tp in resp.assignment.topic_partitions]


async def scenario(d: Daemon) -> list:
    log = []

    tid = d.runtime.catalog.get("t")[0]  # minted per daemon: the same placeholder in both logs

    def note(tag, got):
        log.append((tag, [g.replace(tid, b"T" * 16) for g in got], d.view()))
        return [decode(b, CG.API_KEY, 1)[1] for b in got]  # v0 and v1 answers are the same bytes

    a, b, a2 = d.connect(), d.connect(), d.connect()
    epoch = {}
    owned = {}

    def steady(mid, e=None, version=1):
        return CG(group_id=GID, member_id=mid, member_epoch=epoch[mid] if e is None else e), version

    # A joins and acknowledges its assignment
    ma, mb = MEMBERS
    (r,) = note("join a", await d.send(a, [(CG(group_id=GID, member_id=ma, member_epoch=0, rebalance_timeout_ms=30_000,
                                                subscribed_topic_names=["t"], topic_partitions=[]), 1)]))
    assert r.error_code == E.NONE and r.assignment is not None
    epoch[ma], owned[ma] = r.member_epoch, acked(r)
    (r,) = note("ack a", await d.send(a, [(CG(group_id=GID, member_id=ma, member_epoch=epoch[ma],
                                               topic_partitions=owned[ma]), 1)]))
    assert r.error_code == E.NONE
    # steady heartbeats, the clock moving: the session deadline follows each
    for i in range(3):
        d.clock.advance(1_000)
        note(f"steady a {i}", await d.send(a, [steady(ma)]))
    note("steady a v0", await d.send(a, [steady(ma, version=0)]))
    note("steady a x4 pipelined", await d.send(a, [steady(ma)] * 4))
    # errors, each answered as the full path does
    note("epoch too high", await d.send(a, [steady(ma, epoch[ma] + 1)]))
    note("epoch too low", await d.send(a, [steady(ma, epoch[ma] - 1)]))
    note("unknown member", await d.send(a, [steady("nobody-0123456789abcdef", 1)]))
    note("unknown group", await d.send(a, [(CG(group_id="no-such-group", member_id=ma, member_epoch=1), 1)]))
    note("blank group", await d.send(a, [(CG(group_id="  ", member_id=ma, member_epoch=1), 1)]))
    note("blank member", await d.send(a, [(CG(group_id=GID, member_id="  ", member_epoch=epoch[ma]), 1)]))
    # another client id: the member's metadata changes (a record), the answer is the same
    note("other client id", await d.send(a2, [steady(ma)], client_id="fast-test-2"))
    note("back to the first client id", await d.send(a, [steady(ma)]))
    # B joins in the same read as A's steady beat and A's next: A's answer waits for B's write
    got = note("join b + steady a", await d.send(a, [
        (CG(group_id=GID, member_id=mb, member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=["t"],
            topic_partitions=[]), 1), steady(ma), steady(ma)]))
    epoch[mb], owned[mb] = got[0].member_epoch, acked(got[0])
    pending = {mb: True}
    for resp in got[1:]:
        if resp.assignment is not None:
            owned[ma], pending[ma] = acked(resp), True
        epoch[ma] = resp.member_epoch
    # reconcile: acknowledge what each is given, heartbeat otherwise, until nothing changes
    for step in range(12):
        for mid, link in ((ma, a), (mb, b)):
            req = CG(group_id=GID, member_id=mid, member_epoch=epoch[mid],
                     topic_partitions=owned[mid] if pending.get(mid) else None)
            (resp,) = note(f"reconcile {step} {mid}", await d.send(link, [(req, 1)]))
            assert resp.error_code == E.NONE
            pending[mid] = resp.assignment is not None
            if resp.assignment is not None:
                owned[mid] = acked(resp)
            epoch[mid] = resp.member_epoch
        d.clock.advance(500)
    assert d.view()["state"] == "Stable"
    note("steady a and b", await d.send(b, [steady(ma), steady(mb), steady(mb, version=0)]))
    note("classic group id", await d.send(a, [(CG(group_id="classic-g", member_id=ma, member_epoch=1), 1)]))
    # a malformed (truncated) steady frame: the connection closes, the answers before it leave
    bad = d.connect()
    got = note("truncated", await d.send(bad, [steady(ma), steady(ma)], cut=3))
    log.append(("truncated closed", bad[0].closed or bad[1].aborted))
    # A leaves; its next steady beat is an unknown member's
    note("leave a", await d.send(a, [steady(ma, -1)]))
    note("steady after leave", await d.send(a, [steady(ma, epoch[ma])]))
    return log


def test_steady_consumer_heartbeats_answer_exactly_as_the_full_path(tmp_path):
    async def main():
        logs, dispatched = [], []
        for fast in (True, False):
            path = tmp_path / ("fast" if fast else "full")
            path.mkdir()
            async with Daemon(path, fast) as d:
                # a classic group of the id the scenario uses for "classic-g"
                conn, tr = d.connect()
                conn.data_received(raw(m.JoinGroupRequest(
                    group_id="classic-g", session_timeout_ms=60_000, rebalance_timeout_ms=60_000,
                    protocol_type="consumer", protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]),
                    3, 1, "fast-test"))
                await until(lambda t=tr: t.data, tr)
                logs.append(await scenario(d))
                dispatched.append(d.dispatched)
        fast_log, full_log = logs
        assert len(fast_log) == len(full_log)
        for f, s in zip(fast_log, full_log, strict=True):
            assert f == s, f[0]
        # the fast run answered the steady beats at the edge, the other dispatched everything
        assert dispatched[0] < dispatched[1] - 10
        assert ("truncated closed", True) in fast_log

    run(main())


def test_a_steady_heartbeat_the_edge_cannot_answer_waits_for_a_turn_once_the_budget_is_spent(tmp_path):
    """With a write of its shard in flight the steady-looking beat takes the full path: rebalance
    work, so after this turn's budget it waits in the turn FIFO (edge/turns.py) and is answered in
    a later turn, as the full path answers it."""
    async def main():
        async with Daemon(tmp_path, True) as d:
            link = d.connect()
            mid = MEMBERS[0]
            (r,) = await d.send(link, [(CG(group_id=GID, member_id=mid, member_epoch=0, rebalance_timeout_ms=30_000,
                                           subscribed_topic_names=["t"], topic_partitions=[]), 1)])
            r = decode(r, CG.API_KEY, 1)[1]
            (a,) = await d.send(link, [(CG(group_id=GID, member_id=mid, member_epoch=r.member_epoch,
                                           topic_partitions=acked(r)), 1)])
            epoch = decode(a, CG.API_KEY, 1)[1].member_epoch
            d.runtime._write_pending = lambda shard_id: True  # the edge's shortcut declines
            turns_ = d.server.turns
            assert not turns_.spent()  # opens a turn (its end scheduled) ...
            turns_.start -= 1.0  # ... whose budget is spent
            conn, tr = link
            tr.data.clear()
            before = d.dispatched
            conn.data_received(raw(CG(group_id=GID, member_id=mid, member_epoch=epoch), 1, 99, "fast-test"))
            assert conn.turn_waiting and d.dispatched == before and not tr.data  # waiting, not handled
            await until(lambda: answers(bytes(tr.data)), tr)
            (body,) = answers(bytes(tr.data))
            cid, resp = decode(body, CG.API_KEY, 1)
            assert cid == 99 and resp.error_code == E.NONE and resp.member_epoch == epoch
            assert d.dispatched == before + 1 and not conn.turn_waiting

    run(main())
