"""The `--where` filter grammar (engine/where.py): a filter's text, parsed and pushed into the
engine's scan, returns exactly the rows for which the same predicate is true in Python under
SQL's three-valued logic; bad text is one `BadFilter` naming the column, value or character.

How: hypothesis draws rows (nulls in every nullable column) and predicates as trees of
comparisons, IN / NOT IN lists, IS [NOT] NULL, NOT, AND, OR; each tree is rendered as text
(keywords in random case, `=`/`==` and `!=`/`<>` alike, numbers in several spellings,
quotes doubled) and evaluated in Python on the rows. The rows live in a real engine (memory
WAL, memory object store): part flushed into small objects with zonemaps (so pruning is on the
path), part in memory, some deleted, so the filter runs everywhere a scan reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Column, Engine, Schema
from engine.errors import BadFilter
from engine.objects.store import MemoryObjectStore
from engine.where import parse
from tae_driver.backends.memory import MemoryBackend

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("a", "int32", nullable=True),
        Column("f", "float64", nullable=True),
        Column("g", "float32", nullable=True),
        Column("s", "string", nullable=True),
        Column("b", "bool", nullable=True),
        Column("d", "date32", nullable=True),
    ],
    primary_key=["id"],
)
WORDS = ["", "a", "b", "ab", "o'k", "Z z"]
FLUSHED_BLOCK_ROWS = 2
"""Rows per flushed block: few, so a literal often sits on a block's min or max."""
THIRDS = [0.1, 1 / 3, -2 / 3, 2.5, 1e-3]
"""float32 values whose shortest text is not their value (0.1 is 0.10000000149...)."""

small_ints = st.integers(-4, 4)
halves = st.integers(-8, 8).map(lambda n: n / 2)
row_values = st.fixed_dictionaries(
    {
        "a": st.one_of(st.none(), small_ints),
        "f": st.one_of(st.none(), halves),
        "g": st.one_of(st.none(), st.sampled_from(THIRDS)),
        "s": st.one_of(st.none(), st.sampled_from(WORDS)),
        "b": st.one_of(st.none(), st.booleans()),
        "d": st.one_of(st.none(), st.sampled_from(["2026-01-01", "2026-02-28", "2025-12-31"])),
    }
)

Node = tuple[Any, ...]


def literal(column: str) -> st.SearchStrategy[Any]:
    return {
        "a": st.integers(-5, 5),
        "f": st.one_of(st.integers(-5, 5), halves),
        "g": st.sampled_from([*THIRDS, 0.3]),
        "s": st.sampled_from([*WORDS, "c"]),
        "b": st.booleans(),
        "d": st.sampled_from(["2026-01-01", "2026-02-28", "2025-12-31", "2030-01-01"]),
    }[column]


@st.composite
def predicates(draw: st.DrawFn, depth: int = 0) -> Node:
    if depth < 3 and draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["and", "or", "not"]))
        if kind == "not":
            return ("not", draw(predicates(depth + 1)))
        return (kind, draw(predicates(depth + 1)), draw(predicates(depth + 1)))
    column = draw(st.sampled_from(["a", "f", "g", "s", "b", "d"]))
    form = draw(st.sampled_from(["cmp", "cmp", "in", "null"]))
    if form == "null":
        return ("null", column, draw(st.booleans()))
    if form == "in":
        values = draw(st.lists(literal(column), min_size=1, max_size=4))
        return ("in", column, values, draw(st.booleans()))
    ops = ["=", "!="] if column == "b" else ["=", "!=", "<", "<=", ">", ">="]
    return ("cmp", column, draw(st.sampled_from(ops)), draw(literal(column)))


def render(node: Node, draw: Callable[[st.SearchStrategy[Any]], Any]) -> str:
    """The predicate as filter text, in one of its many spellings."""

    def word(w: str) -> str:
        return str(draw(st.sampled_from([w.upper(), w.lower(), w.capitalize()])))

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return word("true" if v else "false")
        if isinstance(v, str):
            return "'" + v.replace("'", "''") + "'"
        if isinstance(v, float) and v.is_integer() and draw(st.booleans()):
            return f"{v:.1e}"  # 2.0e+00
        return repr(v)

    def column(name: str) -> str:
        return f'"{name}"' if draw(st.booleans()) else name

    kind = node[0]
    if kind in ("and", "or"):
        inner = f"{render(node[1], draw)} {word(kind)} {render(node[2], draw)}"
        return f"({inner})"
    if kind == "not":
        return f"{word('not')} ({render(node[1], draw)})"
    if kind == "null":
        middle = f"{word('is')} {word('not')} " if node[2] else f"{word('is')} "
        return f"{column(node[1])} {middle}{word('null')}"
    if kind == "in":
        listed = ", ".join(value(v) for v in node[2])
        negated = f"{word('not')} " if node[3] else ""
        return f"{column(node[1])} {negated}{word('in')} ({listed})"
    op = node[2]
    if op == "=":
        op = draw(st.sampled_from(["=", "=="]))
    elif op == "!=":
        op = draw(st.sampled_from(["!=", "<>"]))
    space = draw(st.sampled_from(["", " ", "  "]))
    return f"{column(node[1])}{space}{op}{space}{value(node[3])}"


def truth(node: Node, row: dict[str, Any]) -> bool | None:
    """SQL's three-valued truth of the predicate on one row (None: unknown)."""
    kind = node[0]
    if kind == "and":
        left, right = truth(node[1], row), truth(node[2], row)
        if left is False or right is False:
            return False
        return None if left is None or right is None else True
    if kind == "or":
        left, right = truth(node[1], row), truth(node[2], row)
        if left is True or right is True:
            return True
        return None if left is None or right is None else False
    if kind == "not":
        inner = truth(node[1], row)
        return None if inner is None else not inner
    got = row[node[1]]
    if kind == "null":
        return (got is not None) if node[2] else (got is None)
    if got is None:
        return None
    if kind == "in":
        listed = node[2]
        if node[1] == "g":
            got, listed = float(np.float32(got)), [float(np.float32(v)) for v in listed]
        found = got in listed
        return not found if node[3] else found
    want = node[3]
    if node[1] == "g":  # a float32 column: the row's value and the literal are float32s
        got, want = float(np.float32(got)), float(np.float32(want))
    return bool(
        {
            "=": got == want,
            "!=": got != want,
            "<": got < want,
            "<=": got <= want,
            ">": got > want,
            ">=": got >= want,
        }[node[2]]
    )


async def scan_ids(
    rows: list[dict[str, Any]], deleted: set[int], filters: list[str]
) -> list[set[int]]:
    engine = await Engine.open(
        "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
    )
    try:
        async with engine.transaction() as txn:
            await txn.create_database("db")
            await txn.create_table("db", "t", SCHEMA)
        half = len(rows) // 2
        for start in range(0, half, FLUSHED_BLOCK_ROWS):
            async with engine.transaction() as txn:
                await txn.table("db", "t").insert(
                    rows[start : min(half, start + FLUSHED_BLOCK_ROWS)]
                )
            assert engine.maintenance is not None
            await engine.maintenance.settle(freeze_all=True)  # the first half in small objects
        if rows[half:]:
            async with engine.transaction() as txn:
                await txn.table("db", "t").insert(rows[half:])
        if deleted:
            async with engine.transaction() as txn:
                await txn.table("db", "t").delete(sorted(deleted))
        found = []
        async with engine.snapshot(engine.visible_ts) as view:
            for text in filters:
                table = await view.table("db", "t").scan(columns=["id"], filter=parse(text, SCHEMA))
                found.append(set(table.column("id").to_pylist()))
        return found
    finally:
        await engine.close()


def as_engine_row(i: int, values: dict[str, Any]) -> dict[str, Any]:
    import datetime

    row = {"id": i, **values}
    if row["d"] is not None:
        row["d"] = datetime.date.fromisoformat(row["d"])
    return row


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row_values, max_size=40), st.data())
def test_the_engine_returns_exactly_the_rows_the_predicate_holds_for(
    values: list[dict[str, Any]], data: st.DataObject
) -> None:
    rows = [as_engine_row(i, v) for i, v in enumerate(values)]
    deleted = (
        set(data.draw(st.lists(st.sampled_from(range(len(rows))), max_size=5))) if rows else set()
    )
    trees = data.draw(st.lists(predicates(), min_size=1, max_size=6))
    texts = [render(tree, data.draw) for tree in trees]
    found = asyncio.run(scan_ids(rows, deleted, texts))
    for tree, text, got in zip(trees, texts, found, strict=True):
        expected = {
            i
            for i, v in enumerate(values)
            if i not in deleted and truth(tree, {"id": i, **v}) is True
        }
        assert got == expected, text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("custmer = 42", "unknown column 'custmer' at character 1"),
        ("a = 4.5", "'4.5' at character 5 is not a value of column 'a' (int32): an integer"),
        ("a = 99999999999", "out of the range of column 'a' (int32"),
        ("a = NULL", "use 'a' IS NULL"),
        ("s = 3", "column 's' (string): 'quoted text'"),
        ("b = 1", "TRUE or FALSE"),
        ("d = '2026-13-01'", "'YYYY-MM-DD'"),
        ("(a = 1", "expected ')' to close a parenthesis, found the end of the filter"),
        ("a = 1 s = 'x'", "unexpected 's' at character 7 (join conditions with AND or OR)"),
        ("a IS 3", "expected NULL after IS, found '3'"),
        ("a NOT 3", "expected IN after NOT"),
        ("a IN 3", "expected '(' after IN"),
        ("a", "expected a comparison"),
        ("", "expected a column name, found the end of the filter"),
        ("s = 'open", 'unexpected character "\'" at character 5'),
        ("a = 1 AND", "expected a column name"),
        ("a ~ 1", "unexpected character '~' at character 3"),
        ("NOT " * 70 + "a = 1", "nests deeper than 64"),
    ],
)
def test_bad_text_is_one_bad_filter_naming_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(BadFilter) as caught:
        parse(text, SCHEMA)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_literals_take_the_column_type_and_nulls_are_unknown_under_not_in() -> None:
    import pyarrow as pa

    table = pa.table(
        {"id": [1, 2, 3], "a": pa.array([1, None, 3], pa.int32())},
    )
    assert table.filter(parse("a NOT IN (1)", SCHEMA)).column("id").to_pylist() == [3]
    assert table.filter(parse("NOT (a = 1)", SCHEMA)).column("id").to_pylist() == [3]
    assert table.filter(parse("a IS NULL OR a > 2", SCHEMA)).column("id").to_pylist() == [2, 3]
    # The literal is the column's type (an int32 scalar), so nothing is cast per row.
    assert "int32" in str(parse("a IN (1, 2)", SCHEMA))


def test_timestamp_binary_and_unsigned_literals() -> None:
    import datetime

    import pyarrow as pa

    schema = Schema(
        [
            Column("id", "uint8"),
            Column("at", "timestamp[us]", nullable=True),
            Column("raw", "binary", nullable=True),
            Column("x", "float32", nullable=True),
        ],
        primary_key=["id"],
    )
    table = pa.table(
        {
            "id": pa.array([1, 2, 255], pa.uint8()),
            "at": pa.array(
                [datetime.datetime(2026, 11, 26, 12), None, datetime.datetime(2027, 1, 1)],
                pa.timestamp("us"),
            ),
            "raw": pa.array([b"ab", b"", None], pa.binary()),
            "x": pa.array([0.5, -1.0, None], pa.float32()),
        }
    )

    def ids(text: str) -> list[int]:
        return list(table.filter(parse(text, schema)).column("id").to_pylist())

    assert ids("at < '2026-11-26 12:00:00.000001'") == [1]
    assert ids("at >= '2026-11-26T12:00'") == [1, 255]
    assert ids("raw = ''") == [2]
    assert ids("raw IN ('ab', '')") == [1, 2]
    assert ids("id = 255 OR x <= -1") == [2, 255]
    assert ids("x > 1e-1") == [1]
    with pytest.raises(BadFilter, match=r"out of the range of column 'id' \(uint8: 0..255\)"):
        parse("id = 256", schema)
    with pytest.raises(BadFilter, match="out of the range"):
        parse("id = -1", schema)


def test_a_column_named_with_spaces_is_not_pruned_by_its_neighbours_bounds() -> None:
    """Columns "v" and " v": `" v" = 1` printed by pyarrow as `( v == 1)` was pruned with
    the bounds of "v" (100..199), so every row was lost."""
    schema = Schema([Column("v", "int64"), Column(" v", "int64")], primary_key=["v"])

    async def main() -> int:
        engine = await Engine.open(
            "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
        )
        try:
            async with engine.transaction() as txn:
                await txn.create_database("db")
                await txn.create_table("db", "t", schema)
                await txn.table("db", "t").insert([{"v": 100 + i, " v": 1} for i in range(100)])
            assert engine.maintenance is not None
            await engine.maintenance.settle(freeze_all=True)
            async with engine.transaction() as txn:
                found = await txn.table("db", "t").scan(filter=parse('" v" = 1', schema))
            return int(found.num_rows)
        finally:
            await engine.close()

    assert asyncio.run(main()) == 100


def test_a_float32_literal_finds_its_row_in_memory_and_in_an_object_alike() -> None:
    """`x = 0.1` on a float32 column is the float32 0.1 (0.10000000149...): it matched the row
    in memory, and zonemap pruning (reading `0.1` as a float64) dropped it once flushed."""
    schema = Schema([Column("id", "int64"), Column("x", "float32")], primary_key=["id"])

    async def main() -> list[int]:
        engine = await Engine.open(
            "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
        )
        try:
            async with engine.transaction() as txn:
                await txn.create_database("db")
                await txn.create_table("db", "t", schema)
                await txn.table("db", "t").insert([{"id": 1, "x": 0.1}, {"id": 2, "x": 2.5}])
            counts = []
            for _ in range(2):
                async with engine.transaction() as txn:
                    found = await txn.table("db", "t").scan(filter=parse("x <= 0.1", schema))
                counts.append(int(found.num_rows))
                assert engine.maintenance is not None
                await engine.maintenance.settle(freeze_all=True)  # then from an object
            return counts
        finally:
            await engine.close()

    assert asyncio.run(main()) == [1, 1]
