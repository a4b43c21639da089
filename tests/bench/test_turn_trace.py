"""bench._turn_trace: how a trace of loop callbacks is cut into event-loop iterations."""
from bench._turn_trace import iterations, summary


def test_an_iteration_ends_where_a_callback_follows_the_reads_or_after_a_gap():
    ms = 0.001
    events = [
        ["T", 0.0, 8 * ms, 3], ["S", 8 * ms, 10 * ms, 0],  # callbacks, then the poll phase's reads
        ["R", 10 * ms, 11 * ms, 11], ["R", 11 * ms, 12 * ms, 12],
        ["T", 12 * ms, 20 * ms, 0],  # a callback after reads: the next iteration
        ["R", 20 * ms, 21 * ms, 12],
        ["R", 30 * ms, 31 * ms, 12],  # after a 9 ms gap (the loop idle): another
    ]
    its = iterations(list(reversed(events)))  # sorted by start time first
    assert [len(it) for it in its] == [4, 2, 1]
    first = summary(its[0], 0.0)
    assert first["span_ms"] == 12.0 and first["busy_ms"] == 12.0
    assert first["by_kind"] == {"T": [1, 8.0], "S": [1, 2.0], "R11": [1, 1.0], "R12": [1, 1.0]}
    assert list(first["by_kind"])[0] == "T"  # the costliest first


def test_requests_calls_and_collections_inside_an_iteration_are_listed_with_names():
    from bench._turn_trace import inner

    ms = 0.001
    it = [["T", 0.0, 30 * ms, 1], ["R", 30 * ms, 31 * ms, 12]]
    events = [["H", 1 * ms, 25 * ms, 11],  # a JoinGroup handled for 24 ms
              ["Q", 2 * ms, 20 * ms, 0],  # inside it, a traced function
              ["G", 3 * ms, 13 * ms, 0 + 10 * 42],  # a young collection of 10 ms that freed 42
              ["H", 40 * ms, 45 * ms, 14]]  # after the iteration: not listed
    got = inner(events, it, {"0": "ClassicGroups.join_group"})
    assert got == {"H11": [1, 24.0], "Q:ClassicGroups.join_group": [1, 18.0], "G0": [1, 10.0, 42]}
