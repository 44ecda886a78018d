"""A parsed filter's kernel mask (engine/storage/masks.py) selects exactly the rows pyarrow's
own `Table.filter(expression)` selects, or declines.

How: hypothesis draws tables of int8, int32, uint16, int64, float32 and float64 columns (nulls,
NaN and both infinities included), filters of comparisons with literals of every kind
(integers in and out of a column's range, halves, float32 scalars printed short, float64
values that are no float32, and `and`/`or` of those), and checks the rows kept by the mask
equal pyarrow's. The common filters must take the mask (a test that the fast path is used,
not only that it is harmless), and the ones it cannot read exactly must decline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.storage import pruning
from engine.storage.masks import mask

SCHEMA = pa.schema(
    [
        ("i8", pa.int8()),
        ("i32", pa.int32()),
        ("u16", pa.uint16()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
    ]
)

specials = st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.5, -0.0, 1e300])


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    count = draw(st.integers(1, 40))
    columns = []
    for field in SCHEMA:
        kind = field.type
        if pa.types.is_integer(kind):
            info = np.iinfo(kind.to_pandas_dtype())
            values = st.one_of(
                st.integers(max(int(info.min), -20), min(int(info.max), 20)),
                st.sampled_from([int(info.min), int(info.max)]),
            )
        else:
            values = st.one_of(st.integers(-20, 20).map(float), specials)
        column = draw(st.lists(st.one_of(st.none(), values), min_size=count, max_size=count))
        columns.append(pa.array(column, type=kind))
    return pa.table(columns, schema=SCHEMA)


literals = st.one_of(
    st.integers(-20, 20),
    st.integers(-20, 20),
    st.integers(-(2**40), 2**40),
    st.integers(-20, 20).map(lambda i: i + 0.5),
    st.floats(-30, 30, width=32).map(lambda f: pa.scalar(f, pa.float32())),
    st.floats(-30, 30, width=64),
    st.sampled_from([127, 128, -129, 65_535, 65_536, -1, 2**31, 0.1]),
)


@st.composite
def filters(draw: st.DrawFn, table: pa.Table, depth: int = 0) -> pc.Expression:
    """Comparisons of the table's columns, half of them with a value the column holds (so
    `<` and `<=` differ on its rows), joined by `and` / `or`."""
    if depth < 2 and draw(st.integers(0, 2)) == 0:
        left, right = draw(filters(table, depth + 1)), draw(filters(table, depth + 1))
        return left & right if draw(st.booleans()) else left | right
    name = draw(st.sampled_from(SCHEMA.names))
    held: list[Any] = [v for v in table.column(name).to_pylist() if v is not None]
    value: Any = draw(literals)
    pick_held: bool = draw(st.booleans())
    if held and pick_held:
        value = draw(st.sampled_from(held))
    field = pc.field(name)
    return {
        "==": field == value,
        "!=": field != value,
        "<": field < value,
        "<=": field <= value,
        ">": field > value,
        ">=": field >= value,
    }[draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))]


@settings(max_examples=300, deadline=None)
@given(tables(), st.data())
def test_the_mask_keeps_what_pyarrows_filter_keeps(table: pa.Table, data: st.DataObject) -> None:
    expression = data.draw(filters(table))
    node = pruning.parse(expression)
    if node is None:
        return  # not the mask's business: the scan runs the expression
    try:
        expected = table.filter(expression)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return  # pyarrow refuses the comparison: the scan reports its error
    keep = mask(node, table)
    if keep is None:
        return
    # (repr: NaN is not equal to itself, but prints the same)
    assert repr(table.filter(keep).to_pylist()) == repr(expected.to_pylist()), str(expression)


def test_the_common_filters_take_the_mask_and_unknown_literals_do_not() -> None:
    table = pa.table(
        {
            "customer": pa.array([1, 42, None, 42], pa.int32()),
            "amount": pa.array([0.5, 1.5, 2.0, None]),
            "f32": pa.array([0.1, 0.25, 0.5, 1.0], pa.float32()),
        }
    )

    def taken(expression: pc.Expression) -> list[dict[str, object]] | None:
        node = pruning.parse(expression)
        assert node is not None, str(expression)
        keep = mask(node, table)
        if keep is None:
            return None
        rows: list[dict[str, object]] = table.filter(keep).to_pylist()
        assert rows == table.filter(expression).to_pylist()
        return rows

    assert taken(pc.field("customer") == 42) is not None
    assert taken((pc.field("customer") == 42) & (pc.field("amount") > 1)) is not None
    assert taken((pc.field("customer") < 2) | (pc.field("amount") >= 1.5)) is not None
    assert taken(pc.field("f32") <= pa.scalar(0.25, pa.float32())) is not None
    # Declined: a float32 printed short (0.1 is not its value), past int32, a fraction
    # against an integer column.
    assert taken(pc.field("f32") == pa.scalar(0.1, pa.float32())) is None
    assert taken(pc.field("customer") == 2**40) is None
    assert taken(pc.field("customer") > 1.5) is None
