"""The scan's key path (engine/scan.py: a filter bounding the integer primary key reads only
the blocks whose key ranges meet it, sliced by binary search) returns exactly the rows of a
full scan filtered by pyarrow, at every snapshot.

How: hypothesis draws histories of inserts (keys anywhere, so persisted blocks' key ranges
overlap), deletes, updates and flushes/merges, holds a snapshot open half way through (its
blocks are dropped by later merges and must stay readable to it), and then, at the old and
the newest snapshot, runs key filters of every shape the path reads (a point, a half-open
range, a range `and` another column, an `or` of two ranges, a non-integer literal, a float32
literal, bounds past the int64 range, a range holding no key) and compares each with the
scan without a filter (the grouped path, which never takes the key path) filtered by
pyarrow, and with a model of the live rows. Then a table larger than a few blocks: a point
reads one persisted block, a range the blocks it meets. Last, the check itself is shown to
catch a wrong key path: with the interval cut short by one key, or the last candidate block
dropped, it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.objects.store import MemoryObjectStore
from engine.scan import ScanCounts, scan_parts
from engine.schema import Column, Schema
from engine.storage import TableData, pruning, scan_ranges
from engine.txn import Transaction
from tae_driver.backends.memory import MemoryBackend

SCHEMA = Schema(
    [Column("id", "int64"), Column("a", "int32", nullable=True), Column("s", "string")],
    primary_key=["id"],
)
INT64_MAX = (1 << 63) - 1


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def rows(ids: list[int], seed: int) -> pa.Table:
    a = [None if (i + seed) % 5 == 0 else (i * 7 + seed) % 20 - 5 for i in ids]
    s = [f"s{i}-{seed}" for i in ids]
    return pa.table({"id": ids, "a": a, "s": s}, schema=SCHEMA.to_arrow())


async def open_engine() -> Engine:
    eng = await Engine.open(
        "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
    )
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", SCHEMA)
    return eng


async def settle(eng: Engine) -> None:
    maintenance = eng.maintenance
    assert maintenance is not None
    await maintenance.settle(freeze_all=True, rounds_max=10_000)


def key_filters(lo: int, hi: int) -> list[pc.Expression]:
    key = pc.field("id")
    return [
        key == lo,
        (key >= lo) & (key < hi),
        (key >= lo) & (key <= hi) & (pc.field("a") > 0),
        (pc.field("a") < 3) & (key > lo),
        (key < lo) | (key > hi),
        key == lo + 0.5,
        key > lo - 0.5,
        key >= pa.scalar(lo + 0.25, pa.float32()),
        (key <= hi) & (key > -(2**62)),
        key < INT64_MAX,
        (key >= hi) & (key < lo),
        (key != lo) & (key < hi),
    ]


async def check(view: Transaction, model: dict[int, dict[str, Any]], lo: int, hi: int) -> None:
    """Every key filter over `view` returns what pyarrow's filter of the full scan returns
    (and the full scan holds the model's rows)."""
    table = view.table("d", "t")
    whole = (await table.scan()).sort_by("id")
    assert whole.column("id").to_pylist() == sorted(model), "the full scan lost or kept a row"
    assert whole.to_pylist() == [model[k] for k in sorted(model)]
    for expression in key_filters(lo, hi):
        for columns in (None, ["id", "a"], ["a"]):
            got = await table.scan(columns=columns, filter=expression)
            expected = whole.filter(expression)
            if columns is not None:
                expected = expected.select(columns)
            if columns == ["a"]:
                # No key to order by: compare the multisets.
                assert sorted(got.to_pylist(), key=repr) == sorted(
                    expected.to_pylist(), key=repr
                ), (str(expression), columns)
            else:
                assert got.sort_by("id").to_pylist() == expected.to_pylist(), (
                    str(expression),
                    columns,
                )


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 300), st.integers(1, 60), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.integers(0, 300), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("update"), st.integers(0, 300), st.integers(1, 40), st.integers(-9, 9)),
        st.tuples(st.just("flush"), st.just(0), st.just(0), st.just(0)),
        st.tuples(st.just("hold"), st.just(0), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


async def apply(
    eng: Engine, model: dict[int, dict[str, Any]], op: tuple[str, int, int, int]
) -> None:
    kind, first, count, seed = op
    # Keys spread out (a stride), so blocks flushed at different times overlap in range.
    ids = list(range(first, first + count * 3, 3))
    async with eng.transaction() as txn:
        table = txn.table("d", "t")
        if kind == "insert":
            fresh = [i for i in ids if i not in model]
            if fresh:
                batch = rows(fresh, seed)
                await table.insert(batch)
                model.update({r["id"]: r for r in batch.to_pylist()})
        elif kind == "delete":
            await table.delete(ids)
            for i in ids:
                model.pop(i, None)
        elif kind == "update":
            live = [i for i in ids if i in model]
            await table.update(live, {"a": seed})
            for i in live:
                model[i] = {**model[i], "a": seed}
    if kind == "flush":
        await settle(eng)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(history=ops, bounds=st.tuples(st.integers(-5, 320), st.integers(0, 120)))
def test_key_path_equals_the_full_scan_filtered(
    history: list[tuple[str, int, int, int]], bounds: tuple[int, int]
) -> None:
    lo, width = bounds

    async def main() -> None:
        eng = await open_engine()
        model: dict[int, dict[str, Any]] = {}
        held: dict[int, dict[str, Any]] | None = None
        async with contextlib.AsyncExitStack() as stack:
            old_view: Transaction | None = None
            try:
                for op in history:
                    if op[0] == "hold" and old_view is None:
                        old_view = await stack.enter_async_context(eng.snapshot(eng.visible_ts))
                        held = dict(model)
                        continue
                    await apply(eng, model, op)
                await settle(eng)  # later merges drop blocks the held view still reads
                if old_view is not None:
                    assert held is not None
                    await check(old_view, held, lo, lo + width)
                async with eng.snapshot(eng.visible_ts) as view:
                    await check(view, model, lo, lo + width)
                # A transaction's own writes are scanned with the persisted rows.
                async with eng.transaction() as txn:
                    table = txn.table("d", "t")
                    doomed = [i for i in sorted(model) if lo <= i <= lo + width][:3]
                    await table.delete(doomed)
                    fresh = [i for i in range(lo, lo + width) if i not in model][:3]
                    if fresh:
                        await table.insert(rows(fresh, 4))
                    mine = {k: v for k, v in model.items() if k not in doomed}
                    mine.update({r["id"]: r for r in rows(fresh, 4).to_pylist()})
                    await check(txn, mine, lo, lo + width)
                    await txn.rollback()
            finally:
                await stack.aclose()
                await eng.close()

    run(main)


async def scan_counts(view: Transaction, expression: pc.Expression) -> tuple[pa.Table, ScanCounts]:
    table = view.table("d", "t")
    counts = ScanCounts()
    parts = [p async for p in scan_parts(view, table, ["id", "a"], expression, counts)]
    return pa.concat_tables(parts), counts


async def big_table() -> Engine:
    """8 flushes of 5,000 keys (two blocks each at most), merged; then deletes."""
    eng = await open_engine()
    for first in range(0, 40_000, 5_000):
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert(rows(list(range(first, first + 5_000)), 1))
        await settle(eng)
    async with eng.transaction() as txn:
        await txn.table("d", "t").delete(list(range(20_000, 20_100, 2)))
    return eng


def test_a_point_reads_one_block_and_a_range_the_blocks_it_meets() -> None:
    async def main() -> None:
        eng = await big_table()
        try:
            async with eng.snapshot(eng.visible_ts) as view:
                got, counts = await scan_counts(view, pc.field("id") == 12_345)
                assert got.column("id").to_pylist() == [12_345]
                assert counts.blocks_visible > 2
                assert counts.blocks_read == 1
                got, counts = await scan_counts(
                    view, (pc.field("id") >= 19_990) & (pc.field("id") < 20_010)
                )
                alive = [i for i in range(19_990, 20_010) if not (i >= 20_000 and i % 2 == 0)]
                assert got.column("id").to_pylist() == alive
                assert 1 <= counts.blocks_read <= 2 < counts.blocks_visible
                got, counts = await scan_counts(view, pc.field("id") == 20_002)
                assert got.num_rows == 0  # deleted
        finally:
            await eng.close()

    run(main)


@pytest.mark.parametrize("sabotage", ["interval one short", "last block dropped"])
def test_the_check_catches_a_wrong_key_path(sabotage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the key path broken on purpose, `check` fails: the comparisons above can fail."""
    if sabotage == "interval one short":
        honest_interval = pruning.key_interval

        def short(node: pruning.Node, key: str) -> pruning.KeyInterval | None:
            found = honest_interval(node, key)
            if found is None or found.lo >= found.hi:
                return found
            return pruning.KeyInterval(found.lo, found.hi - 1, found.exact)

        monkeypatch.setattr(pruning, "key_interval", short)
    else:
        honest_blocks = scan_ranges.key_range_blocks

        def fewer(data: TableData, lo: int, hi: int, ts: int) -> tuple[list[Any], int] | None:
            found = honest_blocks(data, lo, hi, ts)
            if found is None or len(found[0]) < 2:
                return found
            return found[0][:-1], found[1]

        monkeypatch.setattr(scan_ranges, "key_range_blocks", fewer)

    async def main() -> None:
        eng = await big_table()
        model = {
            r["id"]: r
            for first in range(0, 40_000, 5_000)
            for r in rows(list(range(first, first + 5_000)), 1).to_pylist()
            if not (20_000 <= r["id"] < 20_100 and r["id"] % 2 == 0)
        }
        try:
            async with eng.snapshot(eng.visible_ts) as view:
                with pytest.raises(AssertionError):
                    await check(view, model, 4_990, 15_010)
        finally:
            await eng.close()

    run(main)
