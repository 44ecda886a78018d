"""Zonemaps hold correct bounds for every column type, survive their byte round trip, report
damage as `ObjectCorrupt`, and `prune` never drops a block holding a matching row.

How: bounds are compared with pyarrow's own min/max on tables of all 15 engine types with
nulls, NaN and all-null columns; long strings check the cut-and-round-up rules at character
boundaries, 0xFF bytes and U+10FFFF. The pruning property runs under hypothesis: random tables
(ints with nulls, floats with NaN and infinities, strings with long shared prefixes, dates,
bools) split into random blocks, and random filters (comparisons, isin, is_null, is_valid,
and, or, not); for each block the brute-force answer is `block.filter(expr).num_rows > 0`,
and every such block must be among `prune`'s answer. Plain cases check that pruning does
prune. Damage: every prefix, a flipped bit at every byte, another magic or version, and field
rules broken behind a valid checksum. Golden bytes are in test_golden.py.
"""

from __future__ import annotations

import datetime
import itertools
import struct
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import SchemaError
from engine.objects import limits
from engine.objects.errors import ObjectCorrupt
from engine.objects.zonemap import HEADER, ColumnZone, Pruner, ZoneMap, prune
from engine.schema import TYPES

P = limits.ZONEMAP_STRING_PREFIX_BYTES


def all_types_table() -> pa.Table:
    rows = 4
    columns: dict[str, pa.Array] = {}
    samples: dict[str, list[Any]] = {
        "int8": [-128, 5, None, 127],
        "int16": [3, -7, 9, None],
        "int32": [None, 1, 2, 3],
        "int64": [-(2**63), 2**63 - 1, 0, None],
        "uint8": [0, 255, None, 1],
        "uint16": [1, 2, 3, 4],
        "uint32": [2**32 - 1, 0, 5, None],
        "uint64": [2**64 - 1, 0, None, 7],
        "float32": [1.5, -2.25, None, 3.0],
        "float64": [float("inf"), -1e300, 2.0, None],
        "bool": [True, None, True, True],
        "string": ["b", "a\u00e9", None, "zz"],
        "binary": [b"\x00", b"\xff", None, b"a"],
        "date32": [datetime.date(1, 1, 1), datetime.date(9999, 12, 31), None, None],
        "timestamp[us]": [datetime.datetime(2026, 11, 23, 1, 2, 3, 4), None, None, None],
    }
    for name, arrow_type in TYPES.items():
        columns[name.replace("[us]", "")] = pa.array(samples[name], arrow_type)
    table = pa.table(columns)
    assert table.num_rows == rows
    return table


def test_bounds_of_every_type_match_pyarrow() -> None:
    table = all_types_table()
    zonemap = ZoneMap.build(table)
    assert zonemap.row_count == 4
    for zone, column in zip(zonemap.columns, table.columns, strict=True):
        assert zone.null_count == column.null_count
        bounds = pc.min_max(column)
        assert zone.type in TYPES
        from engine.objects.values import to_scalar

        assert to_scalar(zone.min, zone.type) == bounds["min"], zone  # type: ignore[arg-type]
        assert to_scalar(zone.max, zone.type) == bounds["max"], zone  # type: ignore[arg-type]
    assert ZoneMap.from_bytes(zonemap.to_bytes(), "t") == zonemap


def test_nan_all_null_and_empty_columns_give_no_bounds() -> None:
    table = pa.table(
        {
            "f": pa.array([1.0, float("nan")]),
            "n": pa.array([None, None], pa.int64()),
            "s": pa.array(["a", "b"]),
        }
    )
    zonemap = ZoneMap.build(table)
    assert zonemap.column("f") == ColumnZone("f", "float64", 0, None, None, has_nan=True)
    assert zonemap.column("n") == ColumnZone("n", "int64", 2, None, None)
    assert str(zonemap.guarantee) == str(
        pc.field("n").is_null() & (pc.field("s") >= "a") & (pc.field("s") <= "b")
    )
    empty = ZoneMap.build(table.slice(0, 0))
    assert empty.row_count == 0
    assert prune([empty, zonemap], pc.field("s") == "a") == [1]
    assert ZoneMap.from_bytes(zonemap.to_bytes(), "t") == zonemap


@pytest.mark.parametrize(
    ("values", "low", "high", "high_truncated"),
    [
        (["a" * (P + 10), "b"], "a" * P, "b", False),
        (["a", "b" * (P + 1)], "a", "b" * (P - 1) + "c", True),
        # A 2-byte character straddling the cut is dropped whole, then rounded up.
        (["x", "x" * (P - 1) + "\u00e9zz"], "x", "x" * (P - 2) + "y", True),
        (["x", "\U0010ffff" * 20], "x", None, True),
        # U+D7FF + 1 is a surrogate: the next character is U+E000.
        (["x", "\ud7ff" * 30], "x", "\ud7ff" * 20 + "\ue000", True),
    ],
)
def test_long_strings_are_cut_and_the_max_rounded_up(
    values: list[str], low: str, high: str | None, high_truncated: bool
) -> None:
    zone = ZoneMap.build(pa.table({"s": pa.array(values)})).column("s")
    assert zone.min == low
    assert zone.max == high
    assert zone.max_truncated == high_truncated
    if high is not None:
        assert all(value <= high for value in values)
    assert all(value >= low for value in values)
    assert (
        ZoneMap.from_bytes(ZoneMap.build(pa.table({"s": values})).to_bytes(), "t").column("s")
        == zone
    )


def test_long_binaries_are_cut_and_the_max_rounded_up() -> None:
    zone = ZoneMap.build(pa.table({"b": pa.array([b"\x01" * 100, b"\x02\xff" + b"\xff" * 100])}))
    column = zone.column("b")
    assert column.min == b"\x01" * P
    assert column.max == b"\x03"
    only_ff = ZoneMap.build(pa.table({"b": pa.array([b"\xff" * (P + 1)])})).column("b")
    assert only_ff.max is None
    assert only_ff.max_truncated


def test_prune_prunes() -> None:
    blocks = [pa.table({"k": pa.array(range(lo, lo + 100), pa.int64())}) for lo in (0, 100, 200)]
    zonemaps = [ZoneMap.build(block) for block in blocks]
    k = pc.field("k")
    assert prune(zonemaps, k == 150) == [1]
    assert prune(zonemaps, k >= 199) == [1, 2]
    assert prune(zonemaps, (k < 50) | (k > 250)) == [0, 2]
    assert prune(zonemaps, k == 1000) == []
    assert prune(zonemaps, pc.scalar(True)) == [0, 1, 2]
    assert prune([], k == 1) == []
    pruner = Pruner(zonemaps)  # built once, asked many times: the same answers
    assert [pruner.prune(k == 150), pruner.prune(k >= 199)] == [[1], [1, 2]]
    with pytest.raises(SchemaError):
        prune(zonemaps, pc.field("nope") == 1)


# --- Pruning against brute force -------------------------------------------------------------

_SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("f", pa.float64()),
        ("s", pa.string()),
        ("d", pa.date32()),
        ("b", pa.bool_()),
    ]
)

_ints = st.one_of(st.none(), st.integers(-20, 20))
_floats = st.one_of(
    st.none(),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 0.0]),
    st.floats(-20, 20, allow_nan=False),
)
_strings = st.one_of(
    st.none(),
    st.text(alphabet="ab\u00e9", max_size=3),
    st.text(alphabet="ab", min_size=1, max_size=3).map(lambda tail: "p" * P + tail),
)
_dates = st.one_of(st.none(), st.dates(datetime.date(2000, 1, 1), datetime.date(2000, 1, 20)))
_bools = st.one_of(st.none(), st.booleans())
_LITERALS = {"i": _ints, "f": _floats, "s": _strings, "d": _dates, "b": _bools}


@st.composite
def _rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(0, 40))
    return [{name: draw(strategy) for name, strategy in _LITERALS.items()} for _ in range(count)]


@st.composite
def _comparison(draw: st.DrawFn) -> pc.Expression:
    name = draw(st.sampled_from(sorted(_LITERALS)))
    field = pc.field(name)
    kind = draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "isin", "null", "valid"]))
    if kind == "null":
        return field.is_null()
    if kind == "valid":
        return field.is_valid()
    literal_strategy = _LITERALS[name].filter(lambda value: value is not None)
    if kind == "isin":
        options = draw(st.lists(literal_strategy, min_size=1, max_size=3))
        return field.isin(pa.array(options, _SCHEMA.field(name).type))
    literal = pa.scalar(draw(literal_strategy), _SCHEMA.field(name).type)
    operators = {
        "==": field.__eq__,
        "!=": field.__ne__,
        "<": field.__lt__,
        "<=": field.__le__,
        ">": field.__gt__,
        ">=": field.__ge__,
    }
    expression: pc.Expression = operators[kind](literal)
    return expression


def _filters() -> st.SearchStrategy[pc.Expression]:
    return st.recursive(
        _comparison(),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(lambda pair: pair[0] & pair[1]),
            st.tuples(inner, inner).map(lambda pair: pair[0] | pair[1]),
            inner.map(lambda expression: ~expression),
        ),
        max_leaves=5,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_rows(), cuts=st.lists(st.integers(0, 40), max_size=6), filter_=_filters())
def test_prune_never_drops_a_matching_block(
    rows: list[dict[str, Any]], cuts: list[int], filter_: pc.Expression
) -> None:
    table = pa.Table.from_pylist(rows, schema=_SCHEMA)
    bounds = sorted({0, len(rows), *(cut for cut in cuts if cut <= len(rows))})
    blocks = [table.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)]
    if not blocks:
        blocks = [table]
    zonemaps = [ZoneMap.build(block) for block in blocks]
    # The zonemaps that prune are the ones read back from bytes, as the engine does.
    decoded = [ZoneMap.from_bytes(zonemap.to_bytes(), "t") for zonemap in zonemaps]
    assert decoded == zonemaps
    kept = set(prune(decoded, filter_))
    for index, block in enumerate(blocks):
        if block.filter(filter_).num_rows:
            assert index in kept, (index, str(filter_), block.to_pylist())


# --- Damage ---------------------------------------------------------------------------------


def _sealed(body_and_header: bytearray) -> bytes:
    """Recompute the checksum of a (deliberately wrong) zonemap: a writer bug behind a valid
    checksum."""
    checksum = xxhash.xxh3_64_intdigest(bytes(body_and_header[:16] + body_and_header[24:]))
    body_and_header[16:24] = struct.pack("<Q", checksum)
    return bytes(body_and_header)


def test_damage_is_reported_with_the_source_name() -> None:
    data = ZoneMap.build(all_types_table()).to_bytes()
    for size in range(len(data)):
        with pytest.raises(ObjectCorrupt) as info:
            ZoneMap.from_bytes(data[:size], "blk-9")
        assert info.value.name == "blk-9"
    for index in range(len(data)):
        damaged = bytearray(data)
        damaged[index] ^= 0x10
        with pytest.raises(ObjectCorrupt):
            ZoneMap.from_bytes(bytes(damaged), "blk-9")
    with pytest.raises(ObjectCorrupt, match="bad magic"):
        ZoneMap.from_bytes(b"XXZM" + data[4:], "x")
    with pytest.raises(ObjectCorrupt, match="unknown version"):
        ZoneMap.from_bytes(data[:4] + b"\x02" + data[5:], "x")
    with pytest.raises(ObjectCorrupt, match="bytes after"):
        ZoneMap.from_bytes(_sealed(bytearray(data) + b"\x00"), "x")
    with pytest.raises(ObjectCorrupt, match="zonemap longer"):
        ZoneMap.from_bytes(bytes(limits.ZONEMAP_BYTES_MAX + 1), "x")


def _one_column(zone_bytes: bytes, row_count: int = 10) -> bytes:
    header = HEADER.pack(b"TEZM", 1, 0, 1, row_count, 0)
    return _sealed(bytearray(header + zone_bytes))


@pytest.mark.parametrize(
    ("zone_bytes", "reason"),
    [
        (b"\x01\x00x\x05int64" + b"\x20" + bytes(8), "field out of range"),  # unknown flag
        (b"\x01\x00x\x05int64" + b"\x00" + struct.pack("<Q", 11), "field out of range"),
        (b"\x01\x00x\x05int64" + b"\x04" + bytes(8), "field out of range"),  # NaN on ints
        (b"\x01\x00x\x05int64" + b"\x08" + bytes(8), "field out of range"),  # truncated int
        (b"\x01\x00x\x04int9" + b"\x00" + bytes(8), "field out of range"),  # unknown type
        (b"\x00\x00\x05int64" + b"\x00" + bytes(8), "field out of range"),  # empty name
        (  # min > max
            b"\x01\x00x\x05int64\x03" + bytes(8) + struct.pack("<qq", 5, 4),
            "field out of range",
        ),
        (b"\x01\x00x\x04bool\x01" + bytes(8) + b"\x02", "bad value"),
        (b"\x01\x00x\x04int8\x01" + bytes(8) + struct.pack("<q", 128), "bad value"),
        (b"\x01\x00x\x07float64\x01" + bytes(8) + struct.pack("<d", float("nan")), "bad value"),
        (b"\x01\x00x\x07float32\x01" + bytes(8) + struct.pack("<d", 0.1), "bad value"),
        (b"\x01\x00x\x06string\x01" + bytes(8) + b"\x01\x00\xff", "bad value"),
        (b"\x01\x00x\x06string\x01" + bytes(8) + b"\x09\x00ab", "runs past the end"),
    ],
)
def test_field_rules_behind_a_valid_checksum(zone_bytes: bytes, reason: str) -> None:
    with pytest.raises(ObjectCorrupt, match=reason):
        ZoneMap.from_bytes(_one_column(zone_bytes), "x")
