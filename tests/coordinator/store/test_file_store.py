"""FileStore: the file log behind the Store interface (what ``herd serve`` runs)."""
from __future__ import annotations

import pytest

from coordinator.store import Store, StoreError
from coordinator.store.filelog import FileStore
from coordinator.store.logformat import LogError


async def test_file_store_opens_loads_writes_and_reloads(tmp_path):
    store = FileStore(tmp_path, 3, fsync="never")
    assert isinstance(store, Store)
    heard = []
    store.set_listener(heard.extend)
    await store.open()
    assert list(store.owned_shards()) == [0, 1, 2]
    assert await store.load(1) == []
    assert store.submit(1, [(b"k", b"v1")]) == 1
    assert store.submit(1, [(b"k", b"v2"), (b"gone", b"x")]) == 2
    assert store.submit(2, [(b"gone", None)]) == 1
    # fsync=never: everything staged is settled by flush itself, in each shard's order
    assert sorted(store.flush()) == [(1, 2, None), (2, 1, None)]
    assert store.submit(1, [(b"gone", None)]) == 3
    await store.close()
    assert heard == [(1, 3, None)]  # what flush did not settle reaches the listener (close writes it)

    again = FileStore(tmp_path, 3, fsync="never")
    await again.open()
    assert await again.load(1) == [(b"k", b"v2")]  # latest only: each key's last value, no tombstones
    assert await again.load(1) == []  # handed over once
    assert await again.load(2) == []
    assert [s.shard for s in again.stats()] == [0, 1, 2]
    await again.close()


async def test_file_store_refuses_another_shard_count_with_one_line(tmp_path):
    first = FileStore(tmp_path, 3, fsync="never")
    await first.open()
    await first.close()
    with pytest.raises(StoreError) as err:
        await FileStore(tmp_path, 4, fsync="never").open()
    assert isinstance(err.value, LogError) and "\n" not in str(err.value)
    assert "fixed for the life" in str(err.value)
