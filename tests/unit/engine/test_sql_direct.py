"""SQL's direct path (engine/sql_direct.py, engine/sql_keys.py) answers what DuckDB answers
over `scan()`'s whole table at the same snapshot, and is taken when the WHERE bounds the key.

How: hypothesis draws a history of inserts, deletes, updates and flushes (persisted blocks
with delete masks, merged, beside rows in memory), holds a snapshot open half-way through it
(an old snapshot read after later merges), and opens a transaction with uncommitted inserts
and deletes of its own; then random queries whose WHERE is key conjuncts (=, <, <=, >, >=
either side, negative values, BETWEEN, IN) joined by AND, with or without a non-key term or
an OR that keeps them off the direct path, and select lists from a bare `*` to aggregates,
GROUP BY and ORDER BY. Each answer must equal (rows as a multiset, names and types) DuckDB's
own answer over the registered `scan()` of the same snapshot; every query whose WHERE is only
key conjuncts must have been answered by the direct path (a spy counts it), so the test is
not satisfied by the streamed path alone. Then: the direct path reads no DuckDB dataset and
runs a cheap small query with no thread (both fail on the code before it: it streamed every
query through a thread), a DuckDB error on it falls back to the streamed path's message, and
a key range past `SQL_DIRECT_ROWS_MAX` is streamed.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import limits, sql, sql_databases, sql_direct
from engine.engine import Engine
from engine.errors import SqlError
from engine.txn import Transaction

# The table and helpers the streamed path's tests use: both paths read the same data.
from tests.unit.engine.test_sql import open_engine, rows, run, settle


async def apply(eng: Engine, step: tuple[str, int, int, int]) -> None:
    kind, lo, count, seed = step
    if kind == "flush":
        await settle(eng)  # L0 blocks into objects, merged
        return
    async with eng.transaction() as txn:
        table = txn.table("shop", "t")
        live = {r["id"] for r in (await table.scan(columns=["id"])).to_pylist()}
        ids = list(range(lo, lo + count))
        if kind == "insert":
            fresh = [i for i in ids if i not in live]
            if fresh:
                await table.insert(rows(fresh, seed))
        elif kind == "delete":
            await table.delete(ids)
        elif kind == "update":
            await table.update([i for i in ids if i in live], {"a": seed})


def reference(whole: pa.Table, query: str) -> pa.Table:
    """DuckDB's own answer over the whole table as `scan()` gave it."""
    con = duckdb.connect()
    try:
        con.register("whole", whole)
        con.execute("create schema shop")
        con.execute("create view shop.t as select * from whole")
        return con.sql(query).to_arrow_table()
    finally:
        con.close()


def same(got: pa.Table, want: pa.Table) -> bool:
    """Equal as multisets of rows, with the same names and types."""
    if [(f.name, f.type) for f in got.schema] != [(f.name, f.type) for f in want.schema]:
        return False
    return sorted(map(repr, got.to_pylist())) == sorted(map(repr, want.to_pylist()))


class Spy:
    """Counts the queries `sql_direct.answer` answered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answered = 0
        real = sql_direct.answer

        async def spied(*args: Any, **kwargs: Any) -> pa.Table | None:
            found = await real(*args, **kwargs)
            self.answered += found is not None
            return found

        monkeypatch.setattr(sql_direct, "answer", spied)


# --- hypothesis: the direct path equals DuckDB over scan() -------------------------------------

history = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(-10, 60), st.integers(1, 40), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.integers(-10, 80), st.integers(1, 30), st.just(0)),
        st.tuples(st.just("update"), st.integers(-10, 80), st.integers(1, 30), st.integers(-9, 9)),
        st.tuples(st.just("flush"), st.just(0), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=8,
)

key = st.sampled_from(["id", "t.id", "ID"])
value = st.integers(-12, 70).map(str)


@st.composite
def key_term(draw: st.DrawFn) -> tuple[str, bool]:
    """A term on the key, and whether the direct path reads bounds from it."""
    kind = draw(st.integers(0, 7))
    column = draw(key)
    if kind <= 3:
        op = draw(st.sampled_from(["=", "<", "<=", ">", ">="]))
        if draw(st.booleans()):
            return f"{draw(value)} {op} {column}", True
        return f"{column} {op} {draw(value)}", True
    if kind <= 5:
        return f"{column} between {draw(value)} and {draw(value)}", True
    if kind == 6:
        values = draw(st.lists(value, min_size=1, max_size=4))
        return f"{column} in ({', '.join(values)})", True
    return f"{column} = -(-{draw(st.integers(0, 80))})", False  # not a plain value


@st.composite
def where(draw: st.DrawFn) -> tuple[str, bool]:
    """A WHERE clause, and whether the direct path must take it (a top-level AND with a
    term it reads bounds from)."""
    terms = draw(st.lists(key_term(), min_size=1, max_size=2))
    texts = [text for text, _ in terms]
    bounded = any(used for _, used in terms)
    extra = draw(st.sampled_from(["", "", "", "a > 2", "s is not null", "f <= 1.5", "or"]))
    if extra == "or":
        return f"({' and '.join(texts)}) or a = 3", False
    return " and ".join([*texts, extra] if extra else texts), bounded


selects = st.sampled_from(
    [
        ("*", ""),
        ("*", ""),
        ("id, s", ""),
        ("s, a, id", ""),
        ("t.a, t.s", ""),
        ("id", ""),
        ("count(*) as n", ""),
        ("sum(a) as total, min(f), max(s), count(a)", ""),
        ("a, count(*) as n", " group by a"),
        ("id, a + 1 as b", " order by id desc"),
        ("distinct s", ""),
        ("id, f", " order by f nulls first, id limit 3"),
        ("upper(s) as u, id", ""),  # not cheap: DuckDB on the query's thread
        ("id, row_number() over (order by id) as r", ""),
    ]
)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(
    before=history,
    after=history,
    own=st.tuples(st.integers(-10, 90), st.integers(0, 20), st.integers(-10, 90)),
    queries=st.lists(st.tuples(selects, where()), min_size=1, max_size=4),
)
def test_the_direct_path_answers_as_duckdb_over_scan_at_the_same_snapshot(
    monkeypatch: pytest.MonkeyPatch,
    before: list[tuple[str, int, int, int]],
    after: list[tuple[str, int, int, int]],
    own: tuple[int, int, int],
    queries: list[tuple[tuple[str, str], tuple[str, bool]]],
) -> None:
    spy = Spy(monkeypatch)
    expected_direct = 0

    async def check(view: Transaction, label: str) -> None:
        nonlocal expected_direct
        whole = await view.table("shop", "t").scan()
        for (select, tail), (condition, bounded) in queries:
            query = f"select {select} from shop.t where {condition}{tail}"
            got = await sql.run(view, query)
            want = reference(whole, query)
            assert same(got, want), (label, query, got.to_pylist(), want.to_pylist())
            expected_direct += bounded

    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            for step in [("insert", 0, 60, 1), ("flush", 0, 0, 0), *before]:
                await apply(eng, step)
            async with eng.snapshot(eng.visible_ts) as old:
                for step in after:
                    await apply(eng, step)
                await check(old, "old snapshot")
            async with eng.snapshot(eng.visible_ts) as view:
                await check(view, "current")
            async with eng.transaction() as txn:
                table = txn.table("shop", "t")
                first, count, gone = own
                live = {r["id"] for r in (await table.scan(columns=["id"])).to_pylist()}
                fresh = [i for i in range(first, first + count) if i not in live]
                if fresh:
                    await table.insert(rows(fresh, 4))
                await table.delete([gone, gone + 1])
                await check(txn, "own writes")
                await txn.rollback()
        finally:
            await eng.close()

    run(main)
    assert spy.answered >= expected_direct


def test_every_bound_shape_at_its_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each comparison, both ways round, at a key that exists (over persisted blocks with
    deletes, rows in memory and an uncommitted transaction's own rows), as bare projections
    (answered without DuckDB: an off-by-one in a bound shows) and as aggregates."""
    spy = Spy(monkeypatch)
    shapes = [
        "id < 30", "30 > id", "id <= 30", "30 >= id", "id > 30", "30 < id", "id >= 30",
        "30 <= id", "id = 30", "30 = id", "id between 29 and 31", "id in (29, 31, 99)",
        "id > -3 and id < 2", "id = -2", "id < -9", "id >= 31 and id <= 30",
    ]  # fmt: skip
    queries = [f"select {select} from shop.t where {shape}" for shape in shapes
               for select in ("*", "id", "count(*) as n, sum(a) as total")]  # fmt: skip

    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            for step in [("insert", -5, 60, 1), ("flush", 0, 0, 0), ("delete", 31, 1, 0)]:
                await apply(eng, step)
            await apply(eng, ("insert", 60, 10, 2))  # in memory
            async with eng.transaction() as txn:
                await txn.table("shop", "t").delete([29])
                await txn.table("shop", "t").insert(rows([-9, 70], 3))
                for view in (txn, None):
                    async with eng.snapshot(eng.visible_ts) as current:
                        reader = txn if view is txn else current
                        whole = await reader.table("shop", "t").scan()
                        for query in queries:
                            got = await sql.run(reader, query)
                            want = reference(whole, query)
                            assert same(got, want), (query, got.to_pylist(), want.to_pylist())
                await txn.rollback()
        finally:
            await eng.close()

    run(main)
    assert spy.answered == 2 * len(queries)


# --- the path taken -----------------------------------------------------------------------------


async def loaded(keys_count: int = 20_000) -> Engine:
    eng = await open_engine()
    for first in range(0, keys_count, 5_000):
        async with eng.transaction() as txn:
            await txn.table("shop", "t").insert(rows(list(range(first, first + 5_000)), 1))
    await settle(eng)
    async with eng.transaction() as txn:
        await txn.table("shop", "t").delete([7, 8, 9])
    return eng


def test_a_key_query_reads_no_dataset_and_a_cheap_one_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fails on the streamed path alone: every query went through `EngineTable.scanner` on
    a thread of `QUERY_THREADS`."""

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the direct path streamed a dataset or used a thread")

    async def main() -> None:
        eng = await loaded()
        try:
            monkeypatch.setattr(sql.EngineTable, "scanner", refused)
            monkeypatch.setattr(sql_databases.QUERY_THREADS, "submit", refused)
            scans: list[sql.ScanReport] = []
            async with eng.snapshot(eng.visible_ts) as view:
                point = await sql.run(view, "select * from shop.t where id = 12", scans=scans)
                gone = await sql.run(view, "select * from t where id = 8")
                total = await sql.run(
                    view, "select sum(a) as total, count(*) as n from t where id between 5 and 104"
                )
                want = await view.table("shop", "t").scan()
            assert point.to_pylist() == [
                r for r in want.to_pylist() if r["id"] == 12
            ]  # (types: same() in the hypothesis test)
            assert gone.num_rows == 0  # deleted, by the snapshot's masks
            kept = [r for r in want.to_pylist() if 5 <= r["id"] <= 104]
            assert total.to_pylist() == [
                {"total": sum(r["a"] for r in kept if r["a"] is not None), "n": len(kept)}
            ]
            [report] = scans
            assert report.rows_out == 1 and report.blocks_read == 0  # the key index's row
        finally:
            await eng.close()

    run(main)


def test_a_duckdb_error_on_the_direct_path_is_the_streamed_paths_error() -> None:
    async def main() -> None:
        eng = await loaded(5_000)
        try:
            for query in (
                "select nosuch from shop.t where id = 3",
                "select error('boom ' || id) from shop.t where id between 3 and 3",
            ):
                with pytest.raises(SqlError) as direct:
                    await eng.sql(query)
                limits_before = limits.SQL_DIRECT_ROWS_MAX
                try:
                    limits.SQL_DIRECT_ROWS_MAX = -1  # the streamed path only
                    with pytest.raises(SqlError) as streamed:
                        await eng.sql(query)
                finally:
                    limits.SQL_DIRECT_ROWS_MAX = limits_before
                assert str(direct.value) == str(streamed.value)
        finally:
            await eng.close()

    run(main)


def test_key_bounds_past_the_limit_are_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = Spy(monkeypatch)
    monkeypatch.setattr(limits, "SQL_DIRECT_ROWS_MAX", limits.BLOCK_ROWS_MAX)  # one block

    async def main() -> None:
        eng = await loaded()
        try:
            small = await eng.sql("select count(*) as n from t where id >= 100 and id < 200")
            assert spy.answered == 1
            large = await eng.sql("select count(*) as n from t where id >= 100 and id < 15000")
            assert spy.answered == 1  # streamed: its blocks hold more than the limit
            assert small.to_pylist() == [{"n": 100}]
            assert large.to_pylist() == [{"n": 15000 - 100}]
        finally:
            await eng.close()

    run(main)
