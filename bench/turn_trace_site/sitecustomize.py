"""Loaded by a daemon started by ``bench.big_group --trace-turns`` (on its PYTHONPATH, with
$HERD_TURN_TRACE set to a file): wraps the loop's callbacks (socket reads, the turn FIFO, fan-out
slices, store flushes and drains, core timers) to record when each ran and for how long; on
SIGUSR1 (and at exit) writes them to $HERD_TURN_TRACE as JSON lines ``[kind, t0, t1, extra]``.
For finding which work makes a loop iteration long (``python -m bench._turn_trace FILE``); never
loaded by herd itself."""
import os

if os.environ.get("HERD_TURN_TRACE"):
    import atexit
    import json
    import signal
    import time
    from array import array

    _now = time.perf_counter
    _kinds = array("b")
    _t0 = array("d")
    _t1 = array("d")
    _extra = array("i")
    _CAP = 3_000_000

    def _record(kind, t0, extra):
        if len(_t0) < _CAP:
            _kinds.append(kind)
            _t0.append(t0)
            _t1.append(_now())
            _extra.append(extra)

    def _dump(*_a):
        path = os.environ["HERD_TURN_TRACE"]
        with open(path + ".tmp", "w") as f:
            for i in range(len(_t0)):
                f.write(json.dumps([chr(_kinds[i]), _t0[i], _t1[i], _extra[i]]) + "\n")
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, _dump)
    atexit.register(_dump)

    from coordinator import runtime as _rt
    from coordinator.edge import server as _srv
    from coordinator.edge import turns as _turns

    def _wrap(cls, name, kind, extra=None):
        fn = getattr(cls, name)
        code = ord(kind)

        def wrapper(self, *a):
            t0 = _now()
            try:
                return fn(self, *a)
            finally:
                _record(code, t0, extra(self, *a) if extra is not None else 0)
        setattr(cls, name, wrapper)

    def _api(self, data):
        return ((data[4] << 8) | data[5]) if len(data) >= 6 else -1

    _wrap(_srv.Connection, "data_received", "R", _api)
    _wrap(_srv.Connection, "_continue", "C")
    _wrap(_turns.Turns, "_next_turn", "T", lambda self: len(self.waiting))
    _wrap(_rt.Runtime, "_release_slice", "S", lambda self, replies, start: start)
    _wrap(_rt.Runtime, "_flush", "F")
    _wrap(_rt.Runtime, "_drain", "D")
    _wrap(_rt.Runtime, "_fire", "X")
    _wrap(_rt.Runtime, "_run_later", "L")
