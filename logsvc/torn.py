"""What a power loss can leave at the end of an append-only log file (pure, no I/O).

Shared by logsvc's shard store (`logsvc/store/records.py`) and tae_driver's file backend
(`tae_driver/backends/segment.py`), which decide the same question: is the first bad record
in a log file a torn tail (bytes that could never have been acknowledged, cut on open) or
corruption (refuse to open, name it, change nothing; ARCHITECTURE.md §11)?

The model (chaos-plan §4.5, LevelDB `log_format.md`, ALICE): a writer appends a group of
records with one `write` and acknowledges them only after one `fdatasync`. Bytes synced
before are never damaged by a power loss. Of the last, unsynced group write, the disk may
hold any prefix (the file ends inside a record), and pages or sectors of it that were never
written read as zeros (the size was committed, the data blocks were not). Anything else (a
flipped byte in a record that is whole, garbage followed by valid records) is not what a
power loss does, so it is corruption; and a bad record after which valid records follow is
corruption unless something proves those records were never acknowledged either (the shard
store's per-record durable-index hints; the file backend's v1 frames carry no such hint,
so there it always is).

This module holds the sector arithmetic both readers use; each reader applies it to its own
record format.
"""

from __future__ import annotations

SECTOR_BYTES = 512
"""The unit in which a disk tears a write: a whole zeroed sector is the mark of unwritten
space, where a few zero bytes may be just data."""
_ZERO_SECTOR = bytes(SECTOR_BYTES)


def has_zero_sector(data: bytes | memoryview, lo_bytes: int, hi_bytes: int) -> bool:
    """Whether `data[lo_bytes:hi_bytes]` contains a whole, sector-aligned run of zero bytes."""
    assert 0 <= lo_bytes <= hi_bytes <= len(data)
    sector = -(-lo_bytes // SECTOR_BYTES) * SECTOR_BYTES
    while sector + SECTOR_BYTES <= hi_bytes:
        if data[sector : sector + SECTOR_BYTES] == _ZERO_SECTOR:
            return True
        sector += SECTOR_BYTES
    return False


def zero_tail_start(data: bytes | memoryview, lo_bytes: int) -> int:
    """The offset, at or after `lo_bytes`, from which every byte to the end of `data` is
    zero (`len(data)` when the last byte is not zero)."""
    assert 0 <= lo_bytes <= len(data)
    return lo_bytes + len(bytes(data[lo_bytes:]).rstrip(b"\0"))


def is_zero_filled_tail(data: bytes | memoryview, lo_bytes: int) -> bool:
    """Whether the bytes from `lo_bytes` to the end look like space a power loss left
    unwritten: all zero from `lo_bytes`, or zero from some point on through at least one
    whole sector that ends the file (a committed size whose last blocks were never written)."""
    start = zero_tail_start(data, lo_bytes)
    if start == len(data):
        return False
    return start == lo_bytes or has_zero_sector(data, start, len(data))
