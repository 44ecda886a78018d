"""The record codec matches its golden vectors and FORMAT.md, and reports every kind of damage.

Golden: encoding fixed inputs gives exactly the bytes in `golden/*_record_v1.hex`, and the
header fields sit where FORMAT.md says. A failure means the format changed: bump the version
and add vectors rather than edit these. Corruption: every prefix of a record, a flipped byte
in each header field, in the checksum and in the body, a zeroed tail and all-zero bytes are
rejected with the reason FORMAT.md's table promises; resealed (checksum recomputed) records
with a bad magic, version, flags, type 0 or DSN rule are rejected by those checks. A short
hypothesis round trip covers arbitrary entries.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tae_driver import limits, record
from tae_driver.checksum import xxh3_64
from tae_driver.errors import CorruptRecord
from tae_driver.record import EntriesRecord, SkipRecord, decode, encode_record, encode_skip

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text().strip())


def reseal(payload: bytes) -> bytes:
    """Recompute the checksum so that only the semantic checks can object."""
    return struct.pack("<Q", xxh3_64(payload[8:])) + payload[8:]


def patched(payload: bytes, offset: int, value: bytes) -> bytes:
    return payload[:offset] + value + payload[offset + len(value) :]


def reason_of(payload: bytes) -> str:
    with pytest.raises(CorruptRecord) as info:
        decode(payload)
    return info.value.reason


# --- golden vectors -------------------------------------------------------------------------


def test_entries_vector_encodes_exactly_and_decodes_back() -> None:
    encoded = encode_record(7, 5, [b"hello", b""])
    assert encoded == golden("entries_record_v1.hex")
    decoded = decode(encoded)
    assert decoded == EntriesRecord(7, 5, (b"hello", b""))
    assert isinstance(decoded, EntriesRecord)
    assert decoded.end_dsn == 8


def test_marker_vector_is_a_record_with_no_entries() -> None:
    encoded = encode_record(10, 9, [])
    assert encoded == golden("marker_record_v1.hex")
    marker = decode(encoded)
    assert marker == EntriesRecord(10, 9, ())
    assert isinstance(marker, EntriesRecord)
    assert marker.end_dsn == 9  # an empty range


def test_skip_vector_is_sorted_pairs() -> None:
    encoded = encode_skip([(5, 12), (3, 40)])
    assert encoded == golden("skip_record_v1.hex")
    assert decode(encoded) == SkipRecord(((3, 40), (5, 12)))


def test_header_fields_are_where_format_md_says() -> None:
    data = golden("entries_record_v1.hex")
    assert int.from_bytes(data[0:8], "little") == xxh3_64(data[8:])
    assert data[8:12] == b"TWAL"
    assert data[12] == record.VERSION == 1
    assert data[13] == record.RecordType.ENTRIES
    assert data[14:16] == b"\0\0"
    assert int.from_bytes(data[16:20], "little") == len(data) == 53
    assert int.from_bytes(data[20:24], "little") == 2
    assert int.from_bytes(data[24:32], "little") == 7
    assert int.from_bytes(data[32:40], "little") == 5
    assert data[40:] == b"\x05\0\0\0hello\0\0\0\0"
    assert len(data[:40]) == limits.RECORD_HEADER_BYTES


# --- corruption -----------------------------------------------------------------------------

SAMPLE = encode_record(1000, 990, [b"alpha", b"", b"gamma" * 10])


def test_every_truncation_is_rejected() -> None:
    for size in range(len(SAMPLE)):
        reason = reason_of(SAMPLE[:size])
        expected = (
            record.REASON_SHORT if size < limits.RECORD_HEADER_BYTES else record.REASON_LENGTH
        )
        assert reason == expected, size


def test_flipped_length_byte_is_a_length_error() -> None:
    for offset in range(record.OFFSET_LENGTH, record.OFFSET_LENGTH + 4):
        flipped = patched(SAMPLE, offset, bytes([SAMPLE[offset] ^ 0x01]))
        assert reason_of(flipped) == record.REASON_LENGTH


@pytest.mark.parametrize("offset", [0, 3, 7])
def test_flipped_checksum_byte_is_a_checksum_error(offset: int) -> None:
    flipped = patched(SAMPLE, offset, bytes([SAMPLE[offset] ^ 0x80]))
    assert reason_of(flipped) == record.REASON_CHECKSUM


def test_every_flipped_header_or_body_byte_fails_the_checksum() -> None:
    length_field = range(record.OFFSET_LENGTH, record.OFFSET_LENGTH + 4)
    for offset in range(8, len(SAMPLE)):
        if offset in length_field:
            continue
        flipped = patched(SAMPLE, offset, bytes([SAMPLE[offset] ^ 0x10]))
        assert reason_of(flipped) == record.REASON_CHECKSUM, offset


def test_zeroed_tail_fails_the_checksum() -> None:
    for tail in (1, 5, len(SAMPLE) - limits.RECORD_HEADER_BYTES):
        zeroed = SAMPLE[:-tail] + bytes(tail)
        assert reason_of(zeroed) == record.REASON_CHECKSUM


def test_all_zero_bytes_never_decode() -> None:
    assert reason_of(bytes(64)) == record.REASON_LENGTH
    # Even with a consistent length and checksum, type 0 is invalid.
    zeros = bytearray(64)
    zeros[record.OFFSET_LENGTH : record.OFFSET_LENGTH + 4] = (64).to_bytes(4, "little")
    zeros[record.OFFSET_MAGIC : record.OFFSET_MAGIC + 4] = record.MAGIC.to_bytes(4, "little")
    zeros[record.OFFSET_VERSION] = record.VERSION
    assert reason_of(reseal(bytes(zeros))) == record.REASON_TYPE


@pytest.mark.parametrize(
    ("offset", "value", "reason"),
    [
        (record.OFFSET_MAGIC, b"XWAL", record.REASON_MAGIC),
        (record.OFFSET_VERSION, b"\x02", record.REASON_VERSION),
        (record.OFFSET_TYPE, b"\x00", record.REASON_TYPE),
        (record.OFFSET_TYPE, b"\x07", record.REASON_TYPE),
        (record.OFFSET_FLAGS, b"\x01\x00", record.REASON_FLAGS),
        (record.OFFSET_COUNT, (2).to_bytes(4, "little"), record.REASON_BODY),
        (record.OFFSET_COUNT, (4).to_bytes(4, "little"), record.REASON_BODY),
        (record.OFFSET_START_DSN, (0).to_bytes(8, "little"), record.REASON_DSN),
        (record.OFFSET_SAFE_DSN, (1000).to_bytes(8, "little"), record.REASON_DSN),
        (record.OFFSET_TYPE, b"\x02", record.REASON_DSN),  # an ENTRIES body read as SKIP
    ],
)
def test_resealed_semantic_damage_is_reported(offset: int, value: bytes, reason: str) -> None:
    assert reason_of(reseal(patched(SAMPLE, offset, value))) == reason


def test_skip_records_must_be_sorted_and_sized() -> None:
    skip = encode_skip([(1, 2), (3, 4)])
    body = limits.RECORD_HEADER_BYTES
    swapped = skip[:body] + skip[body + 16 : body + 32] + skip[body : body + 16]
    assert reason_of(reseal(swapped)) == record.REASON_BODY
    with_dsn = patched(skip, record.OFFSET_START_DSN, (5).to_bytes(8, "little"))
    assert reason_of(reseal(with_dsn)) == record.REASON_DSN


def test_trailing_bytes_after_the_entries_are_rejected() -> None:
    longer = SAMPLE + b"xx"
    longer = patched(longer, record.OFFSET_LENGTH, len(longer).to_bytes(4, "little"))
    assert reason_of(reseal(longer)) == record.REASON_BODY


def test_an_entry_running_past_the_end_is_rejected() -> None:
    offset = limits.RECORD_HEADER_BYTES
    bad = patched(SAMPLE, offset, (10_000).to_bytes(4, "little"))
    assert reason_of(reseal(bad)) == record.REASON_BODY


def test_encode_refuses_what_decode_would_reject() -> None:
    with pytest.raises(AssertionError):
        encode_record(5, 5, [b"x"])  # safe DSN must be below the record's own DSNs
    with pytest.raises(AssertionError):
        encode_record(1, 0, [b""] * (limits.RECORD_ENTRIES_MAX + 1))
    with pytest.raises(AssertionError):
        encode_skip([])


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(1, 2**40),
    gap=st.integers(1, 2**20),
    entries=st.lists(st.binary(max_size=64), max_size=limits.RECORD_ENTRIES_MAX),
)
def test_round_trip(start: int, gap: int, entries: list[bytes]) -> None:
    safe = max(0, start - gap)
    decoded = decode(encode_record(start, safe, entries))
    assert decoded == EntriesRecord(start, safe, tuple(entries))
