"""build_daemon: one node and a cluster node differ only by the objects given to the runtime and the
catalog at construction; building opens, locks and binds nothing (Daemon.run does, tested by
tests/integration/test_startup.py and tests/cluster/test_serve.py)."""
from __future__ import annotations

import pytest

from coordinator.cluster.node import ClusterNode
from coordinator.cluster.pgstore import PgStore
from coordinator.config import Config
from coordinator.core.catalog import ThisNodeOnly
from coordinator.daemon import ClusterMember, SingleNode, StartError, build_daemon
from coordinator.runtime import OwnsEveryShard
from coordinator.store.filelog import FileStore


def test_one_node_owns_every_shard_routes_to_itself_and_keeps_topics_in_shard_0(tmp_path):
    data = tmp_path / "data"
    d = build_daemon(Config(data_dir=data, offsets_partitions=3))
    assert isinstance(d.node, SingleNode) and isinstance(d.store, FileStore)
    assert isinstance(d.runtime.ownership, OwnsEveryShard) and d.runtime.topic_store is None
    assert isinstance(d.catalog.routing, ThisNodeOnly)
    assert d.runtime.ownership.shard_failed(0) is False  # FAILED until restart
    assert d.catalog.brokers() == [(0, d.catalog.host, d.catalog.port)]
    assert not data.exists()  # nothing opened or locked before run()


def test_a_cluster_node_is_the_runtimes_ownership_and_topic_store_and_the_catalogs_routing(tmp_path):
    d = build_daemon(Config(data_dir=tmp_path / "data", store="postgresql://u@127.0.0.1:1/db", node_id=2,
                            offsets_partitions=3))
    assert isinstance(d.node, ClusterMember) and isinstance(d.store, PgStore)
    node = d.node.node
    assert isinstance(node, ClusterNode) and node.store is d.store
    assert d.runtime.ownership is node and d.runtime.topic_store is node
    assert d.catalog.routing is node.routing
    assert node.shard_failed(0) is False  # not joined yet: nothing to reload
    assert d.catalog.coordinator("g") is None  # no lease view yet: COORDINATOR_NOT_AVAILABLE, not a guess
    assert node.metric_lines in d.metrics.collectors


def test_a_setting_that_cannot_be_used_is_one_line_at_build_time(tmp_path):
    with pytest.raises(StartError, match="cannot read .*none.pem"):
        build_daemon(Config(data_dir=tmp_path, security_protocol="SSL", ssl_certfile=str(tmp_path / "none.pem")))


def test_a_data_cluster_is_the_catalog_given_to_the_runtime_and_shares_the_lag_reader(tmp_path):
    from coordinator.ops.datacatalog import DataCatalog

    d = build_daemon(Config(data_dir=tmp_path / "data", data_bootstrap_server="127.0.0.1:1",
                            data_metadata_refresh_interval_ms=700))
    assert isinstance(d.data, DataCatalog) and d.runtime.data is d.data
    assert d.catalog.data is d.data.view and d.data.on_change == d.runtime.topics_changed
    assert d.data.interval_ms == 700
    assert d.console.refresher.source is d.data.reader  # one reader: one connection per broker
    assert d.data.metric_lines in d.metrics.collectors
    assert build_daemon(Config(data_dir=tmp_path / "data")).runtime.data is None  # herd's own catalog


def test_a_data_command_config_that_cannot_be_read_is_one_line_at_build_time(tmp_path):
    with pytest.raises(StartError, match="data_command_config"):
        build_daemon(Config(data_dir=tmp_path, data_bootstrap_server="127.0.0.1:1",
                            data_command_config=str(tmp_path / "missing.properties")))
