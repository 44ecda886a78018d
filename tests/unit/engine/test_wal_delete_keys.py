"""The WAL's DeleteKeys command (engine/FORMAT.md, entry version 3, issue 23): a Delete with its
rows' primary keys.

A second encoder written from FORMAT.md's grammar agrees with the codec; the golden vectors
cover every key type (and round-trip through `decode_entries`, the many-at-a-time decoder the
Spark jobs and the change stream use); an entry is written in the lowest version its commands
need (a keyless Delete stays version 1, byte for byte), version 1 and 2 entries refuse command
type 8, and an old-version encode drops the keys; behind a valid checksum every rule of the
keys' grammar is refused with its reason, a run-length mask claiming millions of rows is
refused without allocating for them, and random keys of every key type round-trip. (The
prefix, flipped-bit and random-resealed-damage tests of test_wal_codec.py run on the version 3
vectors too.)
"""

from __future__ import annotations

import datetime
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, FrozenBitMap

from engine.errors import WalCorruption
from engine.schema import KEY_TYPES
from engine.wal import codec, keys
from engine.wal.batch import decode_entries
from engine.wal.codec import decode_entry, encode_entry
from engine.wal.entry import Delete, DeletedKeys, MemoItem, TxnEntry
from tests.unit.engine.golden_entries import ENTRIES
from tests.unit.engine.test_wal_codec import (
    DSN,
    command,
    deleted_keys,
    golden,
    reason_of,
    reseal,
    str16,
    txn_entry,
)

MASK = FrozenBitMap([1, 5])
ID_KEYS = DeletedKeys((("id", "int64"),), (42, 43))


def delete_keys_entry(
    section: bytes, mask: FrozenBitMap | BitMap = MASK, version: int = 3
) -> bytes:
    """A version 3 entry of one DeleteKeys (type 8) on block 1 of table 2, database 1, whose
    keys section (key_count, keydefs, keydata) is `section`."""
    raw = mask.serialize()
    body = struct.pack("<QQQI", 1, 2, 1, len(raw)) + raw + section
    return txn_entry(command(8, body), version=version)


def keydef(name: bytes, type_name: bytes) -> bytes:
    return str16(name) + bytes([len(type_name)]) + type_name


ONE_ID = struct.pack("<H", 1) + keydef(b"id", b"int64")


def one_delete(delete: Delete) -> TxnEntry:
    return TxnEntry(1, 2, (MemoItem(1, 2, 1),), (delete,))


def test_the_second_encoder_agrees_with_the_codec() -> None:
    values = struct.pack("<qq", 42, 43)
    assert delete_keys_entry(ONE_ID + values) == encode_entry(
        one_delete(Delete(1, 2, 1, MASK, ID_KEYS))
    )
    # A compound key (string, bool): offsets then bytes, then the bits (row 5's true).
    compound = DeletedKeys((("s", "string"), ("b", "bool")), (("ab", False), ("c", True)))
    section = struct.pack("<H", 2) + keydef(b"s", b"string") + keydef(b"b", b"bool")
    section += struct.pack("<III", 0, 2, 3) + b"abc" + b"\x02"
    encoded = encode_entry(one_delete(Delete(1, 2, 1, MASK, compound)))
    assert delete_keys_entry(section) == encoded
    assert decode_entry(encoded, DSN) == one_delete(Delete(1, 2, 1, MASK, compound))


def test_an_entry_is_written_in_the_lowest_version_its_commands_need() -> None:
    keyless = one_delete(Delete(1, 2, 1, MASK))
    assert encode_entry(keyless)[codec.OFFSET_VERSION] == 1  # as every build wrote it
    assert encode_entry(keyless) == encode_entry(keyless, version=1)
    keyed = one_delete(Delete(1, 2, 1, MASK, ID_KEYS))
    assert encode_entry(keyed)[codec.OFFSET_VERSION] == 3
    # An old version's writer drops the keys: a plain Delete, readable by older builds.
    assert encode_entry(keyed, version=2) == encode_entry(keyless)
    decoded = decode_entry(encode_entry(keyed, version=1), DSN)
    assert isinstance(decoded, TxnEntry) and decoded.commands == (Delete(1, 2, 1, MASK),)


def test_versions_1_and_2_refuse_the_command() -> None:
    entry = delete_keys_entry(ONE_ID + struct.pack("<qq", 42, 43))
    assert isinstance(decode_entry(entry, DSN), TxnEntry)
    for version in (1, 2):
        older = reseal(entry[:2] + bytes([version]) + entry[3:])
        assert reason_of(older) == codec.REASON_COMMAND


def test_the_golden_vectors_cover_every_key_type() -> None:
    covered: set[str] = set()
    for name, entry in ENTRIES.items():
        for cmd in entry.commands if isinstance(entry, TxnEntry) else ():
            if isinstance(cmd, Delete) and cmd.keys is not None:
                assert name.endswith("_v3")
                covered |= {type_name for _, type_name in cmd.keys.columns}
                if len(cmd.keys.columns) > 1:
                    assert len(cmd.rows) >= 3 and max(cmd.rows) >= 1 << 16  # two containers
    assert covered == KEY_TYPES


def test_the_many_at_a_time_decoder_reads_version_3_beside_older_entries() -> None:
    names = sorted(ENTRIES)
    payloads = [golden(name) for name in names]
    decoded = decode_entries(payloads, list(range(1, len(names) + 1)))
    for index, name in enumerate(names):
        if name.endswith("_v3"):
            assert decoded.entry(index) == ENTRIES[name]


def reason(section: bytes) -> str:
    got = reason_of(delete_keys_entry(section))
    assert got.startswith(codec.REASON_KEYS)
    return got


def test_the_keys_grammar_is_enforced() -> None:
    values = struct.pack("<qq", 42, 43)
    assert reason(struct.pack("<H", 0) + values).endswith(keys.REASON_DEFINITION)
    assert reason(struct.pack("<H", 1025) + keydef(b"id", b"int64") + values).endswith(
        keys.REASON_DEFINITION
    )
    for bad_def in (keydef(b"id", b"float64"), keydef(b"", b"int64"), keydef(b"\xff", b"int64")):
        assert reason(struct.pack("<H", 1) + bad_def + values).endswith(keys.REASON_DEFINITION)
    twice = struct.pack("<H", 2) + keydef(b"id", b"int64") * 2
    assert reason(twice + values * 2).endswith(keys.REASON_DEFINITION)
    assert reason(ONE_ID + values[:-1]).endswith(keys.REASON_TRUNCATED)
    assert reason(ONE_ID + values + b"\x00").endswith(keys.REASON_TRAILING)
    assert reason(ONE_ID[:-2]).endswith(keys.REASON_TRUNCATED)
    bools = struct.pack("<H", 1) + keydef(b"b", b"bool")
    assert isinstance(decode_entry(delete_keys_entry(bools + b"\x03"), DSN), TxnEntry)
    assert reason(bools + b"\x07").endswith(keys.REASON_PADDING)
    text = struct.pack("<H", 1) + keydef(b"s", b"string")
    assert isinstance(
        decode_entry(delete_keys_entry(text + struct.pack("<III", 0, 1, 2) + b"ab"), DSN),
        TxnEntry,
    )
    assert reason(text + struct.pack("<III", 1, 1, 2) + b"ab").endswith(keys.REASON_OFFSETS)
    assert reason(text + struct.pack("<III", 0, 2, 1) + b"ab").endswith(keys.REASON_OFFSETS)
    assert reason(text + struct.pack("<III", 0, 1, 9) + b"ab").endswith(keys.REASON_TRUNCATED)
    assert reason(text + struct.pack("<III", 0, 1, 2) + b"a\xff").endswith(keys.REASON_VALUE)
    dates = struct.pack("<H", 1) + keydef(b"d", b"date32")
    assert reason(dates + struct.pack("<ii", 0, 1 << 30)).endswith(keys.REASON_VALUE)
    stamps = struct.pack("<H", 1) + keydef(b"t", b"timestamp[us]")
    assert reason(stamps + struct.pack("<qq", 0, -(1 << 62))).endswith(keys.REASON_VALUE)


def test_a_mask_of_millions_of_rows_is_refused_without_allocating_for_them() -> None:
    runs = BitMap(range(0, 4_000_000))
    runs.run_optimize()  # a few bytes of runs claiming 4 million rows
    assert len(runs.serialize()) < 1024
    for section in (
        ONE_ID + struct.pack("<q", 1),
        struct.pack("<H", 1) + keydef(b"s", b"string") + struct.pack("<I", 0),
        struct.pack("<H", 1) + keydef(b"b", b"bool") + b"\x01",
    ):
        entry = delete_keys_entry(section, runs)
        tracemalloc.start()
        try:
            with pytest.raises(WalCorruption) as caught:
                decode_entry(entry, DSN)
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak_bytes < 256 * 1024
        assert caught.value.reason.endswith(keys.REASON_TRUNCATED)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_random_keys_of_every_key_type_round_trip(data: st.DataObject) -> None:
    offsets = data.draw(st.lists(st.integers(0, (1 << 32) - 1), min_size=1, max_size=40))
    rows = FrozenBitMap(offsets)
    deleted = data.draw(deleted_keys(len(rows)))
    entry = one_delete(Delete(1, 2, 1, rows, deleted))
    encoded = encode_entry(entry)
    assert encoded[codec.OFFSET_VERSION] == 3
    decoded = decode_entry(encoded, DSN)
    assert decoded == entry
    assert encode_entry(decoded) == encoded


def test_decoded_dates_and_timestamps_are_the_values_the_engine_keys_hold() -> None:
    """The engine's keys are `pa.scalar(...).as_py()` values (engine/schema.py): date32 a
    `date`, timestamp[us] a naive `datetime`; the bounds of Python's range decode."""
    values = (
        (datetime.date(1, 1, 1), datetime.datetime(1, 1, 1)),
        (datetime.date(9999, 12, 31), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)),
    )
    deleted = DeletedKeys((("d", "date32"), ("t", "timestamp[us]")), values)
    entry = one_delete(Delete(1, 2, 1, MASK, deleted))
    assert decode_entry(encode_entry(entry), DSN) == entry
