"""bench.big_group's pure parts and bench.vs_kafka's bigGroup row summary: the targets' checks with
and without herd's loop-lag metric (Kafka has none), and the kafka/herd ratios. No server here."""
from __future__ import annotations

import pytest

from bench import big_group as B
from bench import vs_kafka as V


def result(target: str, big: int, *, p99=(10.0, 20.0), form_s=2.0, synced=None, lag=True) -> dict:
    lag0 = {"buckets": {"0.05": 10, "0.1": 12}, "count": 12, "max_s": 0.02} if lag else None
    lag1 = {"buckets": {"0.05": 15, "0.1": 19}, "count": 20, "max_s": 0.3} if lag else None
    phase = {"baseline": {"seconds": 6.0, "hb_ms": {"p99": 1.0, "max": 2.0}, "loop_lag": B.lag_delta(lag0, lag0),
                          "server_cpu_s": 0.5}}
    for k, p in zip(("formation", "rebalance"), p99, strict=True):
        phase[k] = {"seconds": 1.0, "hb_ms": {"p99": p, "max": p * 2}, "loop_lag": B.lag_delta(lag0, lag1),
                    "daemon_cpu_s": 1.0, "server_cpu_s": 0.8 if k == "formation" else 0.4}
    return {"target": target, "big_members": big, "small_groups": 1000, "small_members": 10000, "phases": phase,
            "formation_s_from_last_join": form_s, "rebalance_s_from_leave": 1.5, "minting_ids_s": 0.5,
            "rebalance_s_from_last_join": 0.9, "rejoin_spread_s": 3.0,
            "big_synced": synced or [big, big - 1], "big_errors": {}, "loop_lag_max_s_end": 0.3 if lag else None,
            "server_rss_mb_end": 100.0 if target == "herd" else 500.0,
            "heartbeat_window": {"errors": {"UNKNOWN_MEMBER_ID": 2}, "members_failed": 1, "unanswered": 0,
                                 "load_cpu_util": 0.4}}


def test_lag_delta_counts_the_probes_between_two_scrapes_and_none_without_the_metric():
    a = {"buckets": {"0.05": 10, "0.1": 12}, "count": 12}
    b = {"buckets": {"0.05": 15, "0.1": 19}, "count": 20}
    assert B.lag_delta(a, b) == {"probes": 8, "over_50ms": 3, "over_100ms": 1}
    assert B.lag_delta(None, b) is None and B.lag_delta(a, None) is None


def test_checks_take_the_worse_phase_and_null_the_loop_lag_on_kafka():
    herd = B.checks(result("herd", 5000, p99=(30.0, 60.0)))
    assert herd["hb_p99_ms"] == 60.0 and herd["hb_p99_ok"] is False and herd["hb_p99_ratio"] == pytest.approx(1.2)
    assert herd["loop_lag_over_100ms_in_big_phases"] == 2 and herd["loop_lag_ok"] is False
    assert herd["formation_ok"] is True and herd["big_group_complete"] is True and herd["small_errors"] == 3
    kafka = B.checks(result("kafka", 5000, p99=(40.0, 10.0), lag=False))
    assert kafka["hb_p99_ok"] is True and kafka["loop_lag_max_s"] is None
    assert kafka["loop_lag_ok"] is None and kafka["loop_lag_ratio"] is None
    assert kafka["loop_lag_over_100ms_in_big_phases"] is None


def test_a_group_that_did_not_complete_does_not_meet_the_formation_target():
    c = B.checks(result("kafka", 10000, form_s=3.0, synced=[0, 0], lag=False))
    assert c["big_group_complete"] is False and c["formation_ok"] is False
    assert B.checks(result("herd", 5000, form_s=12.0))["formation_ok"] is False


def test_the_big_group_row_summarises_and_divides_kafka_by_herd():
    h = result("herd", 5000, p99=(20.0, 10.0))
    k = result("kafka", 5000, p99=(80.0, 5.0), form_s=4.0, lag=False)
    for r in (h, k):
        r["checks"] = B.checks(r)
    hs, ks = V.big_group_summary(h), V.big_group_summary(k)
    assert hs["formation_hb_p99_ms"] == 20.0 and hs["loop_lag_max_s"] == 0.3 and ks["loop_lag_max_s"] is None
    assert hs["formation_server_cpu_s"] == 0.8 and hs["rebalance_server_cpu_s"] == 0.4
    assert hs["rebalance_s_from_last_join"] == 0.9 and hs["rejoin_spread_s"] == 3.0
    r = V.big_group_ratios(hs, ks)
    assert r["formation_hb_p99_ms"] == 4.0 and r["rebalance_hb_p99_ms"] == 0.5 and r["hb_p99_ms"] == 4.0
    assert r["formation_s"] == 2.0 and r["server_rss_mb_end"] == 5.0 and r["rebalance_s"] == 1.0
    assert r["both_complete"] is True
    assert V.big_group_ratios(hs, dict(ks, formation_s=None))["formation_s"] is None
    failed = V.big_group_ratios(hs, dict(ks, big_group_complete=False))  # its times are the time to failure
    assert failed["both_complete"] is False and "formation_s" not in failed and "rebalance_s" not in failed
    assert failed["hb_p99_ms"] == 4.0
