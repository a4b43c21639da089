"""herd's settings: one frozen dataclass, loaded from defaults < TOML file < HERD_* env < flags.

Every setting has the same name in all three places: ``offsets_partitions`` is
``--offsets-partitions``, ``HERD_OFFSETS_PARTITIONS`` and ``offsets_partitions = 50`` in TOML.
A bad value raises :class:`ConfigError` with one clear line; the CLI prints it and exits 2.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field, fields

INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    # where it listens and keeps its data
    #: address to listen on (`0.0.0.0` or `::`: every interface; then set `advertised_host`)
    host: str = "127.0.0.1"
    #: port to listen on; `0` picks a free port (see `port_file`).
    #: `make run` passes `--port` only for `make run PORT=...`; a `PORT` in the environment is not used
    port: int = 9092
    #: directory of the shard logs (the file store), created if missing; one herd per directory (a lock file)
    data_dir: str = "./herd-data"
    #: write the bound port to this file once listening (useful with `--port 0`); removed at a clean stop
    port_file: str | None = None
    #: Kafka: advertised.listeners
    #: the host Metadata and FindCoordinator give clients. Default: `host`, or the machine's FQDN
    #: (`socket.getfqdn()`) when `host` is `0.0.0.0` or `::`: that may be `localhost`, so set it
    advertised_host: str | None = None  # what Metadata/FindCoordinator tell clients (default: host)
    #: Kafka: advertised.listeners
    #: the port Metadata and FindCoordinator give clients (default: the bound port)
    advertised_port: int | None = None  # default: the bound port
    #: Kafka: node.id
    #: what Metadata and DescribeCluster report; in a cluster, each node's own id (a second live
    #: node with the same id is refused)
    node_id: int = 0
    #: Kafka: cluster.id
    #: what Metadata and DescribeCluster report
    cluster_id: str = "herd-cluster"

    # group coordinator (Kafka names in comments)
    #: Kafka: offsets.topic.num.partitions
    #: number of shards (offsets partitions); a group's shard is `shard_for(group_id, n)`. Fixed for the
    #: life of a data directory (and of a cluster's database)
    offsets_partitions: int = 50  # offsets.topic.num.partitions
    #: Kafka: group.initial.rebalance.delay.ms
    #: how long the first rebalance of an empty group waits for more members
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    #: Kafka: group.min.session.timeout.ms
    #: smallest session timeout a member may ask for
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    #: Kafka: group.max.session.timeout.ms
    #: largest session timeout a member may ask for
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    #: Kafka: group.max.size
    #: most members in one (classic) group
    group_max_size: int = INT32_MAX  # group.max.size
    #: Kafka: offsets.retention.minutes
    #: how long the offsets of an empty group are kept (10080: 7 days)
    offsets_retention_minutes: int = 10080  # offsets.retention.minutes (7 days)
    #: Kafka: offsets.retention.check.interval.ms
    #: how often expired offsets are removed
    offsets_retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms
    #: Kafka: offset.metadata.max.bytes
    #: longest commit metadata (counted in characters), else OFFSET_METADATA_TOO_LARGE
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes (counted in characters)

    # consumer groups (KIP-848, ConsumerGroupHeartbeat): the server decides both timeouts
    #: Kafka: group.consumer.session.timeout.ms
    #: a consumer-protocol (KIP-848) member not heard from this long is fenced; the server's, not the client's
    group_consumer_session_timeout_ms: int = 45000  # group.consumer.session.timeout.ms
    #: Kafka: group.consumer.min.session.timeout.ms
    #: lower bound of `group_consumer_session_timeout_ms` (checked at start-up)
    group_consumer_min_session_timeout_ms: int = 45000  # group.consumer.min.session.timeout.ms
    #: Kafka: group.consumer.max.session.timeout.ms
    #: upper bound of `group_consumer_session_timeout_ms` (checked at start-up)
    group_consumer_max_session_timeout_ms: int = 60000  # group.consumer.max.session.timeout.ms
    #: Kafka: group.consumer.heartbeat.interval.ms
    #: how often consumer-protocol members heartbeat (told in every ConsumerGroupHeartbeat answer);
    #: lower than the session timeout
    group_consumer_heartbeat_interval_ms: int = 5000  # group.consumer.heartbeat.interval.ms
    #: Kafka: group.consumer.min.heartbeat.interval.ms
    #: lower bound of `group_consumer_heartbeat_interval_ms`
    group_consumer_min_heartbeat_interval_ms: int = 5000  # group.consumer.min.heartbeat.interval.ms
    #: Kafka: group.consumer.max.heartbeat.interval.ms
    #: upper bound of `group_consumer_heartbeat_interval_ms`
    group_consumer_max_heartbeat_interval_ms: int = 15000  # group.consumer.max.heartbeat.interval.ms
    #: Kafka: group.consumer.max.size
    #: most members in one consumer group (GROUP_MAX_SIZE_REACHED)
    group_consumer_max_size: int = INT32_MAX  # group.consumer.max.size
    #: Kafka: group.consumer.assignors
    #: server-side assignors a member may name (`ServerAssignor`); the first is the default
    #: (UNSUPPORTED_ASSIGNOR for others)
    group_consumer_assignors: str = "uniform,range"  # group.consumer.assignors (the first is the default)
    #: Kafka: group.consumer.assignment.interval.ms
    #: least time between two runs of a consumer group's server-side assignor (KIP-1263): joins
    #: arriving together are assigned in one run; 0: every heartbeat that needs it runs it
    group_consumer_assignment_interval_ms: int = 0  # group.consumer.assignment.interval.ms
    #: the heartbeat interval told to a consumer-protocol member while it can only wait for its
    #: assignment (its join not yet assigned, held back by `group_consumer_assignment_interval_ms`,
    #: or partitions of its target still owned by members revoking them), if shorter; 0: always
    #: `group_consumer_heartbeat_interval_ms`, as Kafka (herd's own setting)
    group_consumer_pending_heartbeat_interval_ms: int = 1000

    # topic catalog
    #: Kafka: auto.create.topics.enable
    #: create a topic the first time a client asks for it in Metadata (never with
    #: `data_bootstrap_server`: a topic the data cluster lacks is UNKNOWN_TOPIC_OR_PARTITION)
    auto_create_topics: bool = True  # auto.create.topics.enable
    #: Kafka: num.partitions
    #: partitions of an auto-created topic
    default_partitions: int = 1  # num.partitions
    #: Kafka: kafka-topics.sh --create
    #: topics to create at start, `NAME:PARTITIONS` each (the count is required): `--topic orders:6`
    #: (repeatable), `HERD_TOPICS=orders:6,events:3`, `topics = ["orders:6"]` in the file; a topic herd
    #: already has keeps its partition count (it grows only by a larger count at start-up). With
    #: `data_bootstrap_server` the data cluster's topics are the catalog: `--topic` creates nothing, and
    #: a name the data cluster lacks stops `herd serve` with one line
    topics: tuple[tuple[str, int], ...] = ()  # --topic name:partitions

    # network and disk
    #: Kafka: socket.request.max.bytes (100 MiB)
    #: largest request frame (8 MiB); a bigger one closes the connection. Smaller than Kafka's: group
    #: requests are small, and one huge request would hold the event loop for seconds
    max_frame_size: int = 8 * 1024 * 1024  # Kafka: socket.request.max.bytes (100 MiB); see docs/configuration.md
    #: Kafka: connections.max.idle.ms
    #: close a connection idle this long
    connections_max_idle_ms: int = 600000  # connections.max.idle.ms
    #: Kafka: max.connections
    #: connections beyond this are closed at once (the refusals are logged at most once per 10 s)
    max_connections: int = 10000
    #: Kafka: queued.max.request.bytes
    #: unprocessed requests plus unsent answers of one connection; past it herd stops reading that socket
    max_pending_bytes_per_connection: int = 16 * 1024 * 1024
    #: Kafka: queued.max.request.bytes
    #: every connection's buffered requests and unsent answers together (a frame counted at its announced
    #: size once its prefix arrives); past it the connections that would add more stop being read until it
    #: fits again. Unset: min(1 GiB, a quarter of RAM)
    max_buffered_bytes: int | None = None
    #: Kafka: max.connections.per.ip
    #: connections one client address may hold; more are closed at once
    max_connections_per_ip: int = INT32_MAX
    #: on a SASL listener, a connection not authenticated this long after it opened is closed (idle
    #: sockets cannot hold the max_connections slots)
    sasl_handshake_timeout_ms: int = 10000
    #: `always`: a reply that wrote records is sent only after they are fsynced (PostgreSQL store:
    #: after the transaction committed); `interval`: sent once written to the OS (survives herd being
    #: killed), the log fdatasynced every `fsync_interval_ms` (a power loss loses at most that window:
    #: Kafka's default guarantee); `never`: leave flushing to the OS (benchmarks only). The file store's
    #: setting: the cluster (PostgreSQL) store always commits before it answers
    fsync: str = "always"  # always | interval | never
    #: Kafka: log.flush.interval.ms
    #: with `fsync = "interval"`: how often the file log is fdatasynced (what a power loss can lose)
    fsync_interval_ms: int = 1000

    # where shards are stored: "file" (the log in data_dir) or postgresql://USER[:PASSWORD]@HOST:PORT/DB
    # (a cluster). repr=False: the URL may carry a password; show ``store_display`` instead.
    #: `file`: the log in `data_dir`; `postgresql://USER[:PASSWORD]@HOST:PORT/DB` (or
    #: `?host=/socket/dir`): a node of a cluster (docs/cluster.md); pass it as `HERD_STORE` to keep the
    #: password out of `ps`
    store: str = field(default="file", repr=False)
    #: cluster: how long a node owns a shard without renewing (it stops serving it a fifth earlier)
    shard_lease_ms: int = 10000  # how long a node owns a shard without renewing (PostgreSQL store)

    # security of the listener (Kafka: listeners=<protocol>://..., ssl.*, sasl.enabled.mechanisms)
    #: Kafka: listeners (its protocol)
    #: `PLAINTEXT`, `SSL` (TLS), `SASL_PLAINTEXT` or `SASL_SSL` (docs/operating.md, "Security")
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    #: Kafka: ssl.keystore.*
    #: the server's certificate chain, PEM (the key may be in this file)
    ssl_certfile: str | None = None  # PEM: the server's certificate chain (and key, if no keyfile)
    #: Kafka: ssl.keystore.*
    #: the server's private key, PEM (default: in the certificate file)
    ssl_keyfile: str | None = None  # PEM private key
    #: Kafka: ssl.key.password
    #: the private key's password (prefer `HERD_SSL_KEY_PASSWORD`: flags show in `ps`)
    ssl_key_password: str | None = field(default=None, repr=False)  # ssl.key.password
    #: Kafka: ssl.truststore.*
    #: CAs, PEM, that sign client certificates
    ssl_cafile: str | None = None  # PEM CAs that sign client certificates (ssl.truststore)
    #: Kafka: ssl.client.auth
    #: `none`, `requested` or `required`: ask clients for a certificate (mutual TLS; needs `ssl_cafile`)
    ssl_client_auth: str = "none"  # ssl.client.auth: none | requested | required
    #: Kafka: sasl.enabled.mechanisms
    #: the mechanisms offered on a SASL listener
    sasl_mechanisms: str = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"  # sasl.enabled.mechanisms
    #: Kafka: the JAAS user_<name>= entries / SCRAM credentials
    #: `user:password` per line, `#` comments; read at start-up (keep it mode 600)
    sasl_users_file: str | None = None  # user:password per line
    #: Kafka: ssl.principal.mapping.rules
    #: how a TLS client certificate's subject becomes the principal: `RULE:pattern/replacement/[L|U]`,
    #: comma-separated, and `DEFAULT` (the whole subject); see docs/operating.md, "Authorization"
    ssl_principal_mapping_rules: str = "DEFAULT"  # ssl.principal.mapping.rules (TLS client certificates)

    # authorization
    #: Kafka: authorizer.class.name
    #: `none`: every client may do everything; `acl`: Kafka's ACLs (docs/operating.md, "Authorization")
    authorizer: str = "none"  # none (every client may do everything) | acl (Kafka's ACLs)
    #: Kafka: super.users
    #: principals allowed everything with `authorizer = acl`: `User:admin;User:ops`
    super_users: str = ""  # User:admin;User:ops
    #: Kafka: allow.everyone.if.no.acl.found
    #: with `authorizer = acl`, allow a resource that no ACL names (default: deny)
    allow_everyone_if_no_acl_found: bool = False

    # operating
    #: `debug`, `info`, `warning` or `error`
    log_level: str = "info"
    #: `auto` logs JSON lines, or key=value when stderr is a terminal; `json`; `console`
    log_format: str = "auto"  # auto (json unless a TTY) | json | console
    #: serve Prometheus `/metrics`, `/healthz`, `/readyz`, the JSON views and the console on this
    #: port (docs/operating.md); unset: off
    metrics_port: int | None = None
    #: the address of the metrics port (plain HTTP: keep it on 127.0.0.1 or a private network)
    metrics_host: str = "127.0.0.1"
    #: a file of credentials the HTTP port asks for: lines `bearer <sha256-hex of a token> [User:name]`
    #: and `basic <user> <sha256-hex of the password>` (make one with `printf %s SECRET | sha256sum`);
    #: every path but `/healthz` and `/readyz` then needs one; with `authorizer = acl` the views show
    #: the principal (`User:<user>`, the token's, else `User:ANONYMOUS`) what it may DESCRIBE
    #: (docs/operating.md); unset: open
    http_auth_file: str | None = None
    #: rebalances kept per group by the flight recorder (`herd groups history`)
    rebalance_history_size: int = 20  # generations kept per group by the flight recorder
    # herd's own stall (loop or process paused) of this long or longer gives members the time back
    #: a pause of herd itself (its loop or process did not run, e.g. SIGSTOP, a frozen VM) this
    #: long or longer is a stall: every session and rebalance deadline moves by it and the sockets are read
    #: before any expiry; `0` turns it off (docs/reliability.md)
    stall_threshold_ms: int = 1000

    # consumer lag: the Kafka cluster that holds the partitions' records (see coordinator/lag.py)
    #: `HOST:PORT[,HOST:PORT]` of the Kafka cluster that holds the partitions' records: its topics
    #: are herd's (Metadata gives its partition counts and topic ids, ListOffsets its offsets;
    #: docs/operating.md, "The data cluster is the catalog") and herd reads its log ends for consumer
    #: lag (docs/operating.md, "The console and lag"). Unset: herd's own topics, commit ages only, no lag
    data_bootstrap_server: str | None = None  # HOST:PORT[,HOST:PORT]; unset: commit ages only, no lag
    #: TLS/SASL client properties for the data cluster's connections (the same file
    #: `herd groups --command-config` takes)
    data_command_config: str | None = None  # TLS/SASL client properties for it (as herd groups --command-config)
    #: how often the data cluster's log ends are read
    lag_refresh_interval_ms: int = 30000  # how often its log-end offsets are read
    #: with `data_bootstrap_server`: how often the data cluster's topics (partition counts, topic ids)
    #: are read again
    data_metadata_refresh_interval_ms: int = 30000
    #: (log end, time) samples kept per partition to estimate lag in seconds
    lag_history_size: int = 30  # (log end, time) samples kept per partition for time lag
    #: `partition`: `herd_group_lag{group,topic,partition}` and `herd_group_lag_seconds{...}`;
    #: `group`: only the per-group series (bounded cardinality)
    lag_metrics: str = "partition"  # partition: lag per group, topic and partition; group: per group only

    def validate(self) -> Config:
        def positive(name):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")

        for name in ("offsets_partitions", "group_max_size", "offsets_retention_minutes",
                     "offsets_retention_check_interval_ms", "default_partitions", "max_frame_size",
                     "connections_max_idle_ms", "max_connections", "max_pending_bytes_per_connection",
                     "max_connections_per_ip", "sasl_handshake_timeout_ms",
                     "rebalance_history_size", "shard_lease_ms",
                     "lag_refresh_interval_ms", "data_metadata_refresh_interval_ms"):
            positive(name)
        for name in ("initial_rebalance_delay_ms", "min_session_timeout_ms", "offset_metadata_max_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.stall_threshold_ms != 0 and self.stall_threshold_ms < 100:
            raise ConfigError(f"stall_threshold_ms must be 0 (off) or at least 100 (the loop is looked at every "
                              f"50 ms), got {self.stall_threshold_ms}")
        if self.max_buffered_bytes is not None and self.max_buffered_bytes <= 0:
            raise ConfigError(f"max_buffered_bytes must be positive, got {self.max_buffered_bytes}")
        if self.max_session_timeout_ms < self.min_session_timeout_ms:
            raise ConfigError("max_session_timeout_ms must be >= min_session_timeout_ms")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0-65535, got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be 0-65535, got {self.metrics_port}")
        if self.advertised_port is not None and not 1 <= self.advertised_port <= 65535:
            raise ConfigError(f"advertised_port must be 1-65535, got {self.advertised_port}")
        for name in ("host", "metrics_host", "data_dir", "cluster_id"):
            if not getattr(self, name).strip():
                hint = " (use 0.0.0.0 to listen on every interface)" if name.endswith("host") else ""
                raise ConfigError(f"{name} must not be empty{hint}")
        for name in ("advertised_host", "port_file", "http_auth_file"):
            if getattr(self, name) is not None and not getattr(self, name).strip():
                raise ConfigError(f"{name} must not be empty (leave it unset for the default)")
        if self.fsync not in ("always", "interval", "never"):
            raise ConfigError(f"fsync must be 'always', 'interval' or 'never', got {self.fsync!r}")
        if not 1 <= self.fsync_interval_ms <= INT32_MAX:
            raise ConfigError(f"fsync_interval_ms must be 1-{INT32_MAX}, got {self.fsync_interval_ms}")
        self.consumer_group_config()  # the group_consumer_* settings, checked as Kafka does
        self._validate_security()
        self._validate_authorization()
        self._validate_store()
        self._validate_lag()
        if self.log_format not in ("auto", "json", "console"):
            raise ConfigError(f"log_format must be auto, json or console, got {self.log_format!r}")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level must be debug, info, warning or error, got {self.log_level!r}")
        for name, parts in self.topics:
            if not _TOPIC_RE.fullmatch(name):
                raise ConfigError(f"invalid topic name {name!r}")
            if parts <= 0:
                raise ConfigError(f"topic {name} needs a positive partition count, got {parts}")
        return self

    def _validate_security(self) -> None:
        protocols = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
        if self.security_protocol not in protocols:
            raise ConfigError(f"security_protocol must be one of {', '.join(protocols)}, "
                              f"got {self.security_protocol!r}")
        if self.ssl_client_auth not in ("none", "requested", "required"):
            raise ConfigError(f"ssl_client_auth must be none, requested or required, got {self.ssl_client_auth!r}")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        if tls and not self.ssl_certfile:
            raise ConfigError(f"security_protocol {self.security_protocol} needs ssl_certfile "
                              "(the server's certificate, PEM)")
        if tls and self.ssl_client_auth != "none" and not self.ssl_cafile:
            raise ConfigError(f"ssl_client_auth {self.ssl_client_auth} needs ssl_cafile (the CAs that "
                              "sign client certificates)")
        if not tls:
            given = [n for n in ("ssl_certfile", "ssl_keyfile", "ssl_cafile") if getattr(self, n)]
            if given or self.ssl_client_auth != "none":
                raise ConfigError(f"{(given or ['ssl_client_auth'])[0]} is set but security_protocol is "
                                  f"{self.security_protocol} (use SSL or SASL_SSL for TLS)")
        from protocol.sasl import MECHANISMS

        mechs = self.enabled_mechanisms
        unknown = [x for x in mechs if x not in MECHANISMS]
        if unknown or not mechs:
            raise ConfigError(f"sasl_mechanisms: {', '.join(unknown) or 'none given'}: herd has "
                              f"{', '.join(MECHANISMS)}")
        if self.security_protocol.startswith("SASL_") and not self.sasl_users_file:
            raise ConfigError(f"security_protocol {self.security_protocol} needs sasl_users_file "
                              "(user:password per line)")

    def _validate_authorization(self) -> None:
        if self.authorizer not in ("none", "acl"):
            raise ConfigError(f"authorizer must be 'none' or 'acl', got {self.authorizer!r}")
        from coordinator.core.auth.acl import AclError, parse_super_users
        from coordinator.core.auth.principal import MappingRuleError, parse_rules

        try:
            parse_super_users(self.super_users)
        except AclError as exc:
            raise ConfigError(f"super_users wants User:NAME;User:NAME: {exc}") from None
        try:
            parse_rules(self.ssl_principal_mapping_rules)
        except MappingRuleError as exc:
            raise ConfigError(str(exc)) from None

    def consumer_group_config(self):
        """The ``group_consumer_*`` settings as the consumer-group core takes them (ConfigError
        with one line when they do not fit together)."""
        from coordinator.core.consumer import ConsumerGroupConfig

        try:
            return ConsumerGroupConfig(
                session_timeout_ms=self.group_consumer_session_timeout_ms,
                min_session_timeout_ms=self.group_consumer_min_session_timeout_ms,
                max_session_timeout_ms=self.group_consumer_max_session_timeout_ms,
                heartbeat_interval_ms=self.group_consumer_heartbeat_interval_ms,
                min_heartbeat_interval_ms=self.group_consumer_min_heartbeat_interval_ms,
                max_heartbeat_interval_ms=self.group_consumer_max_heartbeat_interval_ms,
                max_size=self.group_consumer_max_size,
                assignment_interval_ms=self.group_consumer_assignment_interval_ms,
                pending_heartbeat_interval_ms=self.group_consumer_pending_heartbeat_interval_ms,
                authorize_regex=self.authorizer == "acl",
                assignors=tuple(a.strip() for a in self.group_consumer_assignors.split(",") if a.strip()))
        except ValueError as exc:
            # the core names Kafka's settings (group.consumer.x.y); herd's are group_consumer_x_y
            raise ConfigError(re.sub(r"group\.consumer\.([a-z.]+)",
                                     lambda mo: "group_consumer_" + mo.group(1).replace(".", "_"),
                                     str(exc))) from None

    def group_config(self):
        """The settings the group core reads (:class:`coordinator.core.config.GroupConfig`): the
        daemon builds it once and hands it to :class:`~coordinator.core.coordinator.GroupCoordinator`."""
        from coordinator.core.config import GroupConfig

        return GroupConfig(
            offsets_partitions=self.offsets_partitions,
            initial_rebalance_delay_ms=self.initial_rebalance_delay_ms,
            min_session_timeout_ms=self.min_session_timeout_ms,
            max_session_timeout_ms=self.max_session_timeout_ms,
            group_max_size=self.group_max_size,
            offsets_retention_ms=self.offsets_retention_ms,
            offsets_retention_check_interval_ms=self.offsets_retention_check_interval_ms,
            offset_metadata_max_bytes=self.offset_metadata_max_bytes,
            rebalance_history_size=self.rebalance_history_size,
            consumer=self.consumer_group_config())

    def _validate_store(self) -> None:
        if self.store == "file":
            return
        from coordinator.cluster.url import StoreURLError, parse_store_url

        try:
            parse_store_url(self.store)
        except StoreURLError as exc:  # its message starts with "store" and never holds the password
            raise ConfigError(str(exc)) from None

    @property
    def store_url(self):
        """The parsed PostgreSQL URL (a :class:`coordinator.cluster.url.PgURL`), or None for ``file``."""
        if self.store == "file":
            return None
        from coordinator.cluster.url import parse_store_url

        return parse_store_url(self.store)

    @property
    def store_display(self) -> str:
        """``store`` for logs and messages: ``file``, or the URL with its password as ``***``."""
        if self.store == "file":
            return "file"
        from coordinator.cluster.url import redact

        return redact(self.store)

    def _validate_lag(self) -> None:
        if self.lag_history_size < 2:
            raise ConfigError(f"lag_history_size must be at least 2, got {self.lag_history_size}")
        if self.lag_metrics not in ("partition", "group"):
            raise ConfigError(f"lag_metrics must be 'partition' or 'group', got {self.lag_metrics!r}")
        if self.data_bootstrap_server is not None:
            servers = [s.strip() for s in self.data_bootstrap_server.split(",")]
            for server in servers:
                host, sep, port = server.rpartition(":")
                if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
                    raise ConfigError(f"data_bootstrap_server wants HOST:PORT[,HOST:PORT], got "
                                      f"{self.data_bootstrap_server!r}")
        elif self.data_command_config is not None:
            raise ConfigError("data_command_config is set but data_bootstrap_server is not "
                              "(the TLS/SASL settings are for the data cluster's connections)")

    @property
    def enabled_mechanisms(self) -> list[str]:
        return [x.strip().upper() for x in self.sasl_mechanisms.split(",") if x.strip()]

    @property
    def buffered_bytes_limit(self) -> int:
        """``max_buffered_bytes``, or sized to the machine: min(1 GiB, a quarter of its RAM)."""
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        try:
            ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            ram = 4 << 30
        return min(1 << 30, max(64 << 20, ram // 4))

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000

    def replace(self, **changes) -> Config:
        return dataclasses.replace(self, **changes).validate()


_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]{1,249}")
FIELDS = {f.name: f for f in fields(Config)}


def parse_topic(text: str) -> tuple[str, int]:
    """``NAME:PARTITIONS``; the count is required (``orders`` alone was once taken as 1 partition,
    silently, though every help text says NAME:PARTITIONS)."""
    name, sep, count = str(text).partition(":")
    if not sep:
        raise ConfigError(f"wants NAME:PARTITIONS, got {text!r}: give the partition count, "
                          f"e.g. {name or 'orders'}:6")
    try:
        parts = int(count)
    except ValueError:
        raise ConfigError(f"wants NAME:PARTITIONS, got {text!r}: the partition count must be an integer") from None
    return name, parts


def _coerce(name: str, value, source: str | None = None):
    """Turn a string (env/flag) or TOML value into the field's type; errors name ``source`` (the
    environment variable, flag or file the value came from)."""
    try:
        return _coerce_value(name, value)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}") from None


def _coerce_value(name: str, value):
    f = FIELDS[name]
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if name == "topics":
        items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v]
        out = []
        for item in items:
            if isinstance(item, (list, tuple)) and len(item) == 2:
                out.append((str(item[0]), _int("topics partitions", item[1])))
            elif isinstance(item, dict):
                out.append((str(item.get("name")), _int("topics partitions", item.get("partitions", 1))))
            elif isinstance(item, str):
                out.append(parse_topic(item))
            else:
                raise ConfigError(f"topics wants \"name:partitions\" strings, got {item!r}")
        return tuple(out)
    if value is None:
        if "None" in t:
            return None
        raise ConfigError(f"{name} needs a value")
    if t.startswith("bool"):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if t.startswith("int"):
        return _int(name, value)
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return str(value)


def _int(name: str, value) -> int:
    """An integer from an int or a string of one; never a bool or a float (TOML's ``port = 1.5``
    must not become port 1)."""
    if isinstance(value, bool) or isinstance(value, float):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


# HERD_* variables that are not serve settings (other commands and tools read them).
OTHER_ENV = frozenset({"HERD_BOOTSTRAP", "HERD_DATA_BOOTSTRAP", "HERD_HTTP", "HERD_HTTP_TOKEN", "HERD_HTTP_USER",
                       "HERD_HTTP_PASSWORD"})


# Kubernetes gives every pod <SERVICE>_PORT=tcp://10.96.0.7:9092 (and <SERVICE>_SERVICE_HOST, ...)
# for each Service of its namespace (enableServiceLinks, on by default): a Service named "herd" sets
# HERD_PORT to that. It is not a port setting; taken for one, every herd pod failed to start.
_SERVICE_LINK = re.compile(r"(tcp|udp|sctp)://\S+:\d+")


def service_link(key: str, value: str) -> bool:
    """True for ``HERD_PORT=tcp://IP:PORT``, the variable Kubernetes sets for a Service named herd,
    and for the other port settings' names: a Service named herd-metrics sets
    ``HERD_METRICS_PORT=tcp://IP:PORT`` (herd-advertised: ``HERD_ADVERTISED_PORT``)."""
    return key.startswith("HERD_") and key.endswith("_PORT") and \
        _SERVICE_LINK.fullmatch(str(value).strip()) is not None


def unknown_env(env) -> list[tuple[str, str]]:
    """(variable, the setting it was probably meant to be) for each HERD_* variable that is not a
    setting but is close to one: a misspelt setting is otherwise silently ignored."""
    out = []
    names = [f"HERD_{n.upper()}" for n in FIELDS]
    for key in sorted(env):
        if not key.startswith("HERD_") or key in OTHER_ENV or key[5:].lower() in FIELDS:
            continue
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.85)
        if close:
            out.append((key, close[0]))
    return out


def load(toml_path: str | None = None, env: dict | None = None, overrides: dict | None = None) -> Config:
    """Defaults < TOML file < HERD_* environment < explicit overrides (flags)."""
    values: dict = {}
    sources: dict[str, str] = {}  # setting -> where its value came from, for error messages
    if toml_path:
        try:
            with open(toml_path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {toml_path}") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {toml_path}: {exc}") from None
        if isinstance(data.get("herd"), dict):
            stray = sorted(k for k in data if k != "herd")
            if stray:
                raise ConfigError(f"{toml_path} has a [herd] table and settings outside it ({', '.join(stray)}): "
                                  "put them all in [herd], or drop the table")
            data = data["herd"]
        for key, value in data.items():
            name = key.replace("-", "_").replace(".", "_")
            if name not in FIELDS:
                raise ConfigError(f"unknown setting {key!r} in {toml_path}")
            sources[name] = f"{toml_path}: {key}"
            values[name] = _coerce(name, value, sources[name])
    env = os.environ if env is None else env
    for key, value in env.items():
        if not key.startswith("HERD_"):
            continue
        name = key[5:].lower()
        if name in FIELDS and not service_link(key, value):
            sources[name] = key
            values[name] = _coerce(name, value, key)
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        sources[name] = "--topic" if name == "topics" else "--" + name.replace("_", "-")
        values[name] = _coerce(name, value, sources[name])
    try:
        return Config(**values).validate()
    except TypeError as exc:  # pragma: no cover - a programming error in the loader
        raise ConfigError(str(exc)) from None
    except ConfigError as exc:  # validate()'s messages start with the setting's name
        source = sources.get(str(exc).split(" ", 1)[0])
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}") from None


DEFAULT = Config()
