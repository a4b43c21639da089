"""``herd groups`` when the coordinator FindCoordinator names is down (a cluster node that died and
whose lease has not ended yet): it asks again until the group moves, and otherwise says what happened
in one line (issue 33 item 4)."""
from __future__ import annotations

import socket

import pytest

from admin.errors import CliError
from admin.session import Cluster, Deadline
from protocol import errors as E
from protocol import messages as m


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connecting is refused
    return port


class Bootstrap:
    """The bootstrap connection: FindCoordinator answers from a script (node, port) per call."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = 0
        self.versions = {}
        self.host, self.port, self.node_id = "127.0.0.1", 1, None

    def call(self, build):
        self.calls += 1
        node, port = self.answers[min(self.calls, len(self.answers)) - 1]
        build(4)
        return m.FindCoordinatorResponse(coordinators=[m.FindCoordinatorResponseCoordinator(
            key="g", node_id=node, host="127.0.0.1", port=port, error_code=E.NONE)]), 4


def cluster_with(boot, seconds):
    c = Cluster([("127.0.0.1", 1)], Deadline(seconds))
    c._bootstrap = boot
    return c


def test_a_dead_coordinator_is_named_with_what_to_do():
    dead = closed_port()
    c = cluster_with(Bootstrap([(2, dead)]), 1.0)
    with pytest.raises(CliError) as info:
        c.coordinator("g")
    text = str(info.value)
    assert f"the coordinator of group 'g' is node 2 at 127.0.0.1:{dead}, which cannot be reached" in text
    assert "lease ends" in text and "--timeout" in text
    assert "\n" not in text


def test_the_group_is_followed_to_its_new_coordinator(monkeypatch):
    dead = closed_port()
    boot = Bootstrap([(2, dead), (2, dead), (3, 9093)])
    c = cluster_with(boot, 5.0)
    reached = []
    real_node = Cluster.node

    def node(self, node_id):
        if node_id == 3:  # the live node the shard moved to
            reached.append(node_id)
            return "conn-3"
        return real_node(self, node_id)

    monkeypatch.setattr(Cluster, "node", node)
    assert c.coordinator("g") == "conn-3"
    assert boot.calls == 3 and reached == [3] and c.coordinators == {"g": 3}
