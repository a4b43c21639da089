"""One node of a cluster: the PostgreSQL store and the lease manager wired into the runtime.

``herd serve --store postgresql://...`` (:func:`coordinator.daemon.build_daemon`) builds a
:class:`ClusterNode` first and gives it to the runtime at construction as its ownership
(:class:`coordinator.runtime.Ownership`) and topic store (:class:`coordinator.runtime.TopicStore`),
and its :class:`Routing` to the catalog. ``open(runtime)`` names the runtime whose shards it loads
and unloads from then on. It is the lease manager's :class:`~coordinator.cluster.leases.ShardOwner`:

- ``acquired(shard, epoch)``: ``store.grant``; the shard goes LOADING (COORDINATOR_LOAD_IN_PROGRESS),
  its records are replayed (``Runtime.load_shard``), then ACTIVE: its members get a fresh session
  deadline, as Kafka gives the members of a group it loads. A shard that was FAILED (a write failed
  in the database) is unloaded first and loaded again with the new epoch.
- ``lost(shard)``: ``store.disown``, unloaded now (NOT_COORDINATOR).
- ``releasing(shard)``: unloaded first (no new request is taken: NOT_COORDINATOR), then the writes
  already made are settled (``store.drain``; their answers still leave once durable), then disowned.

As the runtime's ownership: ``guard`` (self-fencing on the request path: a process woken from
SIGSTOP serves nothing it may no longer serve, whatever ran first), ``shard_failed`` (a FAILED shard
is reloaded through ``LeaseManager.request_reload`` once the database answers); as its topic store:
``put`` (the topic catalog in ``herd_topics``: first writer wins; the others' topics are read in
every renewal interval). The catalog routes through :class:`Routing`.

Metrics (``herd_cluster_*``) and readiness (``/readyz``: the database answered within a lease) come
from here too.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import time

from coordinator import logging_setup
from coordinator.cluster.leases import LeaseManager
from coordinator.cluster.pgstore import PgStore
from coordinator.core.auth.acls import decode_acl_key
from coordinator.core.catalog import decode_topic_record, topic_key
from coordinator.runtime import FAILED, LOADING, NOT_OWNED

log = logging_setup.get("herd.cluster")

# upper bounds (seconds) of the shard load and database round-trip histograms
LOAD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROUNDTRIP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class Routing:
    """The catalog's view of the cluster (:class:`coordinator.core.catalog.Routing`: pure reads of the
    lease manager's last tick)."""

    def __init__(self, node: ClusterNode):
        self.node = node

    def brokers(self, me: tuple[int, str, int]) -> list[tuple[int, str, int]]:
        leases = self.node.leases
        others = [(n.node_id, n.host, n.port) for n in leases.nodes if n.node_id != me[0]] \
            if leases is not None else []
        return sorted([me, *others])

    def coordinator(self, shard: int, me: tuple[int, str, int]) -> tuple[int, str, int] | None:
        """The live owner of ``shard`` by a view no older than a lease; None: not known now."""
        node = self.node
        leases = node.leases
        if leases is None or not leases.fresh():
            return None
        owner = leases.owner_of(shard)
        if owner is None:
            return None
        if owner == node.node_id:  # ours by the view, but lost or handed over since: ask again
            return node.address if node.serves(shard) else None
        for n in leases.nodes:
            if n.node_id == owner:
                return n.node_id, n.host, n.port
        return None


class ClusterNode:
    def __init__(self, config, store: PgStore, clock):
        self.config = config
        self.node_id = config.node_id
        self.store = store
        self.clock = clock
        self.routing = Routing(self)  # the catalog's, at its construction
        self.runtime = None  # the runtime whose shards this node loads (open)
        self.leases: LeaseManager | None = None
        self.address: tuple[int, str, int] | None = None
        self._fence_at = 0  # monotonic ms of the earliest self-fencing deadline (0: look again)
        self._gen = [0] * config.offsets_partitions  # per shard: bumped by every acquired/lost/releasing
        self._topics: dict[str, bytes] = {}  # name -> record as last read from the database
        self._topic_task: asyncio.Task | None = None
        self._topics_stopped = False
        self._acl_keys: list[bytes] | None = None  # the ACL records as last read from the database
        self.started = False
        # figures for metrics
        self.loads = 0
        self.load_failures = 0
        self.load_buckets = [0] * (len(LOAD_BUCKETS) + 1)
        self.load_seconds = 0.0
        self.roundtrip_buckets = [0] * (len(ROUNDTRIP_BUCKETS) + 1)
        self.roundtrip_seconds = 0.0
        self.reloads = 0

    # ---- lifecycle -------------------------------------------------------------------------------

    def attach(self, runtime) -> None:
        """The runtime (built with this node as its ownership) whose shards this node loads and
        unloads as leases are won and lost."""
        self.runtime = runtime

    async def open(self, runtime) -> None:
        """Before serving: :meth:`attach` ``runtime`` and read the database's topics into its
        catalog and its ACLs (``ClusterError``/``StoreError`` when the database cannot be used)."""
        self.attach(runtime)
        await self.load_topics()
        await self.load_acls()

    def serves(self, shard: int) -> bool:
        return self.runtime is not None and self.runtime.shard_states[shard] != NOT_OWNED

    async def load_topics(self) -> int:
        """Replay the database's topics into the catalog (before serving, then every interval);
        once serving, consumer groups see topics made on another node."""
        changed = []
        for name, record in await self.store.load_topics():
            if self._topics.get(name) != record:
                self._topics[name] = record
                changed.append((topic_key(name), record))
        return self.runtime.replay_topics(changed)

    async def load_acls(self) -> bool:
        """Make the runtime's ACLs the database's (before serving, then every renewal interval, so
        a change made on any node applies everywhere within one lease tick). -> changed."""
        keys = await self.store.load_acls()
        if keys == self._acl_keys:
            return False
        self._acl_keys = keys
        self.runtime.acls.authorizer.replace(decode_acl_key(k) for k in keys)
        return True

    async def put_acl(self, key: bytes, value: bytes | None) -> None:
        """``Runtime.acl_store``: an ACL created (value) or deleted (None) goes to the database."""
        await self.store.put_acl(key, value)
        self._acl_keys = None  # read them back at the next refresh

    async def start(self, host: str, port: int) -> None:
        """Join the cluster: register (a duplicate live node_id: DuplicateNodeError, one line), take
        a first share of the shards and keep renewing. The runtime must have started (its loop)."""
        config = self.config
        self.address = (self.node_id, host, port)
        self.leases = LeaseManager(config.store_url, self.node_id, config.offsets_partitions, self,
                                   host=host, port=port, lease_ms=config.shard_lease_ms, clock=self.clock)
        self.leases.on_roundtrip = self._roundtrip
        await self.leases.start(wait_ms=config.shard_lease_ms)
        self.started = True
        self._topic_task = asyncio.get_running_loop().create_task(self._refresh_topics())

    async def stop(self) -> None:
        """SIGTERM: hand every shard over (the others take them at once), leave the cluster."""
        if self._topic_task is not None:
            self._topics_stopped = True  # the loop's own check, should the cancel be swallowed (gh-86296)
            self._topic_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._topic_task
        if self.leases is not None:
            await self.leases.stop()

    async def _refresh_topics(self) -> None:
        every = max(self.leases.table.renew_every_ms / 1000, 0.05)
        while not self._topics_stopped:
            await asyncio.sleep(every)
            if self._topics_stopped:
                return
            try:
                await self.load_topics()
                await self.load_acls()
            except Exception as exc:  # noqa: BLE001 - the database is down: the next round tries again
                log.debug("topics not refreshed", error=str(exc))

    # ---- the runtime's ownership and topic store --------------------------------------------------

    def guard(self) -> None:
        """Before a group request or heartbeat: stop serving the shards whose lease may have lapsed
        (one comparison unless a deadline has passed)."""
        if self.leases is None:
            return
        now = self.clock.monotonic_ms()
        if now >= self._fence_at:
            self.leases.fence()
            deadline = self.leases.table.next_deadline()
            self._fence_at = math.inf if deadline is None else deadline

    def shard_failed(self, shard: int) -> bool:
        """A write of ``shard`` failed in the database: take it again with a fresh epoch (once the
        database answers) and load it; meanwhile it answers COORDINATOR_NOT_AVAILABLE."""
        if self.leases is None:
            return False
        self.reloads += 1
        self.leases.request_reload(shard)
        return True

    async def put(self, key: bytes, value: bytes) -> bytes:
        """:class:`coordinator.runtime.TopicStore`: keep a topic record in the database; -> the
        stored one."""
        name, _ = decode_topic_record(key, None)
        stored = await self.store.put_topic(name, value)
        self._topics[name] = stored
        return stored

    # ---- ShardOwner ------------------------------------------------------------------------------

    async def acquired(self, shard: int, epoch: int) -> None:
        self._gen[shard] += 1
        gen = self._gen[shard]
        self._fence_at = 0
        runtime = self.runtime
        self.store.grant(shard, epoch)
        if runtime.shard_states[shard] != NOT_OWNED:  # a reload after a failed write
            runtime.unload_shard(shard)
        started = time.perf_counter()
        try:
            records = await runtime.load_shard(shard)
        except BaseException:
            if self._gen[shard] == gen:
                self.load_failures += 1
                if runtime.shard_states[shard] == LOADING:
                    runtime.unload_shard(shard)
            raise
        seconds = time.perf_counter() - started
        self.loads += 1
        self.load_seconds += seconds
        self.load_buckets[_bucket(LOAD_BUCKETS, seconds)] += 1
        log.info("shard loaded", shard=shard, epoch=epoch, records=records, seconds=round(seconds, 3))

    def lost(self, shard: int) -> None:
        self._gen[shard] += 1
        self.store.disown(shard)
        if self.runtime.shard_states[shard] != NOT_OWNED:
            self.runtime.unload_shard(shard)

    async def releasing(self, shard: int) -> None:
        self._gen[shard] += 1
        if self.runtime.shard_states[shard] != NOT_OWNED:
            self.runtime.unload_shard(shard)
        await self.store.drain()
        self.store.disown(shard)

    # ---- operating -------------------------------------------------------------------------------

    def _roundtrip(self, seconds: float) -> None:
        self.roundtrip_seconds += seconds
        self.roundtrip_buckets[_bucket(ROUNDTRIP_BUCKETS, seconds)] += 1

    def readiness(self) -> str | None:
        """None when ready; else why not (for /readyz)."""
        if not self.started or self.leases is None:
            return "not ready: joining the cluster"
        if not self.leases.fresh():
            return "not ready: the database has not answered within a lease (shard_lease_ms)"
        return None

    def metric_lines(self) -> list[str]:
        from coordinator.ops.metrics import Histogram, _family

        leases = self.leases
        states = self.runtime.shard_states if self.runtime is not None else ()
        lines = _family("herd_cluster_shards_owned", "gauge", "Shards whose lease this node holds.",
                        [("", len(leases.held()) if leases else 0)])
        lines += _family("herd_cluster_shards", "gauge", "Shards of this node by state (loading, active, failed).",
                         [(f'{{state="{s}"}}', sum(1 for x in states if x == s)) for s in (LOADING, "active", FAILED)])
        lines += _family("herd_cluster_nodes", "gauge", "Live nodes of the cluster by the last lease tick.",
                         [("", len(leases.nodes) if leases else 0)])
        lines += _family("herd_cluster_lease_renewals_total", "counter", "Shard leases renewed.",
                         [("", leases.renewals if leases else 0)])
        lines += _family("herd_cluster_lease_acquisitions_total", "counter", "Shard leases taken.",
                         [("", leases.acquisitions if leases else 0)])
        lines += _family("herd_cluster_lease_losses_total", "counter", "Shard leases lost (not renewed in time, "
                         "self-fenced, or taken by another node).", [("", leases.losses if leases else 0)])
        lines += _family("herd_cluster_lease_failed_ticks_total", "counter", "Lease rounds that could not reach "
                         "the database.", [("", leases.failed_ticks if leases else 0)])
        lines += _family("herd_cluster_shard_reloads_total", "counter", "Shards reloaded after a write failed in "
                         "the database.", [("", self.reloads)])
        lines += _family("herd_cluster_shard_load_failures_total", "counter", "Shard loads that did not finish.",
                         [("", self.load_failures)])
        loads = Histogram("herd_cluster_shard_load_duration_seconds", "Time to load (replay) a shard won.",
                          buckets=LOAD_BUCKETS)
        loads.series[()] = list(self.load_buckets[:-1]) + [round(self.load_seconds, 6), self.loads]
        lines += loads.render()
        rt = Histogram("herd_cluster_db_roundtrip_seconds", "Round trip of the lease heartbeat statement "
                       "(one UPDATE) to the database.", buckets=ROUNDTRIP_BUCKETS)
        rt.series[()] = list(self.roundtrip_buckets[:-1]) + [round(self.roundtrip_seconds, 6),
                                                             sum(self.roundtrip_buckets)]
        lines += rt.render()
        store = self.store
        lines += _family("herd_store_transactions_total", "counter", "Write transactions committed in the "
                         "database.", [("", store.transactions)])
        lines += _family("herd_store_failed_transactions_total", "counter", "Write transactions that failed.",
                         [("", store.failed_transactions)])
        lines += _family("herd_store_transaction_seconds_total", "counter", "Time spent in committed write "
                         "transactions (round trip included).", [("", round(store.txn_seconds_total, 6))])
        return lines


def _bucket(bounds, value: float) -> int:
    for i, bound in enumerate(bounds):
        if value <= bound:
            return i
    return len(bounds)
