"""``KafkaGroupConsumer``: a herd group member that reads its partitions' records from the Kafka
cluster holding them (the *data cluster*).

herd keeps no records. A stock Kafka consumer has one ``bootstrap.servers`` and sends
FindCoordinator to any broker it knows, so it cannot take its group from herd and its records from
Kafka. This consumer does: the group half is herd's thin client (``GroupConsumer``: its
coordinator, heartbeat thread, assignors, listeners and static membership, unchanged), the record
half is librdkafka (confluent-kafka) in *assign* mode: ``incremental_assign`` / ``seek`` /
``consume`` / ``pause`` on the data cluster, no group there, nothing committed there::

    from client import KafkaGroupConsumer

    with KafkaGroupConsumer("herd:9092", "etl", "kafka:9092", auto_offset_reset="earliest") as c:
        c.subscribe(["events"])
        while running:
            for r in c.poll(1.0):          # list[Record]: topic, partition, offset, key, value, ...
                handle(r)
            # enable.auto.commit (default true) commits the consumed positions to herd every
            # auto.commit.interval.ms, before a revocation and on close; or c.commit() yourself

Install with ``pip install herd[kafka]`` (confluent-kafka); without it the constructor raises an
ImportError naming that extra.

Positions. A newly assigned partition starts at its offset committed in herd, else at
``auto.offset.reset`` (``latest`` by default, as Kafka; ``earliest``; resolved against the data
cluster at once when it answers, so that the position is committed like Kafka's). ``poll`` returns at
most ``max.poll.records`` (500) records and moves each partition's position past the last one it
returned: ``commit()`` commits those positions to herd (``commit(offsets)`` exactly the ones given,
``commit(sync=False)`` without waiting). ``seek(tp, offset)`` moves the position (and the fetch),
``position(tp)`` reads it, ``pause`` / ``resume`` stop and restart the fetching of partitions.

Rebalances run inside ``poll`` (on the polling thread) as in ``GroupConsumer``: on a revocation the
positions are committed first (auto-commit), then the partitions are unassigned from librdkafka --
records it had fetched for them are dropped, none is returned afterwards -- and only then does your
``on_partitions_revoked`` run; the coordinator gives the partitions to another member after that.
So a record is never handed to two members at once (at-least-once delivery: the records returned
after the last commit of a member that dies are read again by the next owner).

Configuration: every ``GroupConsumer`` setting (Kafka names or Pythonic keywords), plus
``auto.offset.reset``, ``max.poll.records``, the fetch settings (``fetch.min.bytes``,
``fetch.max.wait.ms``, ``fetch.max.bytes``, ``max.partition.fetch.bytes``) and ``isolation.level``
(passed to librdkafka too). The data cluster's own client settings go with a ``data.`` prefix and
are passed to librdkafka as they are (``data.security.protocol``, ``data.sasl.mechanism``,
``data.sasl.username``, ``data.ssl.ca.location``, ... any librdkafka property), or come from a Kafka
client properties file, ``data_command_config="client.properties"`` (the file herd's
``data_command_config`` and ``herd groups --command-config`` read).

A data cluster that cannot be reached is logged at WARNING naming its address (at the first error
and every 10 s while it lasts); ``poll`` then returns no records while the group goes on (herd keeps
the membership); librdkafka reconnects on its own and the records flow again from the positions.

The per-record work in Python is one small object per record (``Record``, a view of librdkafka's
message whose fields are read when used): librdkafka fetches, decompresses and batches; ``poll``
takes a batch with one ``consume`` call and reads the consumed positions with one ``position`` call.
``poll_messages`` returns librdkafka's ``Message`` objects as they are (no object of ours at all).
"""

from __future__ import annotations

import logging
import time
from operator import methodcaller

from client import errors as cerr
from client.consumer import GroupConsumer
from client.types import TopicPartition

log = logging.getLogger("herd.client.kafka")

__all__ = ["KafkaGroupConsumer", "Record", "MISSING_EXTRA"]

MISSING_EXTRA = (
    "KafkaGroupConsumer reads records with confluent-kafka (librdkafka), which is not installed: "
    "pip install 'herd[kafka]' (or pip install confluent-kafka)"
)

class Record:
    """One record of the data cluster: ``topic``, ``partition``, ``offset``, ``key``, ``value``,
    ``timestamp_ms``, ``headers`` (a list of (name, bytes) or None).

    A view of librdkafka's message: each field is read from it when asked for, so building a batch
    costs one small object per record and a field nobody reads is never converted to a Python
    object. Unpacks and compares like a 7-tuple (``tuple(r)``, ``r[2]``, ``r._asdict()``);
    ``Record.of(topic, partition, ...)`` makes one from values."""

    __slots__ = ("_m",)
    _fields = ("topic", "partition", "offset", "key", "value", "timestamp_ms", "headers")

    def __init__(self, message):
        self._m = message

    topic = property(lambda self: self._m.topic())
    partition = property(lambda self: self._m.partition())
    offset = property(lambda self: self._m.offset())
    key = property(lambda self: self._m.key())
    value = property(lambda self: self._m.value())
    timestamp_ms = property(lambda self: self._m.timestamp()[1])
    headers = property(lambda self: self._m.headers())

    @classmethod
    def of(cls, topic, partition, offset, key, value, timestamp_ms=-1, headers=None) -> Record:
        return cls(_Values(topic, partition, offset, key, value, timestamp_ms, headers))

    def _tuple(self) -> tuple:
        m = self._m
        return (m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1], m.headers())

    def __iter__(self):
        return iter(self._tuple())

    def __len__(self) -> int:
        return 7

    def __getitem__(self, i):
        return self._tuple()[i]

    def __eq__(self, other):
        if isinstance(other, Record):
            return self._tuple() == other._tuple()
        return self._tuple() == other if isinstance(other, tuple) else NotImplemented

    def __hash__(self):
        return hash(self._tuple())

    def _asdict(self) -> dict:
        return dict(zip(self._fields, self._tuple(), strict=True))

    def __repr__(self) -> str:
        return "Record(" + ", ".join(f"{k}={v!r}" for k, v in zip(self._fields, self._tuple(), strict=True)) + ")"


class _Values:
    """What Record.of wraps: a message's accessors over plain values."""

    __slots__ = ("_v",)

    def __init__(self, *values):
        self._v = values

    def topic(self):
        return self._v[0]

    def partition(self):
        return self._v[1]

    def offset(self):
        return self._v[2]

    def key(self):
        return self._v[3]

    def value(self):
        return self._v[4]

    def timestamp(self):
        return (1 if self._v[5] >= 0 else 0, self._v[5])

    def headers(self):
        return self._v[6]


_error = methodcaller("error")

# Settings of ours (not GroupConsumer's); the ``_FETCH`` ones are librdkafka's too.
_OURS = {"auto.offset.reset": "latest", "max.poll.records": 500}
_FETCH = ("fetch.min.bytes", "fetch.max.wait.ms", "fetch.max.bytes", "max.partition.fetch.bytes", "check.crcs")
_RESETS = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
           "latest": "latest", "largest": "latest", "end": "latest", "none": "none", "error": "none"}
_WARN_EVERY_S = 10.0
_SLICE_S = 0.1  # the longest librdkafka wait between two turns of the group (rebalances, commits)


def _import_kafka():
    try:
        import confluent_kafka
    except ImportError as exc:
        raise ImportError(MISSING_EXTRA) from exc
    return confluent_kafka


def _security_to_librdkafka(sec) -> dict:
    """protocol.client_security.SecurityConfig (from a properties file) -> librdkafka properties."""
    out = {"security.protocol": sec.protocol}
    if sec.uses_tls:
        for key, value in (("ssl.ca.location", sec.ca_location), ("ssl.certificate.location", sec.certificate_location),
                           ("ssl.key.location", sec.key_location), ("ssl.key.password", sec.key_password)):
            if value:
                out[key] = value
        out["ssl.endpoint.identification.algorithm"] = "https" if sec.check_hostname else "none"
        out["enable.ssl.certificate.verification"] = bool(sec.verify_certificates)
    if sec.uses_sasl:
        out["sasl.mechanism"] = sec.sasl_mechanism
        out["sasl.username"] = sec.sasl_username or ""
        out["sasl.password"] = sec.sasl_password or ""
    return out


def split_config(config: dict | None, kwargs: dict) -> tuple[dict, dict, dict]:
    """-> (GroupConsumer settings, our settings, librdkafka settings for the data cluster)."""
    group: dict = {}
    ours: dict = dict(_OURS)
    data: dict = {}
    command_config = None
    for source in (config or {}), kwargs:
        for key, value in source.items():
            name = key.replace("_", ".")
            if name.startswith("data."):
                rest = name[5:]
                if rest == "command.config":
                    command_config = value
                else:
                    # librdkafka property names have no underscores: a Pythonic name maps back.
                    data[rest] = value
            elif name in _OURS:
                ours[name] = value
            elif name in _FETCH:
                data.setdefault(name, value)
            else:
                if name == "isolation.level":
                    data.setdefault(name, value)
                group[key] = value
    if command_config:
        from protocol.client_properties import load_command_config

        security, ignored = load_command_config(str(command_config), "data_command_config")
        for k, v in _security_to_librdkafka(security).items():
            data.setdefault(k, v)
        if ignored:
            log.info("data_command_config: settings that do not apply were ignored: %s", ", ".join(ignored))
    reset = str(ours["auto.offset.reset"]).lower()
    if reset not in _RESETS:
        raise ValueError(f"auto.offset.reset must be earliest, latest or none, not {ours['auto.offset.reset']!r}")
    ours["auto.offset.reset"] = _RESETS[reset]
    try:
        ours["max.poll.records"] = int(ours["max.poll.records"])
    except (TypeError, ValueError):
        raise ValueError(f"max.poll.records must be an integer, not {ours['max.poll.records']!r}") from None
    if not 1 <= ours["max.poll.records"] <= 1_000_000:
        raise ValueError("max.poll.records must be between 1 and 1000000")
    return group, ours, data


class _Bridge:
    """The listener given to the inner GroupConsumer: moves librdkafka's assignment with the group's,
    then calls the user's listener."""

    __slots__ = ("owner", "user")

    def __init__(self, owner, user):
        self.owner = owner
        self.user = user

    def on_partitions_revoked(self, parts):
        self.owner._stop_fetching(parts)
        fn = getattr(self.user, "on_partitions_revoked", None)
        if fn is not None:
            fn(parts)

    def on_partitions_lost(self, parts):
        self.owner._stop_fetching(parts)
        fn = getattr(self.user, "on_partitions_lost", None) or getattr(self.user, "on_partitions_revoked", None)
        if fn is not None:
            fn(parts)

    def on_partitions_assigned(self, parts):
        self.owner._start_fetching(parts)
        fn = getattr(self.user, "on_partitions_assigned", None)
        if fn is not None:
            fn(parts)


class KafkaGroupConsumer:
    """A herd group member that returns its partitions' records. See the module docstring."""

    def __init__(self, bootstrap_servers=None, group_id: str | None = None, data_bootstrap_servers=None,
                 config: dict | None = None, **kwargs):
        ck = _import_kafka()
        self._ck = ck
        group_cfg, ours, data = split_config(config, kwargs)
        if not data_bootstrap_servers:
            raise ValueError("data_bootstrap_servers (the Kafka cluster holding the records) is required")
        if not isinstance(data_bootstrap_servers, str):
            data_bootstrap_servers = ",".join(
                f"{s[0]}:{s[1]}" if isinstance(s, tuple) else str(s) for s in data_bootstrap_servers)
        self.data_bootstrap_servers = data_bootstrap_servers
        self._max_records = ours["max.poll.records"]
        self._reset = ours["auto.offset.reset"]
        self._inner = GroupConsumer(bootstrap_servers, group_id, group_cfg)
        cfg = self._inner.config
        rk_conf = {
            "bootstrap.servers": data_bootstrap_servers,
            # confluent-kafka wants a group.id; in assign mode no group is joined and nothing is
            # committed to the data cluster (herd holds the offsets).
            "group.id": f"herd-assign-{cfg.group_id}",
            "client.id": cfg.client_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": {"none": "error"}.get(self._reset, self._reset),
            "error_cb": self._on_error,
            "logger": _RdkafkaLogger(self),
        }
        rk_conf.update(data)
        try:
            self._rk = ck.Consumer(rk_conf)
        except Exception:
            self._inner.close(0)
            raise
        self._ctp = ck.TopicPartition
        self._fetching: set = set()  # assigned to librdkafka
        self._fetch_ctps: list | None = None  # the same, as librdkafka TopicPartitions (cached)
        self._rk_positions: dict = {}  # librdkafka's consumed position, as last seen
        self._pending: set = set()  # assigned by the group, start offset not known yet (herd unreachable)
        self._paused: set = set()
        self._seeks: dict = {}  # seek() of a pending partition
        self._unresolved: set = set()  # started at a logical offset librdkafka has not resolved yet
        self._warned: dict = {}
        self._closed = False

    # -- context manager ---------------------------------------------------------------------------
    def __enter__(self) -> KafkaGroupConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- logging of the data cluster's errors -----------------------------------------------------
    def _warn(self, key, text: str) -> None:
        now = time.monotonic()
        last = self._warned.get(key)
        if last is not None and now - last < _WARN_EVERY_S:
            return
        self._warned[key] = now
        log.warning("data cluster %s: %s", self.data_bootstrap_servers, text)

    def _on_error(self, err) -> None:
        self._warn(err.code(), f"{err.name()}: {err.str()}")

    # -- subscription ------------------------------------------------------------------------------
    def subscribe(self, topics, listener=None) -> None:
        """Join the herd group for ``topics``; ``listener`` as GroupConsumer's (any subset of
        on_partitions_revoked / on_partitions_assigned / on_partitions_lost)."""
        self._inner.subscribe(topics, _Bridge(self, listener))

    def unsubscribe(self) -> None:
        self._inner.unsubscribe()

    def subscription(self) -> frozenset:
        return self._inner.subscription()

    def assignment(self) -> frozenset:
        """The partitions assigned to this member (as of the last poll)."""
        return self._inner.assignment()

    # -- assignment changes (run on the polling thread, from the inner listener) -------------------
    def _stop_fetching(self, parts) -> None:
        gone = [self._ctp(tp.topic, tp.partition) for tp in parts if tp in self._fetching]
        if gone:
            # librdkafka drops what it fetched for them: no record of theirs is consumed after this.
            self._rk.incremental_unassign(gone)
        self._fetch_ctps = None
        for tp in parts:
            self._rk_positions.pop(tp, None)
            self._fetching.discard(tp)
            self._pending.discard(tp)
            self._paused.discard(tp)
            self._unresolved.discard(tp)
            self._seeks.pop(tp, None)

    def _start_fetching(self, parts) -> None:
        self._pending.update(parts)
        self._start_pending(self._inner.config.s("request_timeout_ms"))

    def _start_pending(self, timeout_s: float) -> None:
        """Assign the pending partitions to librdkafka from their committed offsets in herd (else
        auto.offset.reset). If herd does not answer in time they stay pending (retried by poll)."""
        pending = sorted(self._pending)
        if not pending:
            return
        try:
            committed = self._inner.committed(pending, timeout_s=timeout_s)
        except cerr.KafkaError as exc:
            self._warn("offset-fetch", f"committed offsets from herd not read yet ({exc}); retrying")
            return
        ck = self._ck
        starts, reset = {}, []
        for tp in pending:
            if tp in self._seeks:
                starts[tp] = self._seeks.pop(tp)
            elif committed.get(tp) is not None and committed[tp].offset >= 0:
                starts[tp] = committed[tp].offset
            else:
                reset.append(tp)
        if reset:
            starts.update(self._resolve_reset(reset))
        assign = []
        for tp in pending:
            off = starts.get(tp)
            if off is None:
                if self._reset == "none":
                    raise cerr.KafkaError(f"no committed offset for {tp} and auto.offset.reset=none")
                off = ck.OFFSET_BEGINNING if self._reset == "earliest" else ck.OFFSET_END
                self._unresolved.add(tp)
            else:
                self._inner.seek(tp, off)  # Kafka commits a resolved position even before a record
            assign.append(self._ctp(tp.topic, tp.partition, off))
        self._rk.incremental_assign(assign)
        self._fetching.update(pending)
        self._fetch_ctps = None
        self._pending.difference_update(pending)
        paused = [c for c, tp in zip(assign, pending, strict=True) if tp in self._paused]
        if paused:
            self._rk.pause(paused)

    def _resolve_reset(self, parts) -> dict:
        """The data cluster's earliest / latest offsets of ``parts`` (one batched ListOffsets); {} when
        it does not answer in time (librdkafka then resolves the logical offset itself)."""
        if self._reset == "none":
            return {}
        spec = self._ck.OFFSET_BEGINNING if self._reset == "earliest" else self._ck.OFFSET_END
        try:
            got = self._rk.offsets_for_times([self._ctp(tp.topic, tp.partition, spec) for tp in parts], timeout=5.0)
        except Exception as exc:
            self._warn("list-offsets", f"ListOffsets failed: {exc}")
            return {}
        out = {}
        for c in got:
            if c.error is None and c.offset >= 0:
                out[TopicPartition(c.topic, c.partition)] = c.offset
        return out

    # -- poll --------------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.0) -> list:
        """Run the group (rebalance callbacks, auto-commit) and return up to ``max.poll.records``
        records of the assigned partitions, waiting up to ``timeout_s`` for the first one."""
        return self._poll(timeout_s, Record)

    def poll_messages(self, timeout_s: float = 0.0) -> list:
        """``poll``, returning librdkafka's ``confluent_kafka.Message`` objects as they come (no
        object of ours per record: ``m.value()``, ``m.offset()``, ...); positions, commits and
        rebalances work the same."""
        return self._poll(timeout_s, None)

    def _poll(self, timeout_s: float, wrap) -> list:
        if self._closed:
            raise cerr.IllegalStateError("the consumer is closed")
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        inner, rk, maxn = self._inner, self._rk, self._max_records
        while True:
            inner.poll(0)
            if self._pending:
                self._start_pending(min(1.0, max(0.05, deadline - time.monotonic())))
            remaining = deadline - time.monotonic()
            if not self._fetching or self._fetching <= self._paused:
                if remaining <= 0:
                    return []
                inner.poll(min(remaining, _SLICE_S))
                time.sleep(min(max(0.0, deadline - time.monotonic()), 0.02))
                continue
            msgs = rk.consume(maxn, 0)
            if not msgs and remaining > 0:
                # consume(n, t) waits for n messages or t: wait for the first, then take what is there.
                msgs = rk.consume(1, min(remaining, _SLICE_S))
                if msgs and maxn > 1:
                    msgs += rk.consume(maxn - 1, 0)
            if msgs:
                records = self._records(msgs, wrap)
                if records:
                    return records
            if self._unresolved:
                self._note_resolved()
            if deadline - time.monotonic() <= 0:
                return []

    def _records(self, msgs, wrap) -> list:
        if any(map(_error, msgs)):
            for m in msgs:
                err = m.error()
                if err is not None and err.code() != self._ck.KafkaError._PARTITION_EOF:
                    self._warn(err.code(), f"{err.name()}: {err.str()} ({m.topic()}-{m.partition()})")
            msgs = [m for m in msgs if m.error() is None]
            if not msgs:
                return []
        records = list(map(wrap, msgs)) if wrap is not None else msgs
        # The consumed positions, from librdkafka (its application position moves with what
        # consume() returned): one call per poll, no per-record work here.
        seek, known = self._inner.seek, self._rk_positions
        for c in self._rk.position(self._fetch_list()):
            off = c.offset
            if off >= 0:
                tp = TopicPartition(c.topic, c.partition)
                if known.get(tp) != off:
                    known[tp] = off
                    seek(tp, off)
                    if self._unresolved:
                        self._unresolved.discard(tp)
        return records

    def _fetch_list(self) -> list:
        if self._fetch_ctps is None:
            self._fetch_ctps = [self._ctp(tp.topic, tp.partition) for tp in sorted(self._fetching)]
        return self._fetch_ctps

    def _note_resolved(self) -> None:
        """Partitions started at a logical offset: once librdkafka knows where it is, that position
        becomes ours (and is committed as Kafka commits a reset position)."""
        for c in self._rk.position([self._ctp(tp.topic, tp.partition) for tp in sorted(self._unresolved)]):
            if c.offset >= 0:
                tp = TopicPartition(c.topic, c.partition)
                self._unresolved.discard(tp)
                if tp in self._fetching:
                    self._inner.seek(tp, c.offset)

    # -- positions ---------------------------------------------------------------------------------
    def position(self, partition) -> int | None:
        """The offset of the next record ``poll`` returns for ``partition`` (None if not known yet)."""
        tp = TopicPartition(*partition)
        off = self._inner.position(tp)
        if off is not None:
            return off
        if tp in self._fetching:
            (c,) = self._rk.position([self._ctp(tp.topic, tp.partition)])
            if c.offset >= 0:
                return c.offset
        return None

    def seek(self, partition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on (the next poll returns it first)."""
        tp = TopicPartition(*partition)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offsets are non-negative integers, not {offset!r}")
        self._inner.seek(tp, offset)  # raises IllegalStateError if not assigned
        self._unresolved.discard(tp)
        if tp in self._pending:
            self._seeks[tp] = offset
        elif tp in self._fetching:
            c = self._ctp(tp.topic, tp.partition, offset)
            try:
                self._rk.seek(c)
            except self._ck.KafkaException:
                # not fetching yet (just assigned): assign again from the offset
                self._rk.incremental_unassign([self._ctp(tp.topic, tp.partition)])
                self._rk.incremental_assign([c])
                if tp in self._paused:
                    self._rk.pause([c])

    def pause(self, partitions) -> None:
        """Stop returning (and fetching) records of these assigned partitions until ``resume``."""
        parts = self._own(partitions)
        self._paused.update(parts)
        active = [self._ctp(tp.topic, tp.partition) for tp in parts if tp in self._fetching]
        if active:
            self._rk.pause(active)

    def resume(self, partitions) -> None:
        parts = self._own(partitions)
        active = [self._ctp(tp.topic, tp.partition, self._inner.position(tp) or self._ck.OFFSET_INVALID)
                  for tp in parts if tp in self._paused and tp in self._fetching]
        self._paused.difference_update(parts)
        if active:
            self._rk.resume(active)

    def paused(self) -> frozenset:
        return frozenset(self._paused)

    def _own(self, partitions) -> list:
        if isinstance(partitions, TopicPartition):
            partitions = [partitions]
        parts = [TopicPartition(*p) for p in partitions]
        view = self._inner.assignment()
        for tp in parts:
            if tp not in view:
                raise cerr.IllegalStateError(f"{tp} is not assigned to this consumer")
        return parts

    # -- commits and group state (herd) ------------------------------------------------------------
    def commit(self, offsets=None, sync: bool = True, callback=None, timeout_s: float | None = None):
        """Commit to herd the consumed positions (``offsets=None``: every assigned partition's) or
        exactly ``offsets`` ({tp: offset | (offset, metadata)}); ``sync=False`` returns at once and
        ``callback(offsets, error)`` runs on a later poll. See ``GroupConsumer.commit``."""
        return self._inner.commit(offsets, sync=sync, callback=callback, timeout_s=timeout_s)

    def committed(self, partitions, timeout_s: float | None = None) -> dict:
        return self._inner.committed(partitions, timeout_s=timeout_s)

    def positions(self) -> dict:
        return self._inner.positions()

    def watermarks(self, partition, timeout_s: float = 5.0) -> tuple[int, int]:
        """(low, high) offsets of ``partition`` in the data cluster."""
        tp = TopicPartition(*partition)
        return self._rk.get_watermark_offsets(self._ctp(tp.topic, tp.partition), timeout=timeout_s)

    def generation(self) -> int:
        return self._inner.generation()

    def member_id(self) -> str:
        return self._inner.member_id()

    def group_state(self) -> dict:
        return self._inner.group_state()

    @property
    def config(self):
        return self._inner.config

    @property
    def group_consumer(self) -> GroupConsumer:
        """The inner herd group member."""
        return self._inner

    # -- close -------------------------------------------------------------------------------------
    def close(self, timeout_s: float = 30.0) -> None:
        """Commit positions (auto-commit), run the revocation, leave the herd group (dynamic
        members) and close the data-cluster client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._inner.close(timeout_s)
        finally:
            try:
                self._rk.close()
            except Exception as exc:  # already closed, or librdkafka's own error
                log.debug("closing the data-cluster consumer: %s", exc)


class _RdkafkaLogger:
    """librdkafka's log lines (``logger`` property): errors and warnings to our WARNING, naming the
    data cluster, rate-limited; the rest at DEBUG."""

    def __init__(self, owner):
        import weakref

        self.owner = weakref.ref(owner)

    def log(self, level, msg, *args, **kwargs):
        owner = self.owner()
        text = msg % args if args else msg
        if owner is not None and level >= logging.WARNING:  # confluent-kafka maps syslog levels to logging's
            owner._warn(("log", text[:40]), text)
        else:
            log.debug("librdkafka: %s", text)
