"""spark_jobs/spill.py against a model: rows with random keys (many repeated, so one key's
rows span batches and runs) arriving in random parts, under a bound that spills every few
parts, merged three runs at a time from batches of a few rows: the rows come out in
(key, arrival) order, less deleted keys and dropped blocks, exactly as the in-memory path
gives them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_jobs import spill


def rows_in(
    held_bytes: int, seed: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[pa.Table | spill.SpilledTable, list[tuple[int, int]], int]:
    monkeypatch.setattr(spill, "SPILL_BATCH_BYTES_MAX", 64)
    monkeypatch.setattr(spill, "SPILL_MERGE_FAN_IN", 3)
    rng = np.random.default_rng(seed)
    directory = spill.SpillDir("spill-test-")
    rows = spill.SortedRuns(held_bytes, directory, "test", with_rows=True)
    dead = spill.SortedRuns(held_bytes, directory, "test", with_rows=False)
    model: list[tuple[int, int, int]] = []  # key, arrival, value
    arrived = 0
    deleted: set[int] = set()  # a deleted key removes every row of it, whenever it came
    for _ in range(60):
        count = int(rng.integers(1, 30))
        blocks = rng.integers(1, 6, count)
        offsets = rng.integers(0, 40, count)
        keys = spill.key_of(blocks, offsets)
        values = rng.integers(0, 1 << 40, count)
        seqs = np.arange(arrived, arrived + count, dtype=np.int64)
        arrived += count
        rows.add(keys, seqs, pa.table({"v": values}))
        model.extend(zip(keys.tolist(), seqs.tolist(), values.tolist(), strict=True))
        gone = spill.key_of(rng.integers(1, 6, 3), rng.integers(0, 40, 3))
        dead.add(gone, np.zeros(3, dtype=np.int64))
        deleted.update(gone.tolist())
    table = spill.live_table(rows, dead, {4}, pa.schema([("v", pa.int64())]))
    model = [m for m in sorted(model) if m[0] >> 32 != 4 and m[0] not in deleted]
    spilled = rows.spilled + dead.spilled
    return table, [(m[0], m[2]) for m in model], spilled


@pytest.mark.parametrize("seed", range(4))
def test_spilled_rows_merge_to_the_model(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    table, model, spilled = rows_in(400, seed, monkeypatch)
    assert isinstance(table, spill.SpilledTable) and spilled >= 10
    assert table.read_all().column("v").to_pylist() == [value for _, value in model]
    assert table.num_rows == len(model)
    table.close()


def test_rows_held_in_memory_give_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    table, model, spilled = rows_in(1 << 30, 3, monkeypatch)
    assert isinstance(table, pa.Table) and spilled == 0
    assert table.column("v").to_pylist() == [value for _, value in model]
