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
store's per-record durable-index hints, the file backend's v2 frames' durable-LSN hints;
its v1 frames carry none, so there it always is).

This module holds the sector arithmetic both readers use; each reader applies it to its own
record format.
"""

from __future__ import annotations

SECTOR_BYTES = 512
"""The unit in which a disk tears a write: a whole zeroed sector is the mark of unwritten
space, where a few zero bytes may be just data."""
_ZERO_SECTOR = bytes(SECTOR_BYTES)

PAGE_BYTES = 4096
"""The unit in which the page cache writes a file back: a page of an unsynced write that
never reached the disk reads as zeros from a page boundary (to the next one, or to the end
of the file when the size was committed)."""

ZERO_RUN_BYTES_MIN = 8
"""The shortest zero run taken for unwritten space when it is not a whole sector: a flipped
byte cannot zero 8 bytes, and a record or frame begins with an 8-byte checksum that is all
zero with probability 2^-64."""


def has_zero_sector(data: bytes | memoryview, lo_bytes: int, hi_bytes: int) -> bool:
    """Whether `data[lo_bytes:hi_bytes]` contains a whole, sector-aligned run of zero bytes."""
    assert 0 <= lo_bytes <= hi_bytes <= len(data)
    sector = -(-lo_bytes // SECTOR_BYTES) * SECTOR_BYTES
    while sector + SECTOR_BYTES <= hi_bytes:
        if data[sector : sector + SECTOR_BYTES] == _ZERO_SECTOR:
            return True
        sector += SECTOR_BYTES
    return False


def has_zero_page(data: bytes | memoryview, lo_bytes: int, hi_bytes: int) -> bool:
    """Whether `data[lo_bytes:hi_bytes]` contains a whole, page-aligned run of zero bytes:
    a page of a write that never reached the disk, and far less likely than a zero sector to
    be a record's own data."""
    assert 0 <= lo_bytes <= hi_bytes <= len(data)
    page = -(-lo_bytes // PAGE_BYTES) * PAGE_BYTES
    while page + PAGE_BYTES <= hi_bytes:
        if not any(data[page : page + PAGE_BYTES]):
            return True
        page += PAGE_BYTES
    return False


def zero_tail_start(data: bytes | memoryview, lo_bytes: int) -> int:
    """The offset, at or after `lo_bytes`, from which every byte to the end of `data` is
    zero (`len(data)` when the last byte is not zero)."""
    assert 0 <= lo_bytes <= len(data)
    return lo_bytes + len(bytes(data[lo_bytes:]).rstrip(b"\0"))


def is_lost_page_tail(data: bytes | memoryview, lo_bytes: int) -> bool:
    """Whether the file ends in the zeroed rest of a page that never reached the disk: every
    byte from a page boundary at or after `lo_bytes` to the end is zero, at least
    `ZERO_RUN_BYTES_MIN` of them (shorter than a sector, so `is_zero_filled_tail` misses it)."""
    start = zero_tail_start(data, lo_bytes)
    boundary = -(-start // PAGE_BYTES) * PAGE_BYTES
    return boundary + ZERO_RUN_BYTES_MIN <= len(data)


def is_lost_page_rest(data: bytes | memoryview, lo_bytes: int, hi_bytes: int) -> bool:
    """Whether `data[lo_bytes:hi_bytes]` starts with the zeroed rest of a page that never
    reached the disk: zero from `lo_bytes` (not page-aligned; an aligned lost page holds a
    whole zero sector) to the next page boundary, at least `ZERO_RUN_BYTES_MIN` bytes. The
    page straddled the synced length: its synced part is on disk, the rest reads as zeros,
    and the later pages of the same unsynced write may have been written back."""
    assert 0 <= lo_bytes <= hi_bytes <= len(data)
    boundary = -(-lo_bytes // PAGE_BYTES) * PAGE_BYTES
    if boundary == lo_bytes or boundary > hi_bytes or boundary - lo_bytes < ZERO_RUN_BYTES_MIN:
        return False
    return not any(data[lo_bytes:boundary])


def starts_with_zero_run(data: bytes | memoryview, lo_bytes: int) -> bool:
    """Whether `data` holds at least `ZERO_RUN_BYTES_MIN` zero bytes from `lo_bytes` on: a
    record or frame header that was never written (its checksum cannot be zero)."""
    hi_bytes = lo_bytes + ZERO_RUN_BYTES_MIN
    return hi_bytes <= len(data) and not any(data[lo_bytes:hi_bytes])


def is_zero_filled_tail(data: bytes | memoryview, lo_bytes: int) -> bool:
    """Whether the bytes from `lo_bytes` to the end look like space a power loss left
    unwritten: all zero from `lo_bytes`, or zero from some point on through at least one
    whole sector that ends the file (a committed size whose last blocks were never written)."""
    start = zero_tail_start(data, lo_bytes)
    if start == len(data):
        return False
    return start == lo_bytes or has_zero_sector(data, start, len(data))
