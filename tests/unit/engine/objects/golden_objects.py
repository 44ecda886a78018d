"""Inputs of the golden vectors of engine/objects/FORMAT.md, and their writer.

`python -m tests.unit.engine.objects.golden_objects` rewrites `golden/*.hex` from these
inputs; do that only with a format change (which bumps its version) and say so in the commit.
test_golden.py checks that today's encoders produce exactly the checked-in bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from engine.objects.blockfile import COMMIT_TS_COLUMN, object_schema, write_object
from engine.objects.bloom import BloomFilter
from engine.objects.deltafile import BlockDeleteSummary, encode_meta
from engine.objects.store import MemoryObjectStore
from engine.objects.zonemap import ZoneMap
from engine.schema import Column, Schema

GOLDEN_DIR = Path(__file__).parent / "golden"

SCHEMA = Schema([Column("id", "int64"), Column("note", "string", nullable=True)], ["id"])


def bloom_v1() -> bytes:
    """The filter of int64 keys 1, 2, 3 at the defaults (12 bits per key, k = 5): one word."""
    return BloomFilter.build([pa.array([1, 2, 3], pa.int64())]).to_bytes()


def zonemap_v1() -> bytes:
    """id int64 [3, 1, 2]; note string ["b", null, "a"]."""
    table = pa.table({"id": pa.array([3, 1, 2], pa.int64()), "note": pa.array(["b", None, "a"])})
    return ZoneMap.build(table).to_bytes()


def block_rows_v1() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "note": pa.array(["x", None]),
            COMMIT_TS_COLUMN: pa.array([7, 7], pa.uint64()),
        },
        schema=object_schema(SCHEMA),
    )


def block_meta_v1() -> bytes:
    """The metadata of an L1 object of table 7: rows (1, "x"), (2, null) at commit_ts 7."""
    store = MemoryObjectStore()
    meta = write_object(store, "o", schema=SCHEMA, table_id=7, level=1, data=block_rows_v1())
    return meta.to_bytes()


def delta_meta_v1() -> bytes:
    """Table 2; block 1 has 3 deletes committed between ts 10 and 12; block 9 has 1 at 20."""
    return encode_meta(2, [BlockDeleteSummary(1, 3, 10, 12), BlockDeleteSummary(9, 1, 20, 20)])


GOLDEN: dict[str, Callable[[], bytes]] = {
    "bloom_v1": bloom_v1,
    "zonemap_v1": zonemap_v1,
    "block_meta_v1": block_meta_v1,
    "delta_meta_v1": delta_meta_v1,
}


def to_hex(data: bytes) -> str:
    """32 bytes a line, space-separated pairs: diffable."""
    lines = [data[at : at + 32].hex(" ") for at in range(0, len(data), 32)]
    return "\n".join(lines) + "\n"


def from_hex(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


def main() -> None:
    GOLDEN_DIR.mkdir(exist_ok=True)
    for name, make in GOLDEN.items():
        (GOLDEN_DIR / f"{name}.hex").write_text(to_hex(make()))


if __name__ == "__main__":
    main()
