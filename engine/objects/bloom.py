"""A bloom filter on primary keys: does a block possibly hold this key?

Why (issue 14, seed `004_*` "Indexing and Metadata Management"): `get(key)` and the
primary-key dedupe of every insert must not read a block that cannot hold the key. The zonemap
rules out blocks whose key range misses the key; the bloom filter rules out ~99 % of the rest.

Shape: a *register-blocked* bloom filter (Putze, Sanders, Singler, "Cache-, Hash- and
Space-Efficient Bloom Filters", 2007): each key chooses one 64-bit word and sets `k` bits in
it. A lookup touches one word (one cache line); the build is one vectorized pass over the
keys and one `numpy.bitwise_or.at` (the classic layout scatters `k` bits per key over the
whole filter and builds 3-6x slower in numpy, measured). Its cost: at the same bits per key it
has more false positives than the classic filter, so the default is 12 bits per key (about
1.0 %, `limits.BLOOM_BITS_PER_KEY_DEFAULT`) where a classic filter would use 10.

The key hash (FORMAT.md "Key hash") is defined on values, not on Arrow arrays, so that
`might_contain(key)` with a key as engine.schema produces it (a scalar, or a tuple for a
compound key) agrees bit for bit with the vectorized build:

* integers of every width, bool, date32 (days) and timestamp[us] (microseconds) are taken as
  a 64-bit two's complement integer and mixed (`mix64`), vectorized in numpy;
* string (its UTF-8 bytes) and binary are hashed with XXH3-64, one call per value (about
  0.3 µs each; int keys are the fast path);
* a compound key folds its columns' hashes left to right: h = mix64(h * FOLD + c).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import xxhash

from engine.objects import limits
from engine.objects.errors import ObjectCorrupt

MAGIC = b"TEBF"
VERSION = 1
HEADER = struct.Struct("<4sBBHQQQ")
"""magic, version, hash_count, reserved, bit_count, key_count, checksum (32 bytes)."""
CHECKSUM_OFFSET = 24

MASK64 = (1 << 64) - 1
MIX_ADD = 0x9E3779B97F4A7C15
MIX_MUL_1 = 0xBF58476D1CE4E5B9
MIX_MUL_2 = 0x94D049BB133111EB
FOLD_MUL = 0xC2B2AE3D27D4EB4F

REASON_SHORT = "bloom filter shorter than its header"
REASON_MAGIC = "bloom filter: bad magic"
REASON_VERSION = "bloom filter: unknown version"
REASON_LENGTH = "bloom filter: bit count does not match its length"
REASON_CHECKSUM = "bloom filter: checksum mismatch"
REASON_FIELDS = "bloom filter: field out of range"

U64Array = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]

_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH_DATETIME = datetime.datetime(1970, 1, 1)
_MICROSECOND = datetime.timedelta(microseconds=1)


# --- The key hash ----------------------------------------------------------------------------


def mix64(value: int) -> int:
    """The 64-bit mixer (FORMAT.md): SplitMix64's step and output function (Steele, Lea,
    Flood, "Fast Splittable Pseudorandom Number Generators", 2014). A bijection; the added
    constant keeps 0, the commonest key, away from the fixed point 0 of the multiplies."""
    value = (value + MIX_ADD) & MASK64
    value = ((value ^ (value >> 30)) * MIX_MUL_1) & MASK64
    value = ((value ^ (value >> 27)) * MIX_MUL_2) & MASK64
    return value ^ (value >> 31)


def _mix64_array(values: U64Array) -> U64Array:
    """`mix64` over an array, in place (the array is a private copy)."""
    np.add(values, np.uint64(MIX_ADD), out=values)
    np.bitwise_xor(values, values >> np.uint64(30), out=values)
    np.multiply(values, np.uint64(MIX_MUL_1), out=values)
    np.bitwise_xor(values, values >> np.uint64(27), out=values)
    np.multiply(values, np.uint64(MIX_MUL_2), out=values)
    np.bitwise_xor(values, values >> np.uint64(31), out=values)
    return values


def value_hash(value: object) -> int:
    """The hash of one key column value (a Python value as pyarrow's `as_py` gives it)."""
    if isinstance(value, (bool, int)):
        return mix64(int(value) & MASK64)
    if isinstance(value, str):
        return int(xxhash.xxh3_64_intdigest(value.encode()))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return int(xxhash.xxh3_64_intdigest(bytes(value)))
    if isinstance(value, datetime.datetime):  # before date: a datetime is a date
        assert value.tzinfo is None, "timestamp[us] keys are naive (no time zone)"
        return mix64(((value - _EPOCH_DATETIME) // _MICROSECOND) & MASK64)
    if isinstance(value, datetime.date):
        return mix64((value - _EPOCH_DATE).days & MASK64)
    raise AssertionError(f"not a key value: {value!r}")


def key_hash(key: object) -> int:
    """The hash of one key: a scalar, or a tuple for a compound key (engine.schema)."""
    parts = key if isinstance(key, tuple) else (key,)
    assert parts, "an empty key"
    hashed = value_hash(parts[0])
    for part in parts[1:]:
        hashed = mix64((hashed * FOLD_MUL + value_hash(part)) & MASK64)
    return hashed


def _column_hashes(array: pa.Array | pa.ChunkedArray) -> U64Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    assert array.null_count == 0, "key columns have no nulls"
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.fromiter(
            (xxhash.xxh3_64_intdigest(s.encode()) for s in array.to_pylist()),
            dtype=np.uint64,
            count=len(array),
        )
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return np.fromiter(
            (xxhash.xxh3_64_intdigest(b) for b in array.to_pylist()),
            dtype=np.uint64,
            count=len(array),
        )
    if pa.types.is_date32(kind):
        array = array.cast(pa.int32())
    elif pa.types.is_timestamp(kind):
        assert kind.unit == "us", kind
        array = array.cast(pa.int64())
    if pa.types.is_boolean(kind):
        values: U64Array = array.to_numpy(zero_copy_only=False).astype(np.uint64)
    elif pa.types.is_signed_integer(array.type):
        values = array.to_numpy().astype(np.int64).view(np.uint64)  # astype copies
    else:
        assert pa.types.is_unsigned_integer(array.type), f"not a key type: {kind}"
        values = array.to_numpy().astype(np.uint64)  # astype copies
    return _mix64_array(values)


def key_hashes(key_arrays: Sequence[pa.Array | pa.ChunkedArray]) -> U64Array:
    """`key_hash` of every row of the key columns (one array per key column, key order)."""
    assert key_arrays, "a key has at least one column"
    hashes = _column_hashes(key_arrays[0])
    for array in key_arrays[1:]:
        assert len(array) == len(hashes)
        np.multiply(hashes, np.uint64(FOLD_MUL), out=hashes)
        np.add(hashes, _column_hashes(array), out=hashes)
        _mix64_array(hashes)
    return hashes


# --- The filter -------------------------------------------------------------------------------


def _masks(hashes: U64Array, hash_count: int) -> U64Array:
    """The k bits each hash sets in its word: bit (h >> 6i) & 63 for i < k."""
    masks = np.zeros(len(hashes), dtype=np.uint64)
    bits = np.empty(len(hashes), dtype=np.uint64)  # one temporary, reused: memory traffic
    for index in range(hash_count):
        np.right_shift(hashes, np.uint64(6 * index), out=bits)
        np.bitwise_and(bits, np.uint64(63), out=bits)
        np.left_shift(np.uint64(1), bits, out=bits)
        np.bitwise_or(masks, bits, out=masks)
    return masks


def _word_indexes(hashes: U64Array, word_count: int) -> npt.NDArray[np.int64]:
    """The word of each hash: its high 32 bits scaled to [0, word_count) (Lemire's
    multiply-shift range reduction: no division)."""
    indexes = hashes >> np.uint64(32)
    np.multiply(indexes, np.uint64(word_count), out=indexes)
    np.right_shift(indexes, np.uint64(32), out=indexes)
    return indexes.view(np.int64)  # < word_count < 2**32: the index type numpy wants


@dataclass(frozen=True, slots=True, eq=False)
class BloomFilter:
    """`words` (uint64, little-endian on disk), `hash_count` bits per key, built from
    `key_count` keys. Immutable once built; thread-safe to query."""

    hash_count: int
    key_count: int
    words: U64Array

    @classmethod
    def build(
        cls,
        key_arrays: Sequence[pa.Array | pa.ChunkedArray],
        *,
        bits_per_key: int = limits.BLOOM_BITS_PER_KEY_DEFAULT,
        hash_count: int = limits.BLOOM_HASH_COUNT_DEFAULT,
    ) -> BloomFilter:
        """A filter of the rows of `key_arrays` (one array per key column, in key order)."""
        assert 1 <= hash_count <= limits.BLOOM_HASH_COUNT_MAX
        assert bits_per_key >= 1
        hashes = key_hashes(key_arrays)
        key_count = len(hashes)
        word_count = max(1, -(-key_count * bits_per_key // 64))
        assert word_count * 8 <= limits.BLOOM_BYTES_MAX, "more keys than a filter may hold"
        words = np.zeros(word_count, dtype=np.uint64)
        np.bitwise_or.at(words, _word_indexes(hashes, word_count), _masks(hashes, hash_count))
        words.setflags(write=False)
        return cls(hash_count, key_count, words)

    @property
    def bit_count(self) -> int:
        return len(self.words) * 64

    @property
    def size_bytes(self) -> int:
        return HEADER.size + len(self.words) * 8

    def might_contain(self, key: Any) -> bool:
        """False: the key is certainly not among the filter's keys. True: it may be."""
        return self.might_contain_hash(key_hash(key))

    def might_contain_hash(self, hashed: int) -> bool:
        """`might_contain` of a key whose `key_hash` is `hashed` (one hash asks many filters)."""
        word = int(self.words[((hashed >> 32) * len(self.words)) >> 32])
        mask = 0
        for index in range(self.hash_count):
            mask |= 1 << ((hashed >> (6 * index)) & 63)
        return word & mask == mask

    def might_contain_many(self, key_arrays: Sequence[pa.Array | pa.ChunkedArray]) -> BoolArray:
        """`might_contain` of every row of the key columns, as a numpy bool array."""
        hashes = key_hashes(key_arrays)
        masks = _masks(hashes, self.hash_count)
        words = self.words[_word_indexes(hashes, len(self.words))]
        result: BoolArray = (words & masks) == masks
        return result

    # --- Bytes (FORMAT.md "Bloom filter") ------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = self.words.astype("<u8", copy=False).tobytes()
        header = HEADER.pack(MAGIC, VERSION, self.hash_count, 0, self.bit_count, self.key_count, 0)
        checksum = xxhash.xxh3_64_intdigest(header[:CHECKSUM_OFFSET] + body)
        return header[:CHECKSUM_OFFSET] + struct.pack("<Q", checksum) + body

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, source: str) -> BloomFilter:
        """Decode, or raise `ObjectCorrupt(source, REASON_*)`; `source` names the object the
        bytes come from."""
        view = memoryview(data)
        if len(view) < HEADER.size:
            raise ObjectCorrupt(source, REASON_SHORT, len(view))
        magic, version, hash_count, reserved, bit_count, key_count, checksum = HEADER.unpack_from(
            view
        )
        if magic != MAGIC:
            raise ObjectCorrupt(source, REASON_MAGIC, 0)
        if version != VERSION:
            raise ObjectCorrupt(source, REASON_VERSION, 4)
        if bit_count % 64 or bit_count == 0 or bit_count // 8 != len(view) - HEADER.size:
            raise ObjectCorrupt(source, REASON_LENGTH, 8)
        if len(view) > HEADER.size + limits.BLOOM_BYTES_MAX:
            raise ObjectCorrupt(source, REASON_LENGTH, 8)
        body = view[HEADER.size :]
        hasher = xxhash.xxh3_64()
        hasher.update(view[:CHECKSUM_OFFSET])
        hasher.update(body)
        if hasher.intdigest() != checksum:
            raise ObjectCorrupt(source, REASON_CHECKSUM, CHECKSUM_OFFSET)
        if not 1 <= hash_count <= limits.BLOOM_HASH_COUNT_MAX or reserved:
            raise ObjectCorrupt(source, REASON_FIELDS, 5)
        words = np.frombuffer(body, dtype="<u8").astype(np.uint64)
        words.setflags(write=False)
        return cls(hash_count, key_count, words)
