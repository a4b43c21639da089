"""The console's views and lag metrics over a real GroupCoordinator (manual clock) and a fake log-end
source: exact lags for an Empty group and a member-less writer, time lag growing while nothing is
committed, stale partitions left out, per-group-only export, the list's sorting/filtering/paging."""
from __future__ import annotations

import asyncio
import json
import re

from coordinator.ops.console import Console
from tests.coordinator.core.test_group_harness import Harness

T = ("orders", 0)


class FakeSource:
    def __init__(self, ends):
        self.ends = dict(ends)
        self.fail = None

    async def fetch(self, partitions):
        if self.fail:
            raise self.fail
        return {tp: self.ends[tp] for tp in partitions if tp in self.ends}


def setup(lag_metrics="partition", source=True):
    h = Harness(lag_metrics=lag_metrics, lag_refresh_interval_ms=30_000)
    h.commit("writer", {("orders", 0): 100, ("orders", 1): 50})  # member-less writer
    mids, gen = h.form_group("app", 1)
    h.commit("app", {("orders", 0): 180}, generation=gen, member_id=mids[0])
    h.leave("app", mids[0])  # the group empties: its offsets and lag stay
    assert h.state("app") == "Empty"
    src = FakeSource({("orders", 0): 200, ("orders", 1): 50}) if source else None
    c = Console(h.config, h.gc, clock=h.clock, source=src, now_ms=lambda: h.now)
    c.table_ttl_s = 0  # every call rebuilds: the tests move the manual clock between calls
    return h, c, src


def refresh(c: Console) -> bool:
    return asyncio.run(c.refresher.refresh())


def samples(lines: list[str]) -> dict[str, float]:
    out = {}
    for line in lines:
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_exact_offset_lag_for_an_empty_group_and_a_member_less_writer():
    h, c, src = setup()
    assert refresh(c)
    m = samples(c.metric_lines())
    assert m['herd_group_lag{group="writer",topic="orders",partition="0"}'] == 100
    assert m['herd_group_lag{group="writer",topic="orders",partition="1"}'] == 0
    assert m['herd_group_lag{group="app",topic="orders",partition="0"}'] == 20
    assert m['herd_group_sum_lag{group="writer"}'] == 100 and m['herd_group_max_lag{group="app"}'] == 20
    assert m["herd_lag_source_up"] == 1
    assert 'herd_group_last_commit_age_seconds{group="app"}' in m


def test_time_lag_appears_with_history_and_grows_while_nothing_is_committed():
    h, c, src = setup()
    refresh(c)
    # one sample: the partition at 50 is caught up (0 s); offset 100 of 200 cannot be placed yet
    m = samples(c.metric_lines())
    assert m['herd_group_lag_seconds{group="writer",topic="orders",partition="1"}'] == 0
    assert 'herd_group_lag_seconds{group="writer",topic="orders",partition="0"}' not in m
    h.clock.advance(30_000)
    src.ends[T] = 260  # 60 records in 30 s: 2 per second
    refresh(c)
    lag_s = []
    for _ in range(3):
        m = samples(c.metric_lines())
        lag_s.append(m['herd_group_lag_seconds{group="writer",topic="orders",partition="0"}'])
        h.clock.advance(10_000)
    # 100 was the log end 50 s before the first sample (extrapolated at 2/s), 80 s before the second
    assert lag_s == [80.0, 90.0, 100.0]
    assert samples(c.metric_lines())['herd_group_max_lag_seconds{group="writer"}'] == 110.0


def test_a_failing_source_leaves_stale_lag_out_of_the_metrics_and_it_recovers():
    h, c, src = setup()
    refresh(c)
    src.fail = ConnectionError("down")
    for _ in range(3):
        h.clock.advance(30_000)
        assert not refresh(c)
    m = samples(c.metric_lines())
    assert m["herd_lag_source_up"] == 0
    assert not any(k.startswith("herd_group_lag{") for k in m)
    assert m['herd_lag_partitions{state="stale"}'] == 2
    assert 'herd_group_last_commit_age_seconds{group="writer"}' in m  # commit ages stay
    listed = c.group_list({})
    writer = next(g for g in listed["groups"] if g["group_id"] == "writer")
    assert writer["stale_partitions"] == 2 and writer["lag"] is None
    src.fail = None
    h.clock.advance(30_000)
    assert refresh(c)
    assert samples(c.metric_lines())['herd_group_lag{group="app",topic="orders",partition="0"}'] == 20


def test_per_group_export_has_no_partition_series():
    h, c, src = setup(lag_metrics="group")
    refresh(c)
    text = "\n".join(c.metric_lines())
    assert "herd_group_lag{" not in text and "herd_group_lag_seconds{" not in text
    assert 'herd_group_max_lag{group="writer"} 100' in text


def test_without_a_data_cluster_only_commit_ages():
    h, c, _ = setup(source=False)
    text = "\n".join(c.metric_lines())
    assert re.findall(r"^(\w+)", text.replace("# HELP ", "").replace("# TYPE ", ""), re.M) and \
        {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")} == \
        {"herd_group_last_commit_age_seconds"}
    h.clock.advance(90_000)
    ages = samples(c.metric_lines())
    assert ages['herd_group_last_commit_age_seconds{group="writer"}'] == 90.0
    g = c.group_list({})["groups"]
    assert all(row["lag"] is None and row["lag_seconds"] is None for row in g)


def test_list_sorts_filters_and_pages_server_side():
    h, c, src = setup()
    for i in range(12):
        h.commit(f"load-{i:02}", {("orders", 0): 195 + i % 5})  # lags 5..1
    refresh(c)
    page = c.group_list({"sort": ["lag"], "order": ["desc"], "limit": ["5"]})
    assert page["total"] == 14 and page["matched"] == 14 and len(page["groups"]) == 5
    assert [g["group_id"] for g in page["groups"]][:2] == ["writer", "app"]  # lag 100, then 20
    page2 = c.group_list({"sort": ["lag"], "order": ["desc"], "limit": ["5"], "offset": ["5"]})
    assert [g["lag"] for g in page2["groups"]] == sorted((g["lag"] for g in page2["groups"]), reverse=True)
    assert not {g["group_id"] for g in page["groups"]} & {g["group_id"] for g in page2["groups"]}
    asc = c.group_list({"sort": ["group_id"], "limit": ["100"]})["groups"]
    assert [g["group_id"] for g in asc] == sorted(g["group_id"] for g in asc)
    only = c.group_list({"q": ["LOAD-0"]})
    assert only["matched"] == 10 and all(g["group_id"].startswith("load-0") for g in only["groups"])
    assert c.group_list({"state": ["stable"]})["matched"] == 0
    assert c.group_list({"sort": ["nonsense"], "limit": ["x"]})["sort"] == "group_id"  # bad input: defaults


def test_group_detail_has_partitions_with_lag_and_the_history():
    h, c, src = setup()
    refresh(c)
    d = c.group_detail("app")
    assert d["state"] == "Empty" and d["members"] == []
    [p] = d["partitions"]
    assert (p["topic"], p["partition"], p["committed"], p["log_end"], p["lag"], p["stale"]) == \
        ("orders", 0, 180, 200, 20, False)
    assert [r["reason"] for r in d["history"]][-1] in ("member_left", "initial")
    assert c.group_detail("nope") is None


def test_http_routes_and_headers():
    h, c, src = setup()
    status, ctype, body, headers = c.route("/", "")
    assert status == 200 and ctype.startswith("text/html") and b"console/app.js" in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert c.route("/console/app.js", "")[0] == 200
    assert c.route("/console/../config.py", "")[0] == 404
    status, _, body, _ = c.route("/api/group", "id=%3Cb%3E")
    assert status == 404 and json.loads(body)["group_id"] == "<b>"
    assert c.route("/api/group", "")[0] == 400
    assert c.route("/elsewhere", "") is None


def test_prepare_folds_in_steps_with_loop_turns_and_shares_one_rebuild():
    h, c, src = setup()
    for i in range(120):  # groups spread over the harness's 4 shards
        h.commit(f"many-{i}", {("orders", 0): i})
    refresh(c)
    c.table_ttl_s = 60
    builds = 0
    fold = c._fold

    def counting(*a):
        nonlocal builds
        builds += 1
        yield from fold(*a)

    c._fold = counting

    async def main():
        ticks = 0

        async def other():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(other())
        await asyncio.gather(c.prepare(), c.prepare(), c.prepare_for("/api/groups?limit=5"))
        t.cancel()
        return ticks

    ticks = asyncio.run(main())
    assert builds == 1 and ticks >= 4  # one rebuild; the loop ran between its steps (one per shard)
    now, rows, _ = c.table()  # fresh: no second fold
    assert builds == 1 and len(rows) == 122 and rows["many-7"].last_commit_ms is not None


def test_a_table_replaced_while_its_metrics_render_is_not_torn():
    h, c, src = setup()
    for i in range(3000):
        h.commit(f"many-{i}", {("orders", 1): i})
    refresh(c)
    c.table_ttl_s = 60

    async def main():
        render = asyncio.ensure_future(c.prepare_for("/metrics"))
        for _ in range(3):
            await asyncio.sleep(0)
        c.invalidate()
        await c.prepare()  # a new table while the old one's lines are rendered
        await render
        return c.metric_lines()

    lines = asyncio.run(main())
    ages = [ln for ln in lines if ln.startswith("herd_group_last_commit_age_seconds{")]
    lags = [ln for ln in lines if ln.startswith("herd_group_lag{")]
    assert len(ages) == 3002 and len(lags) == 3003  # every group; writer has 2 partitions, app 1


def test_rebalances_in_the_last_hour_say_when_the_recorder_is_full():
    h = Harness(rebalance_history_size=3)
    c = Console(h.config, h.gc, clock=h.clock, now_ms=lambda: h.now)
    c.table_ttl_s = 0
    h.commit("busy", {("orders", 0): 1})  # offsets keep the group listed once it empties
    mids, gen = h.form_group("busy", 1)
    assert c.group_list({})["groups"][0]["rebalances_1h"] == 1
    for _ in range(4):  # each leave and rejoin: two more rebalances
        h.leave("busy", mids[0])
        mids, gen = h.form_group("busy", 1)
    row = c.group_list({})["groups"][0]
    assert (row["rebalances_1h"], row["rebalances_1h_or_more"]) == (3, True)
    h.leave("busy", mids[0])
    h.clock.advance(3_600_001)  # an hour later: none of the recorded ones is that recent
    row = c.group_list({})["groups"][0]
    assert (row["rebalances_1h"], row["rebalances_1h_or_more"]) == (0, False)


def test_an_answer_uses_what_was_prepared_for_it_even_past_the_ttl():
    h, c, src = setup()
    refresh(c)
    c.table_ttl_s = 0  # every table is "expired" at once: as when preparing took longer than the TTL
    folds = 0
    fold = c._fold

    def counting(*a):
        nonlocal folds
        folds += 1
        yield from fold(*a)

    c._fold = counting
    asyncio.run(c.prepare_for("/metrics"))
    assert folds == 1
    lines = c.metric_lines()  # no second fold, no render in one piece
    assert folds == 1 and any(ln.startswith("herd_group_lag{") for ln in lines)
    asyncio.run(c.prepare_for("/api/groups?limit=1"))
    assert folds == 2
    assert c.group_list({"limit": ["1"]})["total"] == 2 and folds == 2
    c.group_list({})  # not prepared: rebuilt (ttl 0)
    assert folds == 3


def test_type_is_the_group_type_classic_or_consumer_and_the_protocol_type_is_kept_apart():
    """Issue 33 item 5: TYPE showed the protocol type ("consumer" for every group, classic ones
    included); it is the group type as `herd groups list --type` says it (ListGroups v5)."""
    from coordinator.core.consumer.groups import StaticTopics
    from protocol import messages as m

    h = Harness()
    h.gc.set_topics(StaticTopics({"orders": (b"o" * 16, 2)}))
    mids, gen = h.form_group("old-style", 1)  # a classic group whose protocol type is "consumer"
    r = h.call(68, 0, m.ConsumerGroupHeartbeatRequest(
        group_id="kip848", member_id="m1", member_epoch=0, rebalance_timeout_ms=30_000,
        subscribed_topic_names=["orders"], topic_partitions=[]))
    assert r.error_code == 0, r
    c = Console(h.config, h.gc, clock=h.clock, now_ms=lambda: h.now)
    c.table_ttl_s = 0
    rows = {g["group_id"]: g for g in c.group_list({})["groups"]}
    assert {g: (r["type"], r["protocol_type"]) for g, r in rows.items()} == {
        "old-style": ("classic", "consumer"), "kip848": ("consumer", "consumer")}
    assert [g["group_id"] for g in c.group_list({"sort": ["type"]})["groups"]] == ["old-style", "kip848"]
    assert c.group_detail("kip848")["type"] == "consumer" and c.group_detail("old-style")["type"] == "classic"
    # a consumer group's rebalances (its recorded epoch moves) are counted too, not always 0
    assert rows["kip848"]["rebalances_1h"] >= 1 and rows["old-style"]["rebalances_1h"] == 1


def test_rebalances_are_counted_since_the_start_and_say_so_until_an_hour_has_passed():
    """Issue 33 item 5: the flight recorder is in memory, so after a restart the column restarts at
    0; rather than calling that "1h", the list says "since start" until the process is an hour old."""
    h = Harness()
    c = Console(h.config, h.gc, clock=h.clock, now_ms=lambda: h.now)
    c.table_ttl_s = 0
    started = h.clock.wall_ms()
    h.commit("busy", {("orders", 0): 1})
    h.form_group("busy", 1)
    page = c.group_list({})
    assert page["rebalances"] == {"since_ms": started, "since_start": True, "label": "since start"}
    h.clock.advance(3_599_000)
    assert c.group_list({})["rebalances"]["since_start"] is True
    h.clock.advance(2_000)
    page = c.group_list({})
    assert page["rebalances"] == {"since_ms": h.clock.wall_ms() - 3_600_000, "since_start": False, "label": "1h"}
