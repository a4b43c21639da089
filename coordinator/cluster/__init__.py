"""herd as a cluster: shards spread over nodes, their state in PostgreSQL (see DESIGN.md, "Growing
into a cluster").

- :mod:`coordinator.cluster.url`       the ``store`` setting's URL, parsed; shown only redacted
- :mod:`coordinator.cluster.db`        ``connect(url)``: one clear line for every failure to connect
- :mod:`coordinator.cluster.schema`    the tables, created once and version-checked
- :mod:`coordinator.cluster.pgstore`   ``PgStore``: the records of the shards this node owns,
  written with fencing (the runtime's store contract)
- :mod:`coordinator.cluster.placement` the pure decisions: shares, and until when a lease may be
  served (self-fencing)
- :mod:`coordinator.cluster.leases`    ``LeaseManager``: membership and shard leases in the database
- :mod:`coordinator.cluster.errors`    the typed failures (the Store interface's, for writes)
- :mod:`coordinator.cluster.node`      ``ClusterNode``: the store and the leases wired into the runtime
  (the ShardOwner, the runtime's ownership and topic store, the catalog's routing, metrics,
  readiness); ``coordinator.daemon.ClusterMember`` runs it

How ``herd serve --store postgresql://...`` wires it (``coordinator/daemon.py``, ``node.py``)::

    url = config.store_url
    store = PgStore(url, config.offsets_partitions, config.node_id)
    await store.open(cluster_id=config.cluster_id)     # schema created/checked: SchemaError,
                                                       # StoreConnectError (one line, exit 2)
    node = ClusterNode(config, store, clock)           # ownership, topic store, routing
    runtime = Runtime(config, ..., store, ownership=node, topic_store=node)  # submit / flush / listener
    catalog: await store.load_topics(), await store.put_topic(name, record) (first writer wins)
    leases = LeaseManager(url, config.node_id, config.offsets_partitions, owner,
                          host=advertised_host, port=advertised_port, lease_ms=config.shard_lease_ms)
    await leases.start(wait_ms=config.shard_lease_ms)  # DuplicateNodeError: one line, exit 2
    ... on SIGTERM: await leases.stop() (hands every shard over), then await store.close()

``owner`` (a ShardOwner, the runtime's side):

- ``acquired(shard, epoch)``: ``store.grant(shard, epoch)``; shard LOADING; ``await
  store.load(shard)``; replay; ACTIVE (members get a fresh session deadline, as Kafka gives loaded
  members)
- ``lost(shard)``: ``store.disown(shard)``; unload now (NOT_OWNED: NOT_COORDINATOR)
- ``releasing(shard)``: stop taking requests for it, ``await store.drain()``, ``store.disown``,
  unload

Request path: a group's shard is served only while ``leases.serving(shard)`` (a comparison with the
monotonic clock; a process woken from SIGSTOP may read requests before any timer fires).
FindCoordinator answers ``leases.owner_of(shard)`` from ``leases.nodes``; Metadata lists
``leases.nodes``. A write that fails with ``StoreUnavailableError``: the shard goes FAILED
(COORDINATOR_NOT_AVAILABLE) and the runtime calls ``leases.request_reload(shard)``, which takes it
again with a new epoch and calls ``acquired`` again. ``OwnershipLostError``: unload (NOT_OWNED).
"""
