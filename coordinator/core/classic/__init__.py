"""The classic group protocol: ``group`` (one group's state table) and ``groups`` (the shard's
handlers of JoinGroup, SyncGroup, Heartbeat, LeaveGroup and the rebalances)."""
