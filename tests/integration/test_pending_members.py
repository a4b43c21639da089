"""A pending member id (KIP-394) whose connection closed before the member joined with it stops
holding its group's join phase at once (issue 33 item 7): herd's answer to a JoinGroup the client
had already given up on (read when herd resumed from a pause, or from a connection the client
closed) named an id nobody will use, which Kafka's rule would wait for until its session timeout."""
from __future__ import annotations

import json
import threading
import time

import pytest

from protocol import errors as E
from protocol import messages as m
from tools import console_scenario as sc
from tools.daemon import Daemon
from tools.rawclient import RawClient

pytestmark = [pytest.mark.integration]

SESSION_MS = 30_000
PROTOCOLS = [m.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]


def join(c, member_id="", protocols=PROTOCOLS):
    return c.call(m.JoinGroupRequest(group_id="g", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS,
                                     member_id=member_id, protocol_type="consumer", protocols=protocols), 5)


def test_a_pending_id_of_a_closed_connection_does_not_hold_the_rebalance(tmp_path):
    with Daemon(tmp_path / "data", "--metrics-port", "0") as d:
        a = RawClient(d.address, timeout=10)
        try:
            r = join(a)
            assert r.error_code == E.MEMBER_ID_REQUIRED
            me = r.member_id
            r = join(a, me)
            assert r.error_code == E.NONE and r.leader == me
            s = a.call(m.SyncGroupRequest(group_id="g", generation_id=r.generation_id, member_id=me,
                                          assignments=[m.SyncGroupRequestAssignment(member_id=me, assignment=b"")]), 3)
            assert s.error_code == E.NONE
            # another client's JoinGroup is answered MEMBER_ID_REQUIRED; it does not come back yet
            gone = RawClient(d.address, timeout=10)
            pending = join(gone)
            assert pending.error_code == E.MEMBER_ID_REQUIRED
            # the member rejoins (new metadata: a rebalance); the join phase waits for the pending id
            answer: list = []
            rejoin = threading.Thread(target=lambda: answer.append(
                join(a, me, [m.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x02")])))
            rejoin.start()
            time.sleep(1.0)
            assert not answer, "the join phase did not wait for the pending member"
            # the pending id's client goes away: the join phase completes now, not 30 s later
            closed = time.monotonic()
            gone.close()
            rejoin.join(10)
            took = time.monotonic() - closed
            assert answer and answer[0].error_code == E.NONE and answer[0].generation_id == 2, answer
            assert took < 3.0, took
        finally:
            a.close()
        status, _, body = sc.get(sc.metrics_port(d), "/groups/g/history")
        assert status == 200
        history = json.loads(body)
        records = history["rebalances"] if isinstance(history, dict) else history
        [rebalance] = [h for h in records if h["generation"] == 2]
        assert [(p["member_id"], p["outcome"]) for p in rebalance["pending"]] == \
            [(pending.member_id, "connection_closed")]
