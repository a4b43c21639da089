"""The pure core: groups, offsets, the catalog and the shard that holds them. No I/O, no clock
reads, no daemon settings: every operation takes the time as an argument and returns records and
replies. Imports only ``protocol`` and ``coordinator.core`` (tests/test_layering.py checks it).

``classic/``   the classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup)
``consumer/``  KIP-848's ``consumer`` groups (ConsumerGroupHeartbeat)
``shard``      one shard: its groups, offsets and timers; ``coordinator`` routes to the shards
"""
