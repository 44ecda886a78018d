"""Plain aggregates over a key range answered without DuckDB (engine/sql_aggregates.py, taken
by engine/sql_direct.py) equal DuckDB's own answer over `scan()`'s whole table at the same
snapshot, bit for bit: names, types, NULLs, and every bit of a DOUBLE sum.

How: hypothesis draws a history of inserts (int32, int64 near +-2^62, uint32, DOUBLE values
with -0.0, infinities, NaN and magnitudes from 1e-300 to 1e300 that make the order of
additions matter, NULLs), deletes, updates and flushes, holds a snapshot open half-way
through it (read after later merges), and opens a transaction with uncommitted rows of its
own; then queries of counts, sums, mins and maxes with a WHERE of key bounds. Each answer
must equal DuckDB's at one thread (whose sum of DOUBLEs is additions in row order) over the
registered `scan()` of the same snapshot, compared by bit pattern; a spy counts the answers
this module gave, so the test cannot pass on DuckDB alone. Then: a query it takes makes no
DuckDB call once its template's answer schema is known; what it does not take (a float
min, an unsigned sum, DISTINCT, FILTER, a non-key term) is left to DuckDB. Mutations tried
on the module (numpy's pairwise `sum` for the DOUBLE sum, starting it at the first value,
int64 sums that wrap, counting NULLs) each fail the hypothesis test.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import sql, sql_aggregates, sql_databases
from engine.engine import Engine
from engine.objects.store import MemoryObjectStore
from engine.schema import Column, Schema
from engine.txn import Transaction
from tae_driver.backends.memory import MemoryBackend
from tests.unit.engine.test_sql import run, settle

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("a", "int32", nullable=True),
        Column("b", "int64", nullable=True),
        Column("u", "uint32", nullable=True),
        Column("f", "float64", nullable=True),
        Column("s", "string", nullable=True),
    ],
    primary_key=["id"],
)

doubles = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e16, -1e16, 1e300, -1e300, math.inf, -math.inf]),
    st.sampled_from([math.nan, 5e-324, 1e-300, -0.0]),
    st.just(-0.0),
    # Values whose sum's last bits depend on the order of the additions:
    st.sampled_from([0.1, 0.2, 0.3, 0.7, 1.1, 3.3, 1e-8, 1e8 + 0.1, 2.0 / 3.0]),
    st.sampled_from([0.1, 0.2, 0.3, 0.7, 1.1, 3.3, 1e-8, 1e8 + 0.1, 2.0 / 3.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6),
)
wide = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([2**63 - 1, -(2**63), 2**62 + 3, -(2**62)]),  # sums past int64
    st.integers(-5, 5),
)
narrow = st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1))
unsigned = st.one_of(st.none(), st.integers(0, 2**32 - 1))
values = st.tuples(narrow, wide, unsigned, doubles)


def table_of(ids: list[int], drawn: list[tuple[Any, Any, Any, Any]]) -> pa.Table:
    a, b, u, f = zip(*drawn, strict=True) if drawn else ((), (), (), ())
    s = [None if i % 3 == 0 else f"s{i % 4}" for i in ids]
    return pa.table(
        {"id": ids, "a": list(a), "b": list(b), "u": list(u), "f": list(f), "s": s},
        schema=SCHEMA.to_arrow(),
    )


step = st.one_of(
    st.tuples(
        st.just("insert"),
        st.integers(-20, 60),
        st.lists(values, min_size=1, max_size=30),
    ),
    st.tuples(st.just("delete"), st.integers(-20, 80), st.integers(1, 25)),
    st.tuples(st.just("update"), st.integers(-20, 80), st.integers(1, 25), doubles),
    st.tuples(st.just("flush")),
)
history = st.lists(step, max_size=8)


async def apply(eng: Engine, change: tuple[Any, ...]) -> None:
    if change[0] == "flush":
        await settle(eng)
        return
    async with eng.transaction() as txn:
        await change_in(txn, change)


async def change_in(txn: Transaction, change: tuple[Any, ...]) -> None:
    table = txn.table("shop", "t")
    live = {r["id"] for r in (await table.scan(columns=["id"])).to_pylist()}
    if change[0] == "insert":
        first, drawn = change[1], change[2]
        fresh = [(i, v) for i, v in zip(range(first, first + len(drawn)), drawn, strict=True)]
        fresh = [(i, v) for i, v in fresh if i not in live]
        if fresh:
            await table.insert(table_of([i for i, _ in fresh], [v for _, v in fresh]))
    elif change[0] == "delete":
        await table.delete(list(range(change[1], change[1] + change[2])))
    elif change[0] == "update":
        ids = [i for i in range(change[1], change[1] + change[2]) if i in live]
        await table.update(ids, {"f": change[3]})


aggregates = st.sampled_from(
    [
        "count(*)",
        "count(*) as n, count(f), count(s)",
        "sum(f)",
        "sum(f) as total, sum(a), sum(b)",
        "sum(b), min(b), max(b), min(a), max(u), min(id)",
        "max(t.f)",  # (a float max: DuckDB's)
        "sum(u)",  # (an unsigned sum: DuckDB's)
        "min(s), count(distinct a)",  # (DuckDB's)
        "sum(f) filter (where a > 0)",  # (DuckDB's)
        "sum(F), COUNT(*)",
    ]
)
TAKEN = {
    "count(*)",
    "count(*) as n, count(f), count(s)",
    "sum(f)",
    "sum(f) as total, sum(a), sum(b)",
    "sum(b), min(b), max(b), min(a), max(u), min(id)",
    "sum(F), COUNT(*)",
}
"""The select lists engine/sql_aggregates.py answers (the others are DuckDB's)."""
bound = st.integers(-25, 85).map(str)
conditions = st.one_of(
    st.builds(lambda lo, hi: f"id >= {lo} and id < {hi}", bound, bound),
    st.builds(lambda lo, hi: f"id between {lo} and {hi}", bound, bound),
    st.builds(lambda v: f"id = {v}", bound),
    st.builds(lambda v: f"id <= {v}", bound),
    st.builds(lambda v: f"{v} < t.id", bound),
    st.builds(lambda x, y: f"id in ({x}, {y})", bound, bound),
    st.builds(lambda lo: f"id > {lo} and a > 0", bound),  # not exact: DuckDB's
)


def reference(whole: pa.Table, query: str) -> pa.Table:
    """DuckDB's own answer, at one thread, over the whole table `scan()` gave."""
    con = duckdb.connect(config={"threads": 1})
    try:
        con.register("whole", whole)
        con.execute("create schema shop")
        con.execute("create view shop.t as select * from whole")
        return con.sql(query).to_arrow_table()
    finally:
        con.close()


def bits(value: object) -> object:
    """A value as compared: a float by its bit pattern (NaN, -0.0 and the last bit count)."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    return value


def identical(got: pa.Table, want: pa.Table) -> bool:
    if got.schema != want.schema or got.num_rows != want.num_rows:
        return False
    return [[bits(v) for v in row.values()] for row in got.to_pylist()] == [
        [bits(v) for v in row.values()] for row in want.to_pylist()
    ]


class Spy:
    """Counts the answers engine/sql_aggregates.py gave."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answered = 0
        real = sql_aggregates.answer

        def spied(*args: Any, **kwargs: Any) -> pa.Table | None:
            found = real(*args, **kwargs)
            self.answered += found is not None
            return found

        monkeypatch.setattr(sql_aggregates, "answer", spied)


async def open_engine() -> Engine:
    eng = await Engine.open(
        "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
    )
    async with eng.transaction() as txn:
        await txn.create_database("shop")
        await txn.create_table("shop", "t", SCHEMA)
    return eng


async def check_three_views(
    check: Callable[[Transaction, str], Awaitable[None]],
    initial: list[tuple[Any, Any, Any, Any]],
    before: list[tuple[Any, ...]],
    after: list[tuple[Any, ...]],
    own: tuple[Any, ...] | None,
) -> None:
    """`check` at three views of one engine: an old snapshot read after `after` changed
    the table (and flushed it), the current snapshot, and a transaction with its own
    uncommitted change `own` (rolled back)."""
    eng = await open_engine()
    try:
        start = [("insert", -5, initial)] if initial else []
        for change in [*start, ("flush",), *before]:
            await apply(eng, change)
        async with eng.snapshot(eng.visible_ts) as old:
            for change in [*after, ("flush",)]:
                await apply(eng, change)
            await check(old, "old snapshot")
        async with eng.snapshot(eng.visible_ts) as view:
            await check(view, "current")
        async with eng.transaction() as txn:
            if own is not None and own[0] != "flush":
                await change_in(txn, own)
            await check(txn, "own writes")
            await txn.rollback()
    finally:
        await eng.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(
    initial=st.lists(values, min_size=10, max_size=60),
    before=history,
    after=history,
    own=st.one_of(st.none(), step),
    queries=st.lists(st.tuples(aggregates, conditions), min_size=1, max_size=4),
)
def test_aggregates_answer_as_duckdb_over_scan_at_the_same_snapshot(
    monkeypatch: pytest.MonkeyPatch,
    initial: list[tuple[Any, Any, Any, Any]],
    before: list[tuple[Any, ...]],
    after: list[tuple[Any, ...]],
    own: tuple[Any, ...] | None,
    queries: list[tuple[str, str]],
) -> None:
    spy = Spy(monkeypatch)

    async def check(view: Transaction, label: str) -> None:
        whole = await view.table("shop", "t").scan()
        for select, condition in queries:
            query = f"select {select} from shop.t where {condition}"
            got = await sql.run(view, query)
            want = reference(whole, query)
            assert identical(got, want), (label, query, got.to_pylist(), want.to_pylist())

    run(lambda: check_three_views(check, initial, before, after, own))
    taken = [s for s, c in queries if s in TAKEN and "a > 0" not in c]
    assert spy.answered == 3 * len(taken)  # (three snapshots)


def test_a_query_it_takes_makes_no_duckdb_call_and_others_keep_duckdb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = sql_databases.select

    def counted(con: Any, text: str) -> pa.RecordBatchReader:
        calls.append(text)
        return real(con, text)

    monkeypatch.setattr(sql_databases, "select", counted)
    spy = Spy(monkeypatch)

    async def main() -> None:
        eng = await open_engine()
        try:
            drawn = [(i, i * 2**40, i, i / 3) for i in range(1000)]
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(table_of(list(range(1000)), drawn))
                await txn.table("shop", "t").insert(table_of([2000], [(None, None, None, -0.0)]))
            await settle(eng)
            # DuckDB's sum starts at +0.0: the sum of one -0.0 is +0.0.
            zero = "select sum(f) from shop.t where id = 2000"
            assert identical(await eng.sql(zero), pa.table({"sum(f)": [0.0]}))
            assert spy.answered == 1
            query = "select sum(f) as total, count(*) as n, max(b) from shop.t where id >= {}"
            await eng.sql(query.format(10))  # the template's answer schema: one DuckDB run
            calls.clear()
            got = await eng.sql(query.format(500))
            assert calls == []
            assert spy.answered == 3
            async with eng.snapshot(eng.visible_ts) as view:
                whole = await view.table("shop", "t").scan()
            # 500 thirds: numpy's pairwise sum, or any other order, differs in the last bits.
            assert identical(got, reference(whole, query.format(500)))
            assert got.column("n").to_pylist() == [501]  # (and id 2000)
            assert got.column("max(b)").to_pylist() == [999 * 2**40]
            assert got.schema.field("total").type == pa.float64()
            for text in (
                "select max(f) from shop.t where id >= 5",
                "select sum(u) from shop.t where id >= 5",
                "select count(distinct a) from shop.t where id >= 5",
                "select sum(f) filter (where a > 3) from shop.t where id >= 5",
                "select sum(f) from shop.t where id >= 5 and a > 3",
                "select sum(f) + 1 from shop.t where id >= 5",
            ):
                calls.clear()
                await eng.sql(text)
                assert calls, text
            assert spy.answered == 3
        finally:
            await eng.close()

    run(main)
