"""The driver's record codec: what one backend record (one group commit) holds.

Why it looks like this (reference/matrixone-wal.md §2.2, §2.5; layout in FORMAT.md here):

* A record carries `start_dsn`, `count` and `safe_dsn` because replay needs all three: DSNs of
  a record are contiguous, and `safe_dsn` (the contiguous durable watermark when the record was
  dispatched) is the proof replay uses to tell a truncated prefix from a lost tail (§2.5).
* A skip record lists (DSN, backend LSN) pairs, never DSNs alone: after a restart the new
  writer reuses DSNs, and only the LSN tells the stale copy from the new one (§2.7 Q7).
* A record with zero entries is a *safe marker*: it only publishes a `safe_dsn`. The driver
  writes one when it must truncate and no later record proves the truncated DSNs durable
  (see truncation.py).
* Every record has a magic number, a version, a length and an XXH3 checksum over everything
  after the checksum; type 0 is invalid so zero-filled bytes never decode (LevelDB log
  format, shared/STYLE.md). Little-endian throughout; no pickle.

Pure functions only; `decode` raises `CorruptRecord(reason, offset)` with one of the REASON_*
strings below, so tests and callers can tell a torn payload from a bad checksum.
`decode_unsplit` is `decode` less its last check, the walk of the entries' size prefixes
(`EntriesBody.split`): for readers that walk many bodies at once without a bytes object per
entry (spark_jobs/entries.py, issue 23).
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from tae_driver import limits
from tae_driver.checksum import xxh3_64
from tae_driver.errors import CorruptRecord

MAGIC = 0x4C415754  # b"TWAL" read as a little-endian u32
VERSION = 1

_HEADER = struct.Struct("<QIBBHIIQQ")
assert _HEADER.size == limits.RECORD_HEADER_BYTES
_ENTRY_SIZE = struct.Struct("<I")
assert _ENTRY_SIZE.size == limits.ENTRY_SIZE_PREFIX_BYTES
_PAIR = struct.Struct("<QQ")

# Byte offsets of header fields (FORMAT.md); corruption reports point at them.
OFFSET_CHECKSUM = 0
OFFSET_MAGIC = 8
OFFSET_VERSION = 12
OFFSET_TYPE = 13
OFFSET_FLAGS = 14
OFFSET_LENGTH = 16
OFFSET_COUNT = 20
OFFSET_START_DSN = 24
OFFSET_SAFE_DSN = 32

REASON_SHORT = "short"
REASON_LENGTH = "length"
REASON_CHECKSUM = "checksum"
REASON_MAGIC = "magic"
REASON_VERSION = "version"
REASON_TYPE = "type"
REASON_FLAGS = "flags"
REASON_BODY = "body"
REASON_DSN = "dsn"

_U64_MAX = (1 << 64) - 1


class RecordType(enum.IntEnum):
    INVALID = 0
    ENTRIES = 1
    SKIP = 2


@dataclass(frozen=True, slots=True)
class EntriesRecord:
    """Entries with DSNs [start_dsn, start_dsn + count - 1]; count 0 is a safe marker."""

    start_dsn: int
    safe_dsn: int
    entries: tuple[bytes, ...]

    @property
    def count(self) -> int:
        return len(self.entries)

    @property
    def end_dsn(self) -> int:
        """Last DSN held; `start_dsn - 1` for a marker (an empty range)."""
        return self.start_dsn + len(self.entries) - 1


@dataclass(frozen=True, slots=True)
class SkipRecord:
    """(DSN, LSN) pairs of discarded records, sorted; each names one stale copy."""

    pairs: tuple[tuple[int, int], ...]


DecodedRecord = EntriesRecord | SkipRecord


def encode_record(start_dsn: int, safe_dsn: int, entries: Sequence[bytes]) -> bytes:
    """Encode entries with DSNs starting at `start_dsn`. `safe_dsn < start_dsn` always: the
    watermark at dispatch cannot include the record's own DSNs."""
    assert start_dsn >= 1
    assert 0 <= safe_dsn < start_dsn
    assert len(entries) <= limits.RECORD_ENTRIES_MAX
    assert start_dsn + len(entries) - 1 <= _U64_MAX
    parts: list[bytes] = []
    for entry in entries:
        parts.append(_ENTRY_SIZE.pack(len(entry)))
        parts.append(bytes(entry))
    body = b"".join(parts)
    length = limits.RECORD_HEADER_BYTES + len(body)
    assert length <= limits.RECORD_BYTES_MAX
    return _seal(RecordType.ENTRIES, len(entries), start_dsn, safe_dsn, body)


def encode_skip(pairs: Sequence[tuple[int, int]]) -> bytes:
    """Encode a skip record naming (DSN, LSN) of each discarded record copy."""
    ordered = sorted(pairs)
    assert 1 <= len(ordered) <= limits.SKIP_PAIRS_MAX
    for dsn, lsn in ordered:
        assert 1 <= dsn <= _U64_MAX
        assert 1 <= lsn <= _U64_MAX
    assert all(a != b for a, b in itertools.pairwise(ordered))
    body = b"".join(_PAIR.pack(dsn, lsn) for dsn, lsn in ordered)
    return _seal(RecordType.SKIP, len(ordered), 0, 0, body)


def _seal(record_type: RecordType, count: int, start_dsn: int, safe_dsn: int, body: bytes) -> bytes:
    length = limits.RECORD_HEADER_BYTES + len(body)
    header = _HEADER.pack(0, MAGIC, VERSION, record_type, 0, length, count, start_dsn, safe_dsn)
    unsealed = header[8:] + body
    return struct.pack("<Q", xxh3_64(unsealed)) + unsealed


def payload_checksum(payload: bytes) -> int:
    """The checksum field of an encoded record: a cheap identity for duplicate detection."""
    assert len(payload) >= 8
    return int.from_bytes(payload[:8], "little")


def decode(payload: bytes) -> DecodedRecord:
    """Decode one record, checking, in this order: size, length field, checksum, magic,
    version, flags, type, body and DSN fields (FORMAT.md). Raises `CorruptRecord` at the
    first failure."""
    decoded = decode_unsplit(payload)
    if isinstance(decoded, EntriesBody):
        return decoded.split()
    return decoded


@dataclass(frozen=True, slots=True)
class EntriesBody:
    """An ENTRIES record checked up to its entries (`decode_unsplit`): every check of `decode`
    but the last, the walk of its entries' size prefixes, which `split` does. A reader that
    walks many records' bodies at once (spark_jobs/entries.py) takes these, so that no bytes
    object is made per entry; when its walk finds a body that does not parse, `split` raises
    the `CorruptRecord` that `decode` would have raised."""

    start_dsn: int
    safe_dsn: int
    count: int
    payload: bytes
    """The whole record: entry `i`'s size prefix is at RECORD_HEADER_BYTES for i = 0, each
    entry's bytes follow its prefix, and the last ends at the payload's end."""

    @property
    def end_dsn(self) -> int:
        return self.start_dsn + self.count - 1

    def split(self) -> EntriesRecord:
        """The entries, or `CorruptRecord(REASON_BODY, offset)` when the body does not parse
        to exactly `count` entries."""
        return _split(self.payload, self.count, self.start_dsn, self.safe_dsn)


def decode_unsplit(payload: bytes) -> EntriesBody | SkipRecord:
    """`decode` without the walk of an ENTRIES record's body (`EntriesBody.split`, the last
    check): the same checks in the same order, the same `CorruptRecord` for each."""
    size = len(payload)
    if size < limits.RECORD_HEADER_BYTES:
        raise CorruptRecord(REASON_SHORT, size, f"{size} bytes, header needs 40")
    (checksum, magic, version, raw_type, flags, length, count, start_dsn, safe_dsn) = (
        _HEADER.unpack_from(payload, 0)
    )
    if length != size:
        raise CorruptRecord(REASON_LENGTH, OFFSET_LENGTH, f"field says {length}, have {size}")
    if size > limits.RECORD_BYTES_MAX:
        raise CorruptRecord(REASON_LENGTH, OFFSET_LENGTH, f"{size} > {limits.RECORD_BYTES_MAX}")
    if checksum != xxh3_64(memoryview(payload)[8:]):
        raise CorruptRecord(REASON_CHECKSUM, OFFSET_CHECKSUM)
    if magic != MAGIC:
        raise CorruptRecord(REASON_MAGIC, OFFSET_MAGIC, f"{magic:#x}")
    if version != VERSION:
        raise CorruptRecord(REASON_VERSION, OFFSET_VERSION, f"version {version}")
    if flags != 0:
        raise CorruptRecord(REASON_FLAGS, OFFSET_FLAGS, f"{flags:#x}")
    if raw_type == RecordType.ENTRIES:
        if count > limits.RECORD_ENTRIES_MAX:
            raise CorruptRecord(REASON_BODY, OFFSET_COUNT, f"{count} entries")
        if start_dsn < 1 or start_dsn + count - 1 > _U64_MAX:
            raise CorruptRecord(REASON_DSN, OFFSET_START_DSN, f"start DSN {start_dsn}")
        if safe_dsn >= start_dsn:
            raise CorruptRecord(
                REASON_DSN, OFFSET_SAFE_DSN, f"safe {safe_dsn} >= start {start_dsn}"
            )
        return EntriesBody(start_dsn, safe_dsn, count, payload)
    if raw_type == RecordType.SKIP:
        return _decode_skip(payload, count, start_dsn, safe_dsn)
    raise CorruptRecord(REASON_TYPE, OFFSET_TYPE, f"type {raw_type}")


def _split(payload: bytes, count: int, start_dsn: int, safe_dsn: int) -> EntriesRecord:
    entries: list[bytes] = []
    append = entries.append
    unpack_size = _ENTRY_SIZE.unpack_from
    prefix = _ENTRY_SIZE.size
    offset = limits.RECORD_HEADER_BYTES
    size = len(payload)
    # One turn per entry: one bound test per entry; a size prefix past the end is found by
    # the (rare) unpack error.
    for _ in range(count):
        try:
            (entry_size,) = unpack_size(payload, offset)
        except struct.error:
            raise CorruptRecord(REASON_BODY, offset, "entry size runs past the end") from None
        end = offset + prefix + entry_size
        if end > size:
            raise CorruptRecord(REASON_BODY, offset, "entry runs past the end")
        append(payload[offset + prefix : end])
        offset = end
    if offset != size:
        raise CorruptRecord(REASON_BODY, offset, f"{size - offset} trailing bytes")
    return EntriesRecord(start_dsn, safe_dsn, tuple(entries))


def _decode_skip(payload: bytes, count: int, start_dsn: int, safe_dsn: int) -> SkipRecord:
    if start_dsn != 0:
        raise CorruptRecord(REASON_DSN, OFFSET_START_DSN, "skip record with a start DSN")
    if safe_dsn != 0:
        raise CorruptRecord(REASON_DSN, OFFSET_SAFE_DSN, "skip record with a safe DSN")
    if not 1 <= count <= limits.SKIP_PAIRS_MAX:
        raise CorruptRecord(REASON_BODY, OFFSET_COUNT, f"{count} pairs")
    if len(payload) != limits.RECORD_HEADER_BYTES + _PAIR.size * count:
        raise CorruptRecord(REASON_BODY, limits.RECORD_HEADER_BYTES, "size is not 16 * count")
    pairs = tuple(
        _PAIR.unpack_from(payload, limits.RECORD_HEADER_BYTES + i * _PAIR.size)
        for i in range(count)
    )
    previous = (0, 0)
    for i, pair in enumerate(pairs):
        if pair[0] < 1 or pair[1] < 1 or pair <= previous:
            raise CorruptRecord(
                REASON_BODY, limits.RECORD_HEADER_BYTES + i * _PAIR.size, f"pair {pair}"
            )
        previous = pair
    return SkipRecord(pairs)
