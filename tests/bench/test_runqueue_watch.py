"""bench._util.RunQueueWatch: how long watched threads waited for a CPU, from the kernel's schedstat
(the big-group bench tells the machine's stalls from the server's with it)."""
from __future__ import annotations

import os
import time

import pytest

from bench import _util as U


def test_schedstat_of_this_thread_grows_with_the_cpu_it_uses():
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"):
        pytest.skip("no /proc schedstat on this kernel")
    run0, wait0 = U.task_schedstat(os.getpid())
    cpu0 = time.thread_time()
    while time.thread_time() - cpu0 < 0.03:  # 30 ms of this thread's CPU, however long that takes
        pass
    run1, wait1 = U.task_schedstat(os.getpid())
    assert run1 - run0 >= 25_000_000
    assert wait1 >= wait0


def test_waits_between_two_moments_and_in_buckets_come_from_the_samples(monkeypatch):
    now = [0.0]
    stats = {1: (0, 0), 2: (0, 0), 3: (0, 0)}
    monkeypatch.setattr(U, "task_schedstat", lambda pid, tid=None: stats[pid])
    rq = U.RunQueueWatch({"server": [1], "load": [2, 3]}, clock=lambda: now[0])

    def at(t, server, load2, load3):
        now[0] = t
        stats[1], stats[2], stats[3] = server, load2, load3
        rq.sample()

    at(10.0, (0, 0), (0, 0), (0, 0))
    at(10.25, (200_000_000, 40_000_000), (100_000_000, 0), (50_000_000, 10_000_000))
    at(10.5, (300_000_000, 140_000_000), (150_000_000, 5_000_000), (90_000_000, 10_000_000))
    at(10.75, (500_000_000, 140_000_000), (150_000_000, 5_000_000), (90_000_000, 10_000_000))

    whole = rq.between(10.0, 10.75)
    assert whole["server"] == {"run_s": 0.5, "runqueue_wait_s": 0.14}
    assert whole["load"] == {"run_s": 0.24, "runqueue_wait_s": 0.015}  # both load processes summed
    # a moment between samples takes the sample before it
    assert rq.between(10.3, 10.6)["server"]["runqueue_wait_s"] == 0.1
    assert rq.in_buckets(10.0, [0.0, 0.25, 0.5]) == {0.0: {"server": [200.0, 40.0], "load": [150.0, 10.0]},
                                                      0.25: {"server": [100.0, 100.0], "load": [90.0, 5.0]},
                                                      0.5: {"server": [200.0, 0.0], "load": [0.0, 0.0]}}


def test_a_process_that_exits_keeps_its_last_sample_and_the_watch_samples_in_a_thread(monkeypatch):
    calls = []

    def schedstat(pid, tid=None):
        calls.append(pid)
        if pid == 2 and len(calls) > 2:
            raise FileNotFoundError(pid)
        return (len(calls) * 10**8, 0)

    monkeypatch.setattr(U, "task_schedstat", schedstat)
    with U.RunQueueWatch({"a": [1], "b": [2]}, interval=0.01, separate=False) as rq:
        time.sleep(0.05)
    assert len(rq.samples) >= 3
    assert rq.samples[-1][1]["b"] == rq.samples[1][1]["b"]  # gone: its last sample stands, not an error
    assert rq.between(rq.samples[1][0], rq.samples[-1][0])["b"] == {"run_s": 0.0, "runqueue_wait_s": 0.0}
    assert rq.between(rq.samples[0][0], rq.samples[-1][0])["a"]["run_s"] > 0


def test_the_watch_samples_from_a_process_of_its_own_on_the_same_clock():
    """The default: a sampling process (a busy load process's thread would sample only when its GIL
    let it), whose samples come back on this process's perf_counter clock."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"):
        pytest.skip("no /proc schedstat on this kernel")
    t0 = time.perf_counter()
    with U.RunQueueWatch({"me": [os.getpid()]}, interval=0.01) as rq:
        cpu0 = time.thread_time()
        while time.thread_time() - cpu0 < 0.1:  # 100 ms of this thread's CPU
            pass
    t1 = time.perf_counter()
    assert len(rq.samples) >= 3
    assert t0 <= rq.samples[0][0] and rq.samples[-1][0] <= t1
    assert rq.between(t0, t1)["me"]["run_s"] >= 0.05  # most of the spinning was seen


def test_all_threads_of_a_process_are_summed_for_a_name_that_asks_for_it():
    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("no /proc on this system")
    import threading

    stop = threading.Event()
    th = threading.Thread(target=lambda: [None for _ in iter(lambda: stop.wait(0.001), True)])
    th.start()
    try:
        rq = U.RunQueueWatch({"main": [os.getpid()], "all": [os.getpid()]}, all_threads=frozenset({"all"}),
                             separate=False)
        rq.sample()
        run_main, _ = rq.samples[0][1]["main"]
        run_all, _ = rq.samples[0][1]["all"]
        assert run_all > run_main  # the pytest thread's CPU plus the helper thread's
    finally:
        stop.set()
        th.join()


def test_reniced_lowers_this_process_its_children_and_its_own_autogroup_then_restores():
    """bench's --load-nice: run in a process of its own session (its own autogroup), with this test's
    process standing for the server, so nothing here is reniced."""
    import json
    import subprocess
    import sys

    code = """
import json, os, subprocess, sys
from bench import _util as U
out = {"before": os.getpriority(os.PRIO_PROCESS, 0), "group_before": U.autogroup(),
       "server_group": U.autogroup(int(sys.argv[1]))}
with U.Reniced(7, server_pid=int(sys.argv[1])) as r:
    out["inside"] = os.getpriority(os.PRIO_PROCESS, 0)
    out["child"] = int(subprocess.check_output([sys.executable, "-c", "import os; print(os.nice(0))"]))
    out["group_inside"] = U.autogroup()
out["after"] = os.getpriority(os.PRIO_PROCESS, 0)
out["group_after"] = U.autogroup()
out["restored"] = r.restored
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code, str(os.getpid())], capture_output=True, text=True,
                         start_new_session=True, timeout=60, cwd=str(U.REPO))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["inside"] == 7
    assert out["child"] == out["inside"]  # the load processes it starts inherit it
    if out["group_before"] is not None and out["server_group"] is not None:
        if out["group_before"][0] != out["server_group"][0]:  # its own session's group: lowered too
            assert out["group_inside"][1] == 7
        else:  # the kernel kept it in the server's group (seen on CI): that one is left alone
            assert out["group_inside"] == out["group_before"]
    if out["restored"]:
        assert out["after"] == out["before"]
        assert out["group_after"] == out["group_before"]
    else:  # lowering a nice value needs CAP_SYS_NICE
        assert os.geteuid() != 0
