"""``herd groups`` against a three-node cluster: any node as bootstrap; list fans out to every node
of the Metadata (each lists the groups it coordinates), describe asks each group's coordinator."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cluster.load import Committer, find
from tests.cluster.nodes import Node
from tests.conformance.harness import Members, all_partitions, create_topic, wait_converged, wait_until
from tools.daemon import REPO

pytestmark = [pytest.mark.conformance, pytest.mark.integration]


def groups_tool(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "herd_cli", "groups", *args], capture_output=True, text=True,
                       cwd=str(REPO), timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_groups_list_and_describe_across_nodes(tmp_path, pg):
    nodes = [Node(tmp_path, i, pg.url, lease_ms=2000, initial_rebalance_delay_ms=500) for i in (1, 2, 3)]
    ms = Members(tmp_path)
    try:
        for n in nodes:
            n.spawn()
        for n in nodes:
            n.wait_ready()
        boot = ",".join(n.bootstrap for n in nodes)
        # one FindCoordinator per group id (asked twice, the owner may move in between: None the second time)
        wait_until(lambda: len({o.node_id for o in (find(nodes, f"p{i}") for i in range(30)) if o}) == 3,
                   20, "every node to own shards")
        # one committing (empty) group per node, and a live group of two members
        empty: dict[int, str] = {}
        for i in range(300):
            owner = find(nodes, f"idle-{i}")
            if owner is not None and owner.node_id not in empty:
                empty[owner.node_id] = f"idle-{i}"
            if len(empty) == 3:
                break
        load = [Committer(nodes, g, limit_s=30) for g in empty.values()]
        for c in load:
            c.start()
        wait_until(lambda: all(c.acks >= 3 for c in load), 20, "commits")
        for c in load:
            c.stop()
        create_topic(boot, "tool", 2)
        live = [ms.start("confluent", boot, "tool-live", ["tool"], f"t{k}") for k in range(2)]
        wait_converged(live, all_partitions("tool", 2), 60)
        live_owner = find(nodes, "tool-live")
        expected = set(empty.values()) | {"tool-live"}
        for via in nodes:  # any one node as bootstrap
            r = groups_tool("list", "--bootstrap-server", via.bootstrap, "--output", "json")
            assert r.returncode == 0, r.stderr
            listed = {g["group"]: g["state"] for g in json.loads(r.stdout)["groups"]}
            assert expected <= set(listed), (via.node_id, listed)
            assert listed["tool-live"] == "Stable" and all(listed[g] == "Empty" for g in empty.values())
        other = next(n for n in nodes if n is not live_owner)  # bootstrap: a node that is not its coordinator
        r = groups_tool("describe", "tool-live", "--members", "--bootstrap-server", other.bootstrap,
                        "--output", "json")
        assert r.returncode == 0, r.stderr
        (info,) = json.loads(r.stdout)["groups"]
        assert info["state"] == "Stable" and len(info["members"]) == 2
        assert (info["coordinator"]["id"], info["coordinator"]["port"]) == (live_owner.node_id, live_owner.port)
        r = groups_tool("describe", "--all-groups", "--bootstrap-server", nodes[0].bootstrap, "--output", "json")
        assert r.returncode == 0, r.stderr
        described = {g["group"]: g for g in json.loads(r.stdout)["groups"]}
        assert expected <= set(described)
        for g, c in zip(empty.values(), load, strict=True):
            assert [row["current_offset"] for row in described[g]["partitions"]] == [c.acked]
            assert described[g]["coordinator"]["id"] == find(nodes, g).node_id
        assert {d["coordinator"]["id"] for d in described.values()} == {1, 2, 3}
    finally:
        ms.cleanup()
        for n in nodes:
            n.stop()
