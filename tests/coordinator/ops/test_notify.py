"""systemd notification protocol: datagrams on NOTIFY_SOCKET, watchdog pings on a manual loop."""
from __future__ import annotations

import os
import socket

import pytest

from coordinator.ops.notify import Notifier


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(5)
    yield sock
    sock.close()


def test_ready_and_stopping_are_one_datagram_each(listener):
    n = Notifier({"NOTIFY_SOCKET": listener.getsockname()})
    assert n.enabled and n.ready("listening on 127.0.0.1:9092")
    assert listener.recv(4096).decode().split("\n") == [
        "READY=1", "STATUS=listening on 127.0.0.1:9092", f"MAINPID={os.getpid()}"]
    assert n.stopping()
    assert listener.recv(4096) == b"STOPPING=1\nSTATUS=stopping"
    n.close()


def test_abstract_namespace_address():
    name = f"herd-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.send("READY=1")
        assert sock.recv(4096) == b"READY=1"
        n.close()


def test_without_notify_socket_nothing_is_sent_and_no_watchdog():
    n = Notifier({"WATCHDOG_USEC": "1000000"})
    assert not n.enabled and not n.ready("x") and n.watchdog_s is None


@pytest.mark.parametrize("env", [{"NOTIFY_SOCKET": "relative/path"},
                                 {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "soon"},
                                 {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}])
def test_unusable_settings_are_ignored(env):
    n = Notifier(env)
    assert n.watchdog_s is None
    assert n.enabled == ("relative" not in env["NOTIFY_SOCKET"])


def test_a_vanished_socket_never_raises(tmp_path):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert not n.ready("x") and not n.send("WATCHDOG=1")
    assert n._failed


class ManualLoop:
    """call_later recorded, run by hand: the watchdog's schedule without a clock."""

    def __init__(self):
        self.calls = []

    def call_later(self, delay, fn, *args):
        handle = _Handle(self, (delay, fn, args))
        self.calls.append(handle)
        return handle

    def run_next(self):
        handle = self.calls.pop(0)
        delay, fn, args = handle.entry
        fn(*args)
        return delay


class _Handle:
    def __init__(self, loop, entry):
        self.loop, self.entry = loop, entry

    def cancel(self):
        if self in self.loop.calls:
            self.loop.calls.remove(self)


def test_watchdog_pings_at_half_the_period_until_closed(listener):
    n = Notifier({"NOTIFY_SOCKET": listener.getsockname(), "WATCHDOG_USEC": "4000000",
                  "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_s == 4.0
    loop = ManualLoop()
    n.start_watchdog(loop)
    assert listener.recv(4096) == b"WATCHDOG=1"
    assert [c.entry[0] for c in loop.calls] == [2.0]
    assert loop.run_next() == 2.0
    assert listener.recv(4096) == b"WATCHDOG=1" and len(loop.calls) == 1
    n.close()
    assert loop.calls == []
