"""Table schemas, their Arrow types, and turning user rows into checked Arrow batches.

    Schema([Column("id", "int64"), Column("note", "string", nullable=True)],
           primary_key=["id"])

Why here, before anything is logged (issue 13 "Bad input gets a typed error before anything is
logged"): every insert becomes one Arrow `RecordBatch` of exactly the table's schema (names,
order, types, no nulls where the schema forbids them), or a `SchemaError` naming the column.
Primary-key columns are never nullable. Keys are Python values: the value itself for a
one-column key, a tuple for a compound key.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine import limits
from engine.errors import SchemaError

TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date32": pa.date32(),
    "timestamp[us]": pa.timestamp("us"),
}
"""The column types, by the name used in schemas and in the WAL (engine/FORMAT.md)."""

TYPE_ALIASES = {"timestamp": "timestamp[us]", "float": "float32", "double": "float64"}

KEY_TYPES = frozenset(TYPES) - {"float32", "float64"}
"""Types allowed in a primary key: floats are not (NaN and -0.0 make equality unreliable)."""

Key = Any
"""A primary-key value: a scalar for a one-column key, a tuple for a compound key."""


def check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{kind} name must be a non-empty string, not {name!r}")
    if len(name.encode()) > limits.NAME_BYTES_MAX:
        raise SchemaError(
            f"{kind} name {name[:32]!r}... is longer than {limits.NAME_BYTES_MAX} bytes"
        )
    if any(ord(c) < 0x20 for c in name):
        raise SchemaError(f"{kind} name {name!r} contains a control character")
    return name


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    nullable: bool = False

    def __post_init__(self) -> None:
        check_name("column", self.name)
        canonical = TYPE_ALIASES.get(self.type, self.type)
        if canonical not in TYPES:
            raise SchemaError(
                f"column {self.name!r}: unknown type {self.type!r} (one of {', '.join(TYPES)})"
            )
        object.__setattr__(self, "type", canonical)

    @property
    def arrow_type(self) -> pa.DataType:
        return TYPES[self.type]


@dataclass(frozen=True, slots=True)
class Schema:
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    key_indexes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Positions of the key columns, in key order."""
    key_columns: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)
    """(name, type) of the key columns, in key order: what a WAL DeleteKeys command names
    (engine/wal/entry.py `DeletedKeys`)."""
    name_set: frozenset[str] = field(init=False, repr=False, compare=False)
    arrow_nullable: pa.Schema = field(init=False, repr=False, compare=False)
    """The Arrow schema with every field nullable (how batches are usually built)."""
    lossy_checks: tuple[tuple[str, tuple[type, ...], str], ...] = field(
        init=False, repr=False, compare=False
    )

    def __init__(self, columns: Iterable[Column], primary_key: Iterable[str]) -> None:
        cols = tuple(columns)
        if isinstance(primary_key, str):
            primary_key = [primary_key]
        pk = tuple(primary_key)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "primary_key", pk)
        if not cols:
            raise SchemaError("a table needs at least one column")
        if len(cols) > limits.COLUMNS_MAX:
            raise SchemaError(f"{len(cols)} columns, more than {limits.COLUMNS_MAX}")
        names = [c.name for c in cols]
        if len(set(names)) != len(names):
            raise SchemaError(f"duplicate column name in {names}")
        if not pk:
            raise SchemaError("a table needs a primary key")
        if len(set(pk)) != len(pk):
            raise SchemaError(f"duplicate column in primary key {list(pk)}")
        by_name = {c.name: c for c in cols}
        for name in pk:
            if name not in by_name:
                raise SchemaError(f"primary key column {name!r} is not a column")
            if by_name[name].nullable:
                raise SchemaError(f"primary key column {name!r} cannot be nullable")
            if by_name[name].type not in KEY_TYPES:
                raise SchemaError(
                    f"primary key column {name!r} has type {by_name[name].type}, "
                    "which cannot be a key"
                )
        object.__setattr__(self, "key_indexes", tuple(names.index(k) for k in pk))
        object.__setattr__(self, "key_columns", tuple((k, by_name[k].type) for k in pk))
        object.__setattr__(self, "name_set", frozenset(names))
        object.__setattr__(
            self, "arrow_nullable", pa.schema([pa.field(c.name, c.arrow_type) for c in cols])
        )
        object.__setattr__(self, "lossy_checks", _lossy_checks(cols))

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise SchemaError(f"unknown column {name!r}")

    def to_arrow(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns]
        )


# --- Rows -> checked batches -----------------------------------------------------------------


def to_batch(schema: Schema, arrow_schema: pa.Schema, rows: object, table: str) -> pa.RecordBatch:
    """Turn `rows` (a `pa.Table`, a `pa.RecordBatch`, or a sequence of dicts) into one
    RecordBatch of exactly `schema`, or raise `SchemaError`."""
    if isinstance(rows, pa.Table):
        batch = _from_arrow(schema, arrow_schema, rows, table)
    elif isinstance(rows, pa.RecordBatch):
        incoming = rows.schema
        if incoming.equals(arrow_schema):
            batch = rows  # the fast path: already exactly the table's schema
        elif incoming.equals(schema.arrow_nullable):
            # The usual case of a batch built without nullability: same names and types.
            batch = pa.RecordBatch.from_arrays(rows.columns, schema=arrow_schema)
        else:
            batch = _from_arrow(schema, arrow_schema, pa.Table.from_batches([rows]), table)
    elif isinstance(rows, Mapping):
        batch = _from_dicts(schema, arrow_schema, [rows], table)
    elif isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)):
        batch = _from_dicts(schema, arrow_schema, rows, table)
    else:
        raise SchemaError(
            f"{table}: rows must be a pyarrow Table or RecordBatch, or a list of dicts, "
            f"not {type(rows).__name__}"
        )
    for column in schema.columns:
        if not column.nullable and batch.column(column.name).null_count:
            raise SchemaError(f"{table}: null in non-nullable column {column.name!r}")
    return batch


def _from_dicts(
    schema: Schema, arrow_schema: pa.Schema, rows: Sequence[object], table: str
) -> pa.RecordBatch:
    names = schema.name_set
    lossy = schema.lossy_checks
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise SchemaError(f"{table}: row {index} is a {type(row).__name__}, not a dict")
        if not row.keys() <= names:
            extra = sorted(map(str, row.keys() - names))
            raise SchemaError(f"{table}: unknown column {extra[0]!r}")
        for name, refused, what in lossy:
            value = row.get(name)
            if value is not None and isinstance(value, refused):
                raise SchemaError(
                    f"{table}: column {name!r} ({schema.column(name).type}) takes {what}, "
                    f"not {value!r}"
                )
    try:
        batch: pa.RecordBatch = pa.RecordBatch.from_pylist(list(rows), schema=arrow_schema)
        return batch
    except _CONVERSION_ERRORS:
        pass
    # Build column by column, only to name the column at fault.
    for column in schema.columns:
        values = [row.get(column.name) for row in rows]  # type: ignore[attr-defined]
        try:
            pa.array(values, type=column.arrow_type)
        except _CONVERSION_ERRORS as exc:
            raise SchemaError(
                f"{table}: column {column.name!r} ({column.type}): {_first_line(exc)}"
            ) from None
    raise SchemaError(f"{table}: rows do not convert to the table's schema")


_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError)

_INTEGER_TYPES = frozenset(
    ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
)


def _lossy_checks(columns: tuple[Column, ...]) -> tuple[tuple[str, tuple[type, ...], str], ...]:
    """Python values Arrow would convert with a silent loss (it truncates 1.5 to 1 in an
    integer column, and drops the time of a datetime in a date column): refused instead."""
    checks: list[tuple[str, tuple[type, ...], str]] = []
    for column in columns:
        if column.type in _INTEGER_TYPES:
            checks.append((column.name, (float, decimal.Decimal), "integers"))
        elif column.type == "date32":
            checks.append((column.name, (datetime.datetime,), "dates"))
    return tuple(checks)


def _from_arrow(
    schema: Schema, arrow_schema: pa.Schema, data: pa.Table, table: str
) -> pa.RecordBatch:
    names = set(schema.names)
    for name in data.column_names:
        if name not in names:
            raise SchemaError(f"{table}: unknown column {name!r}")
    if len(set(data.column_names)) != len(data.column_names):
        raise SchemaError(f"{table}: duplicate column in input {data.column_names}")
    columns = []
    for column in schema.columns:
        if column.name not in data.column_names:
            columns.append(pa.nulls(data.num_rows, type=column.arrow_type))
            continue
        values = data.column(column.name)
        if values.type != column.arrow_type:
            try:
                values = values.cast(column.arrow_type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SchemaError(
                    f"{table}: column {column.name!r} is {values.type}, not {column.type}: "
                    f"{_first_line(exc)}"
                ) from None
        columns.append(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --- Keys ------------------------------------------------------------------------------------


def batch_keys(schema: Schema, batch: pa.RecordBatch | pa.Table) -> list[Key]:
    """The primary key of every row of `batch` (or a table), in row order."""
    key_cols: list[list[Key]] = [batch.column(i).to_pylist() for i in schema.key_indexes]
    if len(key_cols) == 1:
        return key_cols[0]
    return list(zip(*key_cols, strict=True))


def normalize_key(schema: Schema, key: object, table: str) -> Key:
    """Check a key given by a caller (`delete([3])`, `get((1, "a"))`) against the key
    columns' types, and return it in the form `batch_keys` produces."""
    columns = [schema.column(name) for name in schema.primary_key]
    parts: tuple[object, ...]
    if len(columns) == 1:
        parts = (key,)
    else:
        if not isinstance(key, tuple) or len(key) != len(columns):
            raise SchemaError(
                f"{table}: a key is a tuple of {len(columns)} values "
                f"({', '.join(schema.primary_key)}), not {key!r}"
            )
        parts = key
    normalized = []
    for column, value in zip(columns, parts, strict=True):
        if value is None:
            raise SchemaError(f"{table}: null in key column {column.name!r}")
        try:
            scalar = pa.scalar(value, type=column.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise SchemaError(
                f"{table}: key column {column.name!r} ({column.type}): {_first_line(exc)}"
            ) from None
        normalized.append(scalar.as_py())
    return normalized[0] if len(normalized) == 1 else tuple(normalized)


def describe_value(value: object) -> str:
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    return repr(value)
