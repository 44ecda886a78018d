"""A GROUP BY the engine answers itself (engine/sql_groups.py, scanned by
engine/sql_grouped.py, taken by engine/sql_direct.py) equals DuckDB's own answer over
`scan()`'s whole table at the same snapshot, bit for bit: names, types, NULL groups, and
every bit of a DOUBLE sum per group; as a set of rows without ORDER BY, row for row with it.

How: hypothesis draws a history of inserts (int32, int64 near +-2^62 and at its ends,
uint32, DOUBLE values whose sums depend on the order of additions, NULLs everywhere),
deletes, updates and flushes, holds a snapshot open half-way through it (read after later
merges), and opens a transaction with uncommitted rows of its own; then GROUP BY queries
over an int32, int64, uint32 or VARCHAR column (ranges that keep dense slots and ranges that force
the sorted-keys map, which the dense span limit is lowered to reach often), with counts,
sums, mins and maxes, no WHERE or one of key bounds, and every ORDER BY of the key. Each
answer must equal DuckDB's at one thread over the registered `scan()` of the same snapshot;
a spy counts the answers the engine gave, so the test cannot pass on DuckDB alone. Then:
fixed cases (a part per flush, so a group's DOUBLE sum runs across parts; too many groups
goes to DuckDB), and what the engine does not take stays DuckDB's.

Mutations tried on engine/sql_groups.py, each failing the hypothesis test: a DOUBLE sum per
batch added to the state (`state + bincount(batch)`, not row order), int64 sums not split
in halves (wrapping), and the NULL key's group dropped.
"""

from __future__ import annotations

import struct
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine import limits, sql, sql_aggregates, sql_databases, sql_grouped, sql_groups
from engine.schema import Column, Schema
from engine.txn import Transaction
from tests.unit.engine.test_sql import run, settle
from tests.unit.engine.test_sql_aggregates import (
    check_three_views,
    history,
    identical,
    open_engine,
    reference,
    step,
    table_of,
    values,
)

KEYS = ("a", "b", "u", "t.a", "s")
SELECTS = (
    "{k}, count(*)",
    "{k}, sum(f), count(f)",
    "count(*) as n, {k}, sum(a), sum(b) as total, min(b), max(u), min(id), count(s)",
    "{k}, max(id), min(a), sum(f)",
)
"""Select lists the engine answers (`{k}`: the group column)."""
LEFT = (
    "{k}, sum(u)",  # an unsigned sum
    "{k}, max(f)",  # a float max
    "{k}, count(distinct a)",
    "{k}, sum(f) + 1",
)
"""Select lists DuckDB answers."""
ORDERS = (
    "",
    "order by {k}",
    "order by {k} desc",
    "order by {k} nulls first",
    "order by {k} desc nulls last",
)
bound = st.integers(-25, 85).map(str)
conditions = st.one_of(
    st.just(""),
    st.builds(lambda lo, hi: f"where id >= {lo} and id < {hi}", bound, bound),
    st.builds(lambda v: f"where id = {v}", bound),
    st.builds(lambda x, y: f"where id in ({x}, {y})", bound, bound),
    st.builds(lambda lo: f"where id > {lo} and a > 0", bound),  # not key bounds: DuckDB's
)
queries = st.tuples(
    st.sampled_from(KEYS), st.sampled_from(SELECTS + LEFT), conditions, st.sampled_from(ORDERS)
)


def text(key: str, select: str, condition: str, order: str) -> str:
    return (
        f"select {select.format(k=key)} from shop.t {condition} group by {key} "
        f"{order.format(k=key)}"
    )


def taken(key: str, select: str, condition: str, order: str) -> bool:
    return select in SELECTS and "a > 0" not in condition


def canonical(table: pa.Table) -> list[list[object]]:
    """Rows compared as a set: each value by its bit pattern (floats), then sorted."""

    def bits(value: object) -> object:
        if isinstance(value, float):
            return struct.pack("<d", value)
        return value

    return sorted([repr(bits(v)) for v in row.values()] for row in table.to_pylist())


def same(got: pa.Table, want: pa.Table, ordered: bool) -> bool:
    if ordered:
        return identical(got, want)
    return got.schema == want.schema and canonical(got) == canonical(want)


class Spy:
    """Counts the answers engine/sql_grouped.py gave."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answered = 0
        real = sql_grouped.answer

        async def spied(*args: Any, **kwargs: Any) -> pa.Table | None:
            found = await real(*args, **kwargs)
            self.answered += found is not None
            return found

        monkeypatch.setattr(sql_grouped, "answer", spied)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(
    initial=st.lists(values, min_size=0, max_size=60),
    before=history,
    after=history,
    own=st.one_of(st.none(), step),
    drawn=st.lists(queries, min_size=1, max_size=4),
    dense_slots=st.sampled_from([4, 1 << 16]),
)
def test_group_by_answers_as_duckdb_over_scan_at_the_same_snapshot(
    monkeypatch: pytest.MonkeyPatch,
    initial: list[tuple[Any, Any, Any, Any]],
    before: list[tuple[Any, ...]],
    after: list[tuple[Any, ...]],
    own: tuple[Any, ...] | None,
    drawn: list[tuple[str, str, str, str]],
    dense_slots: int,
) -> None:
    monkeypatch.setattr(limits, "SQL_GROUP_DENSE_SLOTS_MAX", dense_slots)
    spy = Spy(monkeypatch)

    async def check(view: Transaction, label: str) -> None:
        whole = await view.table("shop", "t").scan()
        for key, select, condition, order in drawn:
            query = text(key, select, condition, order)
            got = await sql.run(view, query)
            want = reference(whole, query)
            assert same(got, want, bool(order)), (label, query, got.to_pylist(), want.to_pylist())

    run(lambda: check_three_views(check, initial, before, after, own))
    assert spy.answered == 3 * sum(taken(*q) for q in drawn)


def test_double_sums_run_across_parts_in_row_order_and_many_groups_go_to_duckdb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = sql_databases.select

    def counted(con: Any, query: str) -> pa.RecordBatchReader:
        calls.append(query)
        return real(con, query)

    monkeypatch.setattr(sql_databases, "select", counted)
    spy = Spy(monkeypatch)

    async def main() -> None:
        eng = await open_engine()
        try:
            # Three parts (two flushed objects and L0): each group's sum of thirds and 1e16s
            # crosses them; adding per part, or pairwise, changes the last bits.
            for first in (0, 1000, 2000):
                ids = list(range(first, first + 1000))
                drawn = [
                    (i % 7 - 3, i * 2**40, i, (i / 3) * (1e16 if i % 97 == 0 else 1)) for i in ids
                ]
                async with eng.transaction() as txn:
                    await txn.table("shop", "t").insert(table_of(ids, drawn))
                if first < 2000:
                    await settle(eng)
            query = (
                "select a, sum(f) as total, count(*) as n, sum(b) from shop.t group by a order by a"
            )
            await eng.sql(query)  # the template's answer schema: one DuckDB run
            calls.clear()
            got = await eng.sql(query)
            assert calls == []
            assert spy.answered == 2
            async with eng.snapshot(eng.visible_ts) as view:
                whole = await view.table("shop", "t").scan()
            assert identical(got, reference(whole, query))
            assert got.column("a").to_pylist() == [-3, -2, -1, 0, 1, 2, 3]
            assert sum(got.column("n").to_pylist()) == 3000
            assert got.schema.field("total").type == pa.float64()
            # More groups than the engine keeps: DuckDB answers, and the same.
            monkeypatch.setattr(limits, "SQL_GROUPS_MAX", 100)
            monkeypatch.setattr(limits, "SQL_GROUP_DENSE_SLOTS_MAX", 16)
            many = "select id, count(*) from shop.t group by id order by id"
            calls.clear()
            found = await eng.sql(many)
            assert calls  # (DuckDB ran it)
            assert spy.answered == 2
            monkeypatch.setattr(limits, "SQL_GROUPS_MAX", 1 << 20)
            monkeypatch.setattr(limits, "SQL_GROUP_TEXT_BYTES_MAX", 3)  # (two texts of two bytes)
            texts = "select s, count(*) from shop.t group by s order by s"
            calls.clear()
            assert (await eng.sql(texts)).num_rows == 5  # s0 to s3 and NULL
            assert calls
            assert spy.answered == 2
            assert found.column("id").to_pylist() == list(range(3000))
            for left in (
                "select a, sum(u) from shop.t group by a",
                "select a, count(*) from shop.t group by a having count(*) > 1",
                "select a, count(*) from shop.t group by a order by a limit 2",
                "select a, count(*) from shop.t group by rollup(a)",
                "select f, count(*) from shop.t group by f",
                "select a, b, count(*) from shop.t group by a, b",
                "select a, count(*) from shop.t where u > 3 group by a",
                "select a, count(*) from shop.t group by a order by count(*)",
            ):
                calls.clear()
                await eng.sql(left)
                assert calls, left
            assert spy.answered == 2
        finally:
            await eng.close()

    run(main)


parts = st.lists(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-4, 4), st.integers(-(2**31), 2**31 - 1)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
        ),
        max_size=20,
    ),
    max_size=6,
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(drawn=parts, dense_slots=st.sampled_from([1, 3, 8, 1 << 16]))
# Dense slots from key 0 growing down (a shift of `base - new base`, where base is 0):
@example(drawn=[[(0, 1), (2, 5)], [(-3, None)]], dense_slots=1 << 16)
def test_group_state_over_parts_equals_a_python_model(
    monkeypatch: pytest.MonkeyPatch,
    drawn: list[list[tuple[int | None, int | None]]],
    dense_slots: int,
) -> None:
    """The pure core alone (no engine, no DuckDB), over many small parts: keys first seen
    in any order, so the dense slots grow down and up and switch to sorted keys at any
    point; every group's count, exact sum and min must be a Python model's. (Mutations
    caught: the dense slots not shifted when they grow down from base 0, by the example;
    int64 sums not split in halves; the NULL group dropped.)"""
    monkeypatch.setattr(limits, "SQL_GROUP_DENSE_SLOTS_MAX", dense_slots)
    grouping = sql_groups.Grouping(
        ("k",),
        (
            sql_groups.KeyColumn(("k",)),
            sql_aggregates.Aggregate("count_star", None),
            sql_aggregates.Aggregate("sum", ("v",)),
            sql_aggregates.Aggregate("min", ("v",)),
        ),
        None,
    )
    arrow = pa.schema([("k", pa.int32()), ("v", pa.int64())])
    bound = sql_groups.bind(grouping, lambda parts: parts[0], arrow)
    assert bound is not None
    table = sql_groups.GroupTable(bound)
    model: dict[int | None, list[Any]] = {}
    for rows in drawn:
        part = pa.table({"k": [k for k, _ in rows], "v": [v for _, v in rows]}, schema=arrow)
        assert table.add(part)
        for k, v in rows:
            count, total, least = model.get(k, [0, None, None])
            if v is not None:
                total = v if total is None else total + v
                least = v if least is None else min(least, v)
            model[k] = [count + 1, total, least]
    answer = pa.schema(
        [("k", pa.int32()), ("n", pa.int64()), ("s", pa.decimal128(38, 0)), ("m", pa.int64())]
    )
    got = table.result(answer).to_pylist()
    keys = sorted(k for k in model if k is not None) + ([None] if None in model else [])
    want = [{"k": k, "n": model[k][0], "s": model[k][1], "m": model[k][2]} for k in keys]
    assert got == want


def test_boolean_and_text_group_columns_with_their_null_groups_are_duckdbs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spy = Spy(monkeypatch)
    flags = Schema(
        [
            Column("id", "int64"),
            Column("flag", "bool", nullable=True),
            Column("v", "int64"),
            Column("name", "string", nullable=True),
        ],
        primary_key=["id"],
    )

    async def main() -> None:
        eng = await open_engine()
        try:
            async with eng.transaction() as txn:
                await txn.create_table("shop", "flags", flags)
                drawn = [[True, False, None][i % 3] for i in range(100)]
                # DuckDB orders VARCHAR by UTF-8 bytes: "" < "Z" < "a" < "ab" < "é" < emoji.
                names = ["", "é", "Z", "a", "\U0001f600", None, "ab"]
                await txn.table("shop", "flags").insert(
                    pa.table(
                        {
                            "id": range(100),
                            "flag": drawn,
                            "v": [i * 2**56 for i in range(100)],
                            "name": [names[i % 7] for i in range(100)],
                        },
                        schema=flags.to_arrow(),
                    )
                )
            async with eng.snapshot(eng.visible_ts) as view:
                whole = await view.table("shop", "flags").scan()
            con = duckdb.connect(config={"threads": 1})
            con.register("whole", whole)
            con.execute("create schema shop; create view shop.flags as select * from whole")
            for order in ("order by flag", "order by flag desc nulls first"):
                query = (
                    f"select flag, count(*), sum(v), max(id) from shop.flags group by flag {order}"
                )
                got = await eng.sql(query)
                assert identical(got, con.sql(query).to_arrow_table()), got.to_pylist()
                assert got.column("flag").to_pylist()[0] == (
                    False if order == "order by flag" else None
                )
            for order in ("order by name", "order by name desc nulls first", ""):
                query = f"select name, count(*), sum(v) from shop.flags group by name {order}"
                got = await eng.sql(query)
                assert same(got, con.sql(query).to_arrow_table(), bool(order)), got.to_pylist()
            got = await eng.sql("select name from shop.flags group by name order by name")
            assert got.column("name").to_pylist() == [
                *sorted(n for n in names if n is not None),
                None,
            ]
            con.close()
            assert spy.answered == 6
        finally:
            await eng.close()

    run(main)
