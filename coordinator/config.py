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
    host: str = "127.0.0.1"
    port: int = 9092
    data_dir: str = "./herd-data"
    port_file: str | None = None
    advertised_host: str | None = None  # what Metadata/FindCoordinator tell clients (default: host)
    advertised_port: int | None = None  # default: the bound port
    node_id: int = 0
    cluster_id: str = "herd-cluster"

    # group coordinator (Kafka names in comments)
    offsets_partitions: int = 50  # offsets.topic.num.partitions
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    group_max_size: int = INT32_MAX  # group.max.size
    offsets_retention_minutes: int = 10080  # offsets.retention.minutes (7 days)
    offsets_retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes (counted in characters)

    # consumer groups (KIP-848, ConsumerGroupHeartbeat): the server decides both timeouts
    group_consumer_session_timeout_ms: int = 45000  # group.consumer.session.timeout.ms
    group_consumer_min_session_timeout_ms: int = 45000  # group.consumer.min.session.timeout.ms
    group_consumer_max_session_timeout_ms: int = 60000  # group.consumer.max.session.timeout.ms
    group_consumer_heartbeat_interval_ms: int = 5000  # group.consumer.heartbeat.interval.ms
    group_consumer_min_heartbeat_interval_ms: int = 5000  # group.consumer.min.heartbeat.interval.ms
    group_consumer_max_heartbeat_interval_ms: int = 15000  # group.consumer.max.heartbeat.interval.ms
    group_consumer_max_size: int = INT32_MAX  # group.consumer.max.size
    group_consumer_assignors: str = "uniform,range"  # group.consumer.assignors (the first is the default)

    # topic catalog
    auto_create_topics: bool = True  # auto.create.topics.enable
    default_partitions: int = 1  # num.partitions
    topics: tuple[tuple[str, int], ...] = ()  # --topic name:partitions

    # network and disk
    max_frame_size: int = 8 * 1024 * 1024  # Kafka: socket.request.max.bytes (100 MiB); see README
    connections_max_idle_ms: int = 600000  # connections.max.idle.ms
    max_connections: int = 10000
    max_pending_bytes_per_connection: int = 16 * 1024 * 1024
    # every connection's buffered requests and answers together; None: min(1 GiB, a quarter of RAM)
    max_buffered_bytes: int | None = None
    max_connections_per_ip: int = INT32_MAX  # max.connections.per.ip
    # a SASL listener's connection that has not authenticated after this long is closed
    sasl_handshake_timeout_ms: int = 10000
    fsync: str = "always"  # always | never

    # where shards are stored: "file" (the log in data_dir) or postgresql://USER[:PASSWORD]@HOST:PORT/DB
    # (a cluster). repr=False: the URL may carry a password; show ``store_display`` instead.
    store: str = field(default="file", repr=False)
    shard_lease_ms: int = 10000  # how long a node owns a shard without renewing (PostgreSQL store)

    # security of the listener (Kafka: listeners=<protocol>://..., ssl.*, sasl.enabled.mechanisms)
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    ssl_certfile: str | None = None  # PEM: the server's certificate chain (and key, if no keyfile)
    ssl_keyfile: str | None = None  # PEM private key
    ssl_key_password: str | None = field(default=None, repr=False)  # ssl.key.password
    ssl_cafile: str | None = None  # PEM CAs that sign client certificates (ssl.truststore)
    ssl_client_auth: str = "none"  # ssl.client.auth: none | requested | required
    sasl_mechanisms: str = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"  # sasl.enabled.mechanisms
    sasl_users_file: str | None = None  # user:password per line

    # operating
    log_level: str = "info"
    log_format: str = "auto"  # auto (json unless a TTY) | json | console
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    rebalance_history_size: int = 20  # generations kept per group by the flight recorder
    # herd's own stall (loop or process paused) of this long or longer gives members the time back
    stall_threshold_ms: int = 1000

    # consumer lag: the Kafka cluster that holds the partitions' records (see coordinator/lag.py)
    data_bootstrap_server: str | None = None  # HOST:PORT[,HOST:PORT]; unset: commit ages only, no lag
    data_command_config: str | None = None  # TLS/SASL client properties for it (as herd groups --command-config)
    lag_refresh_interval_ms: int = 30000  # how often its log-end offsets are read
    lag_history_size: int = 30  # (log end, time) samples kept per partition for time lag
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
                     "lag_refresh_interval_ms"):
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
        for name in ("advertised_host", "port_file"):
            if getattr(self, name) is not None and not getattr(self, name).strip():
                raise ConfigError(f"{name} must not be empty (leave it unset for the default)")
        if self.fsync not in ("always", "never"):
            raise ConfigError(f"fsync must be 'always' or 'never', got {self.fsync!r}")
        self.consumer_group_config()  # the group_consumer_* settings, checked as Kafka does
        self._validate_security()
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
                assignors=tuple(a.strip() for a in self.group_consumer_assignors.split(",") if a.strip()))
        except ValueError as exc:
            # the core names Kafka's settings (group.consumer.x.y); herd's are group_consumer_x_y
            raise ConfigError(re.sub(r"group\.consumer\.([a-z.]+)",
                                     lambda mo: "group_consumer_" + mo.group(1).replace(".", "_"),
                                     str(exc))) from None

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
    name, sep, count = str(text).partition(":")
    try:
        parts = int(count) if sep else 1
    except ValueError:
        raise ConfigError(f"--topic wants name:partitions, got {text!r}") from None
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
OTHER_ENV = frozenset({"HERD_BOOTSTRAP", "HERD_DATA_BOOTSTRAP", "HERD_HTTP"})


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
