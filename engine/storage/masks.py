"""A scan's filter as a boolean mask from compute kernels, for the filters the pruner parses
(engine/storage/pruning.py: comparisons of a column with a number, joined by `and` / `or`).

Why: `Table.filter(expression)` runs an Acero plan per call, whose cost grows with the number
of chunks (a group of whole objects is 128 chunks of 8,192 rows per million): 8.5 ms for
`customer == 42` over a million rows of 128 chunks, against 1.2 ms for `pc.equal` with a
scalar of the column's own type and a filter by that mask (best of 30, same process). The
scalar is typed as the column so no column is cast (a Python int would make pyarrow cast an
int32 column to int64 first).

Exactness: a mask is made only when each comparison means exactly what pyarrow's expression
means, else None and the caller runs the expression: the column is an integer or floating
type; the literal's exact value is known (pyarrow prints a float32 literal as its shortest
text, so `0.1` may be 0.10000000149...: a literal is used only when its float32 and float64
readings are the same number), it is an integer for an integer column and within that
column's type, and it is exact in the column's float type for a float column. Comparisons
follow IEEE (NaN compares false, `!=` true) and a null compares null, in both; `and`/`or`
are Kleene's, as the expression's are, and the filter drops nulls, as `Table.filter` does.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.storage.pruning import Compare, Junction, Node

_KERNELS = {
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def mask(node: Node, table: pa.Table) -> pa.ChunkedArray | pa.Array | None:
    """Which rows of `table` match `node` (true, false or null), or None when a comparison
    cannot be made here exactly (module docstring)."""
    if isinstance(node, Junction):
        left = mask(node.left, table)
        if left is None:
            return None
        right = mask(node.right, table)
        if right is None:
            return None
        joined: pa.ChunkedArray = (pc.and_kleene if node.op == "and" else pc.or_kleene)(left, right)
        return joined
    scalar = _literal(node, table.schema)
    if scalar is None:
        return None
    compared: pa.ChunkedArray = _KERNELS[node.op](table.column(node.column), scalar)
    return compared


def _literal(node: Compare, schema: pa.Schema) -> pa.Scalar | None:
    """The comparison's literal as a scalar of its column's type, or None."""
    index = schema.get_field_index(node.column)
    if index < 0:
        return None
    kind = schema.field(index).type
    value = node.value
    as_float32 = _as_float32(value)
    if node.slack and as_float32 != value:
        return None  # a float32 printed short, or a float64 that is not one: unknown
    if pa.types.is_integer(kind):
        if not value.is_integer():
            return None
        info = np.iinfo(kind.to_pandas_dtype())
        number = int(value)
        if not info.min <= number <= info.max:
            return None
        return pa.scalar(number, kind)
    if pa.types.is_float32(kind) or pa.types.is_float64(kind):
        if pa.types.is_float32(kind) and as_float32 != value:
            return None
        return pa.scalar(value, kind)
    return None


def _as_float32(value: float) -> float:
    """`value` rounded to a float32 (infinite past its range, without numpy's warning)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))
