"""Plain aggregates over the direct path's rows, answered without DuckDB where the answer is
DuckDB's own, bit for bit (engine/sql_direct.py). Pure: parse trees and Arrow tables in,
plans and Arrow tables out.

Why. A range query such as `select sum(amount) from t where id >= 5000000 and id < 5010000`
reads its 10,000 rows through the key path in a fraction of a millisecond; handing them to
DuckDB (bind, plan, scan an Arrow stream, aggregate, export the result) costs about as much
again. Counting or summing them here costs tens of microseconds.

What is taken (`select_aggregates`): a SELECT whose select list is nothing but `count(*)`,
`count(col)`, `sum(col)`, `min(col)` and `max(col)` of the table's own columns (aliases
allowed; no DISTINCT, FILTER, ORDER BY inside the call, GROUP BY, HAVING, QUALIFY, ORDER BY,
LIMIT or any other expression), and only when the WHERE is nothing but key bounds, so the
rows the engine read are exactly the rows DuckDB would aggregate, in the same order.

When the answer is DuckDB's (`answer`; anything else returns None and DuckDB runs):

* the result's names and types are DuckDB's own, read from running the query over no rows
  (engine/sql_direct.py), and each type must be the one computed here: BIGINT for counts,
  HUGEINT (Arrow `decimal128(38, 0)`) for the sum of a signed integer column of up to 64
  bits, DOUBLE for the sum of a DOUBLE column, the column's own type for the min or max of
  an integer column;
* NULLs are skipped; a sum, min or max of no non-NULL value is NULL, a count is 0;
* an integer sum is exact (Python integers; DuckDB's HUGEINT holds any sum of at most 2^64
  int64 values);
* a DOUBLE sum is DuckDB's `sum(DOUBLE)` at one thread: IEEE additions in row order onto a
  state that starts at +0.0 (so `sum([-0.0])` is +0.0, `1e16 + 1 - 1e16` is 0.0, not 1.0;
  infinities and NaN propagate), which is what `numpy.cumsum` computes, element after
  element. DuckDB reads the direct path's rows on one thread (engine/sql_direct.py's
  databases run one), so it adds in this order too. The differential test
  (tests/unit/engine/test_sql_aggregates.py) compares bit patterns against DuckDB;
* min and max of floating point columns are left to DuckDB (its NaN and -0.0 order).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_FUNCTIONS = frozenset({"count_star", "count", "sum", "min", "max"})

SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
INTEGERS = (*SIGNED, pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
HUGEINT = pa.decimal128(38, 0)
"""How DuckDB hands a HUGEINT to Arrow (its `sum` of an integer column)."""


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One select-list item: `function` ("count_star", "count", "sum", "min", "max") of
    the column reference `column` (lower-case parts; None for count(*))."""

    function: str
    column: tuple[str, ...] | None


def plain_select(node: dict[str, Any]) -> bool:
    """A SELECT node (DuckDB's `json_serialize_sql` tree) with no modifier (DISTINCT, ORDER
    BY, LIMIT), no GROUP BY, HAVING or QUALIFY, and standard aggregate handling: its select
    list alone says what each output column is (here and engine/sql_keys.py's projection)."""
    if node.get("modifiers") or node.get("group_expressions") or node.get("group_sets"):
        return False
    if node.get("having") is not None or node.get("qualify") is not None:
        return False
    return bool(node.get("aggregate_handling") == "STANDARD_HANDLING")


def select_aggregates(node: dict[str, Any]) -> tuple[Aggregate, ...] | None:
    """The aggregates of a SELECT node (DuckDB's `json_serialize_sql` tree) whose select
    list is only plain aggregates of columns (module docstring), else None."""
    if not plain_select(node):
        return None
    out: list[Aggregate] = []
    for item in node.get("select_list") or []:
        found = aggregate_of(item)
        if found is None:
            return None
        out.append(found)
    return tuple(out) if out else None


def aggregate_of(item: Any) -> Aggregate | None:
    """A select-list item that is one plain aggregate of a column (module docstring), as
    an `Aggregate`; None for anything else (engine/sql_groups.py's select lists too)."""
    if not isinstance(item, dict) or item.get("class") != "FUNCTION":
        return None
    function = item.get("function_name")
    if function not in _FUNCTIONS or item.get("schema") or item.get("catalog"):
        return None
    if item.get("is_operator") or item.get("distinct") or item.get("export_state"):
        return None
    if item.get("filter") is not None or (item.get("order_bys") or {}).get("orders"):
        return None
    arguments = item.get("arguments")
    if not isinstance(arguments, list):
        return None
    if function == "count_star":
        return Aggregate(function, None) if not arguments else None
    if len(arguments) != 1 or not isinstance(arguments[0], dict) or arguments[0].get("name"):
        return None
    expression = arguments[0].get("expression")
    if not isinstance(expression, dict) or expression.get("class") != "COLUMN_REF":
        return None
    parts = expression.get("column_names")
    if not isinstance(parts, list) or not 1 <= len(parts) <= 2:
        return None
    if not all(isinstance(p, str) for p in parts):
        return None
    return Aggregate(function, tuple(p.lower() for p in parts))


def answer(
    aggregates: tuple[Aggregate, ...],
    columns: list[str | None],
    rows: pa.Table,
    schema: pa.Schema,
) -> pa.Table | None:
    """The one-row answer of `aggregates` over `rows`, in DuckDB's answer `schema`;
    `columns[i]` is the table column aggregate i reads (None for count(*)). None when a
    type is not one this module computes exactly as DuckDB does (module docstring)."""
    assert len(columns) == len(aggregates)
    if len(schema) != len(aggregates):
        return None
    arrays = []
    for aggregate, column, field in zip(aggregates, columns, schema, strict=True):
        if aggregate.function == "count_star":
            value: object = rows.num_rows
            wanted: pa.DataType = pa.int64()
        else:
            if column is None or column not in rows.column_names:
                return None
            found = _one(aggregate.function, rows.column(column))
            if found is None:
                return None
            value, wanted = found
        if field.type != wanted:
            return None
        arrays.append(pa.array([value], type=wanted))
    return pa.Table.from_arrays(arrays, schema=schema)


def _one(function: str, values: pa.ChunkedArray) -> tuple[object, pa.DataType] | None:
    """The aggregate of one column and the type DuckDB answers it in; None when this module
    does not compute it."""
    type_ = values.type
    if function == "count":
        return values.length() - values.null_count, pa.int64()
    if function in ("min", "max"):
        if type_ not in INTEGERS:
            return None
        if values.length() == values.null_count:
            return None, type_
        found = pc.min_max(values)
        return found[function].as_py(), type_
    assert function == "sum"
    if type_ == pa.float64():
        return _double_sum(values), type_
    if type_ not in SIGNED:
        return None
    return _integer_sum(values), HUGEINT


def _double_sum(values: pa.ChunkedArray) -> float | None:
    """DuckDB's sum(DOUBLE) at one thread: additions in row order from +0.0, NULLs skipped,
    NULL for no value (module docstring)."""
    kept = values.drop_null() if values.null_count else values
    if len(kept) == 0:
        return None
    flat = np.empty(len(kept) + 1, dtype=np.float64)
    flat[0] = 0.0
    offset = 1
    for chunk in kept.chunks:
        flat[offset : offset + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        offset += len(chunk)
    # cumsum adds element after element (numpy's pairwise summation is for `sum` only).
    return float(np.cumsum(flat)[-1])


def _integer_sum(values: pa.ChunkedArray) -> Decimal | None:
    """The exact sum of a signed integer column as DuckDB's HUGEINT (a decimal128(38, 0));
    NULL for no value. Each int64 splits into its high 32 bits (signed) and low 32 bits,
    whose int64 sums cannot overflow below 2^31 rows."""
    assert len(values) < 1 << 31
    kept = values.drop_null() if values.null_count else values
    if len(kept) == 0:
        return None
    if values.type != pa.int64():
        return Decimal(pc.sum(kept.cast(pa.int64())).as_py())
    total = 0
    for chunk in kept.chunks:
        numbers = chunk.to_numpy(zero_copy_only=False)
        high = int(np.sum(numbers >> 32, dtype=np.int64))
        low = int(np.sum(numbers & 0xFFFFFFFF, dtype=np.int64))
        total += (high << 32) + low
    return Decimal(total)
