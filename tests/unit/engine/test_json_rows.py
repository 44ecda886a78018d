"""Rows as JSON both ways (engine/json_rows.py): what `scan --format json` prints,
`cn insert --json` reads back to the same values, for every column type the engine has, and
every row printed is also a key for `cn delete --json`.

How: hypothesis draws rows of a table with one column of each type (nulls, NaN, infinities,
empty strings and bytes, quotes and non-ASCII text included), prints them as JSON lines,
reads them back (as JSON lines and as one JSON array) and compares them with the drawn
values; keys are read from the same lines, from bare values and from arrays.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Column, Schema
from engine.errors import BadArgument
from engine.json_rows import documents, json_lines, keys, rows

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("i8", "int8", nullable=True),
        Column("u64", "uint64", nullable=True),
        Column("f32", "float32", nullable=True),
        Column("f64", "float64", nullable=True),
        Column("ok", "bool", nullable=True),
        Column("s", "string", nullable=True),
        Column("bin", "binary", nullable=True),
        Column("day", "date32", nullable=True),
        Column("at", "timestamp[us]", nullable=True),
    ],
    primary_key=["id"],
)


def nullable(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


values = st.fixed_dictionaries(
    {
        "i8": nullable(st.integers(-128, 127)),
        "u64": nullable(st.integers(0, 2**64 - 1)),
        "f32": nullable(st.sampled_from([0.5, -2.25, math.inf, -math.inf, math.nan, 1e30])),
        "f64": nullable(st.floats(allow_nan=True, allow_infinity=True)),
        "ok": nullable(st.booleans()),
        "s": nullable(st.text(max_size=8)),
        "bin": nullable(st.binary(max_size=8)),
        "day": nullable(st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31))),
        "at": nullable(st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1))),
    }
)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


@settings(max_examples=200, deadline=None)
@given(st.lists(values, max_size=12))
def test_printed_rows_read_back_as_the_same_values(drawn: list[dict[str, Any]]) -> None:
    originals = [{"id": i, **v} for i, v in enumerate(drawn)]
    table = pa.Table.from_pylist(originals, schema=SCHEMA.to_arrow())
    lines = list(json_lines(table))
    assert all(json.loads(line).keys() == {c.name for c in SCHEMA.columns} for line in lines)
    as_lines = documents("\n".join(lines).encode(), "f")
    as_array = documents(("[" + ",\n".join(lines) + "]").encode(), "f")
    for read in (rows(as_lines, SCHEMA, "f"), rows(as_array, SCHEMA, "f")):
        again = pa.Table.from_pylist(read, schema=SCHEMA.to_arrow()).to_pylist()
        for want, got in zip(table.to_pylist(), again, strict=True):
            assert all(same(want[k], got[k]) for k in want), (want, got)
    assert keys(as_lines, SCHEMA, "f") == list(range(len(drawn)))
    assert keys(list(range(len(drawn))), SCHEMA, "f") == list(range(len(drawn)))
    assert keys([[i] for i in range(len(drawn))], SCHEMA, "f") == list(range(len(drawn)))


def test_composite_keys_take_arrays_and_objects_in_key_order() -> None:
    schema = Schema([Column("a", "string"), Column("b", "date32")], primary_key=["b", "a"])
    got = keys([["2026-11-26", "x"], {"a": "y", "b": "2026-01-01", "extra": 1}], schema, "f")
    assert got == [(datetime.date(2026, 11, 26), "x"), (datetime.date(2026, 1, 1), "y")]
    with pytest.raises(BadArgument, match=r"f: key 1: a key of \(b, a\) is an array or an object"):
        keys(["x"], schema, "f")


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("i8", True, "column 'i8' (int8) cannot take True"),
        ("i8", 1.5, "cannot take 1.5"),
        ("f64", "nan", "cannot take 'nan'"),  # only NaN, Infinity, -Infinity
        ("ok", 1, "column 'ok' (bool) cannot take 1"),
        ("bin", "not base64!", "(binary) cannot take"),
        ("day", "26.11.2026", "(date32) cannot take"),
        ("at", "2026-11-26T12:00:00Z", "a timestamp without a time zone"),
        ("s", ["x"], "(string) cannot take ['x']"),
    ],
)
def test_a_value_that_does_not_fit_names_row_and_column(column: str, value: Any, says: str) -> None:
    with pytest.raises(BadArgument) as caught:
        rows([{"id": 1}, {"id": 2, column: value}], SCHEMA, "in.json")
    assert str(caught.value).startswith("in.json: row 2: ")
    assert says in str(caught.value)


def test_documents_name_the_line_of_bad_json() -> None:
    with pytest.raises(BadArgument, match="f: bad JSON at line 3"):
        documents(b'{"id": 1}\n\n{"id": \n', "f")
    with pytest.raises(BadArgument, match="f: bad JSON at line 2: Extra data"):
        documents(b"[1]\n[2]", "f")  # an array is the whole document
    with pytest.raises(BadArgument, match="f: not UTF-8 at byte 1"):
        documents(b"[\xff]", "f")
    assert documents(b"", "f") == []
