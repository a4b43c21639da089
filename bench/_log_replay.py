"""The file log's replay figure: write N synthetic entries, time ``LogStore.open()`` of them.

A helper, not a benchmark of its own (``bench.startup`` times a whole ``herd serve`` start):
``python -c "from bench._log_replay import benchmark_replay; print(benchmark_replay('/tmp/x'))"``.
"""
from __future__ import annotations

import time

from coordinator.store.filelog import LogStore
from coordinator.store.logformat import CRC32C_IMPL


def benchmark_replay(data_dir, entries: int = 1_000_000, num_shards: int = 50, key_bytes: int = 50,
                     value_bytes: int = 30, distinct_keys: int | None = None) -> dict:
    """Write ``entries`` synthetic entries (fsync="never", in batches) into an EMPTY ``data_dir``, then
    time ``LogStore.open()`` of it. Sizes default to a typical OffsetCommitKey v1 / OffsetCommitValue
    v3 record. -> a dict of parameters and seconds (``bench/`` prints it as JSON)."""
    distinct = distinct_keys or entries
    store = LogStore(data_dir, num_shards, fsync="never", auto_compact=False)
    store.open()
    t0 = time.perf_counter()
    pad_k = b"k" * max(key_bytes - 12, 0)
    pad_v = b"v" * max(value_bytes - 12, 0)
    futures = []
    batch = 1000
    for start in range(0, entries, batch):
        per_shard: dict[int, list] = {}
        for i in range(start, min(start + batch, entries)):
            k = i % distinct
            per_shard.setdefault(k % num_shards, []).append((b"%012d" % k + pad_k, b"%012d" % i + pad_v))
        for shard, items in per_shard.items():
            futures.append(store.append(shard, items))
    for f in futures:
        f.result()
    store.close()
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reader = LogStore(data_dir, num_shards, fsync="never", auto_compact=False)
    shards = reader.open()
    open_s = time.perf_counter() - t0
    n = sum(len(v) for v in shards.values())
    size = sum(s.bytes for s in reader.stats())
    reader.close()
    return {"name": "log_replay", "entries": n, "num_shards": num_shards, "key_bytes": key_bytes,
            "value_bytes": value_bytes, "file_bytes": size, "crc32c": CRC32C_IMPL,
            "write_seconds": round(write_s, 3), "open_seconds": round(open_s, 3)}

