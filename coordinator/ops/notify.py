"""systemd's service notification protocol (``sd_notify``), without libsystemd.

Under a unit with ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (a Unix datagram socket; a
leading ``@`` means the abstract namespace). herd sends ``READY=1`` once it has replayed its log and
accepts connections, ``STOPPING=1`` when it begins to stop, and, when the unit sets ``WatchdogSec=``
(systemd then passes ``WATCHDOG_USEC`` and ``WATCHDOG_PID``), ``WATCHDOG=1`` from the event loop at
half that period: a loop stuck longer than ``WatchdogSec`` gets the service restarted.

Without ``NOTIFY_SOCKET`` every call is a no-op. A failure to notify is logged once, never fatal.
The same socket is how the integration tests learn that a daemon they started is ready, without
polling.
"""
from __future__ import annotations

import os
import socket

from coordinator import logging_setup

log = logging_setup.get("herd.notify")


class Notifier:
    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        self.address: str | None = None
        raw = env.get("NOTIFY_SOCKET") or ""
        if raw.startswith("@"):
            self.address = "\0" + raw[1:]
        elif raw.startswith("/"):
            self.address = raw
        elif raw:
            log.warning("notify.ignored", reason="NOTIFY_SOCKET is neither a path nor @abstract", value=raw)
        self.watchdog_s: float | None = None
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        if self.address is not None and usec:
            try:
                period = int(usec) / 1e6
                mine = not pid or int(pid) == os.getpid()
            except ValueError:
                log.warning("notify.ignored", reason="WATCHDOG_USEC or WATCHDOG_PID is not a number",
                            usec=usec, pid=pid)
            else:
                if period > 0 and mine:
                    self.watchdog_s = period
        self._sock: socket.socket | None = None
        self._failed = False
        self._timer = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; -> whether it was sent."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                try:
                    sock.connect(self.address)
                except OSError:
                    sock.close()
                    raise
                self._sock = sock
            self._sock.send("\n".join(assignments).encode())
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("notify.failed", socket=self.address.replace("\0", "@"), error=str(exc))
            self._close_socket()
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def start_watchdog(self, loop) -> None:
        """Ping from ``loop`` every half watchdog period (nothing to do without one)."""
        if self.watchdog_s is not None and self._timer is None:
            self._ping(loop)

    def _ping(self, loop) -> None:
        self.send("WATCHDOG=1")
        self._timer = loop.call_later(self.watchdog_s / 2, self._ping, loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._close_socket()

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
