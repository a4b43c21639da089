"""Runtime.replay_steps: the start-up replay in steps, so herd serve turns its event loop (/healthz,
signals) during a long replay; stepping changes nothing in what is replayed."""
from __future__ import annotations

from coordinator.config import Config
from coordinator.core import records as R
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.ops.metrics import HttpEndpoint, Metrics
from coordinator.runtime import Runtime


class _Store:
    def set_listener(self, listener) -> None:
        pass


def _runtime() -> Runtime:
    config = Config(offsets_partitions=2)
    return Runtime(config, GroupCoordinator(config.group_config(), node_id=0), Catalog(config, node_id=0), _Store())


def _shards():
    entries = {0: [], 1: []}
    for i in range(8):
        entries[i % 2].append((R.offset_commit_key(f"g{i % 2}", "t", i), R.offset_commit_value(100 + i, -1, "", 0)))
    return entries


def test_replay_steps_pause_every_n_records_and_replay_the_same_offsets():
    stepped = _runtime()
    steps = stepped.replay_steps(_shards(), every=3)
    paused_at = []
    while True:
        try:
            paused_at.append(next(steps))
        except StopIteration as done:
            stats = done.value
            break
    assert paused_at == [3, 6] and stats["records"] == 8
    whole = _runtime()
    assert whole.replay(_shards())["records"] == 8
    assert stepped.groups.list_groups() == whole.groups.list_groups()
    assert [s.offsets.committed for s in stepped.groups.shards] == [s.offsets.committed for s in whole.groups.shards]
    assert sum(len(p) for s in whole.groups.shards for t in s.offsets.committed.values() for p in t.values()) == 8


def test_http_endpoint_before_ready_is_alive_not_ready():
    failed: list[int] = []
    http = HttpEndpoint(Metrics(), lambda: [], lambda g: None, failed_shards=lambda: failed)
    http.ready = False
    assert http.route("/healthz")[0::2] == (200, b"starting: replaying the log\n")
    assert http.route("/readyz")[0] == 503
    assert http.route("/metrics")[0] == 503 and http.route("/groups")[0] == 503
    http.ready = True
    assert http.route("/readyz")[0::2] == (200, b"ready\n")
    assert http.route("/healthz")[0::2] == (200, b"ok\n")
    failed.append(3)
    assert http.route("/readyz")[0] == 503 and http.route("/healthz")[0] == 503
