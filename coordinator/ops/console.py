"""The operator's console and the lag metrics: every group's lag, in offsets and in seconds.

Read-only views over the group coordinator (``list_groups``, ``describe_group``, ``group_history``,
``committed_by_shard``, ...) and the :mod:`coordinator.ops.lag` tracker, shaped three ways:

* Prometheus lines (``metric_lines``, a collector of :class:`coordinator.ops.metrics.Metrics`):
  ``herd_group_lag{group,topic,partition}`` and ``herd_group_lag_seconds{group,topic,partition}``
  (``lag_metrics = "partition"``), the per-group ``herd_group_max_lag``, ``herd_group_max_lag_seconds``
  and ``herd_group_sum_lag``, and ``herd_group_last_commit_age_seconds{group}`` for every group with
  commits (Empty ones included). Lag is exported only where a fresh log-end sample exists: without
  a data cluster, commit ages only; a stale partition drops out (and ``herd_lag_stale_partitions``
  counts it) rather than showing a made-up number.
* JSON for the console (``api``): ``GET /api/groups`` (the list, sorted, filtered and paginated
  here so the page never holds 10,000 rows) and ``GET /api/group?id=G`` (members, partitions, the
  flight recorder's rebalances).
* the page itself: ``GET /`` and ``/console/*``, static files shipped in the package
  (``coordinator/ops/console_static``), hand-written, no build step, no outside host.

Everything is computed on the event loop thread from plain reads (but a page of the list: filtered
and sorted on a thread from the table as it is, ``prepare_for``); the per-group table behind the
list and the metrics is rebuilt at most every ``TABLE_TTL_S`` (the console polls every few seconds),
in steps with a loop turn between them (:meth:`Console.prepare`, awaited by the HTTP endpoint).
"""
from __future__ import annotations

import asyncio
import json
import time
from importlib import resources
from urllib.parse import parse_qs

from coordinator import logging_setup
from coordinator.core.auth.view import EVERYTHING, View
from coordinator.ops.lag import LagRefresher, LagTracker, LogEndSource
from coordinator.ops.metrics import SECURITY_HEADERS, group_forbidden
from protocol.consumer import PROTOCOL_TYPE as CONSUMER
from protocol.consumer import decode_assignment

__all__ = ["Console", "make_source"]

log = logging_setup.get("herd.console")

TABLE_TTL_S = 1.0
GROUP_STEP = 1000
LINE_STEP = 1000
FOLD_STEP = 1000  # committed partitions per step
FREE_STEP = 10_000
HOUR_MS = 3_600_000
MAX_PAGE = 500
SORT_KEYS = ("group_id", "state", "type", "protocol_type", "members", "lag", "lag_seconds", "last_commit_age",
             "rebalances_1h", "partitions")
STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "app.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
def make_source(config, reader=None) -> LogEndSource | None:
    """The log-end source for ``data_bootstrap_server`` (the data-cluster reader,
    :mod:`coordinator.ops.datacluster`, with the TLS/SASL settings of ``data_command_config``; ``reader``
    when the daemon made it already, for its catalog), or None without one (commit ages only).
    ``ValueError`` (one line) for settings that cannot be used."""
    if not config.data_bootstrap_server:
        return None
    from coordinator.ops.datacluster import reader_from_config
    from coordinator.ops.lag import default_timeout_ms

    # each fetch ends (with what it read, or why not) before the refresher gives up on it
    if reader is None:
        reader = reader_from_config(config, timeout_ms=default_timeout_ms(config.lag_refresh_interval_ms) * 9 // 10)
    log.info("lag: reading log ends from the data cluster", data_bootstrap_server=config.data_bootstrap_server,
             security_protocol=reader.security.protocol, interval_ms=config.lag_refresh_interval_ms)
    return reader


class _Row:
    __slots__ = ("group_id", "state", "type", "protocol_type", "members", "lag", "max_lag", "lag_seconds",
                 "lag_seconds_method", "last_commit_ms", "rebalances_1h", "rebalances_capped", "partitions",
                 "known", "stale", "by_topic")

    def __init__(self, group_id: str):
        self.group_id = group_id
        self.state = "Empty"
        self.type = ""  # classic or consumer (KIP-848), as ListGroups v5 and `herd groups list --type`
        self.protocol_type = ""  # a classic group's protocol type ("consumer", "connect", ...)
        self.members = 0
        self.lag: int | None = None  # sum over partitions with a fresh sample
        self.max_lag: int | None = None
        self.lag_seconds: float | None = None  # max over them
        self.lag_seconds_method: str | None = None  # how that max was found (lag.INTERPOLATED, ...)
        self.last_commit_ms: int | None = None
        self.rebalances_1h = 0
        self.rebalances_capped = False
        self.partitions = 0  # committed partitions
        self.known = 0  # of which with a fresh lag
        self.stale = 0  # of which stale (sampled once, not lately)
        # authorizer = acl: the same sums per topic, {topic: _Row} (a principal sees only the topics
        # it may describe: its row is summed from those, :meth:`only`); None otherwise
        self.by_topic: dict[str, _Row] | None = None

    def add(self, off_ts: int, lag_of, key, off: int, now: int) -> tuple | None:
        """Count one committed partition (``lag_of``: the tracker's, or None): its fresh
        ``(lag, lag_ms)``, or None."""
        self.partitions += 1
        if self.last_commit_ms is None or off_ts > self.last_commit_ms:
            self.last_commit_ms = off_ts
        if lag_of is None:
            return None
        end, lag, lag_ms, stale, method = lag_of(key, off, now)
        if end is None:
            return None
        if stale:
            self.stale += 1
            return None
        self.known += 1
        if self.lag is None:
            self.lag = self.max_lag = lag
        else:
            self.lag += lag
            if lag > self.max_lag:
                self.max_lag = lag
        if lag_ms is not None:
            secs = lag_ms / 1000
            if self.lag_seconds is None or secs > self.lag_seconds:
                self.lag_seconds = secs
                self.lag_seconds_method = method
        return lag, lag_ms

    def only(self, topic_visible) -> _Row:
        """This row summed over the topics ``topic_visible`` accepts (itself when all are)."""
        parts = self.by_topic
        if parts is None or all(topic_visible(t) for t in parts):
            return self
        r = _Row(self.group_id)
        r.state, r.type, r.protocol_type, r.members = self.state, self.type, self.protocol_type, self.members
        r.rebalances_1h, r.rebalances_capped = self.rebalances_1h, self.rebalances_capped
        for topic, t in parts.items():
            if not topic_visible(topic):
                continue
            r.partitions += t.partitions
            r.known += t.known
            r.stale += t.stale
            if t.last_commit_ms is not None and (r.last_commit_ms is None or t.last_commit_ms > r.last_commit_ms):
                r.last_commit_ms = t.last_commit_ms
            if t.lag is not None:
                if r.lag is None:
                    r.lag, r.max_lag = t.lag, t.max_lag
                else:
                    r.lag += t.lag
                    r.max_lag = max(r.max_lag, t.max_lag)
            if t.lag_seconds is not None and (r.lag_seconds is None or t.lag_seconds > r.lag_seconds):
                r.lag_seconds, r.lag_seconds_method = t.lag_seconds, t.lag_seconds_method
        return r

    def as_json(self, now_ms: int) -> dict:
        return {"group_id": self.group_id, "state": self.state, "type": self.type,
                "protocol_type": self.protocol_type,
                "members": self.members, "lag": self.lag,
                "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
                "lag_seconds_method": self.lag_seconds_method,
                "last_commit_ms": self.last_commit_ms,
                "last_commit_age": (None if self.last_commit_ms is None
                                    else round((now_ms - self.last_commit_ms) / 1000, 3)),
                "rebalances_1h": self.rebalances_1h, "rebalances_1h_or_more": self.rebalances_capped,
                "partitions": self.partitions,
                "lag_partitions": self.known, "stale_partitions": self.stale}


class Console:
    def __init__(self, config, groups, clock=None, source: LogEndSource | None = None, now_ms=None):
        from coordinator.clock import SystemClock

        self.config = config
        self.groups = groups
        self.clock = clock if clock is not None else SystemClock()
        self.now_ms = now_ms  # monotonic ms for views of rebalances in progress (the runtime's clock)
        self.started_ms = self.clock.wall_ms()  # the flight recorder (in memory) starts empty here
        self.tracker: LagTracker | None = None
        self.refresher: LagRefresher | None = None
        if source is not None:
            interval = config.lag_refresh_interval_ms
            self.tracker = LagTracker(config.lag_history_size, stale_after_ms=2 * interval + 1000)
            self.refresher = LagRefresher(self.tracker, source, groups.committed_partitions, self.clock, interval)
        self._table: tuple[float, int, dict[str, _Row], list[tuple]] | None = None
        self.table_ttl_s = TABLE_TTL_S
        self._building: asyncio.Future | None = None
        self._lines: tuple | None = None  # (the table they were rendered from, lines)
        self._rendering: tuple | None = None  # the table _render_in_steps is reading
        self._prepared = False  # prepare_for just made the table (and lines) the next answer uses
        self._in_use: list = []  # tables a thread reads (never freed in steps meanwhile)
        self._page = None  # the /api/groups answer prepare_for computed

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, loop=None) -> Console:
        if self.refresher is not None:
            self.refresher.start(loop)
        return self

    def stop(self) -> None:
        if self.refresher is not None:
            self.refresher.stop()
            close = getattr(self.refresher.source, "close", None)
            if close is not None:
                close()

    # ---- the per-group table -----------------------------------------------------------------------

    def table(self) -> tuple[int, dict[str, _Row], list[tuple]]:
        """``(wall ms, rows by group, partition lags)``, at most ``table_ttl_s`` old (rebuilt here
        at once if older; :meth:`prepare` rebuilds it in steps). A partition lag is ``(group,
        topic, partition, lag, lag_ms or None)``, fresh samples only."""
        cached = self._table
        prepared, self._prepared = self._prepared, False
        if cached is not None and (prepared or time.monotonic() - cached[0] < self.table_ttl_s):
            return cached[1], cached[2], cached[3]
        now = self.clock.wall_ms()
        rows: dict[str, _Row] = {}
        lags: list[tuple] = []
        for _ in self._fold(now, rows, lags):
            pass
        self._table = (time.monotonic(), now, rows, lags)
        return now, rows, lags

    async def prepare(self) -> None:
        """Make :meth:`table` fresh without holding the event loop: the fold runs in steps of about
        a shard (or ``GROUP_STEP`` groups), a loop turn between them; concurrent callers share one
        rebuild. 10,000 groups x 10 partitions fold in ~0.3 s of CPU: in one piece that would be a
        0.3 s stall for every heartbeat."""
        cached = self._table
        if cached is not None and time.monotonic() - cached[0] < self.table_ttl_s:
            return
        if self._building is None:
            self._building = asyncio.ensure_future(self._build_in_steps())
        await asyncio.shield(self._building)

    async def _build_in_steps(self) -> None:
        try:
            now = self.clock.wall_ms()
            rows: dict[str, _Row] = {}
            lags: list[tuple] = []
            for _ in self._fold(now, rows, lags):
                await asyncio.sleep(0)
            old, self._table = self._table, (time.monotonic(), now, rows, lags)
        finally:
            self._building = None
        if old is not None and old is not self._rendering and not any(t is old for t in self._in_use):
            # (one being rendered or read by a thread is left to refcounting)
            await _free_in_steps(old[2], old[3])

    async def prepare_for(self, target: str, view: View = EVERYTHING) -> None:
        """Called by the HTTP endpoint before it answers ``target``: the paths that read the table.
        ``view``: what the request's principal may see (authorizer = acl)."""
        path = target.split("?", 1)[0]
        if path not in ("/metrics", "/api/groups"):
            return
        await self.prepare()
        if path == "/metrics":
            await self._render_in_steps()
        elif path == "/api/groups":
            # filtering and sorting 20,000 rows takes tens of milliseconds: done on a thread (the
            # loop gets the interpreter back every switch interval), on the table as it is now
            table = self._table
            self._in_use.append(table)
            try:
                page = await asyncio.to_thread(self._page_of, table[1], table[2],
                                               parse_qs(target.partition("?")[2]), view)
            finally:
                self._in_use.remove(table)
            page["lag"] = self.lag_status(page["now_ms"])
            page["rebalances"] = self.rebalance_window(page["now_ms"])
            self._page = page
        # the answer, computed right after this returns (no await between), reads this table and
        # these lines even if preparing them took longer than the TTL: never a rebuild in one piece
        self._prepared = True

    def mark_prepared(self) -> None:
        """The next table/metric lines read takes what was prepared, however old (an HTTP answer
        rendered in slices calls this before each slice)."""
        self._prepared = True

    def invalidate(self) -> None:
        self._table = None

    def _fold(self, now: int, rows: dict[str, _Row], lags: list[tuple]):
        """Fill ``rows`` and ``lags``; yields between steps."""
        groups = self.groups
        since = now - HOUR_MS
        history_size = self.config.rebalance_history_size
        for i, g in enumerate(groups.list_groups()):
            gid = g["group_id"]
            r = rows[gid] = _Row(gid)
            r.state, r.protocol_type, r.members = g["state"], g["protocol_type"], g["members"]
            r.type = g.get("type", "classic")
            starts = groups.rebalance_starts(gid)
            r.rebalances_1h = sum(1 for t in starts if t >= since)
            # the flight recorder keeps rebalance_history_size: all of them this hour means "or more"
            r.rebalances_capped = len(starts) >= history_size and starts[0] >= since
            if i % GROUP_STEP == GROUP_STEP - 1:
                yield
        tracker = self.tracker
        lag_of = tracker.lag_with_method if tracker is not None else None
        per_topic = getattr(self.config, "authorizer", "none") == "acl"
        for shard_rows in groups.committed_by_shard():
            row = None
            for i, (gid, topic, p, off, ts) in enumerate(shard_rows):
                if i % FOLD_STEP == FOLD_STEP - 1:
                    yield
                if row is None or row.group_id != gid:
                    row = rows.get(gid)
                    if row is None:  # committed since the group list was read
                        row = rows[gid] = _Row(gid)
                if per_topic:  # the slower path, summed per topic too
                    if row.by_topic is None:
                        row.by_topic = {}
                    t = row.by_topic.get(topic)
                    if t is None:
                        t = row.by_topic[topic] = _Row(topic)
                    t.add(ts, lag_of, (topic, p), off, now)
                    got = row.add(ts, lag_of, (topic, p), off, now)
                    if got is not None:
                        lags.append((gid, topic, p, got[0], got[1]))
                    continue
                row.partitions += 1
                if row.last_commit_ms is None or ts > row.last_commit_ms:
                    row.last_commit_ms = ts
                if lag_of is None:
                    continue
                end, lag, lag_ms, stale, method = lag_of((topic, p), off, now)
                if end is None:
                    continue
                if stale:
                    row.stale += 1
                    continue
                row.known += 1
                if row.lag is None:
                    row.lag = row.max_lag = lag
                else:
                    row.lag += lag
                    if lag > row.max_lag:
                        row.max_lag = lag
                if lag_ms is not None:
                    secs = lag_ms / 1000
                    if row.lag_seconds is None or secs > row.lag_seconds:
                        row.lag_seconds = secs
                        row.lag_seconds_method = method
                lags.append((gid, topic, p, lag, lag_ms))
            yield

    # ---- Prometheus ------------------------------------------------------------------------------

    def metric_lines(self) -> list[str]:
        """The lines for /metrics (a :class:`coordinator.ops.metrics.Metrics` collector): those
        :meth:`prepare_for` rendered in steps for this table, else rendered here at once."""
        if self._prepared and self._lines is not None and self._lines[0] is self._table:
            self._prepared = False
            return self._lines[1]
        self.table()
        table = self._table
        if self._lines is not None and self._lines[0] is table:
            return self._lines[1]
        out: list[str] = []
        for _ in self._render(out):
            pass
        self._lines = (table, out)
        return out

    async def _render_in_steps(self) -> None:
        table = self._table
        if table is None or (self._lines is not None and self._lines[0] is table):
            return
        out: list[str] = []
        self._rendering = table
        try:
            for _ in self._render(out):
                await asyncio.sleep(0)
        finally:
            self._rendering = None
        if self._table is table:
            old, self._lines = self._lines, (table, out)
            if old is not None:
                await _free_in_steps({}, old[1])

    def _render(self, out: list[str]):
        """Append the exposition lines to ``out``; yields every ``LINE_STEP`` lines (100,000
        partitions make ~240,000 lines: in one piece, a stall of half a second)."""
        from coordinator.ops.metrics import _escape, _fmt

        _, now, rows, lags = self._table

        def family(name, kind, help_text):
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")

        committed = sorted((r for r in rows.values() if r.last_commit_ms is not None), key=lambda r: r.group_id)
        family("herd_group_last_commit_age_seconds", "gauge",
               "Seconds since the group's newest offset commit (every group with committed offsets, Empty ones too).")
        for i in range(0, len(committed), LINE_STEP):
            out.extend(f'herd_group_last_commit_age_seconds{{group="{_escape(r.group_id)}"}} '
                       f'{_fmt(round(max(0, now - r.last_commit_ms) / 1000, 3))}' for r in committed[i:i + LINE_STEP])
            yield
        if self.refresher is None:
            return  # no data cluster: no lag, not even empty lag families
        if self.config.lag_metrics == "partition":
            family("herd_group_lag", "gauge", "Log-end offset minus committed offset, per group and partition "
                   "(fresh log-end samples only).")
            for i in range(0, len(lags), LINE_STEP):
                out.extend(f'herd_group_lag{{group="{_escape(g)}",topic="{_escape(t)}",partition="{p}"}} {lag}'
                           for g, t, p, lag, _ in lags[i:i + LINE_STEP])
                yield
            family("herd_group_lag_seconds", "gauge", "How long ago the log end was at the committed offset "
                   "(interpolated from log-end samples; older than them, the age of the record at the committed "
                   "offset), per group and partition; only where it is known.")
            for i in range(0, len(lags), LINE_STEP):
                out.extend(f'herd_group_lag_seconds{{group="{_escape(g)}",topic="{_escape(t)}",partition="{p}"}} '
                           f'{_fmt(ms / 1000)}' for g, t, p, _, ms in lags[i:i + LINE_STEP] if ms is not None)
                yield
        known = [r for r in committed if r.lag is not None]
        family("herd_group_max_lag", "gauge", "The group's largest partition lag in offsets.")
        out.extend(f'herd_group_max_lag{{group="{_escape(r.group_id)}"}} {r.max_lag}' for r in known)
        yield
        family("herd_group_sum_lag", "gauge", "The group's lag in offsets summed over its partitions.")
        out.extend(f'herd_group_sum_lag{{group="{_escape(r.group_id)}"}} {r.lag}' for r in known)
        yield
        family("herd_group_max_lag_seconds", "gauge", "The group's largest partition lag in seconds.")
        out.extend(f'herd_group_max_lag_seconds{{group="{_escape(r.group_id)}"}} {_fmt(r.lag_seconds)}'
                   for r in known if r.lag_seconds is not None)
        yield
        ref, tracker = self.refresher, self.tracker
        stale = tracker.stale_count(now)
        family("herd_lag_source_up", "gauge", "1 when the data cluster answered the last log-end refresh entirely.")
        out.append(f"herd_lag_source_up {int(ref.up)}")
        family("herd_lag_refreshes_total", "counter", "Log-end refreshes run.")
        out.append(f"herd_lag_refreshes_total {ref.refreshes}")
        family("herd_lag_refresh_failures_total", "counter", "Log-end refreshes with a failed or timed-out batch.")
        out.append(f"herd_lag_refresh_failures_total {ref.failures}")
        family("herd_lag_last_success_timestamp_seconds", "gauge", "Unix time of the last complete log-end refresh.")
        out.append(f"herd_lag_last_success_timestamp_seconds {_fmt((ref.last_success_ms or 0) / 1000)}")
        family("herd_lag_refresh_cpu_seconds", "gauge", "Process CPU time of the last log-end refresh.")
        out.append(f"herd_lag_refresh_cpu_seconds {_fmt(round(ref.last_cpu_s, 6))}")
        family("herd_lag_partitions", "gauge", "Partitions with log-end samples, and of them stale ones.")
        out.append(f'herd_lag_partitions{{state="tracked"}} {len(tracker)}')
        out.append(f'herd_lag_partitions{{state="stale"}} {stale}')

    # ---- HTTP ------------------------------------------------------------------------------------

    def route(self, path: str, query: str, view: View = EVERYTHING):
        """``(status, content type, body, headers)`` for the console's paths, None for others;
        ``view``: what the request's principal may see (a group it may not describe: 403)."""
        if path in ("/", "/index.html"):
            return self._static("index.html")
        if path.startswith("/console/"):
            name = path[len("/console/"):]
            if name in STATIC:
                return self._static(name)
            return 404, "text/plain", b"not found\n", SECURITY_HEADERS
        if path == "/api/groups":
            page, self._page = self._page, None  # computed off the loop by prepare_for
            return self._json(page if page is not None else self.group_list(parse_qs(query), view))
        if path == "/api/group":
            gid = parse_qs(query, keep_blank_values=True).get("id", [None])[0]
            if gid is None:
                return self._json({"error": "id is required"}, 400)
            if not view.group(gid):
                return self._json(group_forbidden(view, gid), 403)
            detail = self.group_detail(gid, view)
            if detail is None:
                return self._json({"error": "unknown group", "group_id": gid}, 404)
            return self._json(detail)
        return None

    def _static(self, name: str):
        body = (resources.files("coordinator.ops") / "console_static" / name).read_bytes()
        return 200, STATIC[name], body, SECURITY_HEADERS

    @staticmethod
    def _json(obj, status: int = 200):
        return status, "application/json", json.dumps(obj, separators=(",", ":")).encode(), SECURITY_HEADERS

    def lag_status(self, now: int) -> dict:
        if self.refresher is None:
            return {"configured": bool(self.config.data_bootstrap_server), "up": False,
                    "reader": False, "data_bootstrap_server": self.config.data_bootstrap_server}
        st = self.refresher.status()
        st["reader"] = True
        st["data_bootstrap_server"] = self.config.data_bootstrap_server
        return st

    def group_list(self, q: dict, view: View = EVERYTHING) -> dict:
        now, rows, _ = self.table()
        page = self._page_of(now, rows, q, view)
        page["lag"] = self.lag_status(now)
        page["rebalances"] = self.rebalance_window(now)
        return page

    @staticmethod
    def _page_of(now: int, rows: dict, q: dict, view: View = EVERYTHING) -> dict:
        """The list's page for query ``q`` (pure: reads ``rows`` only; run on a thread): only the
        groups ``view`` shows, each summed over the topics it shows."""
        def one(name, default=""):
            v = q.get(name)
            return v[0] if v else default

        text = one("q").strip().lower()
        states = {s.lower() for s in one("state").split(",") if s}
        sort = one("sort", "group_id")
        if sort not in SORT_KEYS:
            sort = "group_id"
        desc = one("order", "asc") == "desc"
        try:
            offset = max(0, int(one("offset", "0")))
            limit = min(MAX_PAGE, max(1, int(one("limit", "50"))))
        except ValueError:
            offset, limit = 0, 50
        if not (view.all_groups and view.all_topics):
            rows = {gid: r.only(view.topic) for gid, r in rows.items() if view.group(gid)}
        selected = [r for r in rows.values()
                    if (not text or text in r.group_id.lower()) and (not states or r.state.lower() in states)]
        # ties always in group id order (a stable sort by id first; reverse keeps it stable)
        selected.sort(key=lambda r: r.group_id)
        if sort in ("state", "type", "protocol_type"):
            selected.sort(key=lambda r: getattr(r, sort), reverse=desc)
        elif sort == "group_id":
            if desc:
                selected.reverse()
        else:  # numbers; groups without a value (no commit, no lag known) last in both orders
            if sort == "last_commit_age":
                def value(r):
                    return None if r.last_commit_ms is None else now - r.last_commit_ms
            else:
                def value(r):
                    return getattr(r, sort)
            present = [r for r in selected if value(r) is not None]
            absent = [r for r in selected if value(r) is None]
            present.sort(key=value, reverse=desc)
            selected = present + absent
        page = selected[offset:offset + limit]
        by_state: dict[str, int] = {}
        for r in rows.values():
            by_state[r.state] = by_state.get(r.state, 0) + 1
        return {"now_ms": now, "total": len(rows), "matched": len(selected), "offset": offset, "limit": limit,
                "sort": sort, "order": "desc" if desc else "asc", "by_state": by_state,
                "lag": None, "groups": [r.as_json(now) for r in page]}

    def rebalance_window(self, now: int) -> dict:
        """What ``rebalances_1h`` counts: the last hour, or since this process started when that was
        less than an hour ago (the flight recorder is in memory: it starts empty with the process)."""
        since_start = now - self.started_ms < HOUR_MS
        return {"since_ms": max(now - HOUR_MS, self.started_ms), "since_start": since_start,
                "label": "since start" if since_start else "1h"}

    def group_detail(self, gid: str, view: View = EVERYTHING) -> dict | None:
        """One group's page (``view``: only the topics it shows; the caller checked the group)."""
        groups = self.groups
        mono = self.now_ms() if self.now_ms is not None else None
        described = groups.describe_group(gid, mono)
        if described is None:
            return None
        now = self.clock.wall_ms()
        assignments = groups.member_assignments(gid)
        owner: dict[tuple[str, int], str] = {}
        members = []
        consumer_group = described.get("type") == "consumer"  # KIP-848: the coordinator assigns
        for m in described["members"]:
            mid = m["member_id"]
            if consumer_group:
                assigned = sorted((t, list(ps)) for t, ps in (m.get("assignment") or {}).items())
            else:
                assigned = _decode_assignment(assignments.get(mid, b""), described["protocol_type"])
            if assigned and not view.all_topics:
                assigned = [(topic, parts) for topic, parts in assigned if view.topic(topic)]
            for topic, parts in assigned or []:
                for p in parts:
                    owner[(topic, p)] = mid
            members.append({"member_id": mid, "group_instance_id": m.get("group_instance_id", m.get("instance_id")),
                            "client_id": m["client_id"], "client_host": m["client_host"],
                            "session_timeout_ms": m.get("session_timeout_ms"), "assignment": assigned,
                            "awaiting_join": m.get("awaiting_join", False),
                            "awaiting_sync": m.get("awaiting_sync", False)})
        tracker = self.tracker
        partitions = []
        offsets = groups.group_offsets(gid)
        for topic in sorted(offsets):
            if not view.topic(topic):
                continue
            for p in sorted(offsets[topic]):
                o = offsets[topic][p]
                row = {"topic": topic, "partition": p, "committed": o["offset"], "commit_ms": o["commit_timestamp"],
                       "metadata": o["metadata"], "log_end": None, "lag": None, "lag_seconds": None,
                       "lag_seconds_method": None, "sampled_ms": None, "stale": None, "owner": owner.get((topic, p))}
                if tracker is not None:
                    end, lag, lag_ms, stale, method = tracker.lag_with_method((topic, p), o["offset"], now)
                    row.update(log_end=end, lag=lag, lag_seconds=None if lag_ms is None else lag_ms / 1000,
                               lag_seconds_method=None if lag_ms is None else method,
                               sampled_ms=tracker.sampled_ms((topic, p)), stale=stale if end is not None else None)
                partitions.append(row)
        # assigned partitions with no commit yet: shown, so an owner without progress is visible
        for (topic, p), mid in sorted(owner.items()):
            if p not in offsets.get(topic, {}):
                end = None if tracker is None else tracker.log_end((topic, p))
                partitions.append({"topic": topic, "partition": p, "committed": None, "commit_ms": None,
                                   "metadata": None, "log_end": end,
                                   "lag": None, "lag_seconds": None, "lag_seconds_method": None, "sampled_ms": None,
                                   "stale": None, "owner": mid})
        history = groups.group_history(gid, mono) or []
        return {"now_ms": now, "group_id": gid, "state": described["state"], "type": described.get("type", "classic"),
                "protocol_type": described["protocol_type"], "protocol": described["protocol"],
                "generation": described["generation"], "leader": described.get("leader"),
                "state_since_ms": described.get("state_since_wall_ms"), "members": members,
                "pending_members": described.get("pending_member_ids", []), "partitions": partitions,
                "history": history, "history_size": self.config.rebalance_history_size,
                "lag": self.lag_status(now)}


async def _free_in_steps(rows: dict, items: list) -> None:
    """Empty a replaced table (or its lines) a slice at a time: dropping 100,000 tuples or 240,000
    strings at once is 13-18 ms of deallocation in one piece. Nothing reads a replaced table (the
    readers are synchronous and take the current one)."""
    while items:
        del items[-FREE_STEP:]
        await asyncio.sleep(0)
    while rows:
        for _ in range(min(FREE_STEP, len(rows))):
            rows.popitem()
        await asyncio.sleep(0)


def _decode_assignment(data: bytes, protocol_type: str):
    """``[(topic, [partitions])]`` of a consumer-protocol assignment; None when the group's protocol
    is not "consumer" or the bytes do not decode (shown as unknown, not as nothing)."""
    if protocol_type != CONSUMER:
        return None
    try:
        _, asg = decode_assignment(data)
    except Exception:
        return None
    return [(tp.topic, sorted(tp.partitions)) for tp in asg.assigned_partitions]
