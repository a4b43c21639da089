"""The console in a real browser (headless Debian chromium via playwright-core) against a real daemon
with real groups of the thin client: the list, sorting, filtering, paging, a group's page, and a
rebalance appearing in the timeline without a reload. Group ids are user input: one is HTML."""
from __future__ import annotations

import json
import threading

import pytest

from tools import console_scenario as sc
from tools.browser import Browser
from tools.daemon import Daemon

pytestmark = pytest.mark.integration

EXTRA = 30  # load-00.. groups: with 4 named groups, two pages of 25


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    data = tmp_path_factory.mktemp("console") / "data"
    with Daemon(data, "--metrics-port", "0", "--topic", "orders:4", "--topic", "payments:1",
                "--min-session-timeout-ms", "500") as d:
        port = sc.metrics_port(d)
        members = sc.build(d.bootstrap)
        for i in range(EXTRA):
            sc.commit_standalone(d.bootstrap, f"load-{i:02}", {("orders", i % 4): i})
        try:
            with Browser() as b:
                yield d, port, members, b
        finally:
            for c in members.values():
                c.close(timeout_s=5)


def rows(b: Browser) -> list[str]:
    return b.eval("[...document.querySelectorAll('tr.group-row')].map(r => r.getAttribute('data-group'))")


def wait_rows(b: Browser, expr: str, timeout_ms: int = 10_000) -> list[str]:
    """Wait until the listed group ids satisfy ``expr`` (JS over ``ids``); returns them."""
    b.wait_for("(() => { const ids = [...document.querySelectorAll('tr.group-row')]"
               f".map(r => r.getAttribute('data-group')); return ({expr}) ? ids : null; }})()", timeout_ms)
    return rows(b)


def sort_by(b: Browser, key: str, desc: bool) -> list[str]:
    """Click a column header; wait for the list sorted that way to be drawn."""
    b.call("click", selector=f"th[data-sort={key}]")
    b.wait_for(f"document.querySelector('th[data-sort={key}]').classList.contains('sorted') && "
               f"document.querySelector('th[data-sort={key}]').classList.contains('desc') === {json.dumps(desc)}")
    return rows(b)


def open_list(b: Browser, port: int) -> None:
    b.goto(f"http://127.0.0.1:{port}/")
    b.wait_for("document.querySelectorAll('tr.group-row').length > 0")


def test_the_list_shows_the_groups_and_group_ids_stay_text(world):
    d, port, _, b = world
    open_list(b, port)
    b.call("select", selector="#page-size", value="100")
    ids = wait_rows(b, f"ids.length === {EXTRA + 4}")
    assert {"billing", "audit", "reports", sc.HOSTILE} <= set(ids)
    # the HTML group id is shown as text: no element made from it, no script run
    assert b.eval("document.querySelectorAll('#groups img').length") == 0
    assert b.eval("window.__pwned") is None
    cell = b.eval(f"[...document.querySelectorAll('tr.group-row')].find(r => r.getAttribute('data-group') === "
                  f"{json.dumps(sc.HOSTILE)}).querySelector('td.group').textContent")
    assert cell == sc.HOSTILE
    billing = b.eval("[...document.querySelector('tr[data-group=\"billing\"]').cells].map(c => c.textContent)")
    # TYPE is the group type (classic/consumer, as `herd groups list --type`), not the protocol type
    assert billing[1] == "Stable" and billing[2] == "classic" and billing[3] == "2" and billing[4] == "4"
    # the flight recorder is in memory and the daemon is minutes old: the column says so
    assert b.eval("document.querySelector('th[data-sort=rebalances_1h]').textContent") == "Rebalances since start"
    audit = b.eval("[...document.querySelector('tr[data-group=\"audit\"]').cells].map(c => c.textContent)")
    assert audit[1] == "Empty" and audit[3] == "0" and audit[4] == "3" and audit[7].endswith("ago")
    assert b.call("errors") == []


def test_sorting_by_a_column_and_back(world):
    d, port, _, b = world
    open_list(b, port)
    ids = sort_by(b, "members", desc=True)  # numbers sort largest first
    assert ids[0] == "billing"
    assert ids[1:4] == sorted(ids[1:4])  # ties in group id order
    ids = sort_by(b, "partitions", desc=True)
    assert ids[:3] == ["billing", "reports", "audit"]  # 4, 4 (ties by id), 3
    ids = sort_by(b, "group_id", desc=False)
    assert ids == sorted(ids) and ids[0] == sorted([sc.HOSTILE, "audit"])[0]
    ids = sort_by(b, "group_id", desc=True)  # again: descending
    assert ids == sorted(ids, reverse=True) and ids[0] == "reports"


def test_filtering_by_text_and_state(world):
    d, port, _, b = world
    open_list(b, port)
    b.call("fill", selector="#filter", value="BILL")
    assert wait_rows(b, "ids.length === 1") == ["billing"]
    b.call("fill", selector="#filter", value="")
    wait_rows(b, "ids.length > 1")
    b.call("select", selector="#state-filter", value="Stable")
    assert wait_rows(b, "ids.length === 1") == ["billing"]
    b.call("select", selector="#state-filter", value="Empty")
    ids = wait_rows(b, "ids.length > 1 && !ids.includes('billing')")
    assert "reports" in ids and "audit" in ids
    assert "of" in b.eval("document.getElementById('matched').textContent")
    b.call("select", selector="#state-filter", value="")


def test_paging(world):
    d, port, _, b = world
    open_list(b, port)
    b.call("select", selector="#page-size", value="25")
    first = wait_rows(b, "ids.length === 25")
    assert b.eval("document.getElementById('page').textContent") == "page 1 of 2"
    b.call("click", selector="#next")
    second = wait_rows(b, f"ids.length === {EXTRA + 4 - 25}")
    assert not set(first) & set(second)
    assert b.eval("document.getElementById('next').disabled") is True


def test_a_group_page_shows_members_and_offsets(world):
    d, port, members, b = world
    b.goto(f"http://127.0.0.1:{port}/#/group/billing")
    b.wait_for("document.querySelectorAll('tr.member-row').length === 2")
    clients = b.eval("[...document.querySelectorAll('tr.member-row')].map(r => r.cells[0].textContent).sort()")
    assert clients == ["billing-1", "billing-2"]
    assigned = b.eval("[...document.querySelectorAll('tr.member-row')].map(r => r.cells[2].textContent)")
    assert sorted(assigned) == ["orders-0orders-1", "orders-2orders-3"]
    parts = b.eval("[...document.querySelectorAll('tr.partition-row')].map(r => [r.getAttribute('data-tp'), "
                   "r.cells[2].textContent, r.cells[7].textContent])")
    owner_of = {f"orders-{tp.partition}": name for name, c in members.items() for tp in c.assignment()}
    assert {tp: (off, owner) for tp, off, owner in parts} == {
        tp: (str(100 + int(tp[-1]) if owner_of[tp] == "billing-1" else 200 + int(tp[-1])),
             f"{owner_of[tp]}@/127.0.0.1") for tp in owner_of}
    # the flight recorder, newest first: the rebalance that made the group of two (billing-2 joining,
    # or both in the initial one when their joins arrived together)
    newest = b.eval("document.querySelector('li.rebalance').textContent")
    assert "stable, 2 member(s)" in newest
    assert b.eval("document.querySelector('li.rebalance').getAttribute('data-reason')") in ("member_joined", "initial")


def test_the_hostile_group_page_is_text_too(world):
    d, port, _, b = world
    open_list(b, port)
    b.call("click", selector=f"tr[data-group={json.dumps(sc.HOSTILE)}] a")
    title = b.wait_for("document.getElementById('group-title') && document.getElementById('group-title').textContent")
    assert title == sc.HOSTILE
    assert b.eval("document.querySelectorAll('main img').length") == 0 and b.eval("window.__pwned") is None


def test_a_member_leaving_appears_in_the_timeline_without_a_reload(world):
    d, port, members, b = world
    b.goto(f"http://127.0.0.1:{port}/#/group/billing")
    b.wait_for("document.querySelectorAll('tr.member-row').length === 2")
    before = b.eval("document.querySelectorAll('li.rebalance').length")
    b.eval("window.__same_page = true")
    stay, leave = members["billing-1"], members.pop("billing-2")
    stop = threading.Event()

    def keep_polling():  # the member that stays rejoins when its heartbeat says "rebalance"
        while not stop.is_set():
            stay.poll(0.05)

    t = threading.Thread(target=keep_polling, daemon=True)
    t.start()
    try:
        leave.close(timeout_s=5)
        b.wait_for(f"document.querySelectorAll('li.rebalance').length > {before} && "
                   "document.querySelector('li.rebalance').getAttribute('data-reason') === 'member_left' && "
                   "document.querySelectorAll('tr.member-row').length === 1", 20_000)
    finally:
        stop.set()
        t.join(5)
    assert b.eval("window.__same_page") is True  # refreshed in place, not reloaded
    newest = b.eval("document.querySelector('li.rebalance').textContent")
    assert "billing-1@/127.0.0.1" in newest  # whom it waited for
    assert "phases" in newest
    assert b.call("errors") == []
