"""The byte formats of engine/objects/FORMAT.md match their golden vectors, and the fields
sit where FORMAT.md says.

How: today's encoders, given the inputs of golden_objects.py, must produce exactly the bytes
checked in under golden/ (written by another process, so the encoding is deterministic);
decoding them gives the inputs back. A second implementation written here from FORMAT.md
alone (the key hash, the bloom word, the headers and checksums) must agree with the code. A
failure means the format changed: bump its version and add vectors, do not rewrite these.
"""

from __future__ import annotations

import datetime
import struct
from pathlib import Path

import pyarrow as pa
import pytest
import xxhash

import engine.objects
from engine.objects.blockfile import BlockObjectReader, read_meta, write_object
from engine.objects.bloom import BloomFilter, key_hash
from engine.objects.deltafile import BlockDeleteSummary, _decode_meta
from engine.objects.store import MemoryObjectStore
from engine.objects.zonemap import ColumnZone, ZoneMap
from tests.unit.engine.objects.golden_objects import (
    GOLDEN,
    GOLDEN_DIR,
    SCHEMA,
    block_rows_v1,
    from_hex,
)

M64 = (1 << 64) - 1


def golden(name: str) -> bytes:
    return from_hex((GOLDEN_DIR / f"{name}.hex").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_encoders_write_exactly_the_golden_bytes(name: str) -> None:
    assert GOLDEN[name]() == golden(name)


# --- From FORMAT.md alone -------------------------------------------------------------------


def splitmix64(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def test_key_hash_table_of_format_md() -> None:
    table = {
        0: 0xE220A8397B1DCDAF,
        1: 0x910A2DEC89025CC1,
        -1: 0xE4D971771B652C20,
        "a": 0xE6C632B61E964E1F,
        (1, "a"): 0x32366E5E034CE39F,
    }
    for key, expected in table.items():
        assert key_hash(key) == expected, key
    assert key_hash(-1) == splitmix64(2**64 - 1)
    assert key_hash("a") == xxhash.xxh3_64_intdigest(b"a")
    fold = splitmix64((splitmix64(1) * 0xC2B2AE3D27D4EB4F + xxhash.xxh3_64_intdigest(b"a")) & M64)
    assert key_hash((1, "a")) == fold
    # Integers of every width, bool, dates and timestamps are their 64-bit value.
    assert key_hash(True) == key_hash(1)
    assert key_hash(datetime.date(1970, 1, 2)) == key_hash(1)
    assert key_hash(datetime.datetime(1970, 1, 1, 0, 0, 0, 1)) == key_hash(1)
    assert key_hash(b"a") == key_hash("a")


def test_bloom_vector_by_hand() -> None:
    data = golden("bloom_v1")
    magic, version, k, reserved, bits, keys, checksum = struct.unpack_from("<4sBBHQQQ", data)
    assert (magic, version, k, reserved, bits, keys) == (b"TEBF", 1, 5, 0, 64, 3)
    assert checksum == xxhash.xxh3_64_intdigest(data[:24] + data[32:])
    (word,) = struct.unpack_from("<Q", data, 32)
    expected = 0
    for key in (1, 2, 3):
        hashed = splitmix64(key)
        assert ((hashed >> 32) * 1) >> 32 == 0  # one word: every key chooses word 0
        for index in range(5):
            expected |= 1 << ((hashed >> (6 * index)) & 63)
    assert word == expected
    bloom = BloomFilter.from_bytes(data, "golden")
    assert all(bloom.might_contain(key) for key in (1, 2, 3))


def test_zonemap_vector_by_hand() -> None:
    data = golden("zonemap_v1")
    magic, version, reserved, columns, rows, checksum = struct.unpack_from("<4sBBHQQ", data)
    assert (magic, version, reserved, columns, rows) == (b"TEZM", 1, 0, 2, 3)
    assert checksum == xxhash.xxh3_64_intdigest(data[:16] + data[24:])
    body = data[24:]
    id_column = b"\x02\x00id\x05int64\x03" + struct.pack("<Qqq", 0, 1, 3)
    note_column = b"\x04\x00note\x06string\x03" + struct.pack("<Q", 1) + b"\x01\x00a\x01\x00b"
    assert body == id_column + note_column
    assert ZoneMap.from_bytes(data, "golden") == ZoneMap(
        3,
        (
            ColumnZone("id", "int64", 0, 1, 3),
            ColumnZone("note", "string", 1, "a", "b"),
        ),
    )


def test_block_meta_vector_by_hand() -> None:
    data = golden("block_meta_v1")
    fields = struct.unpack_from("<4sBBHQIQ", data)
    magic, version, level, reserved, table_id, blocks, checksum = fields
    assert (magic, version, level, reserved, table_id, blocks) == (b"TEBO", 1, 1, 0, 7, 1)
    assert checksum == xxhash.xxh3_64_intdigest(data[:20] + data[28:])
    at = 28
    assert data[at : at + 6] == b"\x01\x00\x02\x00id"  # 1 key column: "id"
    at += 6
    rows, zonemap_len = struct.unpack_from("<II", data, at)
    assert rows == 2
    at += 8
    zonemap = ZoneMap.from_bytes(data[at : at + zonemap_len], "golden")
    assert [zone.name for zone in zonemap.columns] == ["id", "note", "__commit_ts"]
    at += zonemap_len
    assert struct.unpack_from("<qq", data, at) == (1, 2)  # key range [1, 2]
    at += 16
    (bloom_len,) = struct.unpack_from("<I", data, at)
    bloom = BloomFilter.from_bytes(data[at + 4 : at + 4 + bloom_len], "golden")
    assert at + 4 + bloom_len == len(data)
    assert bloom.key_count == 2
    # The same bytes are what a written object carries in its footer.
    store = MemoryObjectStore()
    write_object(store, "o", schema=SCHEMA, table_id=7, level=1, data=block_rows_v1())
    meta = read_meta(store, "o")
    assert meta.to_bytes() == data
    assert (meta.blocks[0].key_min, meta.blocks[0].key_max) == (1, 2)
    with BlockObjectReader(store, "o") as reader:
        assert reader.read_block(0).equals(block_rows_v1())


def test_delta_meta_vector_by_hand() -> None:
    data = golden("delta_meta_v1")
    magic, version, r8, r16, table_id, blocks, checksum = struct.unpack_from("<4sBBHQIQ", data)
    assert (magic, version, r8, r16, table_id, blocks) == (b"TEDL", 1, 0, 0, 2, 2)
    assert checksum == xxhash.xxh3_64_intdigest(data[:20] + data[28:])
    assert data[28:] == struct.pack("<QIQQQIQQ", 1, 3, 10, 12, 9, 1, 20, 20)
    assert _decode_meta(data, "golden") == (
        2,
        [BlockDeleteSummary(1, 3, 10, 12), BlockDeleteSummary(9, 1, 20, 20)],
    )


def test_arrow_array_hashing_matches_the_golden_filter() -> None:
    rebuilt = BloomFilter.build([pa.chunked_array([[1], [2, 3]], pa.int64())])
    assert rebuilt.to_bytes() == golden("bloom_v1")


def _example_bytes(heading: str) -> bytes:
    """The leading hex pairs of each line of the first code block after `heading` in
    FORMAT.md: the worked example, byte for byte."""
    text = (Path(engine.objects.__file__).parent / "FORMAT.md").read_text()
    block = text[text.index(heading) :].split("```")[1]
    data = bytearray()
    for line in block.splitlines():
        for token in line.split():
            if len(token) != 2 or any(c not in "0123456789abcdef" for c in token):
                break
            data.append(int(token, 16))
    return bytes(data)


@pytest.mark.parametrize(
    ("heading", "name"),
    [
        ("Worked example, `bloom_v1.hex`", "bloom_v1"),
        ("Worked example, `zonemap_v1.hex`", "zonemap_v1"),
        ("`delta_meta_v1.hex` (84 bytes)", "delta_meta_v1"),
    ],
)
def test_format_md_worked_examples_are_the_golden_bytes(heading: str, name: str) -> None:
    assert _example_bytes(heading) == golden(name)


def test_format_md_block_meta_example_header() -> None:
    assert _example_bytes("Layout of `block_meta_v1.hex`")[:34] == golden("block_meta_v1")[:34]
