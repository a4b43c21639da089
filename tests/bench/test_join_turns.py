"""bench.join_turns: the in-process big-group turns run end to end on a small group (every join and
sync answered without error, the leader's answer lists every member, two generations)."""
from types import SimpleNamespace

from bench import join_turns


def test_a_small_group_forms_and_rejoins_and_every_figure_is_reported():
    res = join_turns.run(SimpleNamespace(members=300, gc="herd", rounds=1))
    assert set(res) == {"formation", "rejoin"}
    assert res["rejoin"]["generation"] == res["formation"]["generation"] + 1
    for phase in res.values():
        for k in ("join_end_ms", "worst_turn_after_join_ms", "leader_sync_ms", "worst_turn_after_sync_ms"):
            assert phase[k] >= 0
