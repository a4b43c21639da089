"""NetworkThread pieces that need no socket: the poll timestamp hand-over and ``caught_up``."""

from __future__ import annotations

import queue

import pytest

from client.config import parse_config
from client.coordinator import ConsumerCoordinator
from client.network import NetworkThread


@pytest.fixture
def net():
    cfg = parse_config("127.0.0.1:9", "g", max_poll_interval_ms=10000)
    n = NetworkThread(ConsumerCoordinator(cfg, 100.0), queue.SimpleQueue())  # never started
    yield n
    n._sel.close()
    n._wake_r.close()
    n._wake_w.close()


def test_last_poll_reaches_the_poll_timer_when_the_thread_wakes(net):
    hb = net.core.heartbeat
    assert net.last_poll == hb.last_poll == 100.0
    net.last_poll = 107.5  # what GroupConsumer.poll writes, without waking the thread
    assert hb.last_poll == 100.0
    net._sync_poll()  # done first thing after every wake-up
    assert hb.last_poll == 107.5 and hb.poll_deadline() == 117.5
    calls = []
    net.core.note_poll = calls.append
    net._sync_poll()
    assert calls == []  # unchanged: nothing to hand over


def test_caught_up_once_every_command_ran_and_was_published(net):
    assert net.caught_up()
    seq = net.submit(lambda core, now: None)
    assert seq == 1 and not net.caught_up()
    net._run_commands(100.0)
    assert not net.caught_up()  # ran, but the snapshot is not published yet
    net._publish()
    assert net.caught_up() and net.commands_done == 1
