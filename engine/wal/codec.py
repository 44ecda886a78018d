"""The codec of the engine's WAL entries: `encode_entry` / `decode_entry` (bytes in
engine/FORMAT.md).

Why this shape (shared/STYLE.md "Formats are documented beside their code"): little-endian
fixed fields with explicit lengths, a magic, a version and an xxh3-64 checksum over header and
body, no pickle; rows as a standard Arrow IPC stream (readable by any Arrow implementation)
and delete masks in roaring's portable serialization. The driver record around each entry
(tae_driver/FORMAT.md) carries the DSN and its own checksum; this checksum makes an entry
self-checking wherever its bytes travel (Spark jobs read entries out of segment files).

Encoding runs once per commit: one join of all parts (the Arrow buffers are copied once) and a
cached schema message, about 3.4 us for an entry of a 1-row or 10-row 4-column batch (pyarrow
26, of which 1.5 us is Arrow's `RecordBatch.serialize`). Decoding never trusts a length: every
count and size is checked against the bytes that remain before anything is allocated, Arrow
and roaring only see bounded, checksummed bytes and validate them, and every failure is a
`WalCorruption(dsn, reason, offset)` with one of the `REASON_*` strings below.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import pyarrow as pa
import xxhash
from pyroaring import FrozenBitMap

from engine import limits
from engine.errors import SchemaError, WalCorruption
from engine.schema import TYPES, Column, Schema, check_name
from engine.wal.columns import ColumnsDamaged, decode_columns, encode_columns, encode_rows
from engine.wal.entry import (
    Append,
    AppendInfo,
    AppendRows,
    BlockLevel,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    Command,
    CreateBlock,
    Delete,
    DropBlock,
    EntryType,
    MemoItem,
    Origin,
    TxnEntry,
    UpdateCatalog,
)
from engine.wal.keys import KeysDamaged, decode_keys, encode_keys

MAGIC = b"TE"
VERSION = 3
"""What `encode_entry` writes by default. Version 2 adds the AppendColumns command (a small
append's columns, bare: engine/wal/columns.py), version 3 the DeleteKeys command (a Delete with
its rows' primary keys: engine/wal/keys.py); the other bytes are version 1's, an entry is
written in the lowest version its commands need, and entries of every version still read."""
VERSIONS = frozenset({1, 2, 3})

_HEADER = struct.Struct("<2sBBIIQ")
"""magic, version, entry type, reserved (0), body length, checksum."""
HEADER_BYTES = _HEADER.size
_CHECKED_HEAD = struct.Struct("<2sBBII")
"""The header before the checksum: the checksum covers these 12 bytes, then the body."""

# Byte offsets of the header fields (FORMAT.md); corruption reports point at them.
OFFSET_MAGIC = 0
OFFSET_VERSION = 2
OFFSET_TYPE = 3
OFFSET_RESERVED = 4
OFFSET_BODY_LEN = 8
OFFSET_CHECKSUM = 12

CMD_UPDATE_CATALOG = 1
CMD_APPEND = 2
CMD_DELETE = 3
CMD_CREATE_BLOCK = 4
CMD_DROP_BLOCK = 5
CMD_ORIGIN = 6
CMD_APPEND_COLUMNS = 7
CMD_DELETE_KEYS = 8

_CMD_VERSION_MIN = {CMD_APPEND_COLUMNS: 2, CMD_DELETE_KEYS: 3}
"""The first entry version of each command type added after version 1."""

CLIENT_ID_BYTES_MAX = 255
"""Longest client id of an Origin command (UTF-8 bytes)."""

OBJECT_NAME_BYTES_MAX = 1024
"""Longest object name in a CreateBlock (UTF-8 bytes)."""

RESERVED_ENTRY_TYPES = frozenset({0x11, 0x12})
"""PC and UC (large transactions in pieces, seed 004_*): reserved for issue 14, refused."""

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_TXN_HEAD = struct.Struct("<QQI")  # start_ts, commit_ts, memo_count
_MEMO = struct.Struct("<QQQ")
_CMD_HEAD = struct.Struct("<BI")  # cmd_type, cmd_len
_CATALOG_HEAD = struct.Struct("<BBQQ")
_APPEND_HEAD = struct.Struct("<BIQQI")  # cmd_type, cmd_len, db_id, table_id, info_count
_INFO = struct.Struct("<QII")
_DELETE_HEAD = struct.Struct("<BIQQQI")  # cmd_type, cmd_len, db_id, table_id, block_id, mask_len
_CKP_HEAD = struct.Struct("<QQH")  # ckp_ts, truncate_dsn, location length
_CREATE_HEAD = struct.Struct("<QQQBII")  # db_id, table_id, block_id, level, row_group, rows
_DROP = struct.Struct("<BIQQQ")  # cmd_type, cmd_len, db_id, table_id, block_id

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
REASON_COLUMNS = "AppendColumns does not decode"
REASON_BITMAP = "delete mask does not decode"
REASON_KEYS = "DeleteKeys keys do not decode"
REASON_EMPTY = "a transaction entry without commands"
REASON_BLOCK = "bad block command"

_ARROW_TYPES = frozenset(TYPES.values())

_SCHEMA_MESSAGES_MAX = 16
_schema_messages: list[tuple[pa.Schema, pa.Buffer]] = []
"""Recently used schemas and their IPC schema messages, newest first. Looked up with
`Schema.equals` (tens of ns) rather than by hash: hashing a `pa.Schema` costs more (~1 us)
than serializing it."""


def _stream_parts(batch: pa.RecordBatch) -> tuple[pa.Buffer, pa.Buffer]:
    """The schema message and the record batch message of `batch`'s IPC stream."""
    schema = batch.schema
    for cached, message in _schema_messages:
        if cached.equals(schema, check_metadata=True):
            return message, batch.serialize()
    assert all(field.type in _ARROW_TYPES for field in schema)
    message = schema.serialize()
    _schema_messages.insert(0, (schema, message))
    del _schema_messages[_SCHEMA_MESSAGES_MAX:]
    return message, batch.serialize()


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """`batch` as an Arrow IPC stream: schema message, one record batch message, end marker:
    the bytes `pa.ipc.new_stream` writes, in 1.8 us instead of 4.6 for a small batch."""
    return b"".join((*_stream_parts(batch), _IPC_EOS))


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
        parts.append(_U8.pack(1 if column.nullable else 0))
    parts.append(_U16.pack(len(schema.key_indexes)))
    parts.extend(_U16.pack(index) for index in schema.key_indexes)
    return b"".join(parts)


def _encode_command(cmd: Command, parts: list[bytes | pa.Buffer], version: int) -> int:
    """Append the command's bytes to `parts` (one join for the whole entry: the Arrow
    buffers are copied once, into the entry); the entry version the command needs."""
    if type(cmd) is AppendRows and version < 2:
        cmd = cmd.as_append()  # version 1 writes every append as Arrow IPC
    if type(cmd) is Append or type(cmd) is AppendRows:
        infos = cmd.infos
        assert infos
        assert all(info.rows > 0 for info in infos)
        columns: list[bytes] | None
        if isinstance(cmd, AppendRows):
            assert sum(info.rows for info in infos) == cmd.rows.num_rows
            columns = encode_rows(cmd.rows)
        else:
            assert sum(info.rows for info in infos) == cmd.batch.num_rows
            columns = encode_columns(cmd.batch) if version >= 2 else None
        if columns is not None:
            size = (
                _APPEND_HEAD.size
                - _CMD_HEAD.size
                + _INFO.size * len(infos)
                + sum(len(part) for part in columns)
            )
            parts.append(
                _APPEND_HEAD.pack(CMD_APPEND_COLUMNS, size, cmd.db_id, cmd.table_id, len(infos))
            )
            parts.extend(_INFO.pack(i.block_id, i.offset, i.rows) for i in infos)
            parts += columns
            return 2
        assert type(cmd) is Append
        message, batch = _stream_parts(cmd.batch)
        stream_bytes = len(message) + batch.size + len(_IPC_EOS)
        size = _APPEND_HEAD.size - _CMD_HEAD.size + _INFO.size * len(infos) + 4 + stream_bytes
        parts.append(_APPEND_HEAD.pack(CMD_APPEND, size, cmd.db_id, cmd.table_id, len(infos)))
        parts.extend(_INFO.pack(i.block_id, i.offset, i.rows) for i in infos)
        parts += (_U32.pack(stream_bytes), message, batch, _IPC_EOS)
    elif type(cmd) is Delete:
        assert cmd.rows
        mask = cmd.rows.serialize()
        size = _DELETE_HEAD.size - _CMD_HEAD.size + len(mask)
        if cmd.keys is None or version < 3:  # before version 3 a Delete has no keys
            parts.append(
                _DELETE_HEAD.pack(
                    CMD_DELETE, size, cmd.db_id, cmd.table_id, cmd.block_id, len(mask)
                )
            )
            parts.append(mask)
            return 1
        assert len(cmd.keys.values) == len(cmd.rows)
        keys = encode_keys(cmd.keys)
        size += sum(len(part) for part in keys)
        parts.append(
            _DELETE_HEAD.pack(
                CMD_DELETE_KEYS, size, cmd.db_id, cmd.table_id, cmd.block_id, len(mask)
            )
        )
        parts.append(mask)
        parts += keys
        return 3
    elif type(cmd) is CreateBlock:
        assert cmd.db_id != 0 and cmd.table_id != 0 and cmd.block_id != 0 and cmd.rows > 0
        name = cmd.object_name.encode()
        assert 0 < len(name) <= OBJECT_NAME_BYTES_MAX
        body = b"".join(
            (
                _CREATE_HEAD.pack(
                    cmd.db_id, cmd.table_id, cmd.block_id, cmd.level, cmd.row_group, cmd.rows
                ),
                _U16.pack(len(name)),
                name,
            )
        )
        parts += (_CMD_HEAD.pack(CMD_CREATE_BLOCK, len(body)), body)
    elif type(cmd) is Origin:
        client = cmd.client_id.encode()
        assert 0 < len(client) <= CLIENT_ID_BYTES_MAX and 0 <= cmd.seq < 1 << 64
        body = _U8.pack(len(client)) + client + _U64.pack(cmd.seq)
        parts += (_CMD_HEAD.pack(CMD_ORIGIN, len(body)), body)
    elif type(cmd) is DropBlock:
        assert cmd.db_id != 0 and cmd.table_id != 0 and cmd.block_id != 0
        size = _DROP.size - _CMD_HEAD.size
        parts.append(_DROP.pack(CMD_DROP_BLOCK, size, cmd.db_id, cmd.table_id, cmd.block_id))
    else:
        assert isinstance(cmd, UpdateCatalog)
        assert cmd.db_id != 0
        assert (cmd.kind is CatalogKind.TABLE) == (cmd.table_id != 0)
        creates_table = cmd.kind is CatalogKind.TABLE and cmd.op is CatalogOp.CREATE
        assert (cmd.schema is not None) == creates_table
        body = b"".join(
            (
                _CATALOG_HEAD.pack(cmd.kind, cmd.op, cmd.db_id, cmd.table_id),
                _name(cmd.name),
                b"\x00" if cmd.schema is None else b"\x01" + _encode_schema(cmd.schema),
            )
        )
        parts += (_CMD_HEAD.pack(CMD_UPDATE_CATALOG, len(body)), body)
    return 1


def encode_entry(entry: TxnEntry | CheckpointEntry, *, version: int = VERSION) -> bytes:
    """The entry's bytes (engine/FORMAT.md) in `version` (1: every append as Arrow IPC; 1 and
    2: every Delete without its keys; the golden vectors of old versions and tests of old logs
    write them), or a lower one when its commands need no more. The caller checks the size
    against `limits.TXN_ENTRY_BYTES_MAX` (the engine raises `TxnTooLarge`); everything else the
    decoder would refuse is an assertion here."""
    assert version in VERSIONS
    parts: list[bytes | pa.Buffer]
    if type(entry) is TxnEntry:
        assert entry.commit_ts > entry.start_ts
        assert entry.commands
        memo = entry.memo
        assert len(memo) < 2 or all(a < b for a, b in itertools.pairwise(_memo_keys(memo)))
        parts = [_TXN_HEAD.pack(entry.start_ts, entry.commit_ts, len(memo))]
        parts.extend(_MEMO.pack(m.db_id, m.table_id, m.block_id) for m in memo)
        parts.append(_U32.pack(len(entry.commands)))
        # An entry with nothing of version 2 or 3 in it is written as version 1 (2): the
        # same bytes as before, readable by older builds.
        needs = 1
        for cmd in entry.commands:
            needs = max(needs, _encode_command(cmd, parts, version))
        entry_type = EntryType.AC
    else:
        assert isinstance(entry, CheckpointEntry)
        location = entry.location.encode()
        assert len(location) <= 0xFFFF
        parts = [_CKP_HEAD.pack(entry.ckp_ts, entry.truncate_dsn, len(location)), location]
        entry_type = EntryType.CKP
        needs = 1
    body = b"".join(parts)
    head = _CHECKED_HEAD.pack(MAGIC, needs, entry_type, 0, len(body))
    hasher = xxhash.xxh3_64(head)
    hasher.update(body)
    return b"".join((head, _U64.pack(hasher.intdigest()), body))


def _memo_keys(memo: tuple[MemoItem, ...]) -> list[tuple[int, int, int]]:
    return [(m.db_id, m.table_id, m.block_id) for m in memo]


# --- decoding --------------------------------------------------------------------------------

# The decoder reads a command body apart from its cmd_type and cmd_len, and the memo count
# apart from the timestamps (to check it against the bytes that remain).
_TIMESTAMPS = struct.Struct("<QQ")
_TABLE_REF = struct.Struct("<QQ")
_BLOCK_REF = struct.Struct("<QQQ")
_TYPE_NAMES = {name.encode(): name for name in TYPES}


class _Reader:
    """A cursor over the body or a command; every read is bounds-checked. `base` is where
    `data` starts in the entry, so errors report offsets in the entry."""

    __slots__ = ("base", "data", "dsn", "pos")

    def __init__(self, data: memoryview, dsn: int, base: int) -> None:
        self.data = data
        self.dsn = dsn
        self.pos = 0
        self.base = base

    def fail(self, reason: str, at: int | None = None) -> WalCorruption:
        return WalCorruption(self.dsn, reason, self.base + (self.pos if at is None else at))

    def take(self, size: int, at: int | None = None) -> memoryview:
        """`size` bytes; a size running past the end is reported at `at` (its length
        field), before anything is allocated."""
        end = self.pos + size
        if end > len(self.data):
            raise self.fail(REASON_TRUNCATED, at)
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

    def sized(self, length_fmt: struct.Struct) -> memoryview:
        """A length field, then that many bytes."""
        at = self.pos
        return self.take(self.unpack(length_fmt)[0], at)

    def count(self, item_bytes_min: int) -> int:
        """A u32 count of items of at least `item_bytes_min` bytes each, checked against the
        bytes that remain (so a corrupt count never sizes a loop or an allocation)."""
        at = self.pos
        (count,) = self.unpack(_U32)
        if count * item_bytes_min > len(self.data) - self.pos:
            raise self.fail(REASON_TRUNCATED, at)
        return count

    def text(self, raw: memoryview, at: int) -> str:
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise self.fail(REASON_NAME, at) from None

    def name(self) -> str:
        """A str16 of at most NAME_BYTES_MAX bytes."""
        at = self.pos
        size = self.u16()
        if size > limits.NAME_BYTES_MAX:
            raise self.fail(REASON_NAME, at)
        return self.text(self.take(size), at)

    def done(self) -> bool:
        return self.pos == len(self.data)


def peek_commit_ts(payload: bytes | memoryview) -> int | None:
    """The commit_ts of a transaction entry, read from its fixed place without decoding or
    checking anything else (None: not shaped as one; `decode_entry` says why). A replay
    skips entries its checkpoint already holds with this (decision 0010: a kept WAL is
    long, and decoding its Arrow batches was most of a restart)."""
    data = memoryview(payload)
    if len(data) < HEADER_BYTES + _TIMESTAMPS.size:
        return None
    magic, version, entry_type, _reserved, _body, _checksum = _HEADER.unpack_from(data)
    if magic != MAGIC or version not in VERSIONS or entry_type != EntryType.AC:
        return None
    _start_ts, commit_ts = _TIMESTAMPS.unpack_from(data, HEADER_BYTES)
    return int(commit_ts)


def decode_entry(payload: bytes | memoryview, dsn: int) -> TxnEntry | CheckpointEntry:
    """Decode one entry, checking in this order: size, magic, version, body length, checksum,
    entry type, reserved bits, then the body field by field (FORMAT.md). Raises
    `WalCorruption(dsn, REASON_*, offset)` at the first failure; `dsn` (the driver's number
    for the entry) only names it."""
    data = memoryview(payload)
    size = len(data)
    if size > limits.TXN_ENTRY_BYTES_MAX:
        raise WalCorruption(dsn, REASON_TOO_LARGE, OFFSET_BODY_LEN)
    if size < HEADER_BYTES:
        raise WalCorruption(dsn, REASON_SHORT, size)
    magic, version, entry_type, reserved, body_bytes, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WalCorruption(dsn, REASON_MAGIC, OFFSET_MAGIC)
    if version not in VERSIONS:
        raise WalCorruption(dsn, REASON_VERSION, OFFSET_VERSION)
    if body_bytes != size - HEADER_BYTES:
        raise WalCorruption(dsn, REASON_LENGTH, OFFSET_BODY_LEN)
    hasher = xxhash.xxh3_64(data[:OFFSET_CHECKSUM])
    hasher.update(data[HEADER_BYTES:])
    if hasher.intdigest() != checksum:
        raise WalCorruption(dsn, REASON_CHECKSUM, OFFSET_CHECKSUM)
    # Checked after the checksum: a damaged type byte is reported as damage, not as a type.
    if entry_type in RESERVED_ENTRY_TYPES:
        raise WalCorruption(dsn, REASON_RESERVED_TYPE, OFFSET_TYPE)
    if entry_type not in (EntryType.AC, EntryType.CKP):
        raise WalCorruption(dsn, REASON_TYPE, OFFSET_TYPE)
    if reserved != 0:
        raise WalCorruption(dsn, REASON_RESERVED_BITS, OFFSET_RESERVED)
    reader = _Reader(data[HEADER_BYTES:], dsn, HEADER_BYTES)
    entry: TxnEntry | CheckpointEntry
    if entry_type == EntryType.AC:
        entry = _decode_txn(reader, version)
    else:
        ckp_ts, truncate_dsn, location_bytes = reader.unpack(_CKP_HEAD)
        at = reader.pos - 2
        location = reader.text(reader.take(location_bytes, at), at)
        entry = CheckpointEntry(ckp_ts, truncate_dsn, location)
    if not reader.done():
        raise reader.fail(REASON_TRAILING)
    return entry


def _decode_txn(reader: _Reader, version: int) -> TxnEntry:
    start_ts, commit_ts = reader.unpack(_TIMESTAMPS)
    if commit_ts <= start_ts:
        # A read-only transaction never logs, so a logged one has commit_ts > start_ts.
        raise reader.fail(REASON_TIMESTAMPS, 0)
    memo_at = reader.pos
    memo = tuple(MemoItem(*reader.unpack(_MEMO)) for _ in range(reader.count(_MEMO.size)))
    if any(a >= b for a, b in itertools.pairwise(_memo_keys(memo))):
        raise reader.fail(REASON_MEMO_ORDER, memo_at)
    at = reader.pos
    count = reader.count(_CMD_HEAD.size)
    if count == 0:
        raise reader.fail(REASON_EMPTY, at)
    commands = []
    for _ in range(count):
        at = reader.pos
        kind, size = reader.unpack(_CMD_HEAD)
        decode = _COMMANDS.get(kind)
        if decode is None or version < _CMD_VERSION_MIN.get(kind, 1):
            raise reader.fail(REASON_COMMAND, at)
        start = reader.base + reader.pos
        body = _Reader(reader.take(size, at + 1), reader.dsn, start)
        commands.append(decode(body))
        if not body.done():
            raise body.fail(REASON_COMMAND_LENGTH)
    return TxnEntry(start_ts, commit_ts, memo, tuple(commands))


def _decode_catalog(reader: _Reader) -> UpdateCatalog:
    at = reader.pos
    kind, op, db_id, table_id = reader.unpack(_CATALOG_HEAD)
    name_at = reader.pos
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
    try:
        check_name("table" if catalog_kind is CatalogKind.TABLE else "database", name)
    except SchemaError:
        raise reader.fail(REASON_NAME, name_at) from None
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
        type_name = _TYPE_NAMES.get(bytes(reader.sized(_U8)))
        nullable = reader.u8()
        if type_name is None or nullable not in (0, 1):
            raise reader.fail(REASON_SCHEMA, type_at)
        columns.append((name, type_name, nullable == 1))
    key_at = reader.pos
    key_count = reader.u16()
    if key_count > count:
        raise reader.fail(REASON_SCHEMA, key_at)
    key_indexes = [reader.u16() for _ in range(key_count)]
    if any(index >= count for index in key_indexes):
        raise reader.fail(REASON_SCHEMA, key_at)
    try:
        return Schema(
            [Column(n, t, nullable=z) for n, t, z in columns],
            primary_key=[columns[i][0] for i in key_indexes],
        )
    except SchemaError:  # duplicate or bad column names, no key, a nullable or float key...
        raise reader.fail(REASON_SCHEMA, at) from None


def _decode_append(reader: _Reader) -> Append:
    db_id, table_id = reader.unpack(_TABLE_REF)
    infos_at = reader.pos
    infos = tuple(AppendInfo(*reader.unpack(_INFO)) for _ in range(reader.count(_INFO.size)))
    batch_at = reader.pos
    # A copy: the batch's buffers then point into memory of their own, immutable and 8-byte
    # aligned (a memoryview of the caller's buffer could be neither).
    raw = bytes(reader.sized(_U32))
    try:
        batch = _read_batch(raw)
    except Exception:  # any failure of Arrow on these bytes is damage
        raise reader.fail(REASON_ARROW, batch_at) from None
    if not infos or any(i.rows == 0 for i in infos) or sum(i.rows for i in infos) != batch.num_rows:
        raise reader.fail(REASON_INFOS, infos_at)
    return Append(db_id, table_id, infos, batch)


def _read_batch(raw: bytes) -> pa.RecordBatch:
    """The one record batch of an IPC stream that is exactly: a schema message of engine
    column types, an uncompressed record batch message, the end-of-stream marker. Raises
    (Arrow's exceptions, ValueError, StopIteration, struct.error) on anything else."""
    source = pa.BufferReader(raw)
    messages = pa.ipc.MessageReader.open_stream(source)
    first = messages.read_next_message()
    if first.type != "schema":
        raise ValueError("the stream does not start with a schema")
    schema = pa.ipc.read_schema(first)
    # The engine's types only: no dictionaries, views or nested types, so Arrow allocates
    # nothing beyond the buffers in these bytes.
    if not all(field.type in _ARROW_TYPES for field in schema):
        raise ValueError("a column type outside engine.schema.TYPES")
    second = messages.read_next_message()
    if second.type != "record batch" or _compressed(second.metadata.to_pybytes()):
        raise ValueError("not an uncompressed record batch")
    batch = pa.ipc.read_record_batch(second, schema)
    try:
        messages.read_next_message()
    except StopIteration:
        pass
    else:
        raise ValueError("more than one batch")
    if source.tell() != len(raw) or not raw.endswith(_IPC_EOS):
        raise ValueError("no end-of-stream marker, or bytes after it")
    batch.validate(full=True)
    return batch


def _compressed(message: bytes) -> bool:
    """Whether a record batch message compresses its body: Arrow's Message.fbs, Message
    field 2 is the header (a RecordBatch table), whose field 3 is `compression`. Refused: a
    compressed buffer states its decompressed size, so a corrupt size or a zstd bomb would
    allocate far more than the entry's bytes. (Arrow verified this flatbuffer on reading.)"""
    header = _flatbuffer_field(message, _U32.unpack_from(message, 0)[0], 2)
    if header == 0:
        raise ValueError("a record batch message without a header")
    return _flatbuffer_field(message, header + _U32.unpack_from(message, header)[0], 3) != 0


def _flatbuffer_field(buffer: bytes, table: int, field: int) -> int:
    """Where field number `field` of the flatbuffer table at `table` is, 0 when absent."""
    vtable = table - _I32.unpack_from(buffer, table)[0]
    if vtable < 0:
        raise ValueError("vtable before the buffer")
    slot = 4 + 2 * field
    if slot + 2 > _U16.unpack_from(buffer, vtable)[0]:
        return 0
    offset: int = _U16.unpack_from(buffer, vtable + slot)[0]
    return table + offset if offset else 0


def _decode_append_columns(reader: _Reader) -> Append:
    db_id, table_id = reader.unpack(_TABLE_REF)
    infos_at = reader.pos
    infos = tuple(AppendInfo(*reader.unpack(_INFO)) for _ in range(reader.count(_INFO.size)))
    at = reader.pos
    try:
        batch = decode_columns(reader.take(len(reader.data) - at))
    except ColumnsDamaged as exc:
        raise reader.fail(REASON_COLUMNS + ": " + exc.reason, at + exc.offset) from None
    if not infos or any(i.rows == 0 for i in infos) or sum(i.rows for i in infos) != batch.num_rows:
        raise reader.fail(REASON_INFOS, infos_at)
    return Append(db_id, table_id, infos, batch)


def _decode_delete(reader: _Reader) -> Delete:
    return Delete(*_delete_fields(reader))


def _delete_fields(reader: _Reader) -> tuple[int, int, int, FrozenBitMap]:
    db_id, table_id, block_id = reader.unpack(_BLOCK_REF)
    at = reader.pos
    raw = bytes(reader.sized(_U32))
    try:
        # pyroaring deserializes within the given bytes, then runs CRoaring's validation
        # (sorted containers, true cardinalities): ValueError on anything wrong.
        rows = FrozenBitMap.deserialize(raw)
    except Exception:  # any failure of pyroaring on these bytes is damage
        raise reader.fail(REASON_BITMAP, at) from None
    if not rows or rows.serialize() != raw:
        raise reader.fail(REASON_BITMAP, at)
    return db_id, table_id, block_id, rows


def _decode_delete_keys(reader: _Reader) -> Delete:
    """A Delete, then its rows' keys (version 3): the rest of the command."""
    db_id, table_id, block_id, rows = _delete_fields(reader)
    at = reader.pos
    try:
        keys = decode_keys(reader.take(len(reader.data) - at), len(rows))
    except KeysDamaged as exc:
        raise reader.fail(REASON_KEYS + ": " + exc.reason, at + exc.offset) from None
    return Delete(db_id, table_id, block_id, rows, keys)


def _decode_create_block(reader: _Reader) -> CreateBlock:
    at = reader.pos
    db_id, table_id, block_id, level, row_group, rows = reader.unpack(_CREATE_HEAD)
    name_at = reader.pos
    raw = reader.sized(_U16)
    if db_id == 0 or table_id == 0 or block_id == 0 or rows == 0:
        raise reader.fail(REASON_BLOCK, at)
    try:
        block_level = BlockLevel(level)
    except ValueError:
        raise reader.fail(REASON_BLOCK, at) from None
    if not 0 < len(raw) <= OBJECT_NAME_BYTES_MAX:
        raise reader.fail(REASON_NAME, name_at)
    name = reader.text(raw, name_at)
    return CreateBlock(db_id, table_id, block_id, block_level, name, row_group, rows)


def _decode_drop_block(reader: _Reader) -> DropBlock:
    at = reader.pos
    db_id, table_id, block_id = reader.unpack(_BLOCK_REF)
    if db_id == 0 or table_id == 0 or block_id == 0:
        raise reader.fail(REASON_BLOCK, at)
    return DropBlock(db_id, table_id, block_id)


def _decode_origin(reader: _Reader) -> Origin:
    at = reader.pos
    raw = reader.sized(_U8)
    if not raw:
        raise reader.fail(REASON_NAME, at)
    client_id = reader.text(raw, at)
    (seq,) = reader.unpack(_U64)
    return Origin(client_id, seq)


_COMMANDS: dict[int, Callable[[_Reader], Command]] = {
    CMD_UPDATE_CATALOG: _decode_catalog,
    CMD_APPEND: _decode_append,
    CMD_DELETE: _decode_delete,
    CMD_CREATE_BLOCK: _decode_create_block,
    CMD_DROP_BLOCK: _decode_drop_block,
    CMD_ORIGIN: _decode_origin,
    CMD_APPEND_COLUMNS: _decode_append_columns,
    CMD_DELETE_KEYS: _decode_delete_keys,
}
