"""The engine's WAL entry codec matches its golden vectors and engine/FORMAT.md, and reports
every kind of damage as `WalCorruption` naming the DSN.

Golden: encoding the inputs of golden_entries.py gives exactly the bytes in `golden/*.hex`
(every entry type and every command type: catalog create and drop with a schema of a compound
key, an append of every column type with nulls across two blocks, a delete mask, a
checkpoint), the worked example's header fields sit where FORMAT.md says, and decoding gives
the inputs back. A failure means the format changed: bump the version and add vectors.
Damage: every prefix of every vector, a flipped bit at every byte (or a sample of them for the
large vector), extra bytes, all-zero bytes, another version, and resealed entries (checksum
recomputed) whose fields break a rule are each refused with the documented reason and the
DSN passed in; an oversized count or length is refused without allocating. A hypothesis round
trip covers random entries.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import FrozenBitMap

from engine.errors import WalCorruption
from engine.schema import Column, Schema
from engine.wal import codec
from engine.wal.codec import decode_entry, encode_entry
from engine.wal.entry import (
    Append,
    AppendInfo,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    Delete,
    MemoItem,
    TxnEntry,
    UpdateCatalog,
)
from tests.unit.engine.golden_entries import ENTRIES, GOLDEN

DSN = 77


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / f"{name}.hex").read_text().strip())


def reseal(entry: bytes) -> bytes:
    """Recompute the checksum so only the field checks can object."""
    checksum = xxhash.xxh3_64_intdigest(entry[:12] + entry[20:])
    return entry[:12] + struct.pack("<Q", checksum) + entry[20:]


def reason_of(entry: bytes) -> str:
    with pytest.raises(WalCorruption) as caught:
        decode_entry(entry, DSN)
    assert caught.value.dsn == DSN
    assert str(DSN) in str(caught.value)
    return caught.value.reason


def assert_same(a: TxnEntry | CheckpointEntry, b: TxnEntry | CheckpointEntry) -> None:
    """Entries are equal; Arrow batches compare by value (with their schemas)."""
    if isinstance(a, CheckpointEntry):
        assert a == b
        return
    assert isinstance(b, TxnEntry)
    assert (a.start_ts, a.commit_ts, a.memo) == (b.start_ts, b.commit_ts, b.memo)
    assert len(a.commands) == len(b.commands)
    for x, y in zip(a.commands, b.commands, strict=True):
        if isinstance(x, Append):
            assert isinstance(y, Append)
            assert (x.db_id, x.table_id, x.infos) == (y.db_id, y.table_id, y.infos)
            assert x.batch.equals(y.batch, check_metadata=True)
            assert x.batch.schema.equals(y.batch.schema)
        else:
            assert x == y


# --- golden vectors -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_golden_vector_encodes_exactly_and_decodes_back(name: str) -> None:
    encoded = encode_entry(ENTRIES[name])
    assert encoded == golden(name)
    assert_same(decode_entry(encoded, DSN), ENTRIES[name])


def test_header_fields_sit_where_format_md_says() -> None:
    entry = golden("ckp_v1")
    magic, version, entry_type, reserved, body_len, checksum = struct.unpack("<2sBBIIQ", entry[:20])
    assert (magic, version, entry_type, reserved) == (b"TE", 1, 0x40, 0)
    assert body_len == len(entry) - 20 == 40
    assert checksum == xxhash.xxh3_64_intdigest(entry[:12] + entry[20:]) == 0x114A4A43A9F8F926
    assert struct.unpack("<QQH", entry[20:38]) == (500, 42, 22)
    assert entry[38:] == b"ckp/0000000500.parquet"
    create = golden("ac_create_v1")
    assert create[3] == 0x10
    assert struct.unpack("<QQI", create[20:40]) == (100, 101, 2)


def test_the_batch_is_a_plain_arrow_ipc_stream() -> None:
    entry = ENTRIES["ac_append_v1"]
    assert isinstance(entry, TxnEntry)
    append = entry.commands[0]
    assert isinstance(append, Append)
    stream = codec.encode_batch(append.batch)
    assert stream in golden("ac_append_v1")
    read = pa.ipc.open_stream(stream).read_all()
    assert read.to_batches()[0].equals(append.batch)


# --- damage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_prefix_is_refused(name: str) -> None:
    entry = golden(name)
    step = max(1, len(entry) // 300)
    for size in [*range(0, len(entry), step), len(entry) - 1]:
        reason = reason_of(entry[:size])
        if size < codec.HEADER_BYTES:
            assert reason in (codec.REASON_SHORT, codec.REASON_MAGIC, codec.REASON_VERSION)
        else:
            assert reason == codec.REASON_LENGTH


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_a_flipped_bit_anywhere_is_refused(name: str) -> None:
    entry = golden(name)
    step = max(1, len(entry) // 400)
    for offset in range(0, len(entry), step):
        damaged = bytearray(entry)
        damaged[offset] ^= 0x10
        reason = reason_of(bytes(damaged))
        if offset < 2:
            assert reason == codec.REASON_MAGIC
        elif offset == 2:
            assert reason == codec.REASON_VERSION
        elif 8 <= offset < 12:
            assert reason == codec.REASON_LENGTH
        else:
            assert reason == codec.REASON_CHECKSUM


def test_zeroed_extended_and_versioned_entries_are_refused() -> None:
    entry = golden("ac_create_v1")
    assert reason_of(b"") == codec.REASON_SHORT
    assert reason_of(bytes(len(entry))) == codec.REASON_MAGIC
    assert reason_of(entry + b"\x00") == codec.REASON_LENGTH
    assert reason_of(entry[:2] + b"\x02" + entry[3:]) == codec.REASON_VERSION


def test_resealed_entries_are_checked_field_by_field() -> None:
    create = golden("ac_create_v1")
    ckp = golden("ckp_v1")
    # Reserved and unknown entry types, reserved header bits.
    assert reason_of(reseal(ckp[:3] + b"\x11" + ckp[4:])) == codec.REASON_RESERVED_TYPE
    assert reason_of(reseal(ckp[:3] + b"\x12" + ckp[4:])) == codec.REASON_RESERVED_TYPE
    assert reason_of(reseal(ckp[:3] + b"\x00" + ckp[4:])) == codec.REASON_TYPE
    assert reason_of(reseal(ckp[:4] + b"\x01" + ckp[5:])) == codec.REASON_RESERVED_BITS
    # commit_ts not above start_ts.
    same_ts = create[:28] + struct.pack("<Q", 100) + create[36:]
    assert reason_of(reseal(same_ts)) == codec.REASON_TIMESTAMPS
    # Memo out of order.
    memo_a, memo_b = create[40:64], create[64:88]
    swapped = create[:40] + memo_b + memo_a + create[88:]
    assert reason_of(reseal(swapped)) == codec.REASON_MEMO_ORDER
    # An unknown command type (the first command's type byte sits after the count).
    first_cmd = 88 + 4
    assert create[first_cmd] == codec.CMD_UPDATE_CATALOG
    unknown = create[:first_cmd] + b"\x09" + create[first_cmd + 1 :]
    assert reason_of(reseal(unknown)) == codec.REASON_COMMAND
    # A database create that claims a schema.
    kind_at = first_cmd + 5
    as_table = create[:kind_at] + b"\x02" + create[kind_at + 1 :]
    assert reason_of(reseal(as_table)) == codec.REASON_CATALOG
    # Bytes after the last field (body_len adjusted so only the field walk can object).
    longer = create + b"\x00"
    longer = longer[:8] + struct.pack("<I", len(longer) - 20) + longer[12:]
    assert reason_of(reseal(longer)) == codec.REASON_TRAILING


def test_an_oversized_count_is_refused_without_allocating() -> None:
    create = golden("ac_create_v1")
    huge_memo = create[:36] + struct.pack("<I", 0xFFFFFFFF) + create[40:]
    assert reason_of(reseal(huge_memo)) == codec.REASON_TRUNCATED
    huge_cmd = create[:92] + b"\x01" + struct.pack("<I", 0xFFFFFFF0) + create[97:]
    assert reason_of(reseal(huge_cmd)) == codec.REASON_TRUNCATED


def test_bad_arrow_and_bad_masks_behind_a_valid_checksum_are_refused() -> None:
    schema = Schema([Column("id", "int64")], primary_key=["id"])
    batch = pa.RecordBatch.from_pylist([{"id": 1}], schema=schema.to_arrow())
    good = encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 1),), (Append(1, 2, (AppendInfo(1, 0, 1),), batch),))
    )
    stream = codec.encode_batch(batch)
    at = good.index(stream)
    garbage = bytes(b ^ 0x5A for b in stream)
    assert reason_of(reseal(good[:at] + garbage + good[at + len(stream) :])) == codec.REASON_ARROW
    wrong_rows = encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 1),), (Append(1, 2, (AppendInfo(1, 0, 1),), batch),))
    ).replace(struct.pack("<QII", 1, 0, 1), struct.pack("<QII", 1, 0, 2))
    assert reason_of(reseal(wrong_rows)) == codec.REASON_INFOS
    delete = encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 1),), (Delete(1, 2, 1, FrozenBitMap([3])),))
    )
    mask = FrozenBitMap([3]).serialize()
    at = delete.index(mask)
    bad_mask = delete[:at] + b"\xff" * len(mask) + delete[at + len(mask) :]
    assert reason_of(reseal(bad_mask)) == codec.REASON_BITMAP


# --- round trip -----------------------------------------------------------------------------

names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF), min_size=1, max_size=12)
ids = st.integers(min_value=1, max_value=(1 << 64) - 1)


@st.composite
def entries(draw: st.DrawFn) -> TxnEntry | CheckpointEntry:
    if draw(st.booleans()) and draw(st.booleans()):
        return CheckpointEntry(draw(ids), draw(ids), draw(names))
    start = draw(st.integers(min_value=0, max_value=(1 << 63)))
    commit = start + draw(st.integers(min_value=1, max_value=1 << 20))
    memo = tuple(
        MemoItem(*m) for m in sorted(set(draw(st.lists(st.tuples(ids, ids, ids), max_size=4))))
    )
    commands: list[UpdateCatalog | Append | Delete] = []
    for kind in draw(
        st.lists(st.sampled_from(["db", "table", "append", "delete"]), min_size=1, max_size=4)
    ):
        if kind == "db":
            op = draw(st.sampled_from(list(CatalogOp)))
            commands.append(
                UpdateCatalog(CatalogKind.DATABASE, op, draw(ids), 0, draw(names), None)
            )
        elif kind == "table":
            column_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
            schema = Schema(
                [
                    Column(n, draw(st.sampled_from(["int64", "string", "date32"])))
                    for n in column_names
                ],
                primary_key=[column_names[0]],
            )
            commands.append(
                UpdateCatalog(
                    CatalogKind.TABLE, CatalogOp.CREATE, draw(ids), draw(ids), draw(names), schema
                )
            )
        elif kind == "append":
            values = draw(
                st.lists(
                    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
                    min_size=1,
                    max_size=5,
                )
            )
            batch = pa.RecordBatch.from_pylist(
                [{"k": v, "s": None if v % 2 else str(v)} for v in values],
                schema=pa.schema(
                    [pa.field("k", pa.int64(), nullable=False), pa.field("s", pa.string())]
                ),
            )
            split = draw(st.integers(min_value=1, max_value=len(values)))
            infos = (AppendInfo(1, 0, split),) + (
                (AppendInfo(2, 0, len(values) - split),) if split < len(values) else ()
            )
            commands.append(Append(draw(ids), draw(ids), infos, batch))
        else:
            rows = FrozenBitMap(
                draw(
                    st.lists(
                        st.integers(min_value=0, max_value=(1 << 32) - 1), min_size=1, max_size=20
                    )
                )
            )
            commands.append(Delete(draw(ids), draw(ids), draw(ids), rows))
    return TxnEntry(start, commit, memo, tuple(commands))


@settings(max_examples=150, deadline=None)
@given(entries())
def test_random_entries_round_trip(entry: TxnEntry | CheckpointEntry) -> None:
    assert_same(decode_entry(encode_entry(entry), DSN), entry)
