"""The store's byte formats match the checked-in golden vectors and FORMAT.md.

Encoding fixed inputs must give exactly the bytes in `golden/`; decoding those bytes must
give the inputs back. A failure here means the on-disk format changed: bump the version
and add new vectors instead of editing these.
"""

from __future__ import annotations

from pathlib import Path

from logsvc.store import journal_records, meta, records

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text().strip())


def test_segment_vector_encodes_exactly() -> None:
    encoded = (
        records.encode_segment_header(7)
        + records.encode_record(7, 3, 6, b"hello")
        + records.encode_record(8, 3, 6, b"")
    )
    assert encoded == golden("segment_v1.hex")
    assert len(encoded) == 32 + 45 + 40


def test_segment_vector_decodes_to_its_entries() -> None:
    scan = records.scan_segment(golden("segment_v1.hex"), 7, newest=False, payload_bytes_max=1024)
    assert (scan.first_index, scan.last_index, list(scan.offsets)) == (7, 8, [32, 77])
    assert scan.term_runs == [(7, 3)]
    entries = records.read_records(golden("segment_v1.hex")[32:], 32, 7, 2, 1024)
    assert entries == [records.Entry(7, 3, b"hello"), records.Entry(8, 3, b"")]


def test_segment_header_fields_are_where_format_md_says() -> None:
    data = golden("segment_v1.hex")
    assert data[0:8] == b"LOGSVSEG"
    assert int.from_bytes(data[8:10], "little") == 1
    assert int.from_bytes(data[16:24], "little") == 7
    assert int.from_bytes(data[24:32], "little") == records.xxh3(data[0:24])
    record = data[32:77]
    assert int.from_bytes(record[0:8], "little") == records.xxh3(record[8:])
    assert int.from_bytes(record[8:12], "little") == 5
    assert record[12] == records.RECORD_TYPE_ENTRY
    assert int.from_bytes(record[16:24], "little") == 7
    assert int.from_bytes(record[24:32], "little") == 3
    assert int.from_bytes(record[32:40], "little") == 6
    assert record[40:] == b"hello"


def test_meta_vectors_round_trip() -> None:
    voted = meta.Meta(term=5, voted_for="n2", first_index=7)
    assert meta.encode_meta(voted) == golden("meta_v1.hex")
    assert meta.decode_meta(golden("meta_v1.hex")) == voted
    assert meta.encode_meta(meta.Meta()) == golden("meta_v1_fresh.hex")
    assert meta.decode_meta(golden("meta_v1_fresh.hex")) == meta.Meta()


def test_every_meta_byte_is_covered_by_the_checksum() -> None:
    data = golden("meta_v1.hex")
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        assert isinstance(meta.decode_meta(bytes(damaged)), tuple), position


def test_journal_vector_encodes_exactly_and_scans_back() -> None:
    out = bytearray(journal_records.encode_file_header(1))
    jr = journal_records
    jr.encode_record_into(out, jr.TYPE_ATTACH, 1, 0, 0, 0, b"shards/1/journal")
    jr.encode_record_into(out, jr.TYPE_ENTRY, 1, 0, 7, 3, b"hello")
    jr.encode_record_into(out, jr.TYPE_VOTE, 1, 32, 5, 1, b"n2")
    jr.encode_record_into(out, jr.TYPE_TRUNCATE, 1, 32, 7, 0, b"")
    data = golden("journal_v1.hex")
    assert bytes(out) == data
    assert len(data) == 247
    assert data[0:8] == b"LOGSVJNL"
    assert int.from_bytes(data[24:32], "little") == records.xxh3(data[0:24])
    scan = jr.scan_file(data, 1, newest=False, payload_bytes_max=1024)
    assert [(r.rtype, r.store_id, r.synced_bytes, r.a, r.b, r.body) for r in scan.records] == [
        (jr.TYPE_ATTACH, 1, 0, 0, 0, b"shards/1/journal"),
        (jr.TYPE_ENTRY, 1, 0, 7, 3, b"hello"),
        (jr.TYPE_VOTE, 1, 32, 5, 1, b"n2"),
        (jr.TYPE_TRUNCATE, 1, 32, 7, 0, b""),
    ]
