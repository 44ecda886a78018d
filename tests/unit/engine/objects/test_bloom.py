"""The primary-key bloom filter never answers "absent" for a key it holds, answers "present"
for about 1 % of other keys at the default size, agrees between its one-key and vectorized
paths for every key type, and reports damage to its bytes as `ObjectCorrupt`.

How: hypothesis builds filters from random keys of every key type of engine.schema (scalar
and compound, as `batch_keys` gives them) and checks every key is reported present, one by
one and vectorized, before and after a byte round trip. The false-positive rate is measured
on 200,000 keys absent from a filter of 100,000 (sequential and random int64, strings); the
bound is 1.5 %. `key_hash` of a Python value equals the vectorized hash of the same value
in an Arrow array, for the extremes of every integer width. Damage: every prefix, a flipped
bit at every header byte and at sampled body bytes, another magic and version, and k and the
reserved field out of range behind a valid checksum. Golden bytes are in test_golden.py.
"""

from __future__ import annotations

import datetime
import struct

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.objects import limits
from engine.objects.bloom import HEADER, BloomFilter, key_hash, key_hashes
from engine.objects.errors import ObjectCorrupt
from engine.schema import KEY_TYPES, TYPES, Column, Schema, batch_keys

_VALUES: dict[str, st.SearchStrategy[object]] = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "uint8": st.integers(0, 2**8 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1),
    "bool": st.booleans(),
    "string": st.text(max_size=20),
    "binary": st.binary(max_size=20),
    "date32": st.dates(),
    "timestamp[us]": st.datetimes(),
}
assert set(_VALUES) == set(KEY_TYPES)


@st.composite
def _keyed_batches(draw: st.DrawFn) -> tuple[Schema, pa.RecordBatch]:
    types = draw(st.lists(st.sampled_from(sorted(KEY_TYPES)), min_size=1, max_size=3))
    columns = [Column(f"k{index}", type_) for index, type_ in enumerate(types)]
    schema = Schema(columns, [column.name for column in columns])
    rows = draw(st.lists(st.tuples(*(_VALUES[t] for t in types)), min_size=0, max_size=60))
    arrays = [
        pa.array([row[index] for row in rows], TYPES[type_]) for index, type_ in enumerate(types)
    ]
    return schema, pa.RecordBatch.from_arrays(arrays, schema=schema.to_arrow())


@settings(max_examples=200, deadline=None)
@given(data=_keyed_batches())
def test_no_false_negatives_for_any_key_type(data: tuple[Schema, pa.RecordBatch]) -> None:
    schema, batch = data
    key_arrays = [batch.column(index) for index in schema.key_indexes]
    bloom = BloomFilter.build(key_arrays)
    assert bloom.key_count == batch.num_rows
    assert list(key_hashes(key_arrays)) == [key_hash(key) for key in batch_keys(schema, batch)]
    decoded = BloomFilter.from_bytes(bloom.to_bytes(), "t")
    for filter_ in (bloom, decoded):
        assert all(filter_.might_contain(key) for key in batch_keys(schema, batch))
        assert filter_.might_contain_many(key_arrays).all()


@pytest.mark.parametrize(
    ("arrow_type", "values"),
    [
        (pa.int8(), [-128, -1, 0, 127]),
        (pa.int16(), [-(2**15), 2**15 - 1]),
        (pa.int32(), [-(2**31), 2**31 - 1]),
        (pa.int64(), [-(2**63), -1, 2**63 - 1]),
        (pa.uint8(), [0, 255]),
        (pa.uint64(), [0, 2**63, 2**64 - 1]),
        (pa.bool_(), [False, True]),
        (pa.date32(), [datetime.date(1, 1, 1), datetime.date(1969, 12, 31)]),
        (pa.timestamp("us"), [datetime.datetime(1, 1, 1), datetime.datetime(9999, 12, 31)]),
        (pa.string(), ["", "\u00e9", "\U0010ffff"]),
        (pa.binary(), [b"", b"\x00\xff"]),
    ],
)
def test_one_key_and_vectorized_hashes_agree_at_the_extremes(
    arrow_type: pa.DataType, values: list[object]
) -> None:
    array = pa.array(values, arrow_type)
    assert list(key_hashes([array])) == [key_hash(value) for value in array.to_pylist()]


def test_the_same_integer_hashes_the_same_in_every_width() -> None:
    """A key is a value: -1 as int8 and as int64 hash alike (FORMAT.md "Key hash")."""
    hashes = {int(key_hashes([pa.array([-1], t)])[0]) for t in (pa.int8(), pa.int32())}
    assert hashes == {key_hash(-1)}


def _false_positive_rate(present: pa.Array, absent: pa.Array) -> float:
    bloom = BloomFilter.build([present])
    assert bloom.might_contain_many([present]).all()
    return float(bloom.might_contain_many([absent]).mean())


def test_false_positive_rate_at_the_default_size() -> None:
    rng = np.random.default_rng(7)
    sequential = _false_positive_rate(
        pa.array(np.arange(100_000, dtype=np.int64)),
        pa.array(np.arange(100_000, 300_000, dtype=np.int64)),
    )
    randoms = rng.integers(-(2**63), 2**63 - 1, 300_000, dtype=np.int64)
    random_rate = _false_positive_rate(pa.array(randoms[:100_000]), pa.array(randoms[100_000:]))
    strings = _false_positive_rate(
        pa.array([f"order-{i}" for i in range(100_000)]),
        pa.array([f"order-{i}" for i in range(100_000, 300_000)]),
    )
    for rate in (sequential, random_rate, strings):
        assert rate <= 0.015, (sequential, random_rate, strings)
    assert limits.BLOOM_BITS_PER_KEY_DEFAULT == 12


def test_sizes() -> None:
    empty = BloomFilter.build([pa.array([], pa.int64())])
    assert empty.bit_count == 64  # one word at least
    assert not empty.might_contain(0)
    one = BloomFilter.build([pa.array([5], pa.int64())], bits_per_key=12, hash_count=3)
    assert one.hash_count == 3
    assert one.might_contain(5)
    big = BloomFilter.build([pa.array(np.arange(1000, dtype=np.int64))])
    assert big.bit_count == 188 * 64  # 12,000 bits rounded up to whole words
    assert big.size_bytes == HEADER.size + 188 * 8


def _seal(data: bytearray) -> bytes:
    checksum = xxhash.xxh3_64_intdigest(bytes(data[:24] + data[32:]))
    data[24:32] = struct.pack("<Q", checksum)
    return bytes(data)


def test_damage_is_reported_with_the_source_name() -> None:
    data = BloomFilter.build([pa.array(np.arange(100, dtype=np.int64))]).to_bytes()
    for size in range(len(data)):
        with pytest.raises(ObjectCorrupt) as info:
            BloomFilter.from_bytes(data[:size], "blk-3")
        assert info.value.name == "blk-3"
    for index in [*range(HEADER.size), *range(HEADER.size, len(data), 7)]:
        damaged = bytearray(data)
        damaged[index] ^= 0x01
        with pytest.raises(ObjectCorrupt):
            BloomFilter.from_bytes(bytes(damaged), "blk-3")
    with pytest.raises(ObjectCorrupt, match="bad magic"):
        BloomFilter.from_bytes(b"XXXX" + data[4:], "x")
    with pytest.raises(ObjectCorrupt, match="unknown version"):
        BloomFilter.from_bytes(data[:4] + b"\x02" + data[5:], "x")
    with pytest.raises(ObjectCorrupt, match="bit count"):
        BloomFilter.from_bytes(_seal(bytearray(data) + bytes(8)), "x")
    for index, value in [(5, 0), (5, limits.BLOOM_HASH_COUNT_MAX + 1), (6, 1)]:
        damaged = bytearray(data)
        damaged[index] = value
        with pytest.raises(ObjectCorrupt, match="field out of range"):
            BloomFilter.from_bytes(_seal(damaged), "x")
