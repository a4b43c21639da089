"""Churn soak, short version (``bench/soak.py`` runs it for 10 minutes).

Members of three groups (raw-protocol members on threads and in child processes, some of them
static, and unmodified confluent-kafka consumers) join, leave, crash (SIGKILL) and restart at
random for ~30 s while a checker polls DescribeGroups and OffsetFetch: every Stable generation
assigns each partition to exactly one member, no group stays in PreparingRebalance or
CompletingRebalance longer than rebalance timeout + session timeout, committed offsets never go
backwards, and when everyone has left every group ends Empty.
"""
from __future__ import annotations

import json
import os

import pytest

from bench import _util as U
from bench import soak

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHURN_SECONDS = float(os.environ.get("HERD_SOAK_SECONDS", "30"))


def test_churn_keeps_the_group_invariants(tmp_path):
    seed = int.from_bytes(os.urandom(4), "big")
    logs = tmp_path / "members"
    logs.mkdir()
    with U.Herd(topics=[f"{t}:{n}" for t, n in soak.TOPICS.items()], extra_args=soak.HERD_ARGS,
                tmp_root=str(tmp_path)) as herd:
        run = soak.Soak(("127.0.0.1", herd.port), herd.bootstrap, groups=3, seconds=CHURN_SECONDS, seed=seed,
                        session_ms=3000, rebalance_ms=4000, max_members=4, action_every=0.4, log_dir=logs,
                        history_url=soak.metrics_url(herd))
        res = run.run()
        assert herd.proc.poll() is None, "herd died during the soak"
        herd_log = herd.logs()
    detail = json.dumps({k: res[k] for k in ("seed", "violations", "member_thread_errors", "members",
                                             "longest_stay_s", "flight_recorder", "final_states")})
    assert res["violations"] == [], detail
    assert res["member_thread_errors"] == [], detail
    # the soak did what it says: churn happened and was observed
    crashed = sum(k.get("crashed", 0) for k in res["members"].values())
    left = sum(k.get("left", 0) for k in res["members"].values())
    assert crashed >= 3 and left >= 3, detail
    assert res["stable_observations_checked"] >= 50, detail
    assert res["states_seen"].get("PreparingRebalance", 0) > 0, detail
    assert res["raw_member_commits_acknowledged"] > 0 and res["offset_keys"] > 0, detail
    assert set(res["final_states"].values()) <= {"Empty", "Dead"}, detail
    assert "Traceback" not in herd_log, herd_log[-3000:]  # no bug of ours was logged
