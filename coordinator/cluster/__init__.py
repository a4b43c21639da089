"""herd as a cluster: shards spread over nodes, their state in PostgreSQL (see DESIGN.md, "Growing
into a cluster").

- :mod:`coordinator.cluster.url`     the ``store`` setting's URL, parsed and redacted
- :mod:`coordinator.cluster.schema`  the tables, created and version-checked
- :mod:`coordinator.cluster.pgstore` the store of the shards this node owns (fenced writes)
- :mod:`coordinator.cluster.placement` the pure decisions: which shards to take or give up, when a
  lease must be renewed and when to stop serving (self-fencing)
- :mod:`coordinator.cluster.leases`  node membership and shard leases in the database
"""
