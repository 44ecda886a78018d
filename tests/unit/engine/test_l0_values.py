"""Small inserts stay Python values in their L0 block until something reads it (issue 21:
a lone writer's commit built two Arrow arrays when it became visible).

Proves, on a `TableData` driven through `apply_appends` (the path of every commit and of
replay): one-row commits applied one at a time build no Arrow array at all
(`engine.storage.blocks.to_arrow` is never called: on the old code it was called once per
commit); the first read (`table()`, `row()`) builds one batch for all of them; what every
read returns equals the same rows applied as Arrow batches (the old path), interleaved with
Arrow appends and across a block boundary; the values tail is bounded by
`L0_VALUES_ROWS_MAX` rows; and the block's byte count is the rows' Arrow size.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from engine import limits
from engine import rows as rows_module
from engine.rows import small_rows
from engine.schema import Column, Schema, to_batch
from engine.storage import L0Block, TableData
from engine.storage import blocks as blocks_module
from engine.wal.entry import Append, AppendRows

SCHEMA = Schema(
    [Column("id", "int64"), Column("name", "string", nullable=True)], primary_key=["id"]
)


def _row(key: int) -> dict[str, Any]:
    return {"id": key, "name": None if key % 5 == 0 else f"n{key}"}


def _append_rows(data: TableData, rows: list[dict[str, Any]]) -> AppendRows:
    small = small_rows(SCHEMA, data.arrow_schema, rows)
    assert small is not None
    return AppendRows(1, 2, data.allocate(len(rows)), small)


def _append_arrow(data: TableData, rows: list[dict[str, Any]]) -> Append:
    batch = to_batch(SCHEMA, data.arrow_schema, rows, "d.t")
    return Append(1, 2, data.allocate(len(rows)), batch)


def _contents(data: TableData) -> list[tuple[int, list[dict[str, Any]]]]:
    out = []
    for block in data.l0_blocks():
        table = block.table()
        out.append((block.block_id, table.to_pylist()))
        for offset in (0, block.rows - 1):
            assert block.row(offset) == table.slice(offset, 1).to_pylist()[0]
    return out


@pytest.fixture
def to_arrow_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = rows_module.to_arrow

    def counting(arrow_schema: pa.Schema, columns: Any) -> pa.RecordBatch:
        calls.append(len(columns[0]))
        return real(arrow_schema, columns)

    monkeypatch.setattr(blocks_module, "to_arrow", counting)
    return calls


def test_one_row_commits_build_no_arrow_until_the_block_is_read(to_arrow_calls: list[int]) -> None:
    data = TableData("t", SCHEMA)
    for ts, key in enumerate(range(100), start=1):
        data.apply_appends([(ts, _append_rows(data, [_row(key)]))])
    assert to_arrow_calls == []
    (block,) = data.l0_blocks()
    assert block.rows == 100 and block.visible_rows(50) == 50
    assert block.table().column("id").to_pylist() == list(range(100))
    assert to_arrow_calls == [100]  # one batch for the hundred commits
    block.table()
    assert to_arrow_calls == [100]  # read again: nothing new to build
    data.apply_appends([(101, _append_rows(data, [_row(100)]))])
    assert block.row(100) == _row(100)
    assert to_arrow_calls == [100, 1]


def test_values_and_arrow_appends_read_as_the_arrow_path(to_arrow_calls: list[int]) -> None:
    """The same commits, once as values where small (with Arrow batches between) and once
    all as Arrow, across the block boundary (a group of one-row commits split by it, and an
    Arrow batch split by it): every read agrees, and the bytes counted nearly do."""
    fast, slow = TableData("t", SCHEMA), TableData("t", SCHEMA)
    state = {"key": 0, "ts": 0, "commits": 0}

    def commit_until(end_key: int) -> None:
        while state["key"] < end_key:
            state["commits"] += 1
            size = 300 if state["commits"] % 50 == 0 else 1 if state["commits"] % 3 else 7
            key = state["key"]
            size = min(size, end_key - key)
            rows = [_row(k) for k in range(key, key + size)]
            state["ts"] += 1
            command = _append_rows(fast, rows) if size <= 7 else _append_arrow(fast, rows)
            fast.apply_appends([(state["ts"], command)])
            slow.apply_appends([(state["ts"], _append_arrow(slow, rows))])
            state["key"] += size

    commit_until(limits.BLOCK_ROWS_MAX - 20)
    group_fast, group_slow = [], []
    for k in range(state["key"], state["key"] + 40):
        state["ts"] += 1
        group_fast.append((state["ts"], _append_rows(fast, [_row(k)])))
        group_slow.append((state["ts"], _append_arrow(slow, [_row(k)])))
    fast.apply_appends(group_fast)
    slow.apply_appends(group_slow)
    state["key"] += 40
    commit_until(limits.BLOCK_ROWS_MAX + 700)
    assert len(fast.l0_blocks()) == 2
    assert _contents(fast) == _contents(slow)
    for block in fast.l0_blocks():
        other = slow.blocks[block.block_id]
        assert isinstance(other, L0Block)
        assert 0.9 <= block.byte_size() / other.byte_size() <= 1.1
        for at in (1, 2, state["ts"] // 2, state["ts"]):
            assert block.visible_rows(at) == other.visible_rows(at)
    assert fast.live_rows == slow.live_rows == state["key"]


def test_the_values_tail_is_bounded(to_arrow_calls: list[int]) -> None:
    data = TableData("t", SCHEMA)
    commits = limits.L0_VALUES_ROWS_MAX * 2 + 3
    for ts in range(1, commits + 1):
        data.apply_appends([(ts, _append_rows(data, [_row(ts)]))])
    assert to_arrow_calls == [limits.L0_VALUES_ROWS_MAX] * 2  # built as the tail filled
    (block,) = data.l0_blocks()
    assert isinstance(block, L0Block)
    assert block.table().num_rows == commits
