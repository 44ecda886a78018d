"""The codec of the engine's WAL entries: `encode_entry` / `decode_entry` (bytes in
engine/FORMAT.md).

Why this shape (shared/STYLE.md "Formats are documented beside their code"): little-endian
fixed fields with explicit lengths, a magic, a version and an xxh3-64 checksum over header and
body, no pickle; rows as a standard Arrow IPC stream (readable by any Arrow implementation)
and delete masks in roaring's portable serialization. The driver record around each entry
(tae_driver/FORMAT.md) carries the DSN and its own checksum; this checksum makes an entry
self-checking wherever its bytes travel (Spark jobs read entries out of segment files).

Decoding never trusts a length: every count and size is checked against the bytes that remain
before anything is allocated, and every failure is a `WalCorruption(dsn, reason, offset)`
with one of the `REASON_*` strings below.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
import xxhash
from pyroaring import FrozenBitMap

from engine import limits
from engine.errors import SchemaError, WalCorruption
from engine.schema import TYPES, Column, Schema
from engine.wal.entry import (
    Append,
    AppendInfo,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    Command,
    Delete,
    EntryType,
    MemoItem,
    TxnEntry,
    UpdateCatalog,
)

MAGIC = b"TE"
VERSION = 1

_HEADER = struct.Struct("<2sBBIIQ")
"""magic, version, entry type, reserved (0), body length, checksum."""
HEADER_BYTES = _HEADER.size
_CHECKED_HEADER_BYTES = HEADER_BYTES - 8
"""The checksum covers the header up to (not including) itself, then the body."""

CMD_UPDATE_CATALOG = 1
CMD_APPEND = 2
CMD_DELETE = 3

RESERVED_ENTRY_TYPES = frozenset({0x11, 0x12})
"""PC and UC (large transactions in pieces, seed 004_*): reserved; issue 14 writes large
transactions as objects instead."""

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_TXN_HEAD = struct.Struct("<QQ")
_MEMO = struct.Struct("<QQQ")
_CMD_HEAD = struct.Struct("<BI")
_CATALOG_HEAD = struct.Struct("<BBQQ")
_COLUMN_TAIL = struct.Struct("<B")
_TABLE_REF = struct.Struct("<QQ")
_INFO = struct.Struct("<QII")
_DELETE_HEAD = struct.Struct("<QQQ")
_CKP_HEAD = struct.Struct("<QQ")

_IPC_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"

REASON_SHORT = "entry shorter than its header"
REASON_MAGIC = "bad magic"
REASON_VERSION = "unknown version"
REASON_TYPE = "unknown entry type"
REASON_RESERVED_TYPE = "reserved entry type (PC/UC)"
REASON_RESERVED_BITS = "reserved header bits set"
REASON_LENGTH = "body length does not match the entry"
REASON_TOO_LARGE = "entry larger than txn_entry_bytes_max"
REASON_CHECKSUM = "checksum mismatch"
REASON_TRUNCATED = "field runs past the end of the body"
REASON_TRAILING = "bytes after the last field"
REASON_TIMESTAMPS = "commit_ts is not above start_ts"
REASON_MEMO_ORDER = "memo not sorted or repeated"
REASON_COMMAND = "unknown command type"
REASON_COMMAND_LENGTH = "command length does not match its fields"
REASON_CATALOG = "bad catalog command"
REASON_NAME = "bad name"
REASON_SCHEMA = "bad schema"
REASON_INFOS = "append infos do not cover the batch"
REASON_ARROW = "Arrow IPC batch does not decode"
REASON_BITMAP = "delete mask does not decode"
REASON_EMPTY = "a transaction entry without commands"

_SCHEMA_CACHE_MAX = 256
_schema_messages: dict[pa.Schema, bytes] = {}


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """`batch` as an Arrow IPC stream: schema message, one record batch message, end marker.
    The schema message is cached per schema (a commit re-encodes only the batch)."""
    schema = batch.schema
    message = _schema_messages.get(schema)
    if message is None:
        message = schema.serialize().to_pybytes()
        if len(_schema_messages) >= _SCHEMA_CACHE_MAX:
            _schema_messages.clear()
        _schema_messages[schema] = message
    return b"".join((message, batch.serialize().to_pybytes(), _IPC_EOS))


def _name(text: str) -> bytes:
    data = text.encode()
    assert len(data) <= limits.NAME_BYTES_MAX
    return _U16.pack(len(data)) + data


def _encode_schema(schema: Schema) -> bytes:
    parts = [_U16.pack(len(schema.columns))]
    for column in schema.columns:
        type_name = column.type.encode()
        parts.append(_name(column.name))
        parts.append(_U8.pack(len(type_name)) + type_name)
        parts.append(_COLUMN_TAIL.pack(1 if column.nullable else 0))
    parts.append(_U16.pack(len(schema.key_indexes)))
    parts.extend(_U16.pack(index) for index in schema.key_indexes)
    return b"".join(parts)


def _encode_command(cmd: Command) -> bytes:
    if isinstance(cmd, UpdateCatalog):
        body = b"".join(
            (
                _CATALOG_HEAD.pack(cmd.kind, cmd.op, cmd.db_id, cmd.table_id),
                _name(cmd.name),
                b"\x00" if cmd.schema is None else b"\x01" + _encode_schema(cmd.schema),
            )
        )
        kind = CMD_UPDATE_CATALOG
    elif isinstance(cmd, Append):
        batch = encode_batch(cmd.batch)
        body = b"".join(
            (
                _TABLE_REF.pack(cmd.db_id, cmd.table_id),
                _U32.pack(len(cmd.infos)),
                *(_INFO.pack(i.block_id, i.offset, i.rows) for i in cmd.infos),
                _U32.pack(len(batch)),
                batch,
            )
        )
        kind = CMD_APPEND
    else:
        assert isinstance(cmd, Delete)
        mask = cmd.rows.serialize()
        body = b"".join(
            (_DELETE_HEAD.pack(cmd.db_id, cmd.table_id, cmd.block_id), _U32.pack(len(mask)), mask)
        )
        kind = CMD_DELETE
    return _CMD_HEAD.pack(kind, len(body)) + body


def encode_entry(entry: TxnEntry | CheckpointEntry) -> bytes:
    if isinstance(entry, TxnEntry):
        assert entry.commit_ts > entry.start_ts
        assert entry.commands
        parts = [
            _TXN_HEAD.pack(entry.start_ts, entry.commit_ts),
            _U32.pack(len(entry.memo)),
            *(_MEMO.pack(m.db_id, m.table_id, m.block_id) for m in entry.memo),
            _U32.pack(len(entry.commands)),
            *(_encode_command(cmd) for cmd in entry.commands),
        ]
        entry_type = EntryType.AC
    else:
        location = entry.location.encode()
        parts = [
            _CKP_HEAD.pack(entry.ckp_ts, entry.truncate_dsn),
            _U16.pack(len(location)),
            location,
        ]
        entry_type = EntryType.CKP
    body = b"".join(parts)
    head = _HEADER.pack(MAGIC, VERSION, entry_type, 0, len(body), 0)[:_CHECKED_HEADER_BYTES]
    hasher = xxhash.xxh3_64(head)
    hasher.update(body)
    return b"".join((head, _U64.pack(hasher.intdigest()), body))


# --- decoding --------------------------------------------------------------------------------

R = TypeVar("R")


class _Reader:
    """A cursor over the body; every read is bounds-checked. `base` is the body's offset in
    the entry, so errors report offsets in the entry."""

    __slots__ = ("base", "data", "dsn", "pos")

    def __init__(self, data: memoryview, dsn: int, base: int) -> None:
        self.data = data
        self.dsn = dsn
        self.pos = 0
        self.base = base

    def fail(self, reason: str, at: int | None = None) -> WalCorruption:
        return WalCorruption(self.dsn, reason, self.base + (self.pos if at is None else at))

    def take(self, size: int) -> memoryview:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise self.fail(REASON_TRUNCATED)
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        values: tuple[int, ...] = fmt.unpack(self.take(fmt.size))
        return values

    def u8(self) -> int:
        return self.unpack(_U8)[0]

    def u16(self) -> int:
        return self.unpack(_U16)[0]

    def u32(self) -> int:
        return self.unpack(_U32)[0]

    def count(self, item_bytes: int) -> int:
        """A u32 count of items of at least `item_bytes` each, checked against what remains."""
        at = self.pos
        count = self.u32()
        if count * item_bytes > len(self.data) - self.pos:
            raise self.fail(REASON_TRUNCATED, at)
        return count

    def text(self, size: int) -> str:
        at = self.pos
        raw = self.take(size)
        try:
            value = bytes(raw).decode()
        except UnicodeDecodeError:
            raise self.fail(REASON_NAME, at) from None
        return value

    def name(self) -> str:
        at = self.pos
        size = self.u16()
        if size > limits.NAME_BYTES_MAX:
            raise self.fail(REASON_NAME, at)
        return self.text(size)

    def done(self) -> bool:
        return self.pos == len(self.data)


def decode_entry(payload: bytes | memoryview, dsn: int) -> TxnEntry | CheckpointEntry:
    """Decode one entry; `dsn` (the driver's number for it) only names it in errors."""
    data = memoryview(payload)
    if len(data) > limits.TXN_ENTRY_BYTES_MAX:
        raise WalCorruption(dsn, REASON_TOO_LARGE, 0)
    if len(data) < HEADER_BYTES:
        raise WalCorruption(dsn, REASON_SHORT, 0)
    magic, version, entry_type, reserved, body_bytes, checksum = _HEADER.unpack(data[:HEADER_BYTES])
    if magic != MAGIC:
        raise WalCorruption(dsn, REASON_MAGIC, 0)
    if version != VERSION:
        raise WalCorruption(dsn, REASON_VERSION, 2)
    if body_bytes != len(data) - HEADER_BYTES:
        raise WalCorruption(dsn, REASON_LENGTH, 8)
    hasher = xxhash.xxh3_64(data[:_CHECKED_HEADER_BYTES])
    hasher.update(data[HEADER_BYTES:])
    if hasher.intdigest() != checksum:
        raise WalCorruption(dsn, REASON_CHECKSUM, 12)
    # Checked after the checksum: a damaged type byte is reported as damage, not as a type.
    if entry_type in RESERVED_ENTRY_TYPES:
        raise WalCorruption(dsn, REASON_RESERVED_TYPE, 3)
    if entry_type not in (EntryType.AC, EntryType.CKP):
        raise WalCorruption(dsn, REASON_TYPE, 3)
    if reserved != 0:
        raise WalCorruption(dsn, REASON_RESERVED_BITS, 4)
    reader = _Reader(data[HEADER_BYTES:], dsn, HEADER_BYTES)
    entry: TxnEntry | CheckpointEntry
    if entry_type == EntryType.AC:
        entry = _decode_txn(reader)
    else:
        ckp_ts, truncate_dsn = reader.unpack(_CKP_HEAD)
        entry = CheckpointEntry(ckp_ts, truncate_dsn, reader.text(reader.u16()))
    if not reader.done():
        raise reader.fail(REASON_TRAILING)
    return entry


def _decode_txn(reader: _Reader) -> TxnEntry:
    start_ts, commit_ts = reader.unpack(_TXN_HEAD)
    if commit_ts <= start_ts:
        raise reader.fail(REASON_TIMESTAMPS, 0)
    memo_at = reader.pos
    memo = tuple(MemoItem(*reader.unpack(_MEMO)) for _ in range(reader.count(_MEMO.size)))
    keys = [(m.db_id, m.table_id, m.block_id) for m in memo]
    if any(a >= b for a, b in itertools.pairwise(keys)):
        raise reader.fail(REASON_MEMO_ORDER, memo_at)
    commands = []
    for _ in range(reader.count(_CMD_HEAD.size)):
        at = reader.pos
        kind, size = reader.unpack(_CMD_HEAD)
        decode = _COMMANDS.get(kind)
        if decode is None:
            raise reader.fail(REASON_COMMAND, at)
        sub = _Reader(reader.take(size), reader.dsn, reader.base + reader.pos - size)
        commands.append(decode(sub))
        if not sub.done():
            raise sub.fail(REASON_COMMAND_LENGTH)
    if not commands:
        raise reader.fail(REASON_EMPTY)
    return TxnEntry(start_ts, commit_ts, memo, tuple(commands))


def _decode_catalog(reader: _Reader) -> UpdateCatalog:
    at = reader.pos
    kind, op, db_id, table_id = reader.unpack(_CATALOG_HEAD)
    name = reader.name()
    has_schema = reader.u8()
    try:
        catalog_kind, catalog_op = CatalogKind(kind), CatalogOp(op)
    except ValueError:
        raise reader.fail(REASON_CATALOG, at) from None
    wants_schema = catalog_kind is CatalogKind.TABLE and catalog_op is CatalogOp.CREATE
    if has_schema not in (0, 1) or bool(has_schema) != wants_schema or db_id == 0:
        raise reader.fail(REASON_CATALOG, at)
    if (catalog_kind is CatalogKind.TABLE) != (table_id != 0):
        raise reader.fail(REASON_CATALOG, at)
    schema = _decode_schema(reader) if has_schema else None
    return UpdateCatalog(catalog_kind, catalog_op, db_id, table_id, name, schema)


def _decode_schema(reader: _Reader) -> Schema:
    at = reader.pos
    count = reader.u16()
    if count > limits.COLUMNS_MAX:
        raise reader.fail(REASON_SCHEMA, at)
    columns = []
    for _ in range(count):
        name = reader.name()
        type_at = reader.pos
        type_name = reader.text(reader.u8())
        nullable = reader.u8()
        if type_name not in TYPES or nullable not in (0, 1):
            raise reader.fail(REASON_SCHEMA, type_at)
        columns.append((name, type_name, bool(nullable)))
    key_count = reader.u16()
    if key_count > count:
        raise reader.fail(REASON_SCHEMA, at)
    key_indexes = [reader.u16() for _ in range(key_count)]
    try:
        if any(index >= count for index in key_indexes):
            raise SchemaError("key column index out of range")
        return Schema(
            [Column(n, t, nullable=z) for n, t, z in columns],
            primary_key=[columns[i][0] for i in key_indexes],
        )
    except SchemaError:
        raise reader.fail(REASON_SCHEMA, at) from None


def _decode_append(reader: _Reader) -> Append:
    db_id, table_id = reader.unpack(_TABLE_REF)
    infos_at = reader.pos
    infos = tuple(AppendInfo(*reader.unpack(_INFO)) for _ in range(reader.count(_INFO.size)))
    batch_at = reader.pos
    raw = reader.take(reader.u32())
    try:
        stream = pa.ipc.open_stream(pa.py_buffer(raw))
        batch = stream.read_next_batch()
        try:
            stream.read_next_batch()
        except StopIteration:
            pass
        else:
            raise ValueError("more than one batch")
        batch.validate(full=True)
    except (pa.ArrowException, ValueError, StopIteration, OSError):
        raise reader.fail(REASON_ARROW, batch_at) from None
    if not infos or any(i.rows == 0 for i in infos) or sum(i.rows for i in infos) != batch.num_rows:
        raise reader.fail(REASON_INFOS, infos_at)
    return Append(db_id, table_id, infos, batch)


def _decode_delete(reader: _Reader) -> Delete:
    db_id, table_id, block_id = reader.unpack(_DELETE_HEAD)
    at = reader.pos
    raw = bytes(reader.take(reader.u32()))
    try:
        rows = FrozenBitMap.deserialize(raw)
    except (ValueError, OverflowError, MemoryError):
        raise reader.fail(REASON_BITMAP, at) from None
    if not rows or rows.serialize() != raw:
        raise reader.fail(REASON_BITMAP, at)
    return Delete(db_id, table_id, block_id, rows)


_COMMANDS: dict[int, Callable[[_Reader], Command]] = {
    CMD_UPDATE_CATALOG: _decode_catalog,
    CMD_APPEND: _decode_append,
    CMD_DELETE: _decode_delete,
}
