"""The engine's WAL entry codec matches its golden vectors and engine/FORMAT.md, and reports
every kind of damage as `WalCorruption` naming the DSN, never as another exception.

Golden: encoding the inputs of golden_entries.py gives exactly the bytes in `golden/*.hex`
(every entry type and command type: database and table create and drop, a schema of all 15
column types with nullable columns and a compound key, an append of every column type with
nulls across two blocks, a delete mask, a checkpoint), decoding gives the inputs back, and the
header fields and the worked example sit where FORMAT.md says. A failure means the format
changed: bump the version and add vectors. The Arrow part is the standard IPC stream
(`pa.ipc.new_stream`'s bytes) and is deterministic (the vectors were written by another
process). A second encoder here, written from FORMAT.md alone (`seal`, `append_entry`,
`catalog_entry`), builds the hostile inputs and must agree with the codec on valid ones.

Damage: every prefix and a flipped bit at every byte of every vector, extra bytes, zeroed
bytes, another version and entry types 0, PC and UC are refused with FORMAT.md's reason.
Behind a valid checksum (a writer bug or a hostile file), each field rule is refused with its
reason: names and schemas, Arrow streams that are garbage, compressed, of other types,
of two batches, with bytes after the end, or that fail validation; infos not covering the
batch; masks that are garbage, invalid or not canonical; every oversized count or length is
refused without allocating (tracemalloc). Random resealed damage at every byte raises only
`WalCorruption` or decodes to an entry that re-encodes to the damaged bytes (no ignored bytes
outside Arrow's own padding). A hypothesis round trip covers random entries.
"""

from __future__ import annotations

import itertools
import random
import struct
import tracemalloc

import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, FrozenBitMap

from engine import limits
from engine.errors import WalCorruption
from engine.schema import KEY_TYPES, TYPES, Column, Schema
from engine.wal import codec, columns
from engine.wal.codec import decode_entry, encode_batch, encode_entry, peek_commit_ts
from engine.wal.columns import APPEND_COLUMNS_ROWS_MAX
from engine.wal.entry import (
    Append,
    AppendInfo,
    BlockLevel,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    CreateBlock,
    Delete,
    DeletedKeys,
    DropBlock,
    EntryType,
    MemoItem,
    Origin,
    TxnEntry,
    UpdateCatalog,
)
from tests.unit.engine.golden_entries import ENTRIES, GOLDEN, version_of

DSN = 77

Entry = TxnEntry | CheckpointEntry


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
    assert f"DSN {DSN}" in str(caught.value)
    assert caught.value.offset_bytes is not None
    return caught.value.reason


def assert_same(a: Entry, b: Entry) -> None:
    """Entries are equal; Arrow batches compare by value with their schemas, masks by value."""
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
            assert x.batch.schema.equals(y.batch.schema, check_metadata=True)
        else:
            assert x == y


# --- a second encoder, from FORMAT.md -------------------------------------------------------


def seal(body: bytes, entry_type: int = 0x10, version: int = 1, reserved: int = 0) -> bytes:
    head = struct.pack("<2sBBII", b"TE", version, entry_type, reserved, len(body))
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head + body)) + body


def txn_entry(
    *commands: bytes, memo: tuple[tuple[int, int, int], ...] = ((1, 2, 1),), version: int = 1
) -> bytes:
    """An AC entry (start_ts 1, commit_ts 2) of already encoded commands (type, len, body)."""
    head = struct.pack("<QQI", 1, 2, len(memo)) + b"".join(struct.pack("<QQQ", *m) for m in memo)
    return seal(head + struct.pack("<I", len(commands)) + b"".join(commands), version=version)


def command(cmd_type: int, body: bytes) -> bytes:
    return struct.pack("<BI", cmd_type, len(body)) + body


def append_entry(stream: bytes, infos: tuple[tuple[int, int, int], ...] = ((1, 0, 1),)) -> bytes:
    body = struct.pack("<QQI", 1, 2, len(infos))
    body += b"".join(struct.pack("<QII", *info) for info in infos)
    return txn_entry(command(2, body + struct.pack("<I", len(stream)) + stream))


def columns_entry(columns: bytes, infos: tuple[tuple[int, int, int], ...] = ((1, 0, 1),)) -> bytes:
    """A version 2 entry of one AppendColumns command (type 7) of table 2 in database 1."""
    body = struct.pack("<QQI", 1, 2, len(infos))
    body += b"".join(struct.pack("<QII", *info) for info in infos)
    return txn_entry(command(7, body + columns), version=2)


def delete_entry(mask: bytes) -> bytes:
    return txn_entry(command(3, struct.pack("<QQQI", 1, 2, 1, len(mask)) + mask))


def str16(data: bytes) -> bytes:
    return struct.pack("<H", len(data)) + data


def schema_bytes(columns: list[tuple[bytes, bytes, int]], keys: list[int]) -> bytes:
    out = struct.pack("<H", len(columns))
    for name, type_name, nullable in columns:
        out += str16(name) + bytes([len(type_name)]) + type_name + bytes([nullable])
    return out + struct.pack("<H", len(keys)) + b"".join(struct.pack("<H", k) for k in keys)


def catalog_entry(name: bytes = b"t", schema: bytes | None = None, kind: int = 2) -> bytes:
    """A create of table 2 in database 1 (or of database 1 when `kind` is 1)."""
    head = struct.pack("<BBQQ", kind, 1, 1, 2 if kind == 2 else 0) + str16(name)
    tail = b"\x00" if schema is None else b"\x01" + schema
    return txn_entry(command(1, head + tail), memo=((1, 2, 0),))


ONE_COLUMN = schema_bytes([(b"id", b"int64", 0)], [0])
BATCH = pa.RecordBatch.from_pylist([{"id": 1}], schema=pa.schema([pa.field("id", pa.int64())]))


def test_the_second_encoder_agrees_with_the_codec() -> None:
    schema = Schema([Column("id", "int64")], primary_key=["id"])
    create = UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, 1, 2, "t", schema)
    assert catalog_entry(schema=ONE_COLUMN) == encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 0),), (create,))
    )
    append = Append(1, 2, (AppendInfo(1, 0, 1),), BATCH)
    assert append_entry(encode_batch(BATCH)) == encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 1),), (append,)), version=1
    )
    # version 2: rows 1, one column; its definition (str16 name, str8 type, nullable 1 as
    # BATCH's field is, has_validity 0), then the int64 value
    one_id = struct.pack("<IH", 1, 1) + str16(b"id") + b"\x05int64" + b"\x01\x00"
    assert columns_entry(one_id + struct.pack("<q", 1)) == encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 1),), (append,))
    )
    delete = Delete(1, 2, 1, FrozenBitMap([3]))
    assert delete_entry(FrozenBitMap([3]).serialize()) == encode_entry(
        TxnEntry(1, 2, (MemoItem(1, 2, 1),), (delete,))
    )
    location = b"ckp/1"
    ckp = seal(struct.pack("<QQ", 5, 6) + str16(location), entry_type=0x40)
    assert ckp == encode_entry(CheckpointEntry(5, 6, "ckp/1"))


# --- golden vectors -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_golden_vector_encodes_exactly_and_decodes_back(name: str) -> None:
    encoded = encode_entry(ENTRIES[name], version=version_of(name))
    assert encoded == golden(name)
    assert encoded[codec.OFFSET_VERSION] == version_of(name)
    assert_same(decode_entry(encoded, DSN), ENTRIES[name])
    assert_same(decode_entry(memoryview(bytearray(encoded)), DSN), ENTRIES[name])


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_peek_reads_a_transactions_commit_ts_where_format_md_puts_it(name: str) -> None:
    """What a replay skips below its checkpoint without decoding (decision 0010)."""
    entry = ENTRIES[name]
    encoded = golden(name)
    if isinstance(entry, TxnEntry):
        assert peek_commit_ts(encoded) == entry.commit_ts
    else:
        assert peek_commit_ts(encoded) is None  # a CKP entry is decoded
    assert peek_commit_ts(encoded[:27]) is None  # too short to hold the timestamps
    assert peek_commit_ts(b"XX" + encoded[2:]) is None  # not our magic: decode says why


def test_the_vectors_cover_every_entry_command_and_column_type() -> None:
    entry_types: set[type] = set()
    commands: set[object] = set()
    column_types: set[str] = set()
    key_sizes = {0}
    batch_types: set[pa.DataType] = set()
    appends_by_version: dict[int, set[pa.DataType]] = {}
    for name, entry in ENTRIES.items():
        entry_types.add(type(entry))
        for cmd in entry.commands if isinstance(entry, TxnEntry) else ():
            if isinstance(cmd, UpdateCatalog):
                commands.add((cmd.kind, cmd.op))
                if cmd.schema is not None:
                    column_types |= {c.type for c in cmd.schema.columns}
                    key_sizes.add(len(cmd.schema.primary_key))
                    assert any(c.nullable for c in cmd.schema.columns)
            else:
                commands.add(type(cmd))
            if isinstance(cmd, Append) and len(cmd.infos) == 2:
                batch_types |= {field.type for field in cmd.batch.schema}
                assert any(column.null_count for column in cmd.batch.columns)
                appends_by_version.setdefault(version_of(name), set()).update(
                    field.type for field in cmd.batch.schema
                )
    assert entry_types == {TxnEntry, CheckpointEntry}
    assert commands == {
        (CatalogKind.DATABASE, CatalogOp.CREATE),
        (CatalogKind.DATABASE, CatalogOp.DROP),
        (CatalogKind.TABLE, CatalogOp.CREATE),
        (CatalogKind.TABLE, CatalogOp.DROP),
        Append,
        Delete,
        CreateBlock,
        DropBlock,
        Origin,
    }
    assert column_types == set(TYPES)
    assert max(key_sizes) >= 2  # a compound key
    assert batch_types == set(TYPES.values())
    # every column type, with nulls and two infos, as Arrow IPC (1) and as AppendColumns (2)
    assert appends_by_version == {1: set(TYPES.values()), 2: set(TYPES.values())}


def test_header_fields_sit_where_format_md_says() -> None:
    entry = golden("ckp_v1")
    magic, version, entry_type, reserved, body_len, checksum = struct.unpack("<2sBBIIQ", entry[:20])
    assert (magic, version, entry_type, reserved) == (b"TE", 1, EntryType.CKP, 0)
    assert body_len == len(entry) - 20 == 40
    assert checksum == xxhash.xxh3_64_intdigest(entry[:12] + entry[20:]) == 0x114A4A43A9F8F926
    assert struct.unpack("<QQH", entry[20:38]) == (500, 42, 22)
    assert entry[38:] == b"ckp/0000000500.parquet"
    assert codec.HEADER_BYTES == 20
    assert (codec.OFFSET_TYPE, codec.OFFSET_BODY_LEN, codec.OFFSET_CHECKSUM) == (3, 8, 12)


def test_the_worked_example_of_format_md() -> None:
    """FORMAT.md shows ac_delete_v1 byte by byte."""
    entry = golden("ac_delete_v1")
    assert len(entry) == 131
    assert entry[:12] == b"TE\x01\x10" + bytes(4) + struct.pack("<I", 111)
    assert entry[12:20] == bytes.fromhex("735b091a19cc086c")
    assert struct.unpack("<QQI", entry[20:40]) == (400, 402, 1)
    assert struct.unpack("<QQQ", entry[40:64]) == (1, 2, 1)
    assert struct.unpack("<IBI", entry[64:73]) == (1, codec.CMD_DELETE, 58)
    assert struct.unpack("<QQQI", entry[73:101]) == (1, 2, 1, 30)
    assert entry[101:] == FrozenBitMap([1, 5, 70000]).serialize()
    assert entry[101:] == bytes.fromhex(
        "3a300000020000000000010001000000180000001c000000010005007011"
    )


def test_the_batch_is_the_standard_arrow_ipc_stream() -> None:
    entry = ENTRIES["ac_append_v1"]
    assert isinstance(entry, TxnEntry)
    append = entry.commands[0]
    assert isinstance(append, Append)
    stream = encode_batch(append.batch)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, append.batch.schema) as writer:
        writer.write_batch(append.batch)
    assert stream == sink.getvalue().to_pybytes()
    assert stream == encode_batch(append.batch)  # deterministic (and cached schema message)
    assert stream in golden("ac_append_v1")
    read = pa.ipc.open_stream(stream).read_all()
    assert read.to_batches()[0].equals(append.batch)


def test_encode_refuses_what_decode_would_reject() -> None:
    db = UpdateCatalog(CatalogKind.DATABASE, CatalogOp.CREATE, 1, 0, "d", None)
    memo = (MemoItem(1, 0, 0),)
    bad = [
        TxnEntry(5, 5, memo, (db,)),  # commit_ts not above start_ts
        TxnEntry(1, 2, memo, ()),  # no commands
        TxnEntry(1, 2, (MemoItem(1, 2, 0), MemoItem(1, 0, 0)), (db,)),  # memo unsorted
        TxnEntry(1, 2, (*memo, *memo), (db,)),  # memo repeated
        TxnEntry(1, 2, memo, (Append(1, 2, (AppendInfo(1, 0, 2),), BATCH),)),
        TxnEntry(1, 2, memo, (Append(1, 2, (), BATCH.slice(0, 0)),)),
        TxnEntry(1, 2, memo, (Delete(1, 2, 1, FrozenBitMap()),)),
        TxnEntry(
            1, 2, memo, (UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, 1, 2, "t", None),)
        ),
        TxnEntry(
            1, 2, memo, (UpdateCatalog(CatalogKind.DATABASE, CatalogOp.DROP, 1, 2, "d", None),)
        ),
        TxnEntry(
            1,
            2,
            memo,
            (UpdateCatalog(CatalogKind.DATABASE, CatalogOp.DROP, 1, 0, "d" * 256, None),),
        ),
    ]
    for entry in bad:
        with pytest.raises(AssertionError):
            encode_entry(entry)


# --- damage to the bytes --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_prefix_is_refused(name: str) -> None:
    entry = golden(name)
    for size in range(len(entry)):
        reason = reason_of(entry[:size])
        assert reason == (codec.REASON_SHORT if size < codec.HEADER_BYTES else codec.REASON_LENGTH)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_a_flipped_bit_at_every_byte_is_refused(name: str) -> None:
    entry = golden(name)
    for offset in range(len(entry)):
        damaged = bytearray(entry)
        damaged[offset] ^= 1 << (offset % 8)
        reason = reason_of(bytes(damaged))
        if offset < 2:
            assert reason == codec.REASON_MAGIC
        elif offset == 2:
            assert reason == codec.REASON_VERSION
        elif 8 <= offset < 12:
            assert reason == codec.REASON_LENGTH
        else:  # the type, the reserved bits, the checksum itself and every body byte
            assert reason == codec.REASON_CHECKSUM, offset


def test_zeroed_extended_and_versioned_entries_are_refused() -> None:
    entry = golden("ac_create_v1")
    assert reason_of(b"") == codec.REASON_SHORT
    assert reason_of(bytes(len(entry))) == codec.REASON_MAGIC
    assert reason_of(entry[:20] + bytes(len(entry) - 20)) == codec.REASON_CHECKSUM
    assert reason_of(entry + b"\x00") == codec.REASON_LENGTH
    assert reason_of(entry[:2] + b"\x04" + entry[3:]) == codec.REASON_VERSION
    assert reason_of(reseal(entry[:2] + b"\x04" + entry[3:])) == codec.REASON_VERSION
    assert reason_of(reseal(entry[:2] + b"\x00" + entry[3:])) == codec.REASON_VERSION
    assert reason_of(bytes(limits.TXN_ENTRY_BYTES_MAX + 1)) == codec.REASON_TOO_LARGE


@pytest.mark.parametrize(
    ("entry_type", "reason"),
    [
        (0x00, codec.REASON_TYPE),  # zero-filled space never parses, even resealed
        (0x11, codec.REASON_RESERVED_TYPE),  # PC, reserved for issue 14
        (0x12, codec.REASON_RESERVED_TYPE),  # UC, reserved for issue 14
        (0x20, codec.REASON_TYPE),
        (0xFF, codec.REASON_TYPE),
    ],
)
def test_entry_types_other_than_ac_and_ckp_are_refused(entry_type: int, reason: str) -> None:
    assert reason_of(seal(golden("ckp_v1")[20:], entry_type=entry_type)) == reason
    assert reason_of(seal(bytes(40), entry_type=entry_type)) == reason


def test_resealed_entries_are_checked_field_by_field() -> None:
    create = golden("ac_create_v1")
    ckp = golden("ckp_v1")
    assert reason_of(reseal(ckp[:4] + b"\x01" + ckp[5:])) == codec.REASON_RESERVED_BITS
    assert reason_of(seal(bytes(40), entry_type=0x10)) == codec.REASON_TIMESTAMPS
    # commit_ts not above start_ts.
    same_ts = create[:28] + struct.pack("<Q", 100) + create[36:]
    assert reason_of(reseal(same_ts)) == codec.REASON_TIMESTAMPS
    # Memo out of order, or repeated.
    memo_a, memo_b = create[40:64], create[64:88]
    assert reason_of(reseal(create[:40] + memo_b + memo_a + create[88:])) == codec.REASON_MEMO_ORDER
    assert reason_of(reseal(create[:40] + memo_a + memo_a + create[88:])) == codec.REASON_MEMO_ORDER
    # No commands.
    assert reason_of(seal(struct.pack("<QQII", 1, 2, 0, 0))) == codec.REASON_EMPTY
    # An unknown command type (the first command's type byte sits after the count).
    first_cmd = 88 + 4
    assert create[first_cmd] == codec.CMD_UPDATE_CATALOG
    for cmd_type in (0, 7, 0xFF):
        unknown = create[:first_cmd] + bytes([cmd_type]) + create[first_cmd + 1 :]
        assert reason_of(reseal(unknown)) == codec.REASON_COMMAND
    # A database create that claims to be a table (it has no schema), kind 0, op 3.
    kind_at = first_cmd + 5
    for at, value in ((kind_at, 2), (kind_at, 0), (kind_at + 1, 3)):
        bad = create[:at] + bytes([value]) + create[at + 1 :]
        assert reason_of(reseal(bad)) == codec.REASON_CATALOG
    # A command longer than its fields: cmd_len + 1 and one byte inserted after the command.
    first_len = struct.unpack_from("<I", create, first_cmd + 1)[0]
    end = kind_at + first_len
    longer = create[: first_cmd + 1] + struct.pack("<I", first_len + 1) + create[kind_at:end]
    longer += b"\x00" + create[end:]
    longer = longer[:8] + struct.pack("<I", len(longer) - 20) + longer[12:]
    assert reason_of(reseal(longer)) == codec.REASON_COMMAND_LENGTH
    # Bytes after the last field (body_len adjusted so only the field walk can object).
    for entry in (create, ckp):
        extended = entry + b"\x00"
        extended = extended[:8] + struct.pack("<I", len(extended) - 20) + extended[12:]
        assert reason_of(reseal(extended)) == codec.REASON_TRAILING


def offset_of(entry: bytes) -> int | None:
    with pytest.raises(WalCorruption) as caught:
        decode_entry(entry, DSN)
    return caught.value.offset_bytes


def test_reports_point_at_the_field_format_md_names() -> None:
    create = golden("ac_create_v1")
    assert offset_of(create[:7]) == 7
    assert offset_of(b"XE" + create[2:]) == 0
    assert offset_of(create[:2] + b"\x09" + create[3:]) == 2
    assert offset_of(create[:-1]) == 8
    assert offset_of(create[:-1] + bytes([create[-1] ^ 1])) == 12
    assert offset_of(reseal(create[:3] + b"\x11" + create[4:])) == 3
    assert offset_of(reseal(create[:28] + struct.pack("<Q", 1) + create[36:])) == 20
    assert offset_of(reseal(create[:40] + create[64:88] + create[40:64] + create[88:])) == 36
    assert offset_of(catalog_entry(b"\xff")) == 20 + 16 + 4 + 24 + 4 + 5 + 18  # name length
    stream_at = len(append_entry(STREAM)) - len(STREAM) - 4
    assert offset_of(append_entry(STREAM[:-8])) == stream_at  # batch_len
    assert offset_of(append_entry(STREAM, ((1, 0, 2),))) == 20 + 16 + 4 + 24 + 4 + 5 + 16
    assert offset_of(delete_entry(b"")) == 20 + 16 + 4 + 24 + 4 + 5 + 24  # mask_len


def block_entry(cmd_type: int, body: bytes) -> bytes:
    return txn_entry(command(cmd_type, body), memo=((1, 2, 3),))


def create_body(
    ids: tuple[int, int, int] = (1, 2, 3), level: int = 1, rows: int = 5, name: bytes = b"o"
) -> bytes:
    return struct.pack("<QQQBII", *ids, level, 0, rows) + str16(name)


def test_block_command_rules() -> None:
    assert isinstance(decode_entry(block_entry(4, create_body()), DSN), TxnEntry)
    assert isinstance(decode_entry(block_entry(5, struct.pack("<QQQ", 1, 2, 3)), DSN), TxnEntry)
    for bad in (
        create_body(ids=(0, 2, 3)),
        create_body(ids=(1, 0, 3)),
        create_body(ids=(1, 2, 0)),
        create_body(level=0),
        create_body(level=3),
        create_body(rows=0),
    ):
        assert reason_of(block_entry(4, bad)) == codec.REASON_BLOCK
    for name in (b"", b"\xff", b"x" * 1025):
        assert reason_of(block_entry(4, create_body(name=name))) == codec.REASON_NAME
    for ids in ((0, 2, 3), (1, 0, 3), (1, 2, 0)):
        assert reason_of(block_entry(5, struct.pack("<QQQ", *ids))) == codec.REASON_BLOCK
    assert reason_of(block_entry(5, struct.pack("<QQQ", 1, 2, 3) + b"\x00")) == (
        codec.REASON_COMMAND_LENGTH
    )
    assert reason_of(block_entry(7, b"")) == codec.REASON_COMMAND
    origin = struct.pack("<B", 4) + b"cn-a" + struct.pack("<Q", 9)
    assert isinstance(decode_entry(block_entry(6, origin), DSN), TxnEntry)
    assert reason_of(block_entry(6, b"\x00" + struct.pack("<Q", 9))) == codec.REASON_NAME
    assert reason_of(block_entry(6, b"\x02\xff\xfe" + struct.pack("<Q", 9))) == codec.REASON_NAME
    assert reason_of(block_entry(6, origin[:-1])) == codec.REASON_TRUNCATED


def test_catalog_rules() -> None:
    assert isinstance(decode_entry(catalog_entry(schema=ONE_COLUMN), DSN), TxnEntry)
    assert isinstance(decode_entry(catalog_entry(kind=1), DSN), TxnEntry)
    assert reason_of(catalog_entry(kind=1, schema=ONE_COLUMN)) == codec.REASON_CATALOG
    assert reason_of(catalog_entry(schema=None)) == codec.REASON_CATALOG  # table without one
    for name in (b"", b"\xff\xfe", b"a\x00b", b"caf\xc3", "é".encode("utf-16")):
        assert reason_of(catalog_entry(name, ONE_COLUMN)) == codec.REASON_NAME, name
    assert reason_of(catalog_entry(b"x" * 256, ONE_COLUMN)) == codec.REASON_NAME
    assert isinstance(decode_entry(catalog_entry(b"x" * 255, ONE_COLUMN), DSN), TxnEntry)


@pytest.mark.parametrize(
    ("columns", "keys"),
    [
        ([(b"id", b"int65", 0)], [0]),  # unknown type
        ([(b"id", b"double", 0)], [0]),  # an alias: the WAL holds canonical names only
        ([(b"id", b"INT64", 0)], [0]),
        ([(b"id", b"\xff", 0)], [0]),  # not UTF-8
        ([(b"id", b"int64", 2)], [0]),  # nullable not 0 or 1
        ([(b"id", b"int64", 0)], [1]),  # key index out of range
        ([(b"id", b"int64", 0)], []),  # no key
        ([(b"id", b"int64", 0)], [0, 0]),  # key repeats a column
        ([(b"id", b"int64", 1)], [0]),  # a nullable key
        ([(b"f", b"float64", 0)], [0]),  # a float key
        ([(b"id", b"int64", 0), (b"id", b"string", 1)], [0]),  # duplicate column
        ([(b"", b"int64", 0)], [0]),  # empty column name
        ([(b"a\nb", b"int64", 0)], [0]),  # control character
        ([], []),  # no columns
    ],
)
def test_schema_rules(columns: list[tuple[bytes, bytes, int]], keys: list[int]) -> None:
    assert reason_of(catalog_entry(schema=schema_bytes(columns, keys))) == codec.REASON_SCHEMA


def test_too_many_columns_is_refused_before_reading_them() -> None:
    count = struct.pack("<H", limits.COLUMNS_MAX + 1)
    assert reason_of(catalog_entry(schema=count)) == codec.REASON_SCHEMA


def arrow_stream(batches: list[pa.RecordBatch], **options: object) -> bytes:
    sink = pa.BufferOutputStream()
    write_options = pa.ipc.IpcWriteOptions(**options)
    with pa.ipc.new_stream(sink, batches[0].schema, options=write_options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _invalid_utf8_batch() -> pa.RecordBatch:
    offsets = pa.py_buffer(struct.pack("<ii", 0, 2))
    strings = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(b"\xff\xfe")])
    return pa.RecordBatch.from_arrays([strings], names=["s"])


def _batch_of(array: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([array], names=["c"])


STREAM = encode_batch(BATCH)

BAD_STREAMS = {
    "empty": b"",
    "garbage": bytes(b ^ 0x5A for b in STREAM),
    "schema only": BATCH.schema.serialize().to_pybytes() + STREAM[-8:],
    "no end marker": STREAM[:-8],
    "old 4-byte end marker": STREAM[:-8] + bytes(4),
    "bytes after the end": STREAM + b"\x00",
    "two batches": arrow_stream([BATCH, BATCH]),
    "zstd": arrow_stream([BATCH], compression="zstd"),
    "lz4": arrow_stream([BATCH], compression="lz4"),
    "dictionary": arrow_stream([_batch_of(pa.array(["a"]).dictionary_encode())]),
    "large_string": arrow_stream([_batch_of(pa.array(["a"], pa.large_string()))]),
    "timestamp ns": arrow_stream([_batch_of(pa.array([1], pa.timestamp("ns")))]),
    "timestamp tz": arrow_stream([_batch_of(pa.array([1], pa.timestamp("us", tz="UTC")))]),
    "list": arrow_stream([_batch_of(pa.array([[1]]))]),
    "invalid utf8": encode_batch(_invalid_utf8_batch()),
}


@pytest.mark.parametrize("name", sorted(BAD_STREAMS))
def test_arrow_streams_other_than_one_plain_batch_are_refused(name: str) -> None:
    assert reason_of(append_entry(BAD_STREAMS[name])) == codec.REASON_ARROW


@pytest.mark.parametrize(
    "infos",
    [(), ((1, 0, 2),), ((1, 0, 1), (2, 0, 0)), ((1, 0, 0), (2, 0, 1))],
)
def test_infos_must_cover_the_batch_in_rows_of_one_or_more(
    infos: tuple[tuple[int, int, int], ...],
) -> None:
    assert reason_of(append_entry(STREAM, infos)) == codec.REASON_INFOS


def test_masks_must_be_valid_canonical_and_not_empty() -> None:
    mask = FrozenBitMap([1, 5, 70000]).serialize()
    assert isinstance(decode_entry(delete_entry(mask), DSN), TxnEntry)
    runs = BitMap(range(100, 5000))
    runs.run_optimize()
    assert isinstance(decode_entry(delete_entry(runs.serialize()), DSN), TxnEntry)
    unsorted = struct.pack("<IIHHI", 12346, 1, 0, 2, 16) + struct.pack("<HHH", 5, 1, 9)
    repeated = struct.pack("<IIHHI", 12346, 1, 0, 2, 16) + struct.pack("<HHH", 1, 1, 9)
    for bad in (
        b"",
        b"\xff" * len(mask),
        mask[:-1],
        mask + b"\x00",  # a valid bitmap followed by bytes it does not use
        FrozenBitMap().serialize(),  # an empty mask deletes nothing: never written
        unsorted,
        repeated,
    ):
        assert reason_of(delete_entry(bad)) == codec.REASON_BITMAP, bad.hex()


HUGE = 0xFFFFFFFF
DB_CREATE_HEAD = struct.pack("<BBQQ", 1, 1, 1, 0)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (seal(struct.pack("<QQI", 1, 2, HUGE)), codec.REASON_TRUNCATED),  # memo count
        (seal(struct.pack("<QQII", 1, 2, 0, HUGE)), codec.REASON_TRUNCATED),  # command count
        (txn_entry(struct.pack("<BI", 2, HUGE)), codec.REASON_TRUNCATED),  # cmd_len
        (txn_entry(command(2, struct.pack("<QQI", 1, 2, HUGE))), codec.REASON_TRUNCATED),
        (txn_entry(command(2, struct.pack("<QQII", 1, 2, 0, HUGE))), codec.REASON_TRUNCATED),
        (txn_entry(command(3, struct.pack("<QQQI", 1, 2, 1, HUGE))), codec.REASON_TRUNCATED),
        (txn_entry(command(1, DB_CREATE_HEAD + b"\xff\x00")), codec.REASON_TRUNCATED),  # name
        (txn_entry(command(1, DB_CREATE_HEAD + b"\xff\xff")), codec.REASON_NAME),
        (catalog_entry(schema=struct.pack("<H", 0xFFFF)), codec.REASON_SCHEMA),  # columns
        (catalog_entry(schema=ONE_COLUMN[:-4] + b"\xff\xff"), codec.REASON_SCHEMA),  # keys
        (seal(struct.pack("<QQH", 1, 2, 0xFFFF), entry_type=0x40), codec.REASON_TRUNCATED),
    ],
)
def test_an_oversized_count_or_length_is_refused_without_allocating(
    entry: bytes, reason: str | None
) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(WalCorruption) as caught:
            decode_entry(entry, DSN)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 64 * 1024
    if reason is not None:
        assert caught.value.reason == reason


def _arrow_range(entry: Entry, data: bytes) -> range:
    if not isinstance(entry, TxnEntry) or data[codec.OFFSET_VERSION] == 2:
        return range(0)  # version 2's small appends are AppendColumns: no byte is ignored
    for cmd in entry.commands:
        if isinstance(cmd, Append):
            stream = encode_batch(cmd.batch)
            start = data.index(stream)
            return range(start, start + len(stream))
    return range(0)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_random_resealed_damage_raises_only_wal_corruption(name: str) -> None:
    """Behind a valid checksum, a random byte at every offset of the body either is refused
    with `WalCorruption` or decodes; outside the Arrow stream a decoded entry re-encodes to
    exactly the damaged bytes (the format has no ignored bytes or bits; AppendColumns none at
    all, the value bytes under a null included)."""
    rng = random.Random(f"resealed {name}")
    entry = golden(name)
    arrow = _arrow_range(ENTRIES[name], entry)
    for offset in range(codec.HEADER_BYTES, len(entry)):
        damaged = bytearray(entry)
        damaged[offset] = rng.choice([b for b in range(256) if b != entry[offset]])
        sealed = reseal(bytes(damaged))
        try:
            decoded = decode_entry(sealed, DSN)
        except WalCorruption as exc:
            assert exc.dsn == DSN
            assert exc.offset_bytes is not None
            assert 0 <= exc.offset_bytes <= len(entry)
            continue
        if offset not in arrow:
            assert encode_entry(decoded, version=version_of(name)) == sealed, offset


# --- round trip -----------------------------------------------------------------------------

names = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF), min_size=1, max_size=12)
ids = st.integers(min_value=1, max_value=(1 << 64) - 1)
u32s = st.integers(min_value=0, max_value=(1 << 32) - 1)


@st.composite
def schemas(draw: st.DrawFn) -> Schema:
    column_names = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    key_count = draw(st.integers(min_value=1, max_value=len(column_names)))
    columns = []
    for index, name in enumerate(column_names):
        if index < key_count:
            columns.append(Column(name, draw(st.sampled_from(sorted(KEY_TYPES)))))
        else:
            type_name = draw(st.sampled_from(sorted(TYPES)))
            columns.append(Column(name, type_name, nullable=draw(st.booleans())))
    keys = draw(st.permutations(column_names[:key_count]))
    return Schema(columns, primary_key=keys)


@st.composite
def appends(draw: st.DrawFn) -> Append:
    values = draw(
        st.lists(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), min_size=1, max_size=9)
    )
    batch = pa.RecordBatch.from_pylist(
        [{"k": v, "s": None if v % 2 else str(v), "t": v % 3 == 0} for v in values],
        schema=pa.schema(
            [
                pa.field("k", pa.int64(), nullable=False),
                pa.field("s", pa.string()),
                pa.field("t", pa.bool_()),
            ]
        ),
    )
    cuts: set[int] = set()
    if len(values) > 1:
        cuts = draw(st.sets(st.integers(min_value=1, max_value=len(values) - 1)))
    bounds = [0, *sorted(cuts), len(values)]
    infos = tuple(
        AppendInfo(draw(ids), draw(u32s), hi - lo) for lo, hi in itertools.pairwise(bounds)
    )
    return Append(draw(ids), draw(ids), infos, batch)


KEY_VALUES: dict[str, st.SearchStrategy[object]] = {
    "int8": st.integers(-(1 << 7), (1 << 7) - 1),
    "int16": st.integers(-(1 << 15), (1 << 15) - 1),
    "int32": st.integers(-(1 << 31), (1 << 31) - 1),
    "int64": st.integers(-(1 << 63), (1 << 63) - 1),
    "uint8": st.integers(0, (1 << 8) - 1),
    "uint16": st.integers(0, (1 << 16) - 1),
    "uint32": st.integers(0, (1 << 32) - 1),
    "uint64": st.integers(0, (1 << 64) - 1),
    "bool": st.booleans(),
    "string": st.text(max_size=8),
    "binary": st.binary(max_size=8),
    "date32": st.dates(),
    "timestamp[us]": st.datetimes(),
}
assert set(KEY_VALUES) == KEY_TYPES


@st.composite
def deleted_keys(draw: st.DrawFn, count: int) -> DeletedKeys:
    """The keys of `count` deleted rows: one to three key columns of any key types."""
    key_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    key_columns = tuple((name, draw(st.sampled_from(sorted(KEY_TYPES)))) for name in key_names)
    rows = [
        tuple(draw(KEY_VALUES[type_name]) for _, type_name in key_columns) for _ in range(count)
    ]
    values = tuple(row[0] for row in rows) if len(key_columns) == 1 else tuple(rows)
    return DeletedKeys(key_columns, values)


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        return CheckpointEntry(draw(ids), draw(ids), draw(st.text(max_size=40)))
    start = draw(st.integers(min_value=0, max_value=1 << 63))
    commit = start + draw(st.integers(min_value=1, max_value=1 << 20))
    memo = tuple(
        MemoItem(*m) for m in sorted(set(draw(st.lists(st.tuples(ids, ids, ids), max_size=4))))
    )
    commands: list[UpdateCatalog | Append | Delete | CreateBlock | DropBlock] = []
    for kind in draw(
        st.lists(
            st.sampled_from(["db", "table", "drop", "append", "delete", "create", "unlink"]),
            min_size=1,
            max_size=4,
        )
    ):
        if kind == "create":
            object_name = draw(st.text(min_size=1, max_size=60))
            commands.append(
                CreateBlock(
                    draw(ids),
                    draw(ids),
                    draw(ids),
                    draw(st.sampled_from(list(BlockLevel))),
                    object_name,
                    draw(u32s),
                    draw(u32s.filter(bool)),
                )
            )
            continue
        if kind == "unlink":
            commands.append(DropBlock(draw(ids), draw(ids), draw(ids)))
            continue
        if kind == "db":
            op = draw(st.sampled_from(list(CatalogOp)))
            commands.append(
                UpdateCatalog(CatalogKind.DATABASE, op, draw(ids), 0, draw(names), None)
            )
        elif kind == "table":
            commands.append(
                UpdateCatalog(
                    CatalogKind.TABLE,
                    CatalogOp.CREATE,
                    draw(ids),
                    draw(ids),
                    draw(names),
                    draw(schemas()),
                )
            )
        elif kind == "drop":
            commands.append(
                UpdateCatalog(
                    CatalogKind.TABLE, CatalogOp.DROP, draw(ids), draw(ids), draw(names), None
                )
            )
        elif kind == "append":
            commands.append(draw(appends()))
        else:
            rows = FrozenBitMap(draw(st.lists(u32s, min_size=1, max_size=20)))
            keys = draw(st.none() | deleted_keys(len(rows)))
            commands.append(Delete(draw(ids), draw(ids), draw(ids), rows, keys))
    return TxnEntry(start, commit, memo, tuple(commands))


@settings(max_examples=150, deadline=None)
@given(entries())
def test_random_entries_round_trip(entry: Entry) -> None:
    encoded = encode_entry(entry)
    decoded = decode_entry(encoded, DSN)
    assert_same(decoded, entry)
    assert encode_entry(decoded) == encoded


# --- AppendColumns (version 2) --------------------------------------------------------------

_VALUES: dict[str, st.SearchStrategy[object]] = {
    "int8": st.integers(-(1 << 7), (1 << 7) - 1),
    "int16": st.integers(-(1 << 15), (1 << 15) - 1),
    "int32": st.integers(-(1 << 31), (1 << 31) - 1),
    "int64": st.integers(-(1 << 63), (1 << 63) - 1),
    "uint8": st.integers(0, (1 << 8) - 1),
    "uint16": st.integers(0, (1 << 16) - 1),
    "uint32": st.integers(0, (1 << 32) - 1),
    "uint64": st.integers(0, (1 << 64) - 1),
    "float32": st.floats(width=32, allow_nan=False),
    "float64": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "string": st.text(max_size=8),
    "binary": st.binary(max_size=8),
    "date32": st.dates(),
    "timestamp[us]": st.datetimes(),
}


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_append_columns_round_trip_every_type_and_size(data: st.DataObject) -> None:
    """A batch of any engine types, with or without nulls, of 1 row to past the compact limit,
    sliced or not, decodes to the same batch; small unsliced batches travel as AppendColumns
    (version 2), the others as Arrow IPC (an entry of version 1)."""
    type_names = data.draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=5))
    rows = data.draw(st.sampled_from([1, 2, 7, 8, 9, 63, APPEND_COLUMNS_ROWS_MAX, 300]))
    fields = []
    columns = []
    for index, type_name in enumerate(type_names):
        nullable = data.draw(st.booleans())
        values = st.none() | _VALUES[type_name] if nullable else _VALUES[type_name]
        column = data.draw(st.lists(values, min_size=rows + 1, max_size=rows + 1))
        fields.append(pa.field(f"c{index}", TYPES[type_name], nullable=nullable))
        columns.append(pa.array(column, type=TYPES[type_name]))
    whole = pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
    sliced = data.draw(st.booleans())
    batch = whole.slice(1, rows) if sliced else whole.slice(0, rows)
    entry = TxnEntry(1, 2, (MemoItem(1, 2, 1),), (Append(1, 2, (AppendInfo(1, 0, rows),), batch),))
    encoded = encode_entry(entry)
    compact = not sliced and rows <= APPEND_COLUMNS_ROWS_MAX
    assert encoded[codec.OFFSET_VERSION] == (2 if compact else 1)
    decoded = decode_entry(encoded, DSN)
    assert isinstance(decoded, TxnEntry)
    (append,) = decoded.commands
    assert isinstance(append, Append)
    assert append.batch.equals(batch)
    assert append.batch.schema.equals(batch.schema, check_metadata=True)
    assert_same(decode_entry(encode_entry(entry, version=1), DSN), decoded)


def test_append_columns_refuses_what_version_1_and_the_grammar_do_not_allow() -> None:
    head = struct.pack("<IH", 1, 1)
    one_id = head + str16(b"id") + b"\x05int64"
    value = struct.pack("<q", 1)
    ok = columns_entry(one_id + b"\x00\x00" + value)
    assert isinstance(decode_entry(ok, DSN), TxnEntry)
    as_v1 = ok[:2] + b"\x01" + ok[3:]
    assert reason_of(reseal(as_v1)) == codec.REASON_COMMAND  # command 7 is version 2's

    def reason(columns: bytes) -> str:
        return reason_of(columns_entry(columns))

    assert reason(one_id + b"\x00\x00" + value + b"\x00").endswith(columns.REASON_SIZE)
    assert reason(one_id + b"\x00\x00" + value[:7]).endswith(columns.REASON_TRUNCATED)
    assert reason(one_id + b"\x02\x00" + value).endswith(columns.REASON_DEFINITION)
    # validity on a non-nullable column, and validity bits that say "no nulls"
    assert reason(one_id + b"\x00\x01\x00" + value).endswith(columns.REASON_VALIDITY)
    assert reason(one_id + b"\x01\x01\x01" + value).endswith(columns.REASON_VALIDITY)
    assert reason(one_id + b"\x01\x01\x02" + value).endswith(columns.REASON_PADDING)
    assert reason(struct.pack("<IH", 0, 1) + one_id[6:] + b"\x00\x00").endswith(
        columns.REASON_DEFINITION
    )
    text = head + str16(b"s") + b"\x06string" + b"\x00\x00"
    assert isinstance(
        decode_entry(columns_entry(text + struct.pack("<II", 0, 2) + b"hi"), DSN), TxnEntry
    )
    assert reason(text + struct.pack("<II", 1, 2) + b"hi").endswith(columns.REASON_VALUES)
    assert reason(text + struct.pack("<II", 0, 2) + b"\xff\xfe").endswith(columns.REASON_VALUES)
    bools = head + str16(b"b") + b"\x04bool" + b"\x00\x00"
    assert reason(bools + b"\x03").endswith(columns.REASON_PADDING)
    assert reason(
        struct.pack("<IH", 1, 2) + (str16(b"d") + b"\x04bool\x00\x00") * 2 + b"\x01\x01"
    ).endswith(columns.REASON_DEFINITION)  # two columns of one name
