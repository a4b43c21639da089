"""``herd serve``: run the daemon (every setting as a flag, HERD_* variable or TOML key): the
arguments parsed into a :class:`~coordinator.config.Config`, then
``coordinator.daemon.build_daemon(config).run()``.

The ``herd`` command (``herd_cli``) adds this module's ``serve`` parser next to ``herd groups``
(``admin/``); ``python -m coordinator serve ...`` runs it alone. Nothing here imports ``admin`` or
``client``.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from coordinator import config as cfg
from coordinator.daemon import StartError

SERVE_HELP = {
    "host": "address to listen on",
    "port": "port to listen on (0 picks a free port)",
    "data_dir": "where the per-shard logs live",
    "port_file": "write the bound port to this file once listening",
    "fsync": "always: acknowledge commits after fsync (default); interval: once written to the OS, fsynced "
             "every --fsync-interval-ms (Kafka's default guarantee); never: for benchmarks only",
    "fsync_interval_ms": "with --fsync interval: how often the log is fdatasynced (default 1000)",
    "advertised_host": "the host Metadata and FindCoordinator give clients (default: --host, or the "
                       "machine's FQDN when listening on 0.0.0.0 or ::)",
    "advertised_port": "the port given to clients (default: the bound port)",
    "metrics_port": "serve /metrics, /healthz, /readyz and the JSON views on this port (default: off)",
    "http_auth_file": "credentials the metrics port asks for: 'bearer <sha256-hex>' or 'basic <user> "
                      "<sha256-hex>' per line; /healthz and /readyz stay open (default: none)",
    "security_protocol": "PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
    "ssl_certfile": "the server's certificate chain, PEM (SSL, SASL_SSL)",
    "ssl_keyfile": "its private key, PEM (default: in the certificate file)",
    "ssl_key_password": "the private key's password (prefer HERD_SSL_KEY_PASSWORD: flags show in ps)",
    "ssl_cafile": "CA certificates, PEM, that sign client certificates",
    "ssl_client_auth": "none (default), requested or required: ask clients for a certificate",
    "sasl_mechanisms": "enabled SASL mechanisms (default: PLAIN,SCRAM-SHA-256,SCRAM-SHA-512)",
    "sasl_users_file": "user:password per line (SASL_PLAINTEXT, SASL_SSL); keep it mode 600",
    "ssl_principal_mapping_rules": "how a client certificate's subject becomes a principal: RULE:pattern/"
                                   "replacement/[L|U],...,DEFAULT (Kafka's ssl.principal.mapping.rules)",
    "authorizer": "none (default: every client may do everything) or acl (Kafka's ACLs, managed with "
                  "kafka-acls or herd acls)",
    "super_users": "principals allowed everything with --authorizer acl, e.g. 'User:admin;User:ops'",
    "allow_everyone_if_no_acl_found": "with --authorizer acl, allow a resource no ACL names (default: deny)",
    "data_bootstrap_server": "HOST:PORT[,HOST:PORT] of the Kafka cluster holding the partitions' records: "
                             "its topics are herd's (Metadata, ListOffsets), consumer lag on /metrics and the "
                             "console (default: none: herd's own catalog, commit ages only)",
    "data_command_config": "TLS/SASL client properties file for --data-bootstrap-server (as herd groups "
                           "--command-config)",
    "lag_refresh_interval_ms": "how often the data cluster's log ends are read (default 30000)",
    "data_metadata_refresh_interval_ms": "how often the data cluster's topics (partition counts, topic ids) "
                                         "are read again (default 30000)",
    "lag_metrics": "partition (default): lag per group, topic and partition; group: per group only",
    "max_buffered_bytes": "all connections' buffered requests and answers together; past it herd stops "
                          "reading from the connections that would add more (default: min(1 GiB, RAM/4))",
    "max_connections_per_ip": "connections one client address may hold (Kafka's max.connections.per.ip)",
    "sasl_handshake_timeout_ms": "close a SASL listener's connection not authenticated within this "
                                 "(default 10000)",
}


CliError = StartError  # a mistake the user can fix: printed as one line, exit code 2


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

def serve(config: cfg.Config, repair: bool = False) -> int:
    """Build the daemon from ``config`` and serve until a signal (:mod:`coordinator.daemon`)."""
    from coordinator.daemon import build_daemon

    return build_daemon(config, repair=repair).run()


if __name__ == "__main__":
    sys.exit(main())
