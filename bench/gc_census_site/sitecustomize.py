"""Loaded by a daemon started by ``bench.gc_census --daemon`` (on its PYTHONPATH): on SIGUSR1 the
process writes every GC-tracked object's type count (frozen ones included) to $HERD_GC_CENSUS;
on SIGUSR2 it runs one gcwatch.fork_check and writes its answer to $HERD_GC_CENSUS.check."""
import os

if os.environ.get("HERD_GC_CENSUS"):
    import gc
    import json
    import signal
    from collections import Counter

    def _census(_sig, _frame):
        frozen = gc.get_freeze_count()
        callbacks = gc.callbacks[:]
        gc.callbacks.clear()  # herd's GcWatch would freeze everything again after collect()
        gc.unfreeze()
        gc.collect()
        counts = Counter(type(o).__name__ for o in gc.get_objects())
        gc.freeze()
        gc.callbacks.extend(callbacks)
        with open(os.environ["HERD_GC_CENSUS"] + ".tmp", "w") as f:
            json.dump({"frozen_before": frozen, "total": sum(counts.values()), "by_type": counts}, f)
        os.replace(os.environ["HERD_GC_CENSUS"] + ".tmp", os.environ["HERD_GC_CENSUS"])

    signal.signal(signal.SIGUSR1, _census)

    def _check(_sig, _frame):  # SIGUSR2: one gcwatch.fork_check, its answer to $HERD_GC_CENSUS.check
        import traceback

        from coordinator.ops.gcwatch import fork_check

        def done(found, _frozen=None):
            with open(os.environ["HERD_GC_CENSUS"] + ".check", "w") as f:
                f.write(repr(found))
        try:
            fork_check(lambda fn: fn())(done)
        except BaseException:
            with open(os.environ["HERD_GC_CENSUS"] + ".check", "w") as f:
                f.write(traceback.format_exc())

    signal.signal(signal.SIGUSR2, _check)
