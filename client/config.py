"""Consumer configuration: Kafka's consumer config names, with Pythonic keyword equivalents.

``{"session.timeout.ms": 6000}`` and ``session_timeout_ms=6000`` mean the same thing (a Pythonic
name is the Kafka name with dots written as underscores). Unknown names raise ``ValueError`` so a
typo does not silently fall back to a default. Defaults are Kafka's consumer defaults.

TLS and SASL take librdkafka's names (``security.protocol``, ``ssl.ca.location``,
``sasl.username``, ...): see ``protocol/client_security.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.client_security import ALIASES, PROTOCOLS, SECURITY_DEFAULTS, SecurityConfig, parse_security

__all__ = ["ClientConfig", "DEFAULTS", "parse_config", "parse_bootstrap", "security_of"]

DEFAULTS: dict[str, object] = {
    "bootstrap.servers": None,
    "group.id": None,
    "client.id": "herd-python",
    "group.instance.id": None,
    "session.timeout.ms": 45000,
    "heartbeat.interval.ms": 3000,
    "max.poll.interval.ms": 300000,
    "request.timeout.ms": 30000,
    "default.api.timeout.ms": 60000,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1000,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 1000,
    "socket.connection.setup.timeout.ms": 10000,
    "enable.auto.commit": True,
    "auto.commit.interval.ms": 5000,
    "partition.assignment.strategy": ("range", "cooperative-sticky"),
    "client.rack": None,
    "allow.auto.create.topics": True,
    "metadata.max.age.ms": 300000,
    "isolation.level": "read_uncommitted",
    "connections.max.idle.ms": 540000,  # accepted for compatibility; connections stay open
    "max.frame.bytes": 100 * 1024 * 1024,  # not a Kafka name: the largest response frame accepted
    # Not a Kafka name: how long a member that is not in a stable group may go without reaching its
    # coordinator (every connection attempt failing) before poll() raises NoBrokersAvailableError.
    "broker.unreachable.timeout.ms": 30000,
    # Not a Kafka name: {api name or key: highest version to use}, for brokers that advertise
    # versions they cannot parse (librdkafka's mock cluster: {"JoinGroup": 5, "SyncGroup": 3}).
    "api.versions.max": None,
    **SECURITY_DEFAULTS,
}

# The broker's default group.min.session.timeout.ms (Kafka's, and herd's min_session_timeout_ms).
_BROKER_MIN_SESSION_MS = 6000

_INT_KEYS = {k for k, v in DEFAULTS.items() if isinstance(v, int) and not isinstance(v, bool)}
_BOOL_KEYS = {"enable.auto.commit", "allow.auto.create.topics"}


def parse_bootstrap(servers, security_protocol: str | None = None) -> list[tuple[str, int]]:
    """``"h1:9092,h2:9093"`` or ``["h1:9092", ("h2", 9093)]`` -> ``[(host, port), ...]``.

    A listener URL (``SASL_SSL://h1:9093``) names its security protocol, which must be
    ``security_protocol`` (default PLAINTEXT): the connections use that one."""
    expected = (security_protocol or "PLAINTEXT").upper()
    if servers is None:
        raise ValueError("bootstrap.servers is required")
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        if isinstance(item, tuple):
            host, port = item
        else:
            item = item.strip()
            if not item:
                continue
            scheme, sep, rest = item.partition("://")
            if sep:  # a listener URL as in server.properties / Spark settings
                if scheme.upper() not in PROTOCOLS:
                    raise ValueError(f"bootstrap server {item!r}: unknown security protocol {scheme!r} (one of "
                                     f"{', '.join(PROTOCOLS)})")
                if scheme.upper() != expected:
                    raise ValueError(f"bootstrap server {item!r} names {scheme.upper()} but security.protocol "
                                     f"is {expected}: set security.protocol={scheme.upper()}")
                item = rest
            if item.startswith("["):  # [ipv6]:port
                host, _, rest = item[1:].partition("]")
                port = rest.lstrip(":") or "9092"
            elif item.count(":") == 1:
                host, port = item.split(":")
            else:
                host, port = item, "9092"
        try:
            number = int(port)
        except (TypeError, ValueError):
            number = -1
        if not 0 < number < 65536:
            raise ValueError(f"bootstrap server {item!r}: the port must be a number from 1 to 65535")
        out.append((host, number))
    if not out:
        raise ValueError("bootstrap.servers is empty")
    return out


def security_of(config: dict | None) -> SecurityConfig:
    """The TLS / SASL settings among a consumer config's (Kafka or Pythonic names; the others are
    left alone): what a helper that opens its own connections needs."""
    picked = {}
    for key, value in (config or {}).items():
        name = key.replace("_", ".")
        name = ALIASES.get(name, name)
        if name in SECURITY_DEFAULTS:
            picked[name] = value
    return parse_security(picked)


def _api_caps(value) -> dict[int, int]:
    if not value:
        return {}
    from protocol import messages

    by_name = {cls.NAME.removesuffix("Request"): key for key, cls in messages.REQUESTS.items()}
    out = {}
    for api, version in dict(value).items():
        key = api if isinstance(api, int) else by_name.get(api)
        if key is None:
            raise ValueError(f"api.versions.max: unknown API {api!r}")
        out[key] = int(version)
    return out


def _bool(key, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{key} must be a boolean, not {value!r}")


@dataclass
class ClientConfig:
    """Parsed configuration. Durations are in milliseconds as in Kafka (``*_s`` helpers for seconds)."""

    bootstrap_servers: list
    group_id: str
    client_id: str = "herd-python"
    group_instance_id: str | None = None
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    request_timeout_ms: int = 30000
    default_api_timeout_ms: int = 60000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    socket_connection_setup_timeout_ms: int = 10000
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    partition_assignment_strategy: list = field(default_factory=lambda: ["range", "cooperative-sticky"])
    client_rack: str | None = None
    allow_auto_create_topics: bool = True
    metadata_max_age_ms: int = 300000
    isolation_level: str = "read_uncommitted"
    connections_max_idle_ms: int = 540000
    max_frame_bytes: int = 100 * 1024 * 1024
    broker_unreachable_timeout_ms: int = 30000
    api_versions_max: dict = field(default_factory=dict)  # api key -> highest version
    security: SecurityConfig = field(default_factory=SecurityConfig)  # TLS / SASL (passwords not in repr)

    def s(self, name: str) -> float:
        """A ``*_ms`` setting in seconds: ``cfg.s("session_timeout_ms")``."""
        return getattr(self, name) / 1000.0


def parse_config(bootstrap_servers=None, group_id=None, config: dict | None = None, **kwargs) -> ClientConfig:
    merged: dict[str, object] = {}
    for source in (config or {}), kwargs:
        for key, value in source.items():
            name = key.replace("_", ".")
            name = ALIASES.get(name, name)
            if name not in DEFAULTS:
                raise ValueError(f"unknown consumer config {key!r}")
            merged[name] = value
    if bootstrap_servers is not None:
        merged["bootstrap.servers"] = bootstrap_servers
    if group_id is not None:
        merged["group.id"] = group_id
    values = dict(DEFAULTS)
    values.update(merged)
    for key in _INT_KEYS:
        try:
            values[key] = int(values[key])
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be an integer, not {values[key]!r}") from None
    for key in _BOOL_KEYS:
        values[key] = _bool(key, values[key])
    group = values["group.id"]
    if not isinstance(group, str) or not group:
        raise ValueError("group.id is required (a non-empty string)")
    strategy = values["partition.assignment.strategy"]
    if isinstance(strategy, str):
        strategy = [s.strip() for s in strategy.split(",") if s.strip()]
    elif not isinstance(strategy, (list, tuple)):
        strategy = [strategy]
    if not strategy:
        raise ValueError("partition.assignment.strategy is empty")
    iso = values["isolation.level"]
    if iso not in ("read_uncommitted", "read_committed"):
        raise ValueError(f"isolation.level must be read_uncommitted or read_committed, not {iso!r}")
    security = parse_security({k: values[k] for k in SECURITY_DEFAULTS})
    cfg = ClientConfig(
        bootstrap_servers=parse_bootstrap(values["bootstrap.servers"], security.protocol),
        group_id=group,
        client_id=values["client.id"],
        group_instance_id=values["group.instance.id"] or None,
        session_timeout_ms=values["session.timeout.ms"],
        heartbeat_interval_ms=values["heartbeat.interval.ms"],
        max_poll_interval_ms=values["max.poll.interval.ms"],
        request_timeout_ms=values["request.timeout.ms"],
        default_api_timeout_ms=values["default.api.timeout.ms"],
        retry_backoff_ms=values["retry.backoff.ms"],
        retry_backoff_max_ms=values["retry.backoff.max.ms"],
        reconnect_backoff_ms=values["reconnect.backoff.ms"],
        reconnect_backoff_max_ms=values["reconnect.backoff.max.ms"],
        socket_connection_setup_timeout_ms=values["socket.connection.setup.timeout.ms"],
        enable_auto_commit=values["enable.auto.commit"],
        auto_commit_interval_ms=values["auto.commit.interval.ms"],
        partition_assignment_strategy=list(strategy),
        client_rack=values["client.rack"] or None,
        allow_auto_create_topics=values["allow.auto.create.topics"],
        metadata_max_age_ms=values["metadata.max.age.ms"],
        isolation_level=iso,
        connections_max_idle_ms=values["connections.max.idle.ms"],
        max_frame_bytes=values["max.frame.bytes"],
        broker_unreachable_timeout_ms=values["broker.unreachable.timeout.ms"],
        api_versions_max=_api_caps(values["api.versions.max"]),
        security=security,
    )
    if (cfg.session_timeout_ms <= 0 or cfg.heartbeat_interval_ms <= 0 or cfg.max_poll_interval_ms <= 0
            or cfg.broker_unreachable_timeout_ms <= 0):
        raise ValueError("session.timeout.ms, heartbeat.interval.ms, max.poll.interval.ms and "
                         "broker.unreachable.timeout.ms must be positive")
    if cfg.heartbeat_interval_ms >= cfg.session_timeout_ms:
        raise ValueError(_heartbeat_problem(cfg, "heartbeat.interval.ms" in merged))
    return cfg


def _heartbeat_problem(cfg: ClientConfig, heartbeat_given: bool) -> str:
    """Why a heartbeat interval that is not below the session timeout is refused, naming the
    default when the caller set only one of the two (they may not know the other exists)."""
    session, heartbeat = cfg.session_timeout_ms, cfg.heartbeat_interval_ms
    third = max(1, session // 3)
    if heartbeat_given:
        hint = (f"heartbeat.interval.ms={heartbeat} must be lower than session.timeout.ms={session}: set it to "
                f"about a third of the session timeout or less, e.g. heartbeat_interval_ms={third}")
    else:
        hint = (f"session.timeout.ms={session} must be above heartbeat.interval.ms, which was not set (its "
                f"default is {heartbeat}): set heartbeat_interval_ms (heartbeat.interval.ms) too, to about a "
                f"third of the session timeout or less, e.g. heartbeat_interval_ms={third}")
    if session < _BROKER_MIN_SESSION_MS:
        hint += (f"; note that brokers refuse a session.timeout.ms below their group.min.session.timeout.ms "
                 f"({_BROKER_MIN_SESSION_MS} by default in Kafka and herd)")
    return hint
