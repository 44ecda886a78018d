"""Damaged files are cut back or reported, exactly as FORMAT.md's crash table says.

Real files: a store writes several segments and closes; the test then damages the bytes on
disk (truncate the tail, zero it, append garbage, flip a byte in a length / checksum /
payload of a sealed segment, write an unknown version, delete a middle segment, damage
meta) and reopens, asserting the recovered log or the `Corruption` error (file and offset).
A damaged record is never served, including when the damage happens after open.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from logsvc.store import Corruption, Entry, records
from logsvc.store.meta import META_FILE_NAME, META_TMP_FILE_NAME

from .conftest import open_store


def build(path: str, count: int = 120) -> list[Entry]:
    entries = [Entry(i, 1 + i // 50, bytes([i % 251]) * 90) for i in range(1, count + 1)]
    with open_store(path) as store:
        for entry in entries:  # one sync per entry: durable hints advance record by record
            store.append([entry])
            store.sync()
    return entries


def segments(path: str) -> list[str]:
    return [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".seg")]


def record_offsets(segment_path: str) -> list[int]:
    first = int(os.path.basename(segment_path).split(".")[0])
    with open(segment_path, "rb") as f:
        data = f.read()
    scan = records.scan_segment(data, first, newest=False, payload_bytes_max=1 << 20)
    return list(scan.offsets)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def test_truncated_tail_is_cut_back_and_logged(
    store_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    entries = build(store_dir)
    newest = segments(store_dir)[-1]
    size = os.path.getsize(newest)
    os.truncate(newest, size - 7)
    with caplog.at_level(logging.WARNING, "logsvc.store"), open_store(store_dir) as store:
        assert store.last_index == len(entries) - 1
        assert store.stats().recovery.torn_tail_bytes_cut == 130 - 7
    assert "torn tail" in caplog.text
    assert os.path.getsize(newest) == size - 130  # the cut was written back
    with open_store(store_dir) as store:  # and recovery is idempotent
        assert store.read(1, 1000, 1 << 30) == entries[:-1]


@pytest.mark.parametrize("tail", [bytes(8192), b"\xde\xad\xbe\xef" * 3])
def test_zeroed_or_garbage_tail_is_cut(store_dir: str, tail: bytes) -> None:
    entries = build(store_dir)
    with open(segments(store_dir)[-1], "ab") as f:
        f.write(tail)
    with open_store(store_dir) as store:
        assert store.read(1, 1000, 1 << 30) == entries


@pytest.mark.parametrize(("field", "delta"), [("length", 8), ("checksum", 0), ("payload", 60)])
def test_flipped_byte_in_a_sealed_segment_is_corruption(
    store_dir: str, field: str, delta: int
) -> None:
    build(store_dir)
    sealed = segments(store_dir)[1]
    offset = record_offsets(sealed)[3]
    flip(sealed, offset + delta)
    with pytest.raises(Corruption) as raised:
        open_store(store_dir)
    assert raised.value.path == sealed
    assert raised.value.offset_bytes == offset
    assert field  # (the parameter names the damaged field in the test id)


def test_flipped_byte_mid_newest_segment_with_later_syncs_is_corruption(store_dir: str) -> None:
    build(store_dir)
    newest = segments(store_dir)[-1]
    offset = record_offsets(newest)[1]
    flip(newest, offset + 50)
    with pytest.raises(Corruption, match="durable") as raised:
        open_store(store_dir)
    assert (raised.value.path, raised.value.offset_bytes) == (newest, offset)


def test_unknown_segment_version_is_corruption(store_dir: str) -> None:
    build(store_dir)
    first = segments(store_dir)[0]
    body = struct.pack("<8sHHIQ", b"LOGSVSEG", 9, 32, 0, 1)
    with open(first, "r+b") as f:
        f.write(body + struct.pack("<Q", records.xxh3(body)))
    with pytest.raises(Corruption, match="unknown segment format version 9"):
        open_store(store_dir)


def test_missing_middle_segment_is_corruption(store_dir: str) -> None:
    build(store_dir)
    middle = segments(store_dir)[2]
    os.unlink(middle)
    with pytest.raises(Corruption, match="gap or missing segment") as raised:
        open_store(store_dir)
    assert raised.value.path == segments(store_dir)[2]


def test_missing_first_segment_is_corruption(store_dir: str) -> None:
    build(store_dir)
    os.unlink(segments(store_dir)[0])
    with pytest.raises(Corruption, match="missing segment"):
        open_store(store_dir)


def test_damaged_meta_is_corruption_and_never_replaced(store_dir: str) -> None:
    build(store_dir, count=5)
    meta_path = os.path.join(store_dir, META_FILE_NAME)
    before = Path(meta_path).read_bytes()
    flip(meta_path, 17)
    with pytest.raises(Corruption) as raised:
        open_store(store_dir)
    assert raised.value.path == meta_path
    assert Path(meta_path).read_bytes() != before  # left as found, for the operator


def test_missing_meta_with_segments_is_corruption(store_dir: str) -> None:
    build(store_dir, count=5)
    os.unlink(os.path.join(store_dir, META_FILE_NAME))
    with pytest.raises(Corruption, match="meta is missing"):
        open_store(store_dir)


def test_leftover_meta_tmp_is_deleted_and_meta_kept(store_dir: str) -> None:
    with open_store(store_dir) as store:
        store.save_vote(7, "n1")
    with open(os.path.join(store_dir, META_TMP_FILE_NAME), "wb") as f:
        f.write(b"torn half of a newer meta")
    with open_store(store_dir) as store:
        assert (store.term, store.voted_for) == (7, "n1")
    assert not os.path.exists(os.path.join(store_dir, META_TMP_FILE_NAME))


def test_damage_after_open_is_reported_by_read_never_served(store_dir: str) -> None:
    build(store_dir)
    with open_store(store_dir) as store:  # opened clean; the cache is cold
        sealed = segments(store_dir)[0]
        offset = record_offsets(sealed)[2]
        flip(sealed, offset + 45)
        with pytest.raises(Corruption) as raised:
            store.read(1, 10, 1 << 30)
        assert (raised.value.path, raised.value.offset_bytes) == (sealed, offset)
        assert [e.index for e in store.read(1, 3, 1 << 30)] == [1, 2]  # before it: fine


def test_torn_newest_segment_header_is_deleted(store_dir: str) -> None:
    entries = build(store_dir)
    last = entries[-1].index
    torn = os.path.join(store_dir, f"{last + 1:020d}.seg")
    with open(torn, "wb") as f:
        f.write(records.encode_segment_header(last + 1)[:13])
    with open_store(store_dir) as store:
        assert store.last_index == last
        assert not os.path.exists(torn)
        store.append([Entry(last + 1, 9, b"after")])
        store.sync()
    with open_store(store_dir) as store:
        assert store.read(last + 1, last + 2, 100) == [Entry(last + 1, 9, b"after")]
