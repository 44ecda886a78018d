"""A small insert kept as Python values (issue 21): per-column lists, no Arrow batch.

Why: most commits insert one row, and building an Arrow batch for it (`schema.to_batch`:
`RecordBatch.from_pylist` with its schema checks) was the largest single cost of a commit.
Here the rows stay as the Python values the caller gave; the WAL entry (AppendColumns,
engine/wal/columns.py `encode_rows`) is written straight from them, and Arrow is built once
per group of commits when they are applied (engine/state.py `apply_group`).

Exactly as strict as `to_batch`: `small_rows` takes only values whose conversion by Arrow is
certain and exact (`type(v) is int` within the column's range, `float`, `bool`, `str` that
encodes as UTF-8, `bytes`, a `date`, a naive `datetime`, and None in a nullable column) and
says None to everything else; the caller then goes through `to_batch`, which converts or
raises the typed error it always did. So no row is accepted here that `to_batch` would refuse,
and no value converts differently (tests/unit/engine/test_rows.py checks both, with
hypothesis, byte for byte against the Arrow path).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence

import pyarrow as pa

from engine.schema import Key, Schema

ROWS_MAX = 32
"""Largest insert kept as values; it is also the largest AppendColumns entry
(`engine.wal.columns.APPEND_COLUMNS_ROWS_MAX` asserts they agree): larger inserts are Arrow
batches from the start (bulk loads, where Arrow's C++ conversion is the faster path)."""

_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_US_PER_DAY = 86_400_000_000

_WIDTH_BITS = {
    "int8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
    "uint8": 8,
    "uint16": 16,
    "uint32": 32,
    "uint64": 64,
    "float32": 32,
    "float64": 64,
    "bool": 1,
    "date32": 32,
    "timestamp[us]": 64,
}

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint8": (0, (1 << 8) - 1),
    "uint16": (0, (1 << 16) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}


def _utf8(value: object) -> bool:
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate: Arrow refuses it too (to_batch says so)
        return False
    return True


def _accepts(type_name: str) -> Callable[[object], bool] | None:
    """The exact check of one column type's fast values; None: the type always takes the
    Arrow path (float32: Arrow rounds doubles in C, which Python's struct does not match
    for values out of range)."""
    bounds = _INT_RANGES.get(type_name)
    if bounds is not None:
        low, high = bounds
        return lambda v: type(v) is int and low <= v <= high
    if type_name == "float64":
        return lambda v: type(v) is float
    if type_name == "bool":
        return lambda v: type(v) is bool
    if type_name == "string":
        return _utf8
    if type_name == "binary":
        return lambda v: type(v) is bytes
    if type_name == "date32":
        return lambda v: type(v) is datetime.date
    if type_name == "timestamp[us]":
        return lambda v: type(v) is datetime.datetime and v.tzinfo is None
    return None


def date_days(value: datetime.date) -> int:
    """A date32 value: days since 1970-01-01."""
    return value.toordinal() - _EPOCH_ORDINAL


def timestamp_us(value: datetime.datetime) -> int:
    """A timestamp[us] value of a naive datetime: microseconds since 1970-01-01T00:00, the
    wall time read as UTC (what Arrow does with a naive datetime)."""
    seconds = value.hour * 3600 + value.minute * 60 + value.second
    return (
        (value.toordinal() - _EPOCH_ORDINAL) * _US_PER_DAY + seconds * 1_000_000 + value.microsecond
    )


class _Checks:
    """Per schema: each column's (name, nullable, accepts); built once per table schema."""

    __slots__ = ("column_names", "columns", "fast", "names", "type_names", "widths")

    def __init__(self, schema: Schema) -> None:
        self.names = schema.name_set
        self.column_names = tuple(column.name for column in schema.columns)
        self.type_names = tuple(column.type for column in schema.columns)
        self.widths = tuple(_WIDTH_BITS.get(column.type, 0) for column in schema.columns)
        """Bits per value of fixed-width types, 0 for strings and binaries."""
        self.columns = tuple(
            (column.name, column.nullable, _accepts(column.type)) for column in schema.columns
        )
        self.fast = all(accepts is not None for _, _, accepts in self.columns)


_checks: dict[int, tuple[Schema, _Checks]] = {}
_CHECKS_CACHED_MAX = 256


def _checks_of(schema: Schema) -> _Checks:
    cached = _checks.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    if len(_checks) >= _CHECKS_CACHED_MAX:
        _checks.clear()
    checks = _Checks(schema)
    _checks[id(schema)] = (schema, checks)
    return checks


class SmallRows:
    """At most `ROWS_MAX` checked rows of one table, as per-column lists of Python values
    (None for null), in the table's column order."""

    __slots__ = (
        "_batch",
        "_checks",
        "_size_bytes",
        "arrow_schema",
        "columns",
        "key_indexes",
        "num_rows",
    )

    def __init__(
        self,
        schema: Schema,
        arrow_schema: pa.Schema,
        columns: list[list[object]],
        num_rows: int,
    ) -> None:
        assert 0 < num_rows <= ROWS_MAX
        assert len(columns) == len(schema.columns) == len(arrow_schema)
        self._checks = _checks_of(schema)
        self.arrow_schema = arrow_schema
        self.columns = columns
        self.num_rows = num_rows
        self.key_indexes = schema.key_indexes
        self._batch: pa.RecordBatch | None = None
        self._size_bytes = -1

    @property
    def type_names(self) -> tuple[str, ...]:
        """Each column's type (engine/schema.py `TYPES`), in column order."""
        return self._checks.type_names

    def batch(self) -> pa.RecordBatch:
        """The rows as an Arrow batch of the table's schema (built once, when asked)."""
        if self._batch is None:
            self._batch = to_arrow(self.arrow_schema, self.columns)
        return self._batch

    def primary_keys(self) -> list[Key]:
        """The primary key of every row, in row order (as `schema.batch_keys` gives them)."""
        key_indexes = self.key_indexes
        if len(key_indexes) == 1:
            return list(self.columns[key_indexes[0]])
        return list(zip(*(self.columns[i] for i in key_indexes), strict=True))

    def row(self, index: int) -> dict[str, object]:
        return {
            name: column[index]
            for name, column in zip(self._checks.column_names, self.columns, strict=True)
        }

    def size_bytes(self) -> int:
        """The bytes of the rows' Arrow buffers (validity and padding aside): what the
        workspace limits count (computed once: the workspace and the apply both ask)."""
        if self._size_bytes >= 0:
            return self._size_bytes
        total = 0
        for width, column in zip(self._checks.widths, self.columns, strict=True):
            if width:
                total += (width * self.num_rows + 7) >> 3
            else:
                total += 4 * (self.num_rows + 1)
                for value in column:
                    if type(value) is str:
                        # ASCII (most text) is one byte a character: no encoded copy.
                        total += len(value) if value.isascii() else len(value.encode())
                    elif type(value) is bytes:
                        total += len(value)
        self._size_bytes = total
        return total


def small_rows(schema: Schema, arrow_schema: pa.Schema, rows: object) -> SmallRows | None:
    """`rows` as values when they are a list of at most `ROWS_MAX` plain dicts (or one dict)
    whose every value takes the fast path; None otherwise (the caller uses `to_batch`)."""
    if type(rows) is dict:
        rows = [rows]
    elif type(rows) is not list or not 0 < len(rows) <= ROWS_MAX:
        return None
    assert isinstance(rows, list)
    checks = _checks_of(schema)
    if not checks.fast:
        return None
    names = checks.names
    for row in rows:
        if type(row) is not dict or not row.keys() <= names:
            return None
    if len(rows) == 1:  # most commits: no list built per column to check
        (only,) = rows
        single: list[list[object]] = []
        for name, nullable, accepts in checks.columns:
            assert accepts is not None
            value = only.get(name)
            if value is None:
                if not nullable:
                    return None
            elif not accepts(value):
                return None
            single.append([value])
        return SmallRows(schema, arrow_schema, single, 1)
    columns: list[list[object]] = []
    for name, nullable, accepts in checks.columns:
        assert accepts is not None
        values = [row.get(name) for row in rows]
        for value in values:
            if value is None:
                if not nullable:
                    return None
            elif not accepts(value):
                return None
        columns.append(values)
    return SmallRows(schema, arrow_schema, columns, len(rows))


def to_arrow(arrow_schema: pa.Schema, columns: Sequence[list[object]]) -> pa.RecordBatch:
    """One Arrow batch of checked values (one `pa.array` per column: many commits' rows
    are joined first, engine/storage/table.py `apply_appends`)."""
    arrays = [
        pa.array(values, type=field.type)
        for field, values in zip(arrow_schema, columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
