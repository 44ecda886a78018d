"""A small insert kept as Python values (engine/rows.py) is the Arrow path, exactly.

Proves, with hypothesis over every column type (nulls included, and values each type refuses):
- `small_rows` accepts only rows `to_batch` accepts, and its batch equals `to_batch`'s;
- `encode_rows` writes the same bytes as `encode_columns` of that batch, and a whole entry
  with an `AppendRows` is byte-identical to the one with the `Append` of the Arrow batch (so
  the golden vectors of the Arrow path cover it), and decodes to that `Append`;
- whatever `small_rows` declines goes through `to_batch` with its typed error unchanged.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.errors import SchemaError
from engine.rows import ROWS_MAX, small_rows
from engine.schema import TYPES, Column, Schema, to_batch
from engine.wal.codec import decode_entry, encode_entry
from engine.wal.columns import encode_columns, encode_rows
from engine.wal.entry import Append, AppendInfo, AppendRows, MemoItem, TxnEntry

_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def _values(type_name: str) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]:
    """Values the type takes on the fast path, and ones it refuses, converts lossily, or
    takes only through Arrow."""
    if type_name in _INT_BITS:
        bits = _INT_BITS[type_name]
        good: st.SearchStrategy[Any] = st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        bad: st.SearchStrategy[Any] = st.sampled_from([1 << bits, 1.5, True, "1"])
    elif type_name.startswith("uint"):
        bits = int(type_name[4:])
        good = st.integers(0, (1 << bits) - 1)
        bad = st.sampled_from([-1, 1 << bits, decimal.Decimal(1), False])
    elif type_name in ("float32", "float64"):
        good = st.floats(allow_nan=False, width=64)
        bad = st.sampled_from(["x", b"x", 3, 1 << 60])
    elif type_name == "bool":
        good = st.booleans()
        bad = st.sampled_from([2, "true"])
    elif type_name == "string":
        good = st.text(max_size=12)
        bad = st.sampled_from([b"bytes", 3, "\ud800"])
    elif type_name == "binary":
        good = st.binary(max_size=12)
        bad = st.sampled_from([3, 1.5])
    elif type_name == "date32":
        good = st.dates(min_value=datetime.date(1, 1, 1))
        bad = st.sampled_from([datetime.datetime(2020, 1, 1, 12), "2020-01-01"])
    else:
        assert type_name == "timestamp[us]"
        good = st.datetimes(
            min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31)
        )
        bad = st.sampled_from(
            [datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), datetime.date(2020, 1, 1), 7]
        )
    return good, bad


@st.composite
def tables(draw: st.DrawFn, rows_max: int = ROWS_MAX) -> tuple[Schema, list[dict[str, Any]]]:
    fast_types = sorted(set(TYPES) - {"float32"})  # float32 always takes the Arrow path
    types = draw(st.lists(st.sampled_from(fast_types), min_size=1, max_size=5))
    if draw(st.integers(0, 9)) == 0:
        types.append("float32")
    nullable = [draw(st.booleans()) for _ in types]
    columns = [Column("k", "int64")] + [
        Column(f"c{i}", type_name, nullable=is_nullable)
        for i, (type_name, is_nullable) in enumerate(zip(types, nullable, strict=True))
    ]
    schema = Schema(columns, primary_key=["k"])
    count = draw(st.integers(1, rows_max))
    rows = []
    for row_no in range(count):
        row: dict[str, Any] = {"k": row_no}
        for column in columns[1:]:
            choice = draw(st.integers(0, 5)) if column.nullable else 2
            if choice == 0:
                continue  # missing: null
            if choice == 1:
                row[column.name] = None
            else:
                row[column.name] = draw(_values(column.type)[0])
        rows.append(row)
    if draw(st.integers(0, 3)) == 0:  # one value the fast path must not take
        column = draw(st.sampled_from(columns[1:]))
        row_no = draw(st.integers(0, count - 1))
        bad = _values(column.type)[1]
        rows[row_no][column.name] = draw(bad if column.nullable else bad | st.none())
    return schema, rows


@settings(max_examples=300, deadline=None)
@given(tables())
def test_small_rows_are_the_arrow_path_value_for_value_and_byte_for_byte(
    case: tuple[Schema, list[dict[str, Any]]],
) -> None:
    _check_same_as_arrow(*case)


@settings(max_examples=200, deadline=None)
@given(tables(rows_max=1))
def test_one_row_is_the_arrow_path_byte_for_byte(
    case: tuple[Schema, list[dict[str, Any]]],
) -> None:
    """One row (most commits) has its own encoder (`columns._encode_row`)."""
    _check_same_as_arrow(*case)


def _check_same_as_arrow(schema: Schema, rows: list[dict[str, Any]]) -> None:
    arrow_schema = schema.to_arrow()
    small = small_rows(schema, arrow_schema, rows)
    try:
        expected = to_batch(schema, arrow_schema, rows, "db.t")
    except SchemaError:
        assert small is None  # refused by Arrow: never accepted here
        return
    if small is None:
        return  # a value outside the fast path (float32, an int in a float column...)
    assert small.batch().equals(expected)
    assert small.primary_keys() == expected.column(0).to_pylist()
    assert [small.row(i) for i in range(small.num_rows)] == expected.to_pylist()
    assert b"".join(encode_rows(small)) == b"".join(encode_columns(expected) or [])
    infos = (AppendInfo(1, 0, small.num_rows),)
    memo = (MemoItem(1, 2, 1),)
    from_rows = encode_entry(TxnEntry(1, 2, memo, (AppendRows(1, 2, infos, small),)))
    from_arrow = encode_entry(TxnEntry(1, 2, memo, (Append(1, 2, infos, expected),)))
    assert from_rows == from_arrow
    decoded = decode_entry(from_rows, 1)
    assert isinstance(decoded, TxnEntry)
    (append,) = decoded.commands
    assert isinstance(append, Append)
    assert append.batch.equals(expected)
    # Version 1 (every append as Arrow IPC) writes the Arrow batch's bytes too.
    assert encode_entry(
        TxnEntry(1, 2, memo, (AppendRows(1, 2, infos, small),)), version=1
    ) == encode_entry(TxnEntry(1, 2, memo, (Append(1, 2, infos, expected),)), version=1)


SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("name", "string", nullable=True),
        Column("when", "timestamp[us]", nullable=True),
    ],
    primary_key=["id"],
)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"id": 1.5}], "takes integers"),
        ([{"id": None}], "null in non-nullable"),
        ([{"id": 1, "colour": 2}], "unknown column 'colour'"),
        ([{"id": "1"}], "column 'id' \\(int64\\)"),
        ([{"id": 1 << 63}], "column 'id' \\(int64\\)"),
        ([{"id": 1, "name": 7}], "column 'name' \\(string\\)"),
        ([{"id": 1}, "row"], "row 1 is a str"),
    ],
)
def test_declined_rows_get_to_batchs_typed_error(rows: list[Any], message: str) -> None:
    arrow_schema = SCHEMA.to_arrow()
    assert small_rows(SCHEMA, arrow_schema, rows) is None
    with pytest.raises(SchemaError, match=message):
        to_batch(SCHEMA, arrow_schema, rows, "db.t")


def test_what_is_kept_as_values_and_what_is_not() -> None:
    arrow_schema = SCHEMA.to_arrow()
    when = datetime.datetime(2026, 11, 26, 20, 7, 6, 123456)
    kept = small_rows(SCHEMA, arrow_schema, {"id": 1, "name": "é", "when": when})
    assert kept is not None
    assert kept.columns == [[1], ["é"], [when]]
    assert small_rows(SCHEMA, arrow_schema, [{"id": i} for i in range(ROWS_MAX + 1)]) is None
    assert small_rows(SCHEMA, arrow_schema, []) is None
    assert small_rows(SCHEMA, arrow_schema, pa.table({"id": [1]})) is None
    assert small_rows(SCHEMA, arrow_schema, ({"id": 1},)) is None  # a tuple: to_batch's path


def test_a_transaction_keeps_at_most_one_values_part_per_table(tmp_path: Path) -> None:
    """Values take several times the memory of Arrow buffers: only a table's first insert
    in a transaction stays values, so a transaction of many inserts is bounded as before."""

    async def run() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory", maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.create_database("db")
                await txn.create_table("db", "t", SCHEMA)
            txn = await eng.begin()
            for key in range(5):
                await txn.table("db", "t").insert([{"id": key, "name": f"n{key}"}])
            (writes,) = txn._writes.values()
            kinds = [type(part).__name__ for part in writes.batches]
            assert kinds == ["SmallRows"] + ["RecordBatch"] * 4
            await txn.commit()
            async with eng.transaction() as check:
                rows = (await check.table("db", "t").scan()).sort_by("id").to_pylist()
            assert rows == [{"id": k, "name": f"n{k}", "when": None} for k in range(5)]
        finally:
            await eng.close()

    asyncio.run(run())
