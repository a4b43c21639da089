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

    _names: dict = {}  # a later slice's function (its qualified name) -> the number recorded for it

    def _name_id(fn) -> int:
        return _names.setdefault(getattr(fn, "__qualname__", "?"), len(_names))

    def _dump(*_a):
        path = os.environ["HERD_TURN_TRACE"]
        with open(path + ".tmp", "w") as f:
            for i in range(len(_t0)):
                f.write(json.dumps([chr(_kinds[i]), _t0[i], _t1[i], _extra[i]]) + "\n")
        with open(path + ".names.json", "w") as f:
            json.dump({str(v): k for k, v in _names.items()}, f)
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
    _wrap(_rt.Runtime, "_run_later", "L", lambda self, more: _name_id(more))

    # "H": one request handled for over 1 ms (extra: its API key), inside whichever callback above
    # handled it (a read, the turn FIFO, a connection's deferred processing)
    _handle = _srv.Connection.handle

    def _timed_handle(self, frame):
        t0 = _now()
        try:
            return _handle(self, frame)
        finally:
            if _now() - t0 > 0.001:
                _record(ord("H"), t0, ((frame[0] << 8) | frame[1]) if len(frame) >= 2 else -1)
    _srv.Connection.handle = _timed_handle

    # "Q": a call over 1 ms of each function named in $HERD_TURN_TRACE_FUNCS ("module:Class.method"
    # or "module:function", comma-separated; extra: its name's number), to look inside the above
    import importlib

    def _timed(fn, name_id):
        def wrapper(*a, **k):
            t0 = _now()
            try:
                return fn(*a, **k)
            finally:
                if _now() - t0 > 0.001:
                    _record(ord("Q"), t0, name_id)
        return wrapper

    # "G": each garbage collection over 1 ms, inside whatever it stopped
    import gc as _gc
    _gc_start = [0.0]

    def _gc_cb(phase, info):
        if phase == "start":
            _gc_start[0] = _now()
        elif _now() - _gc_start[0] > 0.001:
            # extra: generation + 10 x the objects it freed (found unreachable)
            _record(ord("G"), _gc_start[0], info.get("generation", 0) + 10 * min(info.get("collected", 0), 10**8))
    _gc.callbacks.insert(0, _gc_cb)

    # "P": each loop-lag probe that found the loop late by over 20 ms (extra: the lag in µs)
    from coordinator.ops import looplag as _looplag
    _observe = _looplag.LoopLag.observe

    def _observed(self, lag):
        if lag > 0.02:
            _record(ord("P"), _now(), int(lag * 1e6))
        return _observe(self, lag)
    _looplag.LoopLag.observe = _observed

    for _spec in filter(None, os.environ.get("HERD_TURN_TRACE_FUNCS", "").split(",")):
        _mod, _, _qual = _spec.strip().partition(":")
        _owner = importlib.import_module(_mod)
        *_path, _attr = _qual.split(".")
        for _p in _path:
            _owner = getattr(_owner, _p)
        _fn = getattr(_owner, _attr)
        setattr(_owner, _attr, _timed(_fn, _name_id(_fn)))
