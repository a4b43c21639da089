"""The data cluster as herd's topic catalog and log-offset oracle, on the event loop.

With ``data_bootstrap_server`` set, herd keeps no topics of its own: the data cluster's partition
counts and topic ids are the catalog (:class:`coordinator.core.catalog.DataTopics`, the pure view), and
ListOffsets is answered with the data cluster's offsets. :class:`DataCatalog` does the reading, with
the same :class:`coordinator.ops.datacluster.DataClusterReader` the lag refresher uses (one connection
per broker, batched per leader, every call bounded by a timeout):

* ``prime()`` at start: one read of every topic (bounded by ``wait_ms``); herd starts whatever it
  gives (the data cluster down: topics are read when it answers).
* every ``data_metadata_refresh_interval_ms``: every topic again. A change (a topic created, grown,
  deleted or recreated under a new id) calls ``on_change`` (the runtime's ``topics_changed``: consumer
  groups get a new target assignment; classic members see the new count in Metadata and rejoin).
* ``read(names)``: a Metadata naming topics the view never read (or not within ``RECHECK_MS``) waits
  for a read of those names, at most ``wait_ms``; names asked for in the same loop turn share one
  read. A read that fails or times out marks its names LEADER_NOT_AVAILABLE for ``RECHECK_MS`` (a
  client retries; the next request does not wait again at once). Consumer groups never wait: a name
  they look up that the view lacks is read soon (``DataTopics.want``) and ``on_change`` follows.
* ``list_offsets(request, version)``: the data cluster's answer for every partition, shaped for the
  client's version by ``Catalog.list_offsets_answer``; a partition whose leader could not be asked
  in time is LEADER_NOT_AVAILABLE (retriable), never a made-up offset.

Nothing here runs inside a group request: the runtime parks only the Metadata or ListOffsets
request itself (its connection's later requests wait behind it, as on a broker).
"""
from __future__ import annotations

import asyncio
import contextlib

from coordinator import logging_setup
from coordinator.core.catalog import PENDING, Catalog, DataTopics
from coordinator.ops.datacluster import DataClusterError, DataClusterReader
from protocol import errors as E

log = logging_setup.get("herd.datacatalog")

WAIT_MS = 5000  # the longest a Metadata or ListOffsets waits for the data cluster
LIST_OFFSETS = {-1: "latest", -2: "earliest", -3: "max-timestamp", -4: "earliest-local", -5: "latest-tiered"}


def from_config(config, catalog: Catalog, clock) -> DataCatalog:
    """The data catalog for ``data_bootstrap_server`` (its reader with the TLS/SASL settings of
    ``data_command_config``; the lag refresher shares it). ``ValueError`` (one line) for settings
    that cannot be used. The runtime it is given to sets ``on_change``."""
    from coordinator.ops.datacluster import reader_from_config
    from coordinator.ops.lag import default_timeout_ms

    reader = reader_from_config(config, timeout_ms=default_timeout_ms(config.lag_refresh_interval_ms) * 9 // 10)
    return DataCatalog(reader, catalog, clock, interval_ms=config.data_metadata_refresh_interval_ms)


class DataCatalog:
    def __init__(self, reader: DataClusterReader, catalog: Catalog, clock, interval_ms: int = 30_000,
                 wait_ms: int = WAIT_MS, on_change=None):
        if catalog.data is None:
            catalog.data = DataTopics()
        self.reader = reader
        self.catalog = catalog
        self.view: DataTopics = catalog.data
        self.clock = clock
        self.interval_ms = interval_ms
        self.wait_ms = wait_ms
        self.on_change = on_change
        self.view.on_wanted = self._wanted
        self._names: set[str] = set()  # the next read's names
        self._all = False  # the next read is of every topic
        self._next: asyncio.Future | None = None  # resolved when the next read ends
        self._task: asyncio.Task | None = None
        self._reads: set[asyncio.Task] = set()
        self.up = None  # None: never read; True/False: the last read answered or not
        self.stats = {"reads": 0, "read_failures": 0, "list_offsets": 0}

    # ---- lifecycle -------------------------------------------------------------------------------

    async def prime(self) -> bool:
        """The first read of every topic, bounded; -> whether it answered."""
        return await self._read_all()

    async def open(self, topics=()) -> None:
        """At start: :meth:`prime`, logged; ``topics`` (``--topic`` NAME:PARTITIONS) checked against
        what it read: a count other than the data cluster's is a warning, a name it lacks is
        ``ValueError`` (one line). A data cluster down at start is a warning: its topics are read
        when it answers."""
        where = ",".join(f"{h}:{p}" for h, p in self.reader.servers)
        if await self.prime():
            log.info("topics: the data cluster's", data_bootstrap_server=where, topics=len(self.view.topics),
                     refresh_interval_ms=self.interval_ms)
        else:
            log.warning("the data cluster did not answer at start: its topics are read when it answers",
                        data_bootstrap_server=where)
        for name, parts in topics:
            topic = self.view.topics.get(name)
            if topic is not None and topic.partitions != parts:
                log.warning("--topic names a partition count the data cluster does not have: its count is used",
                            topic=name, flag=parts, data_cluster=topic.partitions)
        missing = self.missing([name for name, _ in topics])
        if missing:
            self.reader.close()
            raise ValueError(f"--topic {', '.join(missing)}: the data cluster at {where} has no such topic "
                             "(herd takes topics from it: create them there, or drop --topic)")

    def missing(self, names) -> list[str]:
        """Of ``names`` (``--topic``), those the data cluster lacks by the last read of every topic
        ([] when none answered: nothing is known to be missing)."""
        if self.view.full_at is None:
            return []
        return [n for n in names if n not in self.view.topics]

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> DataCatalog:
        loop = loop or asyncio.get_running_loop()
        self._task = loop.create_task(self._run())
        return self

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._reads) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.reader.close()

    def stop_soon(self) -> None:
        """Stop from synchronous code: the tasks are cancelled, the reader closed."""
        for t in (self._task, *self._reads):
            if t is not None:
                t.cancel()
        self._task = None
        self.reader.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            await self.read([])

    # ---- reads -----------------------------------------------------------------------------------

    async def read(self, names: list[str]) -> None:
        """Read ``names`` ([]: every topic) into the view, sharing one read with the other callers of
        this loop turn; returns when it ended or ``wait_ms`` passed (then its names are marked
        LEADER_NOT_AVAILABLE for a while). Never raises for the data cluster's failures."""
        if not names:
            self._all = True
        self._names.update(names)
        fut = self._next
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._next = loop.create_future()
            loop.call_soon(self._launch)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.wait_ms / 1000)
        except TimeoutError:
            self.view.read_failed(names, self.clock.monotonic_ms())

    def _wanted(self) -> None:
        """A consumer group looked up names the view lacks: read those not read lately."""
        now = self.clock.monotonic_ms()
        view = self.view
        names = [n for n in view.wanted if view.lookup(n, now) is PENDING]
        view.wanted.clear()
        if names:
            loop = asyncio.get_running_loop()
            task = loop.create_task(self.read(names))
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    def _launch(self) -> None:
        names, everything, fut = sorted(self._names), self._all, self._next
        self._names, self._all, self._next = set(), False, None
        task = asyncio.get_running_loop().create_task(self._read(names, everything, fut))
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    async def _read(self, names: list[str], everything: bool, fut: asyncio.Future) -> None:
        try:
            if everything:
                await self._read_all()
            if names and not everything:
                await self._read_names(names)
        finally:
            if not fut.done():
                fut.set_result(None)

    async def _read_all(self) -> bool:
        self.stats["reads"] += 1
        try:
            got = await self.reader.topics(None, timeout_ms=self.wait_ms)
        except DataClusterError as exc:
            self._failed(str(exc))
            return False
        self._answered()
        if self.view.apply_all(got.found, got.errors, self.clock.monotonic_ms()):
            self._changed()
        return True

    async def _read_names(self, names: list[str]) -> None:
        self.stats["reads"] += 1
        try:
            got = await self.reader.topics(names, timeout_ms=self.wait_ms)
        except DataClusterError as exc:
            self.view.read_failed(names, self.clock.monotonic_ms())
            self._failed(str(exc))
            return
        self._answered()
        if self.view.apply_names(got.found, got.unknown, got.errors, self.clock.monotonic_ms()):
            self._changed()

    def _failed(self, why: str) -> None:
        self.stats["read_failures"] += 1
        if self.up is not False:
            log.warning("data cluster topics not read: Metadata answers from the last read (topics never read: "
                        "LEADER_NOT_AVAILABLE) until it answers", error=why)
        self.up = False

    def _answered(self) -> None:
        if self.up is False:
            log.info("data cluster topics read again")
        self.up = True

    def _changed(self) -> None:
        log.info("data cluster topics changed", topics=len(self.view.topics), version=self.view.version)
        if self.on_change is not None:
            self.on_change()

    # ---- ListOffsets -----------------------------------------------------------------------------

    async def list_offsets(self, request, version: int):
        """The data cluster's ListOffsets answer for ``request``, shaped for ``version``."""
        self.stats["list_offsets"] += 1
        specs: dict = {}
        duplicates = set()
        for rt in request.topics:
            for rp in rt.partitions:
                tp = (rt.name, rp.partition_index)
                if tp in specs:
                    duplicates.add(tp)
                specs[tp] = rp.timestamp
        if version >= 1:  # as Kafka: a partition asked twice is INVALID_REQUEST, not asked
            for tp in duplicates:
                del specs[tp]
        isolation = request.isolation_level if version >= 2 else 0
        timeout = self.wait_ms
        if version >= 10 and request.timeout_ms > 0:
            timeout = min(timeout, request.timeout_ms)
        answers = await self.reader.list_offsets(specs, isolation, timeout_ms=timeout) if specs else {}
        if version >= 1:
            for tp in duplicates:
                answers[tp] = (E.INVALID_REQUEST, -1, -1)
        return self.catalog.list_offsets_answer(request, version, answers)

    # ---- metrics ---------------------------------------------------------------------------------

    def metric_lines(self) -> list[str]:
        from coordinator.ops.metrics import _family

        lines = _family("herd_data_topics", "gauge", "Topics of the data cluster as herd last read them.",
                        [("", len(self.view.topics))])
        lines += _family("herd_data_catalog_up", "gauge", "1 when the data cluster answered herd's last read of "
                         "its topics.", [("", 1 if self.up else 0)])
        lines += _family("herd_data_catalog_reads_total", "counter", "Reads of the data cluster's topics.",
                         [("", self.stats["reads"])])
        lines += _family("herd_data_catalog_read_failures_total", "counter", "Reads of the data cluster's "
                         "topics that failed or timed out.", [("", self.stats["read_failures"])])
        lines += _family("herd_data_list_offsets_total", "counter", "ListOffsets requests answered from the "
                         "data cluster.", [("", self.stats["list_offsets"])])
        return lines
