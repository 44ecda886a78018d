"""SQL over a snapshot (engine/sql.py, issue 24 item 1) answers what `scan` answers, at the
snapshot asked for, with DuckDB's columns and filters pushed into the engine's scan.

How: hypothesis draws histories of inserts, deletes, updates and flushes/merges into a small
table (nulls included) and SELECTs with a projection and a filter of comparisons, IN, IS
NULL, AND/OR/NOT; the SQL answer must equal pyarrow's filter of `scan()` at the same
snapshot. Then: an older `at` (a commit timestamp, a datetime) sees the old rows; a
pushed-down range filter reads fewer persisted blocks than the table has (the scan's own
counts: this fails if `EngineTable.scanner` drops the filter); a self-join reads two streams
of one snapshot; a LIMIT stops a stream early; errors are typed (syntax, unknown table,
writes, two statements, file access, a result past its limit, no DuckDB); bare names resolve
only when unambiguous; the sync engine and a compute node answer the same.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import limits, sql, sql_databases
from engine.clock import ts_datetime
from engine.cn.node import ComputeNode
from engine.cn.port import LocalTN
from engine.engine import Engine
from engine.errors import BadInput, Overloaded, SnapshotUnavailable, SqlError, SqlUnavailable
from engine.objects.store import MemoryObjectStore
from engine.scan import scan_stream
from engine.schema import Column, Schema
from engine.sync import SyncEngine
from tae_driver.backends.memory import MemoryBackend

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("a", "int32", nullable=True),
        Column("f", "float64", nullable=True),
        Column("s", "string", nullable=True),
    ],
    primary_key=["id"],
)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def rows(ids: list[int], seed: int) -> pa.Table:
    a = [None if (i + seed) % 5 == 0 else (i * 7 + seed) % 20 - 5 for i in ids]
    f = [None if (i + seed) % 7 == 0 else ((i * 3 + seed) % 13) / 2 - 2 for i in ids]
    s = [None if (i + seed) % 4 == 0 else f"s{(i + seed) % 6}" for i in ids]
    return pa.table({"id": ids, "a": a, "f": f, "s": s}, schema=SCHEMA.to_arrow())


async def open_engine(**options: Any) -> Engine:
    eng = await Engine.open("unused", MemoryBackend(), objects=MemoryObjectStore(), **options)
    async with eng.transaction() as txn:
        await txn.create_database("shop")
        await txn.create_table("shop", "t", SCHEMA)
    return eng


async def settle(eng: Engine) -> None:
    maintenance = eng.maintenance
    assert maintenance is not None
    await maintenance.settle(freeze_all=True, rounds_max=10_000)


# --- hypothesis: SQL equals scan ----------------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 60), st.integers(1, 40), st.integers(0, 9)),
        st.tuples(st.just("delete"), st.integers(0, 80), st.integers(1, 30), st.just(0)),
        st.tuples(st.just("update"), st.integers(0, 80), st.integers(1, 30), st.integers(-9, 9)),
        st.tuples(st.just("flush"), st.just(0), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=10,
)


@st.composite
def predicates(draw: st.DrawFn, depth: int = 0) -> tuple[str, pc.Expression]:
    """A SQL condition and the pyarrow expression that means the same (no NaN in the data:
    DuckDB orders NaN above numbers, pyarrow compares it false)."""
    if depth < 2 and draw(st.integers(0, 2)) == 0:
        left, right = draw(predicates(depth + 1)), draw(predicates(depth + 1))
        if draw(st.booleans()):
            return f"({left[0]} and {right[0]})", left[1] & right[1]
        return f"({left[0]} or {right[0]})", left[1] | right[1]
    kind = draw(st.integers(0, 4))
    column = draw(st.sampled_from(["id", "a", "f"]))
    value = draw(st.integers(-6, 70)) if column != "f" else draw(st.integers(-4, 8)) / 2
    op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
    field = pc.field(column)
    if kind == 0:
        return f"{column} is null", field.is_null()
    if kind == 1:
        values = draw(st.lists(st.integers(-6, 70), min_size=1, max_size=4))
        text = ", ".join(str(v) for v in values)
        return f"{column} in ({text})", field.isin(values) & field.is_valid()
    if kind == 2:
        s = draw(st.sampled_from(["s1", "s2", "s5"]))
        return f"s = '{s}'", pc.field("s") == s
    compare = {
        "=": field == value,
        "<>": field != value,
        "<": field < value,
        "<=": field <= value,
        ">": field > value,
        ">=": field >= value,
    }[op]
    if kind == 3:
        return f"not ({column} {op} {value})", ~compare
    return f"{column} {op} {value}", compare


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    history=ops,
    queries=st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "f", "s"]), unique=True, max_size=3),
            st.one_of(st.none(), predicates()),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_select_equals_pyarrow_on_scan_at_the_same_snapshot(
    history: list[tuple[str, int, int, int]],
    queries: list[tuple[list[str], tuple[str, pc.Expression] | None]],
) -> None:
    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            for kind, lo, count, seed in history:
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
                if kind == "flush":
                    await settle(eng)  # L0 blocks into objects, merged
            async with eng.snapshot(eng.visible_ts) as view:
                for columns, predicate in queries:
                    names = ["id", *columns]
                    where = f" where {predicate[0]}" if predicate else ""
                    got = await sql.run(
                        view, f"select {', '.join(names)} from shop.t{where} order by id"
                    )
                    expected = await view.table("shop", "t").scan(
                        columns=names, filter=predicate[1] if predicate else None
                    )
                    expected = expected.sort_by("id")
                    assert got.to_pylist() == expected.to_pylist(), (where, names)
        finally:
            await eng.close()

    run(main)


def test_select_equals_scan_over_flushed_merged_blocks_and_memory() -> None:
    """The same, over persisted blocks (flushed and merged by maintenance), their delete
    masks, and rows still in memory."""

    async def main() -> None:
        eng = await open_engine()
        try:
            for first in range(0, 30_000, 5_000):
                async with eng.transaction() as txn:
                    await txn.table("shop", "t").insert(rows(list(range(first, first + 5_000)), 1))
            await settle(eng)
            async with eng.transaction() as txn:
                await txn.table("shop", "t").delete(range(100, 20_000, 3))
                await txn.table("shop", "t").update(range(0, 3_000, 7), {"a": 99})
                await txn.table("shop", "t").insert(rows(list(range(40_000, 40_500)), 2))
            for query, columns, expression in [
                (
                    "a >= 3 and id < 25000",
                    ["id", "a"],
                    (pc.field("a") >= 3) & (pc.field("id") < 25000),
                ),
                (
                    "a = 99 or s is null",
                    ["id", "s"],
                    (pc.field("a") == 99) | pc.field("s").is_null(),
                ),
                ("f > 1.5", ["id", "f"], pc.field("f") > 1.5),
            ]:
                async with eng.snapshot(eng.visible_ts) as view:
                    got = await sql.run(
                        view, f"select {', '.join(columns)} from t where {query} order by id"
                    )
                    want = await view.table("shop", "t").scan(columns=columns, filter=expression)
                assert got.num_rows > 0
                assert got.to_pylist() == want.sort_by("id").to_pylist(), query
            got = await eng.sql("select count(*) as n, sum(a) as total from shop.t")
            async with eng.snapshot(eng.visible_ts) as view:
                whole = await view.table("shop", "t").scan(columns=["a"])
            assert got.to_pylist() == [
                {"n": whole.num_rows, "total": pc.sum(whole.column("a")).as_py()}
            ]
        finally:
            await eng.close()

    run(main)


def test_the_direct_submit_answers_as_duckdbs_public_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`sql_databases.select` calls DuckDB's private `_submit` (one bind, not two): every
    answer, its schema included, equals what the public `con.sql(text).to_arrow_reader()` gives, and
    errors stay `SqlError`s. This fails if the private route drifts from the public one."""
    queries = [
        "select * from shop.t where id = 7",
        "select a, f, s from t where id >= 3 and id < 30 order by id;",
        "select s, count(*) as n, sum(f) from t group by s order by s nulls first",
        "with x as (select id, a from t where a is not null) select max(id), min(a) from x",
        "/* a comment */ select id from t where s = 's1' or f > 1 order by id -- and one",
        "select 1 as one",
    ]

    async def answers() -> list[pa.Table]:
        eng = await open_engine(maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(rows(list(range(40)), 3))
            await settle(eng)
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(rows(list(range(40, 60)), 5))
            with pytest.raises(SqlError, match="nothing_here"):
                await eng.sql("select * from nothing_here")
            return [await eng.sql(q) for q in queries]
        finally:
            await eng.close()

    direct = asyncio.run(answers())
    assert all(table.num_rows > 0 for table in direct)

    def public(con: Any, text: str) -> pa.RecordBatchReader:
        return con.sql(text).to_arrow_reader(sql_databases.RESULT_BATCH_ROWS)

    monkeypatch.setattr(sql_databases, "select", public)
    monkeypatch.setattr(sql, "_POOL", sql_databases.Pool(limits.SQL_QUERIES_MAX, sql.EngineTable))
    for query, mine, theirs in zip(queries, direct, asyncio.run(answers()), strict=True):
        assert mine.schema == theirs.schema, query
        assert mine.to_pylist() == theirs.to_pylist(), query


# --- snapshots ----------------------------------------------------------------------------------


def test_an_older_at_sees_the_old_rows_by_timestamp_and_by_wall_time() -> None:
    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(rows(list(range(10)), 0))
            before = eng.visible_ts
            async with eng.transaction() as txn:
                await txn.table("shop", "t").delete(range(5))
            query = "select count(*) as n from shop.t"
            assert (await eng.sql(query)).to_pylist() == [{"n": 5}]
            assert (await eng.sql(query, at=before)).to_pylist() == [{"n": 10}]
            # A wall time: its millisecond's last timestamp (both commits may share one).
            assert (await eng.sql(query, at=ts_datetime(eng.visible_ts))).to_pylist() == [{"n": 5}]
            now = datetime.datetime.now(datetime.UTC)
            assert (await eng.sql(query, at=now)).to_pylist() == [{"n": 5}]
            with pytest.raises(SnapshotUnavailable, match="future"):
                await eng.sql(query, at=now + datetime.timedelta(days=1))
            with pytest.raises(BadInput, match="time zone"):
                await eng.sql(query, at=now.replace(tzinfo=None))
            with pytest.raises(BadInput):
                await eng.sql(query, at="yesterday")  # type: ignore[arg-type]
        finally:
            await eng.close()

    run(main)


def test_a_range_filter_and_the_columns_reach_the_scan_and_prune_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The streamed path's pushdown (the direct path would read these 100 keys itself:
    # tests/unit/engine/test_sql_direct.py).
    monkeypatch.setattr(limits, "SQL_DIRECT_ROWS_MAX", 0)

    async def main() -> None:
        eng = await open_engine()
        try:
            for first in range(0, 40_000, 10_000):
                async with eng.transaction() as txn:
                    await txn.table("shop", "t").insert(rows(list(range(first, first + 10_000)), 3))
            await settle(eng)
            scans: list[sql.ScanReport] = []
            async with eng.snapshot(eng.visible_ts) as view:
                got = await sql.run(
                    view,
                    "select sum(a) as total from shop.t where id >= 100 and id < 200",
                    scans=scans,
                )
                want = await view.table("shop", "t").scan(
                    columns=["a"], filter=(pc.field("id") >= 100) & (pc.field("id") < 200)
                )
            assert got.to_pylist() == [{"total": pc.sum(want.column("a")).as_py()}]
            [report] = scans
            assert report.table == "shop.t"
            assert report.columns == ["a"]  # projection: not f, s
            assert report.filter is not None and "id" in report.filter
            assert report.blocks_visible >= 4
            assert report.blocks_read < report.blocks_visible  # zonemaps pruned
            assert report.rows_out == 100  # the filter ran in the scan, not after it
            scans.clear()
            async with eng.snapshot(eng.visible_ts) as view:
                await sql.run(view, "select count(*) from shop.t", scans=scans)
            assert scans[0].blocks_read == scans[0].blocks_visible  # nothing to prune by
        finally:
            await eng.close()

    run(main)


def test_a_self_join_reads_two_streams_of_one_snapshot_and_limit_stops_early() -> None:
    async def main() -> None:
        eng = await open_engine()
        try:
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(rows(list(range(5_000)), 4))
            await settle(eng)
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(rows(list(range(5_000, 6_000)), 4))
            got = await eng.sql(
                "select count(*) as n from shop.t x join t y on x.id = y.id + 1 where y.a = 3"
            )
            async with eng.snapshot(eng.visible_ts) as view:
                table = await view.table("shop", "t").scan(columns=["id", "a"])
            ids = set(table.column("id").to_pylist())
            threes = [r["id"] for r in table.to_pylist() if r["a"] == 3]
            assert got.to_pylist() == [{"n": sum(1 for i in threes if i + 1 in ids)}]
            assert (await eng.sql("select id from t limit 3")).num_rows == 3
        finally:
            await eng.close()

    run(main)


# --- names and errors ---------------------------------------------------------------------------


def test_bare_names_resolve_only_when_one_database_has_the_table() -> None:
    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.create_database("other")
                await txn.create_table("other", "t", SCHEMA)
                await txn.create_table("other", "u", SCHEMA)
                await txn.table("other", "t").insert(rows([1, 2], 0))
            assert (await eng.sql("select count(*) as n from other.t")).to_pylist() == [{"n": 2}]
            assert (await eng.sql("select count(*) as n from u")).to_pylist() == [{"n": 0}]
            with pytest.raises(SqlError, match="does not exist"):
                await eng.sql("select * from t")  # shop.t and other.t
            async with eng.transaction() as txn:
                await txn.drop_table("other", "t")
            assert (await eng.sql("select count(*) as n from t")).to_pylist() == [{"n": 0}]
            async with eng.transaction() as txn:
                await txn.create_table("shop", "T", SCHEMA)
            with pytest.raises(SqlError, match="differ only in case"):
                await eng.sql("select * from shop.t")
        finally:
            await eng.close()

    run(main)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("selec 1", "syntax error"),
        ("select * from nosuch", "nosuch does not exist"),
        ("select nope from shop.t", "nope"),
        ("insert into shop.t values (1, 1, 1, 'x')", "read-only"),
        ("update shop.t set a = 1", "read-only"),
        ("delete from shop.t", "read-only"),
        ("create table x (i int)", "read-only"),
        ("copy (select 1) to '/tmp/x.csv'", "read-only"),
        ("attach '/tmp/x.db'", "read-only"),
        ("select 1; select 2", "one SELECT"),
        ("select * from read_csv('/etc/passwd')", "disabled"),
    ],
)
def test_bad_queries_are_sql_errors_with_duckdbs_message_on_one_line(
    query: str, message: str
) -> None:
    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            with pytest.raises(SqlError, match=message) as raised:
                await eng.sql(query)
            assert isinstance(raised.value, BadInput)
            assert "\n" not in str(raised.value)
            # The engine goes on: the next query on the pooled database works.
            assert (await eng.sql("select count(*) as n from shop.t")).to_pylist() == [{"n": 0}]
        finally:
            await eng.close()

    run(main)


def test_a_result_past_its_limit_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "SQL_RESULT_BYTES_MAX", 1000)

    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.table("shop", "t").insert(rows(list(range(2_000)), 0))
            with pytest.raises(SqlError, match="SQL_RESULT_BYTES_MAX"):
                await eng.sql("select * from shop.t")
            assert (await eng.sql("select count(*) as n from t")).to_pylist() == [{"n": 2000}]
        finally:
            await eng.close()

    run(main)


def test_without_duckdb_sql_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError

    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            with pytest.raises(SqlUnavailable, match=r"pip install 'logsvc\[sql\]'"):
                await eng.sql("select 1")
        finally:
            await eng.close()

    run(main)


# --- the other front doors ----------------------------------------------------------------------


def test_the_sync_engine_answers_sql(tmp_path: Path) -> None:
    with SyncEngine.open(str(tmp_path / "e")) as eng:
        with eng.transaction() as txn:
            txn.create_database("shop")
            txn.create_table("shop", "t", SCHEMA)
        with eng.transaction() as txn:
            txn.table("shop", "t").insert(rows([1, 2, 3], 0))
        before = eng.visible_ts
        with eng.transaction() as txn:
            txn.table("shop", "t").delete([1])
        assert eng.sql("select id from t order by id").column("id").to_pylist() == [2, 3]
        assert eng.sql("select count(*) as n from t", at=before).to_pylist() == [{"n": 3}]


def test_a_compute_node_answers_what_the_tn_answers() -> None:
    async def main() -> None:
        objects = MemoryObjectStore()
        tn = await Engine.open("unused", MemoryBackend(), objects=objects, maintenance=False)
        cn = ComputeNode(LocalTN(tn), objects)
        try:
            async with cn.transaction() as txn:
                await txn.create_database("shop")
                await txn.create_table("shop", "t", SCHEMA)
                await txn.table("shop", "t").insert(rows(list(range(20)), 5))
            before = tn.visible_ts
            async with tn.transaction() as txn:
                await txn.table("shop", "t").delete(range(10))
            query = "select sum(a) as total, count(*) as n from shop.t where id >= 5"
            assert await cn.sql(query) == await tn.sql(query)
            assert await cn.sql(query, at=before) == await tn.sql(query, at=before)
            assert (await cn.sql(query, at=before)).column("n").to_pylist() == [15]
            now = datetime.datetime.now(datetime.UTC)
            assert await cn.sql(query, at=now) == await tn.sql(query)
        finally:
            await cn.close()
            await tn.close()

    run(main)


# --- bounds -------------------------------------------------------------------------------------


def test_a_table_streams_a_group_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine hands DuckDB parts of about `SCAN_GROUP_ROWS` rows, never the table (this
    fails if SQL reads through `scan()`, which returns the whole table at once)."""
    monkeypatch.setattr(limits, "SCAN_GROUP_ROWS", 4_000)
    parts: list[int] = []
    real = scan_stream

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        async for part in real(*args, **kwargs):
            parts.append(part.num_rows)
            yield part

    monkeypatch.setattr(sql, "scan_stream", recorded)

    async def main() -> None:
        eng = await open_engine()
        try:
            for first in range(0, 40_000, 10_000):
                async with eng.transaction() as txn:
                    await txn.table("shop", "t").insert(rows(list(range(first, first + 10_000)), 6))
            await settle(eng)
            got = await eng.sql("select count(*) as n, sum(a) as total from shop.t")
            assert got.column("n").to_pylist() == [40_000]
        finally:
            await eng.close()

    run(main)
    assert sum(parts) == 40_000
    assert len(parts) >= 5
    assert max(parts) < 40_000


def test_a_cancelled_query_stops_and_its_database_serves_the_next() -> None:
    async def main() -> None:
        eng = await open_engine(maintenance=False)
        try:
            endless = "select count(*) from range(1000000000000) a where a.range % 7 = 3"
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(eng.sql(endless), 0.5)
            assert (await eng.sql("select count(*) as n from shop.t")).to_pylist() == [{"n": 0}]
        finally:
            await eng.close()

    run(main)


def test_queries_past_the_pool_are_overloaded() -> None:
    import duckdb

    pool = sql_databases.Pool(2, sql.EngineTable)
    first, second = pool.take(duckdb), pool.take(duckdb)
    with pytest.raises(Overloaded):
        pool.take(duckdb)
    pool.give(first, healthy=True)
    assert pool.take(duckdb) is first  # reused, not opened again
    pool.give(first, healthy=True)
    pool.give(second, healthy=False)  # closed
    assert pool.take(duckdb) is first
