"""The direct path's pure core (engine/sql_keys.py): which queries it may take, and the key
bounds it reads from them, table-driven over DuckDB's own tokenizer and parse trees.

What must hold: a template replaces only plain integer literals; a plan exists only for one
SELECT over one base table with nothing else that could see other rows (each refusal here
is a query whose answer would change if DuckDB saw only the key rows); the bounds are
implied by the WHERE (flipped sides, unary minus, BETWEEN, IN, intersections) and `exact`
only when the WHERE is nothing else; a reference to the whole row reads every column.
"""

from __future__ import annotations

import json

import duckdb
import pytest

from engine import sql_keys

COLUMNS = ["id", "a", "f", "s"]


def plan_of(query: str) -> tuple[sql_keys.KeyPlan | None, tuple[int, ...]]:
    numeric = duckdb.token_type.numeric_const
    found = sql_keys.template(query, [p for p, k in duckdb.tokenize(query) if k == numeric])
    assert found is not None
    text, values = found
    con = duckdb.connect()
    try:
        [(tree,)] = con.execute("select json_serialize_sql(?)", [text]).fetchall()
    finally:
        con.close()
    return sql_keys.analyse(json.loads(tree), len(values)), values


def bounds_of(query: str) -> sql_keys.KeyBounds | None:
    plan, values = plan_of(query)
    assert plan is not None, query
    return sql_keys.key_bounds(plan, "id", COLUMNS, values)


@pytest.mark.parametrize(
    ("query", "text", "values"),
    [
        ("select * from t where id = 5", "select * from t where id = $1", (5,)),
        ("select 1.5, 1e3, 0x1F, 1_000 from t", "select 1.5, 1e3, 0x1F, 1_000 from t", ()),
        ("select '12' from t -- 12\nwhere id=7", "select '12' from t -- 12\nwhere id=$1", (7,)),
        ("select * from t where id = 1234567890123456789", None, ()),  # 19 digits: as text
        ("select * from t limit 3 offset 007", "select * from t limit $1 offset $2", (3, 7)),
    ],
)
def test_a_template_replaces_plain_integer_literals_only(
    query: str, text: str | None, values: tuple[int, ...]
) -> None:
    numeric = duckdb.token_type.numeric_const
    got = sql_keys.template(query, [p for p, k in duckdb.tokenize(query) if k == numeric])
    assert got == (text if text is not None else query, values)


def test_a_query_with_its_own_parameters_has_no_template() -> None:
    assert sql_keys.template("select * from t where id = ?", []) is None
    assert sql_keys.template("select * from t where id = $1", []) is None
    assert sql_keys.template("select '$' from t where id = 1", [27]) is None


@pytest.mark.parametrize(
    "query",
    [
        "select * from t join u on t.id = u.id where t.id = 1",
        "select * from t, u where t.id = 1",
        "select *, (select count(*) from t) from t where id = 1",
        "select * from t where id = 1 and a in (select a from t)",
        "select * from t where id = 1 and exists (select 1)",
        "with t as (select 1 as id) select * from t where id = 1",
        "select * from t where id = 1 union all select * from t",
        "select * from t using sample 10 where id = 1",
        "select * from t tablesample 10% where id = 1",
        "select * from t as x(k, a, f, s) where k = 1",
        "select * from range(10) t(id) where id = 1",
        "select * from memory.shop.t where id = 1",
        "select * from t",
        "select * from t where id = 1 or id = 2",
        "select * from t where a = 1",
        "select * from t where id = 1.0",
        "select * from t where id = '1'",
        "select #2 from t where id = 1",  # (`#$1` does not parse: no plan)
    ],
)
def test_queries_the_direct_path_refuses(query: str) -> None:
    plan, values = plan_of(query)
    assert plan is None or sql_keys.key_bounds(plan, "id", COLUMNS, values) is None, query


@pytest.mark.parametrize(
    ("where", "lo", "hi", "points", "exact"),
    [
        ("id = 5", 5, 5, None, True),
        ("5 = id", 5, 5, None, True),
        ("id = -5", -5, -5, None, True),
        ("id > 5 and id <= 9", 6, 9, None, True),
        ("5 < id and 9 >= ID and t.id < 8", 6, 7, None, True),
        ("id >= -3 and id < -1", -3, -2, None, True),
        ("id between 3 and 7", 3, 7, None, True),
        ("id between 7 and 3", 7, 3, None, True),  # nothing
        ("id in (9, 2, 5) and id > 2", 5, 9, frozenset({5, 9}), True),
        ("id in (1, 2) and id in (2, 3)", 2, 2, frozenset({2}), True),
        ("id in (1, 2) and id > 5", 1, 0, frozenset(), True),
        ("id = 5 and a > 1", 5, 5, None, False),
        ("id = 5 and id <> 4", 5, 5, None, False),
        ("id = 5 and (id = 6 or a = 1)", 5, 5, None, False),
        ("id = 5 and not (id = 6)", 5, 5, None, False),
        ("id = 5 and id = -(-6)", 5, 5, None, False),
        ("id = 5 and id + 0 = 5", 5, 5, None, False),
    ],
)
def test_the_bounds_are_implied_by_the_where_and_exact_only_when_nothing_else(
    where: str, lo: int, hi: int, points: frozenset[int] | None, exact: bool
) -> None:
    got = bounds_of(f"select * from t where {where}")
    assert got is not None
    assert (got.lo, got.hi, got.points, got.exact) == (lo, hi, points, exact)


def test_open_ends_are_left_to_the_caller() -> None:
    below = bounds_of("select * from t where id < 3")
    assert below is not None and below.hi == 2 and below.lo < -(1 << 63)
    above = bounds_of("select * from t where id >= 3")
    assert above is not None and above.lo == 3 and above.hi > (1 << 64)


def test_a_qualified_key_must_name_the_tables_binding() -> None:
    assert bounds_of("select * from shop.t x where x.id = 3") is not None
    plan, values = plan_of("select * from shop.t x where t.id = 3")
    assert plan is not None and sql_keys.key_bounds(plan, "id", COLUMNS, values) is None


@pytest.mark.parametrize(
    ("query", "read", "projected", "cheap"),
    [
        ("select * from t where id = 1", None, COLUMNS, True),
        ("select s, id from t where id = 1", ["id", "s"], ["s", "id"], True),
        ("select t.a from t where id = 1", ["id", "a"], ["a"], True),
        ("select sum(a) as x from t where id = 1 order by x", ["id", "a"], None, True),
        ("select upper(s) from t where id < 3", ["id", "s"], None, False),
        ("select t from t where id = 1", None, None, True),  # the whole row, as a struct
        ("select columns('a') from t where id = 1", None, None, True),
        ("select distinct a from t where id = 1", ["id", "a"], None, True),
        ("select a from t where id = 1 limit 1", ["id", "a"], None, True),
        ("select a, row_number() over () from t where id < 9", ["id", "a"], None, False),
    ],
)
def test_the_columns_a_query_reads_and_a_pure_projection(
    query: str, read: list[str] | None, projected: list[str] | None, cheap: bool
) -> None:
    plan, _ = plan_of(query)
    assert plan is not None
    assert sql_keys.columns_read(plan, COLUMNS) == read
    assert sql_keys.projected(plan, COLUMNS) == projected
    assert plan.cheap is cheap
