"""The fast zonemap pruner (engine/storage/pruning.py) never drops a block that holds a
matching row, and reads only the filters it understands.

How: hypothesis draws a table of an int64, an int32 and a float64 column (nulls and NaN
included), cuts it into blocks with real zonemaps (engine.objects.zonemap), draws filters of
comparisons with numbers joined by and/or, and checks every block holding a row that pyarrow
itself says matches is kept. Filters it must not read (strings, is_in, invert, NaN, huge
integers, odd field names, names with spaces around them) parse to None. Float32 literals,
which pyarrow prints short, never prune a block holding their exact value.
"""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.objects.zonemap import ZoneMap
from engine.storage import pruning

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int32()), ("f", pa.float64())])

ints = st.integers(min_value=-50, max_value=50)
rows = st.lists(
    st.tuples(
        st.one_of(st.none(), ints),
        st.one_of(st.none(), ints),
        st.one_of(st.none(), st.floats(-60, 60), st.just(float("nan"))),
    ),
    min_size=1,
    max_size=60,
)


@st.composite
def filters(draw: st.DrawFn, depth: int = 0) -> pc.Expression:
    if depth < 2 and draw(st.booleans()):
        left, right = draw(filters(depth + 1)), draw(filters(depth + 1))
        return left & right if draw(st.booleans()) else left | right
    column = draw(st.sampled_from(["a", "b", "f"]))
    value: float = draw(ints)
    if draw(st.booleans()):
        value = value + 0.5
    op = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="]))
    field = pc.field(column)
    return {
        "==": field == value,
        "!=": field != value,
        "<": field < value,
        "<=": field <= value,
        ">": field > value,
        ">=": field >= value,
    }[op]


@settings(max_examples=400, deadline=None)
@given(rows, st.integers(1, 8), filters())
def test_no_block_holding_a_match_is_pruned(
    values: list[tuple[int | None, int | None, float | None]], size: int, filter_: pc.Expression
) -> None:
    table = pa.table(
        [pa.array([v[i] for v in values], type=SCHEMA.field(i).type) for i in range(3)],
        schema=SCHEMA,
    )
    blocks = [table.slice(start, size) for start in range(0, table.num_rows, size)]
    node = pruning.parse(filter_)
    assert node is not None, str(filter_)
    keep = pruning.may_match(node, pruning.Bounds([ZoneMap.build(b) for b in blocks]))
    for block, kept in zip(blocks, keep.tolist(), strict=True):
        if block.filter(filter_).num_rows:
            assert kept, f"{filter_} pruned a block with a match: {block.to_pylist()}"


float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.none(), float32s), min_size=1, max_size=40),
    st.integers(1, 8),
    st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
    st.one_of(float32s, st.integers(-(2**31), 2**31).map(lambda i: float(np.float32(i)))),
    st.data(),
)
def test_float32_literals_printed_short_prune_no_match(
    values: list[float | None], size: int, op: str, literal: float, data: st.DataObject
) -> None:
    """A float32 scalar prints as its shortest text (`0.1`, `123456790`), not its value: a
    block holding exactly that float32 was pruned before the literal got its slack."""
    present = [v for v in values if v is not None]
    held: bool = data.draw(st.booleans())
    if present and held:
        chosen: float = data.draw(st.sampled_from(present))
        literal = chosen  # a value some block holds
    table = pa.table({"x": pa.array(values, pa.float32())})
    scalar = pa.scalar(literal, pa.float32())
    field = pc.field("x")
    filter_ = {
        "==": field == scalar,
        "!=": field != scalar,
        "<": field < scalar,
        "<=": field <= scalar,
        ">": field > scalar,
        ">=": field >= scalar,
    }[op]
    blocks = [table.slice(start, size) for start in range(0, table.num_rows, size)]
    node = pruning.parse(filter_)
    if node is None:
        return  # not read (an infinite literal after the cast): prunes nothing
    keep = pruning.may_match(node, pruning.Bounds([ZoneMap.build(b) for b in blocks]))
    for block, kept in zip(blocks, keep.tolist(), strict=True):
        if block.filter(filter_).num_rows:
            assert kept, f"{filter_} pruned a block with a match: {block.to_pylist()}"


def test_it_prunes_what_it_reads() -> None:
    blocks = [pa.table({"a": pa.array(range(i * 10, i * 10 + 10), pa.int64())}) for i in range(5)]
    bounds = pruning.Bounds([ZoneMap.build(b) for b in blocks])

    def kept(expression: pc.Expression) -> list[bool]:
        node = pruning.parse(expression)
        assert node is not None
        mask: list[bool] = pruning.may_match(node, bounds).tolist()
        return mask

    assert kept((pc.field("a") >= 15) & (pc.field("a") < 25)) == [False, True, True, False, False]
    assert kept(pc.field("a") == 42) == [False, False, False, False, True]
    assert kept((pc.field("a") < 5) | (pc.field("a") > 44)) == [True, False, False, False, True]
    assert kept(pc.field("unknown") == 1) == [True] * 5


def test_filters_it_does_not_read_parse_to_none() -> None:
    for expression in (
        pc.field("s") == "x",
        pc.field("a").isin([1, 2]),
        ~(pc.field("a") < 3),
        pc.field("f") == float("nan"),
        pc.field("f") < float("inf"),
        pc.field("a") == pa.scalar(2**60, pa.int64()),
        pc.field("weird name") == 3,
        pc.field(" a") == 3,  # printed "( a == 3)": not column a
        pc.field("a ") < 3,  # printed "(a  < 3)"
        (pc.field("b") > 0) & (pc.field("a\t") == 3),
        pc.field("d") > datetime.date(2020, 1, 1),
        pc.field("a").is_null(),
        pc.field("a") + 1 > 3,
    ):
        assert pruning.parse(expression) is None, str(expression)
