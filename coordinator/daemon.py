"""The daemon ``herd serve`` runs: :func:`build_daemon` builds every object from the settings, and
:meth:`Daemon.run` serves until a signal.

One node and a cluster node are the same daemon built with different objects:

* a :class:`Node` (:class:`SingleNode`: the file store, every shard this process's for good;
  :class:`ClusterMember`: a :class:`~coordinator.cluster.node.ClusterNode`, shards held by leases in
  PostgreSQL) that gives the runtime its ownership and topic store
  (:class:`coordinator.runtime.Ownership`, :class:`coordinator.runtime.TopicStore`) and the catalog
  its routing (:class:`coordinator.core.catalog.Routing`) at their construction, and says how this node
  starts serving and stops (:meth:`Node.start`, :meth:`Node.leave`);
* the store it opens (``FileStore`` or ``PgStore``).

:meth:`Daemon.serve` is the one start-up and shutdown order: bind the listener (and the metrics
port), install the signal handlers, the node starts (the file store: open and replay every shard; a
cluster: read the topics and join), write the port file, tell systemd READY; on SIGTERM, SIGINT or
SIGHUP: tell systemd STOPPING, the node leaves (a cluster hands its shards over), stop accepting,
answer parked requests, close the store, stop.
"""
from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from coordinator import config as cfg
from coordinator import logging_setup

if TYPE_CHECKING:
    from coordinator.core.catalog import Routing
    from coordinator.runtime import Ownership, TopicStore

# the young generation's collection threshold (allocations); see Daemon.start_ops
YOUNG_GC_THRESHOLD = 20_000


class StartError(Exception):
    """A mistake the user can fix (a setting, a busy port, a locked data directory, a database that
    refuses us): printed as one line, exit code 2."""


class Node(Protocol):
    """How this process holds shards, as the daemon drives it (see the module docstring)."""

    ownership: Ownership  # given to the runtime
    topic_store: TopicStore | None  # given to the runtime (None: topics are records of shard 0)
    routing: Routing | None  # given to the catalog (None: this node alone)

    def lock(self):
        """Before the event loop starts: an open file locking what this process alone may use
        (the file store's data directory; StartError when another herd has it), or None."""

    def collectors(self) -> list:
        """Metric collectors of its own (``() -> [lines]``)."""

    def http_checks(self, groups) -> dict:
        """``HttpEndpoint``'s health arguments (``failed_shards``, ``readiness``)."""

    def warn(self, log) -> None:
        """Start-up warnings about the settings."""

    async def start(self, d: Daemon, stop: asyncio.Event) -> bool:
        """From opening the store to serving (the server accepts): False when ``stop`` was set
        before anything was served (the daemon then closes and exits 0)."""

    def stopping(self) -> tuple[str, dict]:
        """The log line that starts the shutdown."""

    async def leave(self, d: Daemon) -> None:
        """The first step of the shutdown, the listener still open."""

    async def shutdown(self, d: Daemon) -> None:
        """After the listener stopped accepting: answer parked requests (``Runtime.shutdown``) and
        close the store."""


class SingleNode:
    """This process alone, over the file store: every shard is loaded (replayed) before serving and
    stays this node's; a shard whose write failed stays FAILED until restart."""

    topic_store = None
    routing = None

    def __init__(self, config: cfg.Config, store):
        from coordinator.runtime import OwnsEveryShard

        self.config = config
        self.store = store
        self.ownership = OwnsEveryShard()

    def lock(self):
        return _lock_data_dir(Path(self.config.data_dir))

    def collectors(self) -> list:
        return []

    def http_checks(self, groups) -> dict:
        return {"failed_shards": lambda: groups.failed_shards}

    def warn(self, log) -> None:
        if self.config.fsync == "never":
            log.warning("fsync=never: acknowledged commits can be lost on a crash; use only for benchmarks")
        elif self.config.fsync == "interval":
            log.info("fsync=interval: commits are acknowledged once written to the OS; a power loss or OS crash "
                     "can lose about the last fsync_interval_ms of them",
                     fsync_interval_ms=self.config.fsync_interval_ms)

    async def start(self, d: Daemon, stop: asyncio.Event) -> bool:
        from coordinator.store import StoreError
        from coordinator.store.logformat import LogCorruptError

        config, runtime, metrics, log = self.config, d.runtime, d.metrics, d.log
        try:
            await self.store.open()
        except LogCorruptError as exc:
            raise StartError(f"{exc} (start with --repair to cut the log at the damage)") from None
        except StoreError as exc:
            raise StartError(str(exc)) from None
        except OSError as exc:  # e.g. a shard file this user may not write
            where = f" ({exc.filename})" if exc.filename else ""
            raise StartError(f"cannot open the logs in {config.data_dir}{where}: {exc.strerror}") from None
        gc.disable()  # replay builds millions of long-lived objects: no point scanning them meanwhile
        try:
            stats = await runtime.load_owned(stop)
        finally:
            gc.enable()
        if stats is None:  # stopped before the replay ended: nothing was served, nothing is written
            return False
        gc.freeze()  # and keep them out of every later collection
        metrics.replay_seconds, metrics.replay_records = stats["seconds"], stats["records"]
        log.info("replayed", records=stats["records"], seconds=stats["seconds"],
                 groups=len(d.groups.list_groups()))
        runtime.start(d.loop)
        d.start_ops()
        await d.server.start()
        log.info("listening", host=d.host, port=d.port, advertised=f"{d.adv_host}:{d.adv_port}",
                 data_dir=str(config.data_dir), fsync=config.fsync, offsets_partitions=config.offsets_partitions,
                 security_protocol=config.security_protocol)
        return True

    def stopping(self) -> tuple[str, dict]:
        return "stopping: answering parked requests and flushing the log", {}

    async def leave(self, d: Daemon) -> None:
        pass

    async def shutdown(self, d: Daemon) -> None:
        d.stop_ops()
        d.runtime.shutdown()
        await self.store.close()


class ClusterMember:
    """A node of a cluster (``store = postgresql://...``): the shards are loaded as their leases are
    won, not at start. Every failure to join (database unreachable, login refused, no such database,
    another ``offsets_partitions``, a duplicate live ``node_id``) is one line (StartError)."""

    def __init__(self, config: cfg.Config, store, node):
        self.config = config
        self.store = store
        self.node = node  # coordinator.cluster.node.ClusterNode
        self.ownership = node
        self.topic_store = node
        self.routing = node.routing

    def lock(self):
        return None  # a cluster node keeps nothing in data_dir (several nodes may share a directory)

    def collectors(self) -> list:
        return [self.node.metric_lines]

    def http_checks(self, groups) -> dict:
        return {"readiness": self.node.readiness}

    def warn(self, log) -> None:
        pass

    async def start(self, d: Daemon, stop: asyncio.Event) -> bool:
        from coordinator.cluster.errors import ClusterError
        from coordinator.store import StoreError

        config, runtime = self.config, d.runtime
        try:
            await self.store.open(cluster_id=config.cluster_id)
        except (ClusterError, StoreError) as exc:
            raise StartError(str(exc)) from None
        try:
            try:
                await self.node.open(runtime)
            except (ClusterError, StoreError) as exc:
                raise StartError(str(exc)) from None
            runtime.start(d.loop)
            d.start_ops()
            await d.server.start()
            try:
                await self.node.start(d.adv_host, d.adv_port)
            except (ClusterError, StoreError) as exc:
                raise StartError(str(exc)) from None
        except BaseException:
            d.server.stop_accepting()
            runtime.shutdown()
            await self.store.close(timeout=1.0)
            raise
        d.log.info("listening", host=d.host, port=d.port, advertised=f"{d.adv_host}:{d.adv_port}",
                   store=config.store_display, node_id=config.node_id, offsets_partitions=config.offsets_partitions,
                   shard_lease_ms=config.shard_lease_ms, security_protocol=config.security_protocol)
        return True

    def stopping(self) -> tuple[str, dict]:
        return "stopping: handing the shards over", {"shards": len(self.node.leases.held())}

    async def leave(self, d: Daemon) -> None:
        await self.node.stop()  # still listening meanwhile: clients are told NOT_COORDINATOR and look again

    async def shutdown(self, d: Daemon) -> None:
        d.stop_ops()
        d.runtime.shutdown()
        await self.store.close(timeout=5.0)


def build_daemon(config: cfg.Config, repair: bool = False) -> Daemon:
    """Every object of ``herd serve`` from ``config`` (one line, StartError, for a setting that cannot
    be used); nothing listens and nothing is opened until :meth:`Daemon.run`."""
    from coordinator.clock import SystemClock
    from coordinator.core.catalog import Catalog
    from coordinator.core.coordinator import GroupCoordinator
    from coordinator.edge.security import SecurityError
    from coordinator.edge.security import load as load_security
    from coordinator.edge.server import Server
    from coordinator.ops.console import Console, make_source
    from coordinator.ops.metrics import Metrics, install_collectors
    from coordinator.runtime import Runtime

    log = _configure_logging(config)
    try:
        security = load_security(config)
    except SecurityError as exc:
        raise StartError(str(exc)) from None
    clock = SystemClock()
    if config.store == "file":
        from coordinator.store.filelog import FileStore

        store = FileStore(Path(config.data_dir), config.offsets_partitions, fsync=config.fsync, repair=repair,
                          fsync_interval_ms=config.fsync_interval_ms)
        node = SingleNode(config, store)
    else:
        from coordinator.cluster.node import ClusterNode
        from coordinator.cluster.pgstore import PgStore

        store = PgStore(config.store_url, config.offsets_partitions, config.node_id)
        node = ClusterMember(config, store, ClusterNode(config, store, clock))
    groups = GroupCoordinator(config.group_config(), node_id=config.node_id)
    catalog = Catalog(config, node_id=config.node_id, routing=node.routing)
    data = None
    if config.data_bootstrap_server:  # the data cluster is the catalog (and the lag's log ends)
        from coordinator.ops import datacatalog

        try:
            data = datacatalog.from_config(config, catalog, clock)
        except ValueError as exc:
            raise StartError(str(exc)) from None
    runtime = Runtime(config, groups, catalog, store, clock=clock, ownership=node.ownership,
                      topic_store=node.topic_store, data=data, acl_store=node.topic_store)
    metrics = Metrics()
    # authorization (authorizer = acl): the gate at the edge; a cluster node keeps the ACLs in the
    # database (its topic store, the ClusterNode, is the runtime's acl_store too)
    from coordinator.core.auth.principal import parse_rules
    from coordinator.edge.authorization import build as build_gate

    gate = build_gate(config, runtime.acls.authorizer, catalog, metrics.authorization_failures)
    rules = None
    if gate is not None and config.security_protocol in ("SSL", "SASL_SSL"):
        rules = parse_rules(config.ssl_principal_mapping_rules)
    server = Server(config, runtime, metrics, security, gate=gate, principal_rules=rules)
    install_collectors(metrics, groups, store, server)
    metrics.collectors.extend(node.collectors())
    if data is not None:
        metrics.collectors.append(data.metric_lines)
    try:
        source = make_source(config, data.reader if data is not None else None)
    except ValueError as exc:
        raise StartError(str(exc)) from None
    console = Console(config, groups, source=source, now_ms=runtime.now_ms)
    metrics.collectors.append(console.metric_lines)
    return Daemon(config, log=log, node=node, store=store, groups=groups, catalog=catalog, runtime=runtime,
                  metrics=metrics, server=server, console=console, data=data)


def _configure_logging(config: cfg.Config):
    logging_setup.configure(config.log_level, config.log_format)
    log = logging_setup.get("herd")
    for key, meant in cfg.unknown_env(os.environ):
        log.warning("ignoring an environment variable that is not a setting", variable=key, did_you_mean=meant)
    for key, value in sorted(os.environ.items()):
        if key[5:].lower() in cfg.FIELDS and cfg.service_link(key, value):
            log.info(f"ignoring {key}: it is a Kubernetes service link, not a port", value=value)
    return log


def _lock_data_dir(path: Path):
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartError(f"cannot create data directory {path}: {exc.strerror}") from None
    try:
        fh = open(path / ".lock", "a+")
    except OSError as exc:
        raise StartError(f"cannot open the lock file {path / '.lock'}: {exc.strerror}") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise StartError(f"data directory {path} is in use by another herd process") from None
    return fh


class Daemon:
    """What :func:`build_daemon` built; :meth:`run` serves it."""

    def __init__(self, config: cfg.Config, *, log, node: Node, store, groups, catalog, runtime, metrics, server,
                 console, data=None):
        self.config = config
        self.log = log
        self.node = node
        self.store = store
        self.groups = groups
        self.catalog = catalog
        self.runtime = runtime
        self.metrics = metrics
        self.server = server
        self.console = console
        self.data = data  # the data cluster as the catalog (coordinator.ops.datacatalog), or None
        self.http = None
        self.lag = None  # the LoopLag, started by the node once serving
        self.loop: asyncio.AbstractEventLoop | None = None
        self.host, self.port, self.adv_host, self.adv_port = "", 0, "", 0

    def start_ops(self) -> None:
        """What watches and shows the running daemon, the same on a single node and a cluster
        node: GC tuning and its watch, stalls counted, the loop-lag probe, the console's log-end
        refresher (with a data cluster). Called by the node once its runtime runs."""
        from coordinator.ops.gcwatch import CHECK_DELAY_S, GcWatch, fork_check
        from coordinator.ops.looplag import LoopLag

        config, metrics = self.config, self.metrics
        # Requests allocate many short-lived objects and almost no cycles: collect the young
        # generation every 20,000 allocations instead of 700 (measured: GC was ~20% of commit CPU at
        # 700); GcWatch freezes what survives each collection, so none walks more than that. A
        # collection stops the loop ~1 us per young object (10-19 ms while a 10,000-member group
        # rejoined, turn trace); 5,000 was tried against it (RESULTS 15.5): no better tail, more
        # CPU while the group formed
        gc.set_threshold(YOUNG_GC_THRESHOLD, 10, 10)
        # The frozen set's periodic walk of everything runs in a forked child (gcwatch.fork_check)
        # where fork exists: the loop pays the fork, not the walk (issue 31 item 4); CHECK_DELAY_S
        # after the doubling that calls for it, not in the middle of the ramp-up that caused it.
        schedule = self.loop.call_soon_threadsafe
        check = fork_check(schedule) if hasattr(os, "fork") else None
        gcwatch = GcWatch(schedule=schedule, check=check, check_delay_s=CHECK_DELAY_S,
                          call_later=self.loop.call_later).install()
        metrics.collectors.append(gcwatch.metric_lines)
        # a burst of rebalance work (over a turn's budget) freezes its new objects at the end of
        # each of its turns instead of stopping for young collections that would free nothing
        # (GcWatch.freeze_young); ordinary turns keep the usual collections
        self.server.turns.after_turn = gcwatch.freeze_young
        self.runtime.stall_listeners.append(metrics.on_stall)
        self.console.start(self.loop)  # the log-end refresher, if a data cluster is known: its own task
        if self.data is not None:
            self.data.start(self.loop)  # its topics read again every data_metadata_refresh_interval_ms
        self.lag = LoopLag(stall_s=config.stall_threshold_ms / 1000 if config.stall_threshold_ms else None)
        self.lag.start(self.loop)
        metrics.collectors.append(self.lag.metric_lines)

    def stop_ops(self) -> None:
        self.console.stop()
        if self.data is not None:
            self.data.stop_soon()

    def run(self) -> int:
        """Serve on a uvloop event loop until a signal: the exit code (0), or StartError."""
        import uvloop

        config = self.config
        if config.port_file:
            parent = Path(config.port_file).resolve().parent
            if not parent.is_dir() or not os.access(parent, os.W_OK):
                raise StartError(f"cannot write port file {config.port_file}: {parent} is not a writable directory")
        lock = self.node.lock()
        if config.port_file:  # one left by a killed herd would name a dead port until this one is ready
            try:
                os.unlink(config.port_file)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if lock is not None:
                    lock.close()
                raise StartError(f"cannot remove the old port file {config.port_file}: {exc.strerror}") from None
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(self.serve())
        finally:
            if lock is not None:
                lock.close()

    async def serve(self) -> int:
        from coordinator.ops.httpauth import HttpAuthError, load_http_auth
        from coordinator.ops.metrics import HttpEndpoint
        from coordinator.ops.notify import Notifier

        config, log, node, server, runtime = self.config, self.log, self.node, self.server, self.runtime
        self.loop = loop = asyncio.get_running_loop()
        try:
            self.host, self.port = host, port = await server.bind()
        except OSError as exc:
            raise StartError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
        http = None
        if config.metrics_port is not None:  # bound first: a busy port fails before the replay
            http = HttpEndpoint(self.metrics, self.groups.iter_groups,
                                lambda g: self.groups.group_history(g, runtime.now_ms()),
                                **node.http_checks(self.groups))
            http.console = self.console
            if config.authorizer == "acl":  # the views show each principal what it may describe
                http.authorizer = runtime.acls.authorizer
            if config.http_auth_file is not None:
                try:
                    http.auth = load_http_auth(config.http_auth_file)
                except HttpAuthError as exc:
                    raise StartError(str(exc)) from None
            try:
                mport = await http.bind(config.metrics_host, config.metrics_port)
            except OSError as exc:
                raise StartError(f"cannot listen for metrics on {config.metrics_host}:{config.metrics_port}: "
                                 f"{exc.strerror}") from None
        self.http = http
        self.adv_host = config.advertised_host or (socket.getfqdn() if host in ("0.0.0.0", "::") else host)
        self.adv_port = config.advertised_port or port
        self.catalog.set_address(self.adv_host, self.adv_port)
        node.warn(log)
        # The signal handlers go in before the log is opened and replayed: as PID 1 in a container a
        # signal without a handler is ignored (a `docker stop` during a long replay waited for SIGKILL),
        # and a SIGTERM right after READY must stop cleanly.
        stop = asyncio.Event()
        received: list[str] = []

        def on_signal(sig: signal.Signals) -> None:
            received.append(sig.name)
            stop.set()

        # SIGHUP too (a closed terminal, as Kafka's LoggingSignalHandler): stop cleanly, not die; unless
        # it was ignored when herd started (nohup), which the JVM respects too
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            loop.add_signal_handler(sig, on_signal, sig)
        if http is not None:  # served from now on: /healthz answers "starting" while the log is replayed
            http.ready = False
            await http.start()
            log.info("metrics listening", host=config.metrics_host, port=mport)
        if self.data is not None:  # a first read of every topic (bounded); a --topic it lacks: one line
            try:
                await self.data.open(config.topics)
            except ValueError as exc:
                if http is not None:
                    http.close()
                server.stop_accepting()
                raise StartError(str(exc)) from None
        if not await node.start(self, stop):  # stopped before serving: nothing served, nothing written
            log.info("stopping before the replay ended", signal=received[0])
            if http is not None:
                http.close()
            server.stop_accepting()
            await self.store.close()
            log.info("stopped")
            return 0
        if http is not None:
            http.ready = True
        failure = None
        if config.port_file:
            tmp = Path(str(config.port_file) + ".tmp")
            try:
                tmp.write_text(f"{port}\n")
                os.replace(tmp, config.port_file)
            except OSError as exc:  # checked at start; the directory changed since: stop cleanly
                failure = StartError(f"cannot write port file {config.port_file}: {exc.strerror}")
        notifier = Notifier()  # systemd Type=notify (and the integration tests): ready, watchdog
        if failure is None:
            notifier.ready(f"listening on {host}:{port}")
            notifier.start_watchdog(loop)
            await stop.wait()

        message, fields = node.stopping()
        log.info(message, signal=received[0] if received else None, **fields)
        notifier.stopping()
        notifier.close()
        await node.leave(self)
        server.stop_accepting()
        if http is not None:
            http.close()
        await node.shutdown(self)
        await asyncio.sleep(0.05)  # let the last durable replies go out
        server.close_all()
        self.lag.stop()
        if config.port_file and failure is None:
            try:  # a port file left behind would tell a supervisor a stopped herd is listening
                os.unlink(config.port_file)
            except OSError:
                pass
        log.info("stopped", event_loop_lag=self.lag.summary())
        if failure is not None:
            raise failure
        return 0
