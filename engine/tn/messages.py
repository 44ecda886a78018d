"""Requests and replies of the TN protocol, and their codec (FORMAT.md beside this file).

Pure functions over bytes, no I/O (shared/STYLE.md, like logsvc/wire/messages.py). The
frames are logsvc's own (`logsvc.wire.frames`: magic, frame version, kind, request id,
length, XXH3 checksums of header and body, a bounded decoder); the bodies are msgpack arrays
of the engine's messages:

    requests (frame kind 1)                  replies (frame kind 2)
    op 16 Authenticate [token, protocol]     tag 80 Authenticated  []
    op 17 Status       []                    tag 81 StatusReply    [visible_ts, checkpoint_ts,
                                                                    role]
    op 18 PullLogtail  [t0, t1]              tag 82 LogtailPage    [checkpoint, checkpoint_ts,
                                                                    entries, upto_ts, more]
    op 19 Commit       [start_ts, client_id, tag 83 Committed      [commit_ts]
                        seq, ops]
    op 20 Subscribe    []                    tag 84 Subscribed     [from_ts]
                                             tag 85 Pushed         [entries]  (id of Subscribe)
    op 21 Checkpoints  []                    tag 86 CheckpointList [[ckp_ts, manifest], ...]
    op 22 Promote      []                    tag 87 Promoted       [visible_ts, was_standby]
                                             tag 95 ErrorReply     [code, message, args]

Why these numbers: logsvc's data plane uses ops 1-7 and tags 65-70 and 127 in the same
frames, so a logsvc client that dials a TN (or a CN that dials a logsvc node) is told
"unknown op" instead of being misunderstood.

Values inside a write set (keys, update values, a DuplicateKey's key) are msgpack scalars,
compound keys arrays; dates and timestamps, which msgpack lacks, are two ext types of fixed
size (FORMAT.md "Values"). Inserted rows are the WAL's own encodings, decoded with the
WAL's refusals: up to 32 rows the compact column body of an AppendColumns command (op kind
`insert_columns`, engine/wal/columns.py: no Arrow IPC messages to build, parse and validate
for a one-row insert, issue 21), larger inserts one Arrow IPC stream (kind `insert`,
engine/wal/codec.py `encode_batch`: no compression, the engine's column types only).
Schemas are the checkpoint's JSON (engine/checkpoint/layout.py).

Encoding checks the rules first (the client's `BadRequest`; a reply that breaks one is a
server bug: assert), decoding checks the same rules, so whatever decodes re-encodes.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import schema_from_json, schema_json
from engine.cn.port import TNStatus
from engine.logtail import Logtail, TailEntry
from engine.schema import TYPES
from engine.tn import limits
from engine.tn.bodies import Fields, kind_of, pack, unpack
from engine.tn.errors import ARGS_SHAPES, BadReply, BadRequest, ErrorCode
from engine.wal.codec import _read_batch, encode_batch
from engine.wal.columns import ColumnsDamaged, decode_columns, encode_columns
from engine.writeset import OP_KINDS, Op, WriteSet
from logsvc.wire.errors import ProtocolError, WrongFrameKind
from logsvc.wire.frames import Frame, FrameDecoder, FrameKind, encode_frame
from logsvc.wire.limits import WireLimits

__all__ = [
    "Authenticate",
    "Authenticated",
    "CheckpointList",
    "Checkpoints",
    "Commit",
    "Committed",
    "Encoded",
    "ErrorReply",
    "Frame",
    "LogtailPage",
    "Promote",
    "Promoted",
    "ProtocolError",
    "PullLogtail",
    "Pushed",
    "Reply",
    "Request",
    "Status",
    "StatusReply",
    "Subscribe",
    "Subscribed",
    "WrongFrameKind",
    "decode_reply",
    "decode_request",
    "encode_body",
    "encode_reply",
    "encode_request",
    "reply_decoder",
    "request_decoder",
]

ROLES = ("active", "standby", "failed")
"""`failed`: a standby whose tail of the WAL is failing (decision 0008); it cannot take over."""

# --- Requests -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authenticate:
    """The first request on a connection; anything before a successful one is UNAUTHORIZED.
    `protocol` is the client's `limits.PROTOCOL`: another value is refused (BAD_REQUEST)."""

    token: str
    protocol: int = limits.PROTOCOL


@dataclass(frozen=True, slots=True)
class Status:
    pass


@dataclass(frozen=True, slots=True)
class PullLogtail:
    """The committed changes in (t0, t1] (engine/logtail.py), a page at a time."""

    t0: int
    t1: int


@dataclass(frozen=True, slots=True)
class Commit:
    write_set: WriteSet


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Push every entry that becomes visible after `Subscribed.from_ts`, in commit order,
    as `Pushed` replies carrying this request's id. One subscription per connection; it
    ends with the connection, or with an ErrorReply (SUBSCRIBER_DROPPED) on that id."""


@dataclass(frozen=True, slots=True)
class Checkpoints:
    pass


@dataclass(frozen=True, slots=True)
class Promote:
    """An operator's `engine promote`: a standby takes over now."""


Request = Authenticate | Status | PullLogtail | Commit | Subscribe | Checkpoints | Promote

# --- Replies --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authenticated:
    pass


@dataclass(frozen=True, slots=True)
class StatusReply:
    status: TNStatus


@dataclass(frozen=True, slots=True)
class LogtailPage:
    """`logtail` up to `logtail.upto_ts`; `more`: the TN stopped at a page bound before the
    t1 it could answer, ask again from `upto_ts`."""

    logtail: Logtail
    more: bool


@dataclass(frozen=True, slots=True)
class Committed:
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Subscribed:
    """Every entry with commit_ts > from_ts will be pushed (and none at or below it)."""

    from_ts: int


@dataclass(frozen=True, slots=True)
class Pushed:
    entries: tuple[TailEntry, ...]


@dataclass(frozen=True, slots=True)
class CheckpointList:
    """Retained checkpoints, oldest first: (ckp_ts, manifest object name)."""

    checkpoints: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Promoted:
    """The TN is active; `was_standby` is False when it already was."""

    visible_ts: int
    was_standby: bool


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """A refused request. `args` go with some codes (errors.ARGS_SHAPES): the fields of the
    engine error the client rebuilds."""

    code: ErrorCode
    message: str
    args: tuple[object, ...] = ()

    @classmethod
    def of(cls, code: ErrorCode, message: str, args: tuple[object, ...] = ()) -> ErrorReply:
        """An ErrorReply whose message is cut to its bound (a reply must always encode)."""
        data = message.encode("utf-8", "replace")
        if len(data) > limits.MESSAGE_BYTES_MAX:
            message = data[: limits.MESSAGE_BYTES_MAX - 3].decode("utf-8", "ignore") + "..."
        return cls(code, message, args)


Reply = (
    Authenticated
    | StatusReply
    | LogtailPage
    | Committed
    | Subscribed
    | Pushed
    | CheckpointList
    | Promoted
    | ErrorReply
)

# --- Numbers --------------------------------------------------------------------------------------

OP_AUTHENTICATE = 16
OP_STATUS = 17
OP_PULL_LOGTAIL = 18
OP_COMMIT = 19
OP_SUBSCRIBE = 20
OP_CHECKPOINTS = 21
OP_PROMOTE = 22

TAG_AUTHENTICATED = 80
TAG_STATUS = 81
TAG_LOGTAIL_PAGE = 82
TAG_COMMITTED = 83
TAG_SUBSCRIBED = 84
TAG_PUSHED = 85
TAG_CHECKPOINT_LIST = 86
TAG_PROMOTED = 87
TAG_ERROR = 95

_ENGINE_ARROW_TYPES = frozenset(TYPES.values())
INSERT_COLUMNS = "insert_columns"
"""The wire kind of an insert of at most 32 rows (engine/wal/columns.py
`APPEND_COLUMNS_ROWS_MAX`) sent as an AppendColumns body; it decodes to an `insert` op. A TN
older than it answers BAD_REQUEST "unknown operation" (typed, at once)."""

_SCALARS = (type(None), bool, int, float, str, bytes, datetime.date, datetime.datetime)

REQUEST_WIRE = WireLimits(
    frame_body_bytes_max=limits.REQUEST_BODY_BYTES_MAX, feed_bytes_max=limits.FEED_BYTES_MAX
)
REPLY_WIRE = WireLimits(
    frame_body_bytes_max=limits.REPLY_BODY_BYTES_MAX, feed_bytes_max=limits.FEED_BYTES_MAX
)


def request_decoder(body_bytes_max: int = limits.REQUEST_BODY_BYTES_MAX) -> FrameDecoder:
    """The server's frame decoder: a request over `body_bytes_max` is refused from its
    header (`FrameTooLarge`) before its body is buffered."""
    assert body_bytes_max <= limits.REQUEST_BODY_BYTES_MAX
    return FrameDecoder(
        WireLimits(frame_body_bytes_max=body_bytes_max, feed_bytes_max=limits.FEED_BYTES_MAX)
    )


def reply_decoder() -> FrameDecoder:
    return FrameDecoder(REPLY_WIRE)


# --- Requests: encode -----------------------------------------------------------------------------


def encode_request(request_id: int, msg: Request | Encoded) -> bytes:
    """The whole frame of a request. `BadRequest` (code TOO_LARGE for a size) when it breaks
    a rule of FORMAT.md: nothing is sent."""
    assert 1 <= request_id <= limits.U64_MAX
    body = msg.body if isinstance(msg, Encoded) else encode_body(msg).body
    return encode_frame(FrameKind.REQUEST, request_id, body, REQUEST_WIRE)


@dataclass(frozen=True, slots=True)
class Encoded:
    """A request's body, encoded and checked once (`encode_body`): a commit sent again after
    a failover is framed again under a new request id, never encoded again."""

    body: bytes


def encode_body(msg: Request) -> Encoded:
    """The body of a request, checked against every rule of FORMAT.md (`BadRequest`, code
    TOO_LARGE for a size, when it breaks one: nothing is sent)."""
    body = _pack_request(msg)
    if len(body) > limits.REQUEST_BODY_BYTES_MAX:
        raise BadRequest(
            f"request of {len(body)} bytes is over the limit of {limits.REQUEST_BODY_BYTES_MAX}",
            ErrorCode.TOO_LARGE,
        )
    # Every rule is checked by decoding what was encoded: one set of rules, on both sides.
    decode_request(Frame(FrameKind.REQUEST, 1, body))
    return Encoded(body)


def _pack_request(msg: Request) -> bytes:
    if isinstance(msg, Authenticate):
        return pack((OP_AUTHENTICATE, msg.token, msg.protocol), BadRequest)
    if isinstance(msg, Status):
        return pack((OP_STATUS,), BadRequest)
    if isinstance(msg, PullLogtail):
        return pack((OP_PULL_LOGTAIL, msg.t0, msg.t1), BadRequest)
    if isinstance(msg, Commit):
        ws = msg.write_set
        ops = tuple(_op_fields(op) for op in ws.ops)
        return pack((OP_COMMIT, ws.start_ts, ws.client_id, ws.seq, ops), BadRequest)
    if isinstance(msg, Subscribe):
        return pack((OP_SUBSCRIBE,), BadRequest)
    if isinstance(msg, Checkpoints):
        return pack((OP_CHECKPOINTS,), BadRequest)
    if isinstance(msg, Promote):
        return pack((OP_PROMOTE,), BadRequest)
    raise BadRequest(f"not a request: {type(msg).__name__}")


def _op_fields(op: Op) -> tuple[object, ...]:
    schema = None if op.schema is None else schema_json(op.schema)
    kind = op.kind
    rows = None
    if op.rows is not None:
        kind, rows = _rows_bytes(op.rows)
    values = tuple((column, value) for column, value in op.values.items())
    return (kind, op.database, op.table, schema, rows, tuple(op.keys), values)


def _rows_bytes(rows: object) -> tuple[str, bytes]:
    """The wire kind of an insert and its rows: `insert_columns` and an AppendColumns body
    for a small batch, else `insert` and an Arrow IPC stream."""
    if not isinstance(rows, pa.Table):
        raise BadRequest(f"insert rows must be a pyarrow Table, not {type(rows).__name__}")
    for field in rows.schema:
        if field.type not in _ENGINE_ARROW_TYPES:
            raise BadRequest(f"insert column {field.name!r}: {field.type} is not an engine type")
    batches = rows.to_batches()
    if len(batches) == 1:
        batch = batches[0]  # what a compute node's insert op holds: no copy
    else:
        columns = [column.combine_chunks() for column in rows.columns]
        batch = pa.RecordBatch.from_arrays(columns, schema=rows.schema)
    kind = INSERT_COLUMNS
    # A null in a non-nullable column travels as Arrow, for the TN to refuse as it always
    # did (SchemaError): the compact body cannot even hold it.
    parts = None
    if batch.num_columns and not any(
        column.null_count and not field.nullable
        for column, field in zip(batch.columns, batch.schema, strict=True)
    ):
        parts = encode_columns(batch)
    if parts is not None:
        data = b"".join(parts)
    else:
        kind, data = "insert", encode_batch(batch)
    if len(data) > limits.OP_ROWS_BYTES_MAX:
        raise BadRequest(
            f"insert of {len(data)} bytes of Arrow is over op_rows_bytes_max "
            f"({limits.OP_ROWS_BYTES_MAX})",
            ErrorCode.TOO_LARGE,
        )
    return kind, data


# --- Requests: decode -----------------------------------------------------------------------------


def decode_request(frame: Frame) -> Request:
    """The request in a frame. `WrongFrameKind` (a `ProtocolError`: close the connection)
    for a reply frame; `BadRequest` (its `code`: BAD_REQUEST, UNKNOWN_OP, TOO_LARGE) for a
    body that is not a valid request: answer that request id and keep serving."""
    if frame.kind != FrameKind.REQUEST:
        raise WrongFrameKind(FrameKind.REQUEST, frame.kind)
    if frame.request_id == 0:
        raise BadRequest("request id 0 is reserved")
    fields = Fields(unpack(frame.body, _bad_request), _bad_request, "request")
    op = fields.op()
    if op == OP_AUTHENTICATE:
        fields.expect("Authenticate", 2)
        token = fields.text("token", limits.TOKEN_BYTES_MAX, bytes_min=1)
        return Authenticate(token, fields.uint("protocol"))
    if op == OP_STATUS:
        fields.expect("Status", 0)
        return Status()
    if op == OP_PULL_LOGTAIL:
        fields.expect("PullLogtail", 2)
        return PullLogtail(fields.uint("t0"), fields.uint("t1"))
    if op == OP_COMMIT:
        fields.expect("Commit", 4)
        start_ts = fields.uint("start_ts")
        client_id = fields.text("client_id", limits.CLIENT_ID_BYTES_MAX, bytes_min=1)
        seq = fields.uint("seq")
        ops = fields.array("ops", limits.COMMIT_OPS_MAX)
        decoded = tuple(_decode_op(value, index) for index, value in enumerate(ops))
        return Commit(WriteSet(start_ts, decoded, client_id, seq))
    if op == OP_SUBSCRIBE:
        fields.expect("Subscribe", 0)
        return Subscribe()
    if op == OP_CHECKPOINTS:
        fields.expect("Checkpoints", 0)
        return Checkpoints()
    if op == OP_PROMOTE:
        fields.expect("Promote", 0)
        return Promote()
    raise BadRequest(f"unknown op {op}", ErrorCode.UNKNOWN_OP)


def _decode_op(value: object, index: int) -> Op:
    where = f"ops[{index}]"
    if type(value) is not tuple:
        raise BadRequest(f"{where} must be an array, not {kind_of(value)}")
    fields = Fields(value, _bad_request, where)
    fields.expect("an op", 7, counts_op=False)
    kind = fields.text("kind", 32, bytes_min=1)
    wire_kind = kind
    if kind == INSERT_COLUMNS:
        kind = "insert"  # the same operation, its rows in the compact encoding
    elif kind not in OP_KINDS:
        raise BadRequest(f"{where}.kind: unknown operation {kind!r}")
    database = fields.text("database", limits.NAME_BYTES_MAX, bytes_min=1)
    table = fields.text("table", limits.NAME_BYTES_MAX)
    schema_text = fields.optional_text("schema", limits.SCHEMA_JSON_BYTES_MAX)
    rows_bytes = fields.optional_bin("rows", limits.OP_ROWS_BYTES_MAX)
    keys = fields.array("keys", limits.OP_KEYS_MAX)
    pairs = fields.array("values", limits.OP_VALUES_MAX)
    ddl_of_database = kind in ("create_database", "drop_database")
    if ddl_of_database == bool(table):
        wants = "no table" if ddl_of_database else "a table"
        raise BadRequest(f"{where}: {kind} takes {wants}")
    if (schema_text is not None) != (kind == "create_table"):
        raise BadRequest(f"{where}: a schema goes with create_table, and only there")
    if (rows_bytes is not None) != (kind == "insert"):
        raise BadRequest(f"{where}: rows go with insert, and only there")
    if keys and kind not in ("delete", "update"):
        raise BadRequest(f"{where}: keys go with delete and update only")
    if bool(pairs) != (kind == "update"):
        raise BadRequest(f"{where}: values go with update, and only there")
    schema = None
    if schema_text is not None:
        try:
            schema = schema_from_json(schema_text, where)
        except (CheckpointCorrupt, RecursionError, ValueError, TypeError, AttributeError) as exc:
            raise BadRequest(f"{where}.schema: {exc}") from None
    rows = None
    if rows_bytes is not None and wire_kind == INSERT_COLUMNS:
        try:
            rows = pa.Table.from_batches([decode_columns(memoryview(rows_bytes))])
        except ColumnsDamaged as exc:
            raise BadRequest(f"{where}.rows: not an AppendColumns body ({exc})") from None
    elif rows_bytes is not None:
        try:
            rows = pa.Table.from_batches([_read_batch(rows_bytes)])
        except Exception as exc:  # any failure of Arrow on these bytes is a bad request
            raise BadRequest(f"{where}.rows: not an engine Arrow IPC stream ({exc})") from None
    for position, key in enumerate(keys):
        _check_key(key, f"{where}.keys[{position}]")
    values: dict[str, object] = {}
    for position, pair in enumerate(pairs):
        at = f"{where}.values[{position}]"
        if type(pair) is not tuple or len(pair) != 2:
            raise BadRequest(f"{at} must be a [column, value] pair")
        column, item = pair
        if type(column) is not str or not 1 <= len(column.encode()) <= limits.NAME_BYTES_MAX:
            raise BadRequest(f"{at}: the column must be a name of 1 to {limits.NAME_BYTES_MAX}")
        if column in values:
            raise BadRequest(f"{at}: column {column!r} is set twice")
        if not isinstance(item, _SCALARS):
            raise BadRequest(f"{at}: a value must be a scalar, not {kind_of(item)}")
        values[column] = item
    return Op(kind, database, table, schema=schema, rows=rows, keys=keys, values=values)


def _check_key(key: object, where: str) -> None:
    if type(key) is tuple:
        if not 2 <= len(key) <= limits.KEY_PARTS_MAX:
            raise BadRequest(f"{where}: a compound key has 2 to {limits.KEY_PARTS_MAX} parts")
        parts: Sequence[object] = key
    else:
        parts = (key,)
    for part in parts:
        if not isinstance(part, _SCALARS):
            raise BadRequest(f"{where}: a key part must be a scalar, not {kind_of(part)}")


# --- Replies: encode ------------------------------------------------------------------------------


def encode_reply(request_id: int, msg: Reply) -> bytes:
    """The whole frame of a reply. Request id 0 goes with an ErrorReply only (a server's
    last word before it closes a connection it cannot parse). A reply that breaks a rule is
    a bug of the server: AssertionError."""
    assert 0 <= request_id <= limits.U64_MAX
    assert request_id or isinstance(msg, ErrorReply)
    body = _pack_reply(msg)
    assert len(body) <= limits.REPLY_BODY_BYTES_MAX, len(body)
    return encode_frame(FrameKind.RESPONSE, request_id, body, REPLY_WIRE)


def _pack_reply(msg: Reply) -> bytes:
    fields: tuple[object, ...]
    if isinstance(msg, Authenticated):
        fields = (TAG_AUTHENTICATED,)
    elif isinstance(msg, StatusReply):
        status = msg.status
        assert status.role in ROLES
        fields = (TAG_STATUS, status.visible_ts, status.checkpoint_ts, status.role)
    elif isinstance(msg, LogtailPage):
        tail = msg.logtail
        assert len(tail.entries) <= limits.LOGTAIL_PAGE_ENTRIES_MAX
        assert all(entry.commit_ts > tail.checkpoint_ts for entry in tail.entries)
        assert (tail.checkpoint is None) == (tail.checkpoint_ts == 0) or tail.checkpoint
        entries = _entries_fields(tail.entries, limits.LOGTAIL_PAGE_BYTES_MAX)
        fields = (TAG_LOGTAIL_PAGE, tail.checkpoint, tail.checkpoint_ts, entries)
        fields = (*fields, tail.upto_ts, msg.more)
    elif isinstance(msg, Committed):
        fields = (TAG_COMMITTED, msg.commit_ts)
    elif isinstance(msg, Subscribed):
        fields = (TAG_SUBSCRIBED, msg.from_ts)
    elif isinstance(msg, Pushed):
        assert 1 <= len(msg.entries) <= limits.PUSH_ENTRIES_MAX
        fields = (TAG_PUSHED, _entries_fields(msg.entries, limits.PUSH_BYTES_MAX))
    elif isinstance(msg, CheckpointList):
        fields = (TAG_CHECKPOINT_LIST, tuple(msg.checkpoints))
    elif isinstance(msg, Promoted):
        fields = (TAG_PROMOTED, msg.visible_ts, msg.was_standby)
    else:
        assert isinstance(msg, ErrorReply), msg
        fields = (TAG_ERROR, int(msg.code), msg.message, tuple(msg.args))
    body = pack(fields, _bug)
    if not isinstance(msg, (LogtailPage, Pushed)):
        # The rules, checked by the decoder (a bug raises). Pages and pushes, the large and
        # frequent replies, are built within their rules by the server and checked by
        # `_entries_fields` instead of a second decode of up to 16 MiB.
        try:
            decode_reply(Frame(FrameKind.RESPONSE, 1, body))
        except BadReply as exc:
            raise _bug(exc.reason) from None
    return body


def _entries_fields(entries: Sequence[TailEntry], bytes_max: int) -> tuple[object, ...]:
    previous = 0
    total_bytes = 0
    for entry in entries:
        assert entry.commit_ts > previous
        assert 1 <= entry.dsn <= limits.U64_MAX
        assert 1 <= len(entry.payload) <= limits.ENTRY_BYTES_MAX
        previous = entry.commit_ts
        total_bytes += len(entry.payload)
    assert total_bytes <= bytes_max
    return tuple((entry.commit_ts, entry.dsn, entry.payload) for entry in entries)


def _bug(reason: str) -> AssertionError:
    return AssertionError(f"a reply that breaks FORMAT.md: {reason}")


# --- Replies: decode ------------------------------------------------------------------------------


def decode_reply(frame: Frame) -> Reply:
    """The reply in a frame. `WrongFrameKind` (close) for a request frame; `BadReply` for a
    body that is not a valid reply (the client drops the connection)."""
    if frame.kind != FrameKind.RESPONSE:
        raise WrongFrameKind(FrameKind.RESPONSE, frame.kind)
    fields = Fields(unpack(frame.body, BadReply), BadReply, "reply")
    tag = fields.op()
    if frame.request_id == 0 and tag != TAG_ERROR:
        raise BadReply("request id 0 is reserved for ErrorReply")
    if tag == TAG_AUTHENTICATED:
        fields.expect("Authenticated", 0)
        return Authenticated()
    if tag == TAG_STATUS:
        fields.expect("StatusReply", 3)
        visible_ts = fields.uint("visible_ts")
        checkpoint_ts = fields.uint("checkpoint_ts")
        role = fields.text("role", limits.ROLE_BYTES_MAX, bytes_min=1)
        if role not in ROLES:
            raise BadReply(f"StatusReply.role: {role!r} is not one of {', '.join(ROLES)}")
        return StatusReply(TNStatus(visible_ts, checkpoint_ts, role))
    if tag == TAG_LOGTAIL_PAGE:
        return _decode_page(fields)
    if tag == TAG_COMMITTED:
        fields.expect("Committed", 1)
        return Committed(fields.uint("commit_ts"))
    if tag == TAG_SUBSCRIBED:
        fields.expect("Subscribed", 1)
        return Subscribed(fields.uint("from_ts"))
    if tag == TAG_PUSHED:
        fields.expect("Pushed", 1)
        entries = _decode_entries(
            fields, "entries", limits.PUSH_ENTRIES_MAX, limits.PUSH_BYTES_MAX, after_ts=0
        )
        if not entries:
            raise BadReply("Pushed.entries is empty")
        return Pushed(entries)
    if tag == TAG_CHECKPOINT_LIST:
        fields.expect("CheckpointList", 1)
        return CheckpointList(
            _decode_checkpoints(fields.array("checkpoints", limits.CHECKPOINTS_MAX))
        )
    if tag == TAG_PROMOTED:
        fields.expect("Promoted", 2)
        return Promoted(fields.uint("visible_ts"), fields.boolean("was_standby"))
    if tag == TAG_ERROR:
        return _decode_error(fields)
    raise BadReply(f"unknown reply tag {tag}")


def _decode_page(fields: Fields) -> LogtailPage:
    fields.expect("LogtailPage", 5)
    checkpoint = fields.optional_text("checkpoint", limits.MANIFEST_NAME_BYTES_MAX)
    checkpoint_ts = fields.uint("checkpoint_ts")
    if checkpoint is None and checkpoint_ts:
        raise BadReply("LogtailPage: checkpoint_ts without a checkpoint")
    if checkpoint == "":
        raise BadReply("LogtailPage.checkpoint is empty")
    entries = _decode_entries(
        fields,
        "entries",
        limits.LOGTAIL_PAGE_ENTRIES_MAX,
        limits.LOGTAIL_PAGE_BYTES_MAX,
        after_ts=checkpoint_ts,
    )
    upto_ts = fields.uint("upto_ts")
    more = fields.boolean("more")
    newest = entries[-1].commit_ts if entries else checkpoint_ts
    if upto_ts < newest:
        raise BadReply(f"LogtailPage.upto_ts {upto_ts} is below what it holds ({newest})")
    return LogtailPage(Logtail(checkpoint, checkpoint_ts, entries, upto_ts), more)


def _decode_entries(
    fields: Fields, name: str, count_max: int, bytes_max: int, after_ts: int
) -> tuple[TailEntry, ...]:
    """Entries in strictly increasing commit_ts order, each after `after_ts`."""
    items = fields.array(name, count_max)
    entries = []
    total_bytes = 0
    previous = after_ts
    for index, item in enumerate(items):
        at = f"{name}[{index}]"
        if type(item) is not tuple or len(item) != 3:
            raise BadReply(f"{at} must be [commit_ts, dsn, payload]")
        commit_ts, dsn, payload = item
        if type(commit_ts) is not int or type(dsn) is not int or type(payload) is not bytes:
            raise BadReply(f"{at} must be [uint, uint, bin]")
        if commit_ts <= previous:
            raise BadReply(f"{at}: commit_ts {commit_ts} does not follow {previous}")
        if not 1 <= dsn <= limits.U64_MAX:
            raise BadReply(f"{at}: dsn {dsn} out of range")
        if not 1 <= len(payload) <= limits.ENTRY_BYTES_MAX:
            raise BadReply(f"{at}: a payload of {len(payload)} bytes")
        total_bytes += len(payload)
        previous = commit_ts
        entries.append(TailEntry(commit_ts, dsn, payload))
    if total_bytes > bytes_max:
        raise BadReply(f"{name}: {total_bytes} payload bytes, over {bytes_max}")
    return tuple(entries)


def _decode_checkpoints(items: tuple[object, ...]) -> tuple[tuple[int, str], ...]:
    checkpoints = []
    previous = -1
    for index, item in enumerate(items):
        if type(item) is not tuple or len(item) != 2:
            raise BadReply(f"checkpoints[{index}] must be [ckp_ts, manifest]")
        ckp_ts, name = item
        if type(ckp_ts) is not int or type(name) is not str or not name:
            raise BadReply(f"checkpoints[{index}] must be [uint, str]")
        if ckp_ts <= previous or len(name.encode()) > limits.MANIFEST_NAME_BYTES_MAX:
            raise BadReply(f"checkpoints[{index}]: out of order, or a name too long")
        previous = ckp_ts
        checkpoints.append((ckp_ts, name))
    return tuple(checkpoints)


def _decode_error(fields: Fields) -> ErrorReply:
    fields.expect("ErrorReply", 3)
    number = fields.uint("code")
    try:
        code = ErrorCode(number)
    except ValueError:
        raise BadReply(f"unknown error code {number}") from None
    message = fields.text("message", limits.MESSAGE_BYTES_MAX)
    args = fields.array("args", 4)
    shape = ARGS_SHAPES.get(code, ())
    if len(args) != len(shape):
        raise BadReply(f"ErrorReply {code.name} carries {len(shape)} args, got {len(args)}")
    for position, (arg, wants) in enumerate(zip(args, shape, strict=True)):
        at = f"ErrorReply.args[{position}]"
        if wants == "str" and type(arg) is not str:
            raise BadReply(f"{at} must be a str")
        if wants == "int" and (type(arg) is not int or arg < 0):
            raise BadReply(f"{at} must be a uint")
        if wants == "key":
            try:
                _check_key(arg, at)
            except BadRequest as exc:
                raise BadReply(exc.reason) from None
    return ErrorReply(code, message, args)


def _bad_request(reason: str) -> BadRequest:
    return BadRequest(reason)
