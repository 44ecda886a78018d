"""Rows and keys as JSON, both ways (issue 24): what `scan --format json` prints and what
`engine cn insert|delete --json FILE` reads, so the one feeds the other.

Pure: bytes or a `pa.Table` and a `Schema` in, text or Python rows out; `BadArgument` naming
the row (1-based) and the column when a value does not fit.

A document is a JSON array of values, or JSON lines (one value a line, blank lines skipped).
A row is an object of column names to values; a column left out is null. By column type:

    int*, float*     a JSON number (float columns also take "NaN", "Infinity", "-Infinity")
    bool             true or false
    string           a JSON string
    binary           base64 text
    date32           "YYYY-MM-DD"
    timestamp[us]    "YYYY-MM-DDTHH:MM:SS[.ffffff]" (no time zone: the column has none)

and null for a null. A key (for delete) is the key column's value for a one-column key, a
JSON array of the key's values in key order, or an object holding the key columns (other
fields are ignored, so rows printed by `scan --format json` are keys too).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from engine.errors import BadArgument
from engine.schema import Column, Schema

BATCH_ROWS = 4096
"""Rows turned into Python values at a time when printing: bounds the objects alive."""

_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# --- out ------------------------------------------------------------------------------------


def json_lines(table: pa.Table) -> Iterator[str]:
    """One JSON object per row of `table`, keys in column order."""
    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
        for row in batch.to_pylist():
            document = {name: json_value(value) for name, value in row.items()}
            yield json.dumps(document, ensure_ascii=False, allow_nan=False)


def json_value(value: Any) -> Any:
    """A column's Python value as the JSON value above (json.dumps it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime.date):  # datetime.datetime too
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


# --- in -------------------------------------------------------------------------------------


def documents(data: bytes, source: str) -> list[Any]:
    """The values of a JSON array or of JSON lines; `BadArgument` naming `source` and the
    line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadArgument(f"{source}: not UTF-8 at byte {exc.start}") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadArgument(f"{source}: bad JSON at line {exc.lineno}: {exc.msg}") from None
        assert isinstance(whole, list)  # it starts with "[" and parsed whole
        return whole
    values = []
    # "\n" only: str.splitlines() also splits at U+2028, U+0085 and others, which JSON
    # strings hold unescaped (json.dumps(ensure_ascii=False) writes them as they are).
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise BadArgument(f"{source}: bad JSON at line {number}: {exc.msg}") from None
    return values


def rows(values: list[Any], schema: Schema, source: str) -> list[dict[str, Any]]:
    """`values` (each an object) as rows of `schema`, each value converted by its column's
    type; `BadArgument` names the row and the column."""
    columns = {c.name: c for c in schema.columns}
    out = []
    for number, value in enumerate(values, start=1):
        if not isinstance(value, dict):
            raise BadArgument(f"{source}: row {number} is not a JSON object")
        row = {}
        for name, cell in value.items():
            column = columns.get(name)
            if column is None:
                raise BadArgument(
                    f"{source}: row {number}: unknown column {name!r} (columns: "
                    f"{', '.join(columns)})"
                )
            row[name] = _engine_value(cell, column, f"{source}: row {number}")
        out.append(row)
    return out


def keys(values: list[Any], schema: Schema, source: str) -> list[Any]:
    """`values` as primary keys of `schema` (the module docstring's three forms)."""
    key_columns = [schema.column(name) for name in schema.primary_key]
    out = []
    for number, value in enumerate(values, start=1):
        where = f"{source}: key {number}"
        if isinstance(value, dict):
            missing = [c.name for c in key_columns if c.name not in value]
            if missing:
                raise BadArgument(f"{where}: no {', '.join(map(repr, missing))}")
            parts = [value[c.name] for c in key_columns]
        elif isinstance(value, list):
            if len(value) != len(key_columns):
                raise BadArgument(
                    f"{where}: a key has {len(key_columns)} values "
                    f"({', '.join(schema.primary_key)}), not {len(value)}"
                )
            parts = value
        elif len(key_columns) == 1:
            parts = [value]
        else:
            raise BadArgument(
                f"{where}: a key of ({', '.join(schema.primary_key)}) is an array or an object"
            )
        converted = [_engine_value(p, c, where) for p, c in zip(parts, key_columns, strict=True)]
        if any(p is None for p in converted):
            raise BadArgument(f"{where}: null in the key")
        out.append(converted[0] if len(converted) == 1 else tuple(converted))
    return out


def _engine_value(value: Any, column: Column, where: str) -> Any:
    """A JSON value as the Python value the engine takes for `column`."""
    if value is None:
        return None
    kind = column.type
    bad = BadArgument(f"{where}: column {column.name!r} ({kind}) cannot take {value!r}")
    if isinstance(value, (dict, list)):
        raise bad
    if kind.startswith(("int", "uint")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if kind.startswith("float"):
        if isinstance(value, str) and value in _FLOAT_WORDS:
            return _FLOAT_WORDS[value]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if not isinstance(value, str):
        raise bad
    try:
        if kind == "binary":
            return base64.b64decode(value, validate=True)
        if kind == "date32":
            return datetime.date.fromisoformat(value)
        if kind == "timestamp[us]":
            moment = datetime.datetime.fromisoformat(value)
            if moment.tzinfo is not None:
                raise BadArgument(
                    f"{where}: column {column.name!r} is a timestamp without a time zone; "
                    f"give {value!r} without one"
                )
            return moment
    except (ValueError, binascii.Error):
        raise bad from None
    return value
