"""``herd serve``: run the daemon (every setting as a flag, HERD_* variable or TOML key).

The ``herd`` command (``herd_cli``) adds this module's ``serve`` parser next to ``herd groups``
(``admin/``); ``python -m coordinator serve ...`` runs it alone. Nothing here imports ``admin`` or
``client``.
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import gc
import os
import signal
import socket
import sys
from dataclasses import fields
from pathlib import Path

from coordinator import config as cfg

SERVE_HELP = {
    "host": "address to listen on",
    "port": "port to listen on (0 picks a free port)",
    "data_dir": "where the per-shard logs live",
    "port_file": "write the bound port to this file once listening",
    "fsync": "always: acknowledge commits after fsync (default); never: for benchmarks only",
    "advertised_host": "the host Metadata and FindCoordinator give clients (default: --host, or the "
                       "machine's FQDN when listening on 0.0.0.0 or ::)",
    "advertised_port": "the port given to clients (default: the bound port)",
    "metrics_port": "serve /metrics, /healthz, /readyz and the JSON views on this port (default: off)",
    "security_protocol": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "ssl_certfile": "the server's certificate chain, PEM (SSL, SASL_SSL)",
    "ssl_keyfile": "its private key, PEM (default: in the certificate file)",
    "ssl_key_password": "the private key's password (prefer HERD_SSL_KEY_PASSWORD: flags show in ps)",
    "ssl_cafile": "CA certificates, PEM, that sign client certificates",
    "ssl_client_auth": "none (default), requested or required: ask clients for a certificate",
    "sasl_mechanisms": "enabled SASL mechanisms (default: PLAIN,SCRAM-SHA-256,SCRAM-SHA-512)",
    "sasl_users_file": "user:password per line (SASL_PLAINTEXT, SASL_SSL); keep it mode 600",
    "data_bootstrap_server": "HOST:PORT[,HOST:PORT] of the Kafka cluster holding the partitions' records: "
                             "consumer lag on /metrics and the console (default: none, commit ages only)",
    "data_command_config": "TLS/SASL client properties file for --data-bootstrap-server (as herd groups "
                           "--command-config)",
    "lag_refresh_interval_ms": "how often the data cluster's log ends are read (default 30000)",
    "lag_metrics": "partition (default): lag per group, topic and partition; group: per group only",
    "max_buffered_bytes": "all connections' buffered requests and answers together; past it herd stops "
                          "reading from the connections that would add more (default: min(1 GiB, RAM/4))",
    "max_connections_per_ip": "connections one client address may hold (Kafka's max.connections.per.ip)",
    "sasl_handshake_timeout_ms": "close a SASL listener's connection not authenticated within this "
                                 "(default 10000)",
}


class CliError(Exception):
    """A mistake the user can fix: printed as one line, exit code 2."""


def _one_line_error(parser: argparse.ArgumentParser):
    """argparse prints the whole usage before an argument error; herd prints one line."""
    def error(message):
        parser.exit(2, f"herd: error: {parser.prog}: {message} (see --help)\n")
    return error


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="run the coordinator daemon",
                       description="Run the herd coordinator daemon.")
    p.error = _one_line_error(p)
    p.add_argument("--config", metavar="FILE.toml", help="TOML config file (keys as the flag names)")
    p.add_argument("--topic", dest="topics", action="append", metavar="NAME:PARTITIONS",
                   help="a topic to create at start-up (repeatable)")
    p.add_argument("--repair", action="store_true",
                   help="cut a shard log at damage found in the middle of it instead of refusing to start")
    for f in fields(cfg.Config):
        if f.name == "topics":
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = f.type if isinstance(f.type, str) else str(f.type)
        help_text = SERVE_HELP.get(f.name, f"default: {f.default}")
        if kind.startswith("bool"):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            p.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="herd", description="herd: a Kafka-protocol consumer-group coordinator")
    ap.error = _one_line_error(ap)
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return ap


def load_config(args) -> cfg.Config:
    overrides = {f.name: getattr(args, f.name, None) for f in fields(cfg.Config) if f.name != "topics"}
    if args.topics:
        overrides["topics"] = args.topics
    return cfg.load(args.config, os.environ, overrides)


def run(args) -> int:
    """Run ``herd serve`` as parsed into ``args``: its exit code; a setting or start-up mistake is
    printed as one line (exit 2)."""
    try:
        config = load_config(args)
        return serve(config, repair=args.repair)
    except (cfg.ConfigError, CliError) as exc:
        print(f"herd: error: {exc}", file=sys.stderr)
        return 2


def main(argv=None) -> int:
    """``python -m coordinator serve ...``: the daemon alone (``herd`` is ``herd_cli.main``)."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


# ---- serve ---------------------------------------------------------------------------------------

def _lock_data_dir(path: Path):
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create data directory {path}: {exc.strerror}") from None
    try:
        fh = open(path / ".lock", "a+")
    except OSError as exc:
        raise CliError(f"cannot open the lock file {path / '.lock'}: {exc.strerror}") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise CliError(f"data directory {path} is in use by another herd process") from None
    return fh


def serve(config: cfg.Config, repair: bool = False) -> int:
    import uvloop

    from coordinator import logging_setup
    logging_setup.configure(config.log_level, config.log_format)
    log = logging_setup.get("herd")
    for key, meant in cfg.unknown_env(os.environ):
        log.warning("ignoring an environment variable that is not a setting", variable=key, did_you_mean=meant)
    for key, value in sorted(os.environ.items()):
        if key[5:].lower() in cfg.FIELDS and cfg.service_link(key, value):
            log.info(f"ignoring {key}: it is a Kubernetes service link, not a port", value=value)
    if config.port_file:
        parent = Path(config.port_file).resolve().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise CliError(f"cannot write port file {config.port_file}: {parent} is not a writable directory")
    # a cluster node keeps nothing in data_dir (several nodes may share a working directory)
    lock = _lock_data_dir(Path(config.data_dir)) if config.store == "file" else None
    if config.port_file:  # one left by a killed herd would name a dead port until this one is ready
        try:
            os.unlink(config.port_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if lock is not None:
                lock.close()
            raise CliError(f"cannot remove the old port file {config.port_file}: {exc.strerror}") from None
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(_serve(config, repair))
    finally:
        if lock is not None:
            lock.close()


async def _serve(config: cfg.Config, repair: bool) -> int:
    from coordinator import logging_setup
    from coordinator.core.catalog import Catalog
    from coordinator.core.coordinator import GroupCoordinator
    from coordinator.edge.security import SecurityError
    from coordinator.edge.security import load as load_security
    from coordinator.edge.server import Server
    from coordinator.ops.console import Console, make_source
    from coordinator.ops.gcwatch import GcWatch
    from coordinator.ops.looplag import LoopLag
    from coordinator.ops.metrics import HttpEndpoint, Metrics, install_collectors
    from coordinator.ops.notify import Notifier
    from coordinator.runtime import Runtime
    from coordinator.store import StoreError
    from coordinator.store.filelog import FileStore
    from coordinator.store.logformat import LogCorruptError

    log = logging_setup.get("herd")
    loop = asyncio.get_running_loop()
    try:
        security = load_security(config)
    except SecurityError as exc:
        raise CliError(str(exc)) from None
    clustered = config.store != "file"
    if clustered:
        from coordinator.cluster.errors import ClusterError
        from coordinator.cluster.node import ClusterNode
        from coordinator.cluster.pgstore import PgStore

        store = PgStore(config.store_url, config.offsets_partitions, config.node_id)
    else:
        store = FileStore(Path(config.data_dir), config.offsets_partitions, fsync=config.fsync, repair=repair)
    groups = GroupCoordinator(config, node_id=config.node_id)
    catalog = Catalog(config, node_id=config.node_id)
    runtime = Runtime(config, groups, catalog, store)
    node = ClusterNode(config, runtime, catalog, store) if clustered else None
    metrics = Metrics()
    server = Server(config, runtime, metrics, security)
    install_collectors(metrics, groups, store, server)
    if node is not None:
        metrics.collectors.append(node.metric_lines)
    try:
        source = make_source(config)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    console = Console(config, groups, source=source, now_ms=runtime.now_ms)
    metrics.collectors.append(console.metric_lines)
    try:
        host, port = await server.bind()
    except OSError as exc:
        raise CliError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
    http = None
    if config.metrics_port is not None:  # bound first: a busy port fails before the replay
        http = HttpEndpoint(metrics, groups.iter_groups,
                            lambda g: groups.group_history(g, runtime.now_ms()),
                            failed_shards=None if clustered else (lambda: groups.failed_shards),
                            readiness=node.readiness if clustered else None)
        http.console = console
        try:
            mport = await http.bind(config.metrics_host, config.metrics_port)
        except OSError as exc:
            raise CliError(f"cannot listen for metrics on {config.metrics_host}:{config.metrics_port}: "
                           f"{exc.strerror}") from None
    adv_host = config.advertised_host or (socket.getfqdn() if host in ("0.0.0.0", "::") else host)
    catalog.set_address(adv_host, config.advertised_port or port)
    if config.fsync == "never" and not clustered:
        log.warning("fsync=never: acknowledged commits can be lost on a crash; use only for benchmarks")
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
    if clustered:
        return await _serve_cluster(config, log, loop, store, node, runtime, groups, server, http, metrics,
                                    stop, received, host, port, adv_host, ClusterError)
    try:
        await store.open()
    except LogCorruptError as exc:
        raise CliError(f"{exc} (start with --repair to cut the log at the damage)") from None
    except StoreError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:  # e.g. a shard file this user may not write
        where = f" ({exc.filename})" if exc.filename else ""
        raise CliError(f"cannot open the logs in {config.data_dir}{where}: {exc.strerror}") from None
    gc.disable()  # replay builds millions of long-lived objects: no point scanning them meanwhile
    try:
        stats = await runtime.load_owned(stop)
    finally:
        gc.enable()
    if stats is None:  # stopped before the replay ended: nothing was served, nothing is written
        log.info("stopping before the replay ended", signal=received[0])
        if http is not None:
            http.close()
        server.stop_accepting()
        await store.close()
        log.info("stopped")
        return 0
    gc.freeze()  # and keep them out of every later collection
    # Requests allocate many short-lived objects and almost no cycles: collect the young
    # generation every 20,000 allocations instead of 700 (measured: GC was ~20% of commit CPU at
    # 700); GcWatch freezes what survives each collection, so none walks more than that.
    gc.set_threshold(20_000, 10, 10)
    metrics.collectors.append(GcWatch(schedule=loop.call_soon_threadsafe).install().metric_lines)
    metrics.replay_seconds, metrics.replay_records = stats["seconds"], stats["records"]
    log.info("replayed", records=stats["records"], seconds=stats["seconds"], groups=len(groups.list_groups()))
    runtime.stall_listeners.append(metrics.on_stall)
    runtime.start(loop)
    console.start(loop)  # the log-end refresher, if a data cluster is known: its own task
    lag = LoopLag(stall_s=config.stall_threshold_ms / 1000 if config.stall_threshold_ms else None).start(loop)
    metrics.collectors.append(lag.metric_lines)
    await server.start()
    log.info("listening", host=host, port=port, advertised=f"{adv_host}:{config.advertised_port or port}",
             data_dir=str(config.data_dir), fsync=config.fsync, offsets_partitions=config.offsets_partitions,
             security_protocol=config.security_protocol)
    if http is not None:
        http.ready = True
    failure = None
    if config.port_file:
        tmp = Path(str(config.port_file) + ".tmp")
        try:
            tmp.write_text(f"{port}\n")
            os.replace(tmp, config.port_file)
        except OSError as exc:  # checked at start; the directory changed since: stop cleanly
            failure = CliError(f"cannot write port file {config.port_file}: {exc.strerror}")
    notifier = Notifier()  # systemd Type=notify (and the integration tests): ready, watchdog
    if failure is None:
        notifier.ready(f"listening on {host}:{port}")
        notifier.start_watchdog(loop)
        await stop.wait()

    log.info("stopping: answering parked requests and flushing the log", signal=received[0] if received else None)
    notifier.stopping()
    notifier.close()
    server.stop_accepting()
    if http is not None:
        http.close()
    console.stop()
    runtime.shutdown()
    await store.close()
    await asyncio.sleep(0.05)  # let the last durable replies go out
    server.close_all()
    lag.stop()
    if config.port_file and failure is None:
        try:  # a port file left behind would tell a supervisor a stopped herd is listening
            os.unlink(config.port_file)
        except OSError:
            pass
    log.info("stopped", event_loop_lag=lag.summary())
    if failure is not None:
        raise failure
    return 0


async def _serve_cluster(config, log, loop, store, node, runtime, groups, server, http, metrics, stop, received,
                         host, port, adv_host, ClusterError) -> int:
    """``herd serve --store postgresql://...``: the shards are loaded as their leases are won, not at
    start. Every failure to join (database unreachable, login refused, no such database, another
    ``offsets_partitions``, a duplicate live ``node_id``) is one line (CliError, exit 2)."""
    from coordinator.ops.looplag import LoopLag
    from coordinator.ops.notify import Notifier
    from coordinator.store import StoreError

    adv_port = config.advertised_port or port
    try:
        await store.open(cluster_id=config.cluster_id)
    except (ClusterError, StoreError) as exc:
        raise CliError(str(exc)) from None
    try:
        try:
            await node.load_topics()
        except (ClusterError, StoreError) as exc:
            raise CliError(str(exc)) from None
        runtime.start(loop)
        lag = LoopLag().start(loop)
        metrics.collectors.append(lag.metric_lines)
        await server.start()
        try:
            await node.start(adv_host, adv_port)
        except (ClusterError, StoreError) as exc:
            raise CliError(str(exc)) from None
    except BaseException:
        server.stop_accepting()
        runtime.shutdown()
        await store.close(timeout=1.0)
        raise
    log.info("listening", host=host, port=port, advertised=f"{adv_host}:{adv_port}", store=config.store_display,
             node_id=config.node_id, offsets_partitions=config.offsets_partitions,
             shard_lease_ms=config.shard_lease_ms, security_protocol=config.security_protocol)
    if http is not None:
        http.ready = True
    failure = None
    if config.port_file:
        tmp = Path(str(config.port_file) + ".tmp")
        try:
            tmp.write_text(f"{port}\n")
            os.replace(tmp, config.port_file)
        except OSError as exc:
            failure = CliError(f"cannot write port file {config.port_file}: {exc.strerror}")
    notifier = Notifier()
    if failure is None:
        notifier.ready(f"listening on {host}:{port}")
        notifier.start_watchdog(loop)
        await stop.wait()
    log.info("stopping: handing the shards over", signal=received[0] if received else None,
             shards=len(node.leases.held()))
    notifier.stopping()
    notifier.close()
    await node.stop()  # still listening meanwhile: clients are told NOT_COORDINATOR and look again
    server.stop_accepting()
    if http is not None:
        http.close()
    runtime.shutdown()
    await store.close(timeout=5.0)
    await asyncio.sleep(0.05)
    server.close_all()
    lag.stop()
    if config.port_file and failure is None:
        try:
            os.unlink(config.port_file)
        except OSError:
            pass
    log.info("stopped", event_loop_lag=lag.summary())
    if failure is not None:
        raise failure
    return 0


if __name__ == "__main__":
    sys.exit(main())
