"""The recovery scan tells a torn tail from corruption exactly as FORMAT.md's table says.

Each case builds segment bytes by hand (header + records with chosen durable hints), damages
them the way a power loss or a bad disk would, and asserts what `scan_segment` reports: how
many records it keeps and whether it calls the damage a torn tail or corruption.
"""

from __future__ import annotations

import pytest

from logsvc.store import records
from logsvc.torn import PAGE_BYTES

PAYLOAD_MAX = 1 << 20


def segment(first: int, payloads: list[bytes], hints: list[int], term: int = 1) -> bytes:
    data = bytearray(records.encode_segment_header(first))
    for offset, (payload, hint) in enumerate(zip(payloads, hints, strict=True)):
        records.encode_record_into(data, first + offset, term, hint, payload)
    return bytes(data)


def offsets_of(data: bytes, first: int) -> list[int]:
    return list(
        records.scan_segment(data, first, newest=False, payload_bytes_max=PAYLOAD_MAX).offsets
    )


def scan(data: bytes, first: int = 1, newest: bool = True) -> records.SegmentScan:
    return records.scan_segment(data, first, newest=newest, payload_bytes_max=PAYLOAD_MAX)


BASE = segment(1, [b"a" * 100, b"b" * 100, b"c" * 100, b"d" * 100], [0, 0, 2, 2])


def test_whole_segment_scans_clean() -> None:
    result = scan(BASE)
    assert (result.count, result.torn_reason, result.end_bytes) == (4, None, len(BASE))


@pytest.mark.parametrize("cut", [1, 20, 39, 40, 41, 139])
def test_partial_last_record_is_a_torn_tail(cut: int) -> None:
    result = scan(BASE[:-cut] if cut < 140 else BASE)
    assert result.count == 3
    assert result.torn_reason is not None
    assert result.end_bytes == offsets_of(BASE, 1)[3]


@pytest.mark.parametrize("tail", [b"\xff" * 7, bytes(range(256)) * 3, bytes(4096) + b"\x01"])
def test_garbage_after_the_last_record_is_a_torn_tail(tail: bytes) -> None:
    result = scan(BASE + tail)
    assert (result.count, result.end_bytes, result.zero_tail_bytes) == (4, len(BASE), 0)
    assert result.torn_reason is not None


@pytest.mark.parametrize("zeros", [1, 39, 40, 4096])
def test_zeros_from_the_last_record_to_the_end_are_zero_ahead_space(zeros: int) -> None:
    # The store's zero-ahead space (FORMAT.md): cut on open like a torn tail, not reported
    # as one; a sealed segment never holds it, so there it is corruption.
    result = scan(BASE + bytes(zeros))
    assert (result.count, result.end_bytes, result.zero_tail_bytes) == (4, len(BASE), zeros)
    assert result.torn_reason is None
    with pytest.raises(records.ScanCorruption):
        scan(BASE + bytes(zeros), newest=False)
    for verify in (True, False):
        read = records.read_segment_records(BASE + bytes(zeros), 1, newest=True, verify=verify)
        assert (read.end, read.end_offset_bytes, len(read.records)) == (
            records.END_CLEAN,
            len(BASE),
            4,
        )


@pytest.mark.parametrize("field_offset", [0, 8, 16, 50])  # checksum, length, index, payload
def test_damage_in_a_sealed_segment_is_corruption(field_offset: int) -> None:
    damaged = bytearray(BASE)
    damaged[offsets_of(BASE, 1)[1] + field_offset] ^= 0x10
    with pytest.raises(records.ScanCorruption) as raised:
        scan(bytes(damaged), newest=False)
    assert raised.value.offset_bytes == offsets_of(BASE, 1)[1]


def test_damage_before_a_record_that_saw_it_durable_is_corruption() -> None:
    # Record 2 is damaged; record 3 says entries up to 2 were durable when it was written.
    damaged = bytearray(BASE)
    damaged[offsets_of(BASE, 1)[1] + 60] ^= 0x01
    with pytest.raises(records.ScanCorruption, match="durable"):
        scan(bytes(damaged))


def test_garbage_in_the_middle_without_zeroed_sectors_is_corruption() -> None:
    data = segment(1, [b"a" * 100] * 4, [0, 0, 0, 0])  # hints never reach the bad record
    damaged = bytearray(data)
    damaged[offsets_of(data, 1)[1] + 45] ^= 0x01
    with pytest.raises(records.ScanCorruption, match="valid records follow"):
        scan(bytes(damaged))


def test_a_zeroed_sector_before_later_unsynced_records_is_a_torn_tail() -> None:
    # Delayed allocation: pages of an unsynced write reached the disk out of order.
    payloads = [bytes([65 + i]) * 300 for i in range(8)]
    data = segment(1, payloads, [0] * 8)
    damaged = bytearray(data)
    damaged[1024:1536] = bytes(512)  # one whole zeroed sector inside records 3..4
    result = scan(bytes(damaged))
    offsets = offsets_of(data, 1)
    bad = max(i for i, off in enumerate(offsets) if off <= 1024)
    assert result.count == bad
    assert result.torn_reason is not None and "unsynced" in result.torn_reason
    assert result.torn_records_dropped > 0


def test_a_zeroed_sector_in_synced_data_is_still_corruption() -> None:
    payloads = [bytes([65 + i]) * 300 for i in range(8)]
    data = segment(1, payloads, [0, 0, 0, 0, 0, 5, 5, 5])
    damaged = bytearray(data)
    damaged[1024:1536] = bytes(512)
    with pytest.raises(records.ScanCorruption, match="durable"):
        scan(bytes(damaged))


def test_torn_header_of_newest_segment_is_reported_as_torn() -> None:
    with pytest.raises(records.TornHeader):
        scan(BASE[:20])
    with pytest.raises(records.TornHeader):
        scan(bytes(32) + bytes(100))


def test_bad_header_followed_by_a_whole_record_is_corruption() -> None:
    damaged = bytearray(BASE)
    damaged[3] ^= 0x01
    with pytest.raises(records.ScanCorruption, match="magic"):
        scan(bytes(damaged))


def test_unknown_version_is_corruption_naming_the_version() -> None:
    import struct

    body = struct.pack("<8sHHIQ", b"LOGSVSEG", 2, 32, 0, 1)
    header = body + struct.pack("<Q", records.xxh3(body))
    with pytest.raises(records.ScanCorruption, match="unknown segment format version 2"):
        scan(header + BASE[32:], newest=False)


def test_header_first_index_must_match_the_name() -> None:
    with pytest.raises(records.ScanCorruption, match="file name"):
        scan(BASE, first=5, newest=False)


def test_type_zero_and_reserved_bytes_are_rejected() -> None:
    record = bytearray(records.encode_record(1, 1, 0, b"x"))
    assert "type 0" in str(records.parse_record(bytes(40), 0, PAYLOAD_MAX))
    record[13] = 1
    assert isinstance(records.parse_record(bytes(record), 0, PAYLOAD_MAX), str)


def test_length_over_the_limit_is_rejected_before_reading_the_payload() -> None:
    record = records.encode_record(1, 1, 0, b"x" * 100)
    assert "exceeds the limit" in str(records.parse_record(record, 0, 50))


def test_the_zeroed_rest_of_a_straddling_page_is_a_torn_tail_not_corruption() -> None:
    """Power loss: the page holding the synced length was never written back, so it reads
    as zeros from that length to its end (fewer than a sector's worth), while later pages of
    the same unsynced write reached the disk. Their durable hints stay below the damaged
    record: a torn tail (cut there), not corruption (found by tests/unit/store/
    test_journal_crash.py's zeros power losses)."""
    data = bytearray(records.encode_segment_header(1))
    offsets = []
    index = 1
    while len(data) < 3 * PAGE_BYTES:
        offsets.append(len(data))
        data += records.encode_record(index, 1, 0, b"p" * 300)
        index += 1
    # The first record starting within 400 bytes before a page boundary: the synced length.
    bad = next(o for o in offsets if 0 < PAGE_BYTES - o % PAGE_BYTES < 400 and o > PAGE_BYTES)
    boundary = -(-bad // PAGE_BYTES) * PAGE_BYTES
    data[bad:boundary] = bytes(boundary - bad)
    scan = records.scan_segment(bytes(data), 1, newest=True, payload_bytes_max=1 << 20)
    assert scan.end_bytes == bad
    assert scan.torn_reason is not None
