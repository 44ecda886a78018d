"""Requests and responses of the data-plane protocol, and their msgpack codec.

Pure functions over bytes, no I/O. `FORMAT.md` beside this file is the specification.

Every message body is one msgpack array (packed with `use_bin_type=True`; no maps, no ext):

    body := [op, field...]     the message's fields in the order its dataclass declares them

    requests (frame kind 1)               responses (frame kind 2)
    op 0: reserved, never valid           tag 65:  Authenticated  []
    op 1: Authenticate  [token]           tag 66:  Appended       [first_lsn, count, duplicate]
    op 2: Append        [shard, records,  tag 67:  Records        [records, first_lsn, next_lsn]
                         client_id, seq,  tag 68:  TruncatedTo    [first_lsn]
                         epoch]           tag 69:  LeaseGranted   [holder, epoch]
    op 3: Read          [shard, from_lsn, tag 70:  ShardStatus    [shard, leader, term,
                         max_bytes]                  first_lsn, next_lsn, commit_index,
    op 4: Tail          [shard, from_lsn,            is_leader]
                         max_bytes, wait_ms]
    op 5: Truncate      [shard, lsn,      tag 127: ErrorResponse  [code, message, leader_hint,
                         epoch]                      first_lsn, current_holder,
    op 6: AcquireLease  [shard, holder,              current_epoch]
                         epoch]
    op 7: Status        [shard]

Truncate's `epoch` was added at the end within version 1: `[5, shard, lsn]`, the body of
earlier clients, still decodes, as epoch 0 (FORMAT.md). Encoding always writes the epoch.

Arrays, not maps: the field order is fixed by the version, so names would only add bytes
and a second way to be malformed. An optional field is present as msgpack nil.

Encoding checks every rule first (`BadRequest` / `RequestTooLarge` / `BadResponse`) and
decoding checks the same rules after reading the types, so whatever decodes re-encodes.
msgpack is imported here and in `logsvc.shard.commands` only; it is a pure codec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

# msgpack 1.2.4 ships no type information; its two calls are wrapped in typed functions.
import msgpack

from logsvc.wire.errors import (
    BadRequest,
    BadResponse,
    ErrorCode,
    MessageError,
    RequestTooLarge,
    UnknownOp,
    WrongFrameKind,
)
from logsvc.wire.frames import Frame, FrameKind, encode_frame
from logsvc.wire.limits import DEFAULT_WIRE_LIMITS, U32_MAX, U64_MAX, WireLimits

# Public names; ErrorCode and the errors the codec raises are re-exported for callers that
# import this module alone (the package `logsvc.wire` exports everything).
__all__ = [
    "AcquireLease",
    "Append",
    "Appended",
    "Authenticate",
    "Authenticated",
    "BadRequest",
    "BadResponse",
    "ErrorCode",
    "ErrorResponse",
    "LeaseGranted",
    "MessageError",
    "Read",
    "Records",
    "Request",
    "RequestTooLarge",
    "Response",
    "ShardStatus",
    "Status",
    "Tail",
    "Truncate",
    "TruncatedTo",
    "UnknownOp",
    "WrongFrameKind",
    "decode_request",
    "decode_response",
    "encode_appended",
    "encode_request",
    "encode_response",
    "request_problem",
    "response_problem",
]

# --- Requests ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authenticate:
    """The first request on a connection: anything else before it is `UNAUTHENTICATED`."""

    token: str


@dataclass(frozen=True, slots=True)
class Append:
    """Append `records` (they get consecutive LSNs) as batch `(client_id, seq)` under lease
    `epoch` (0 for writers that do not fence). A retry with the same `(client_id, seq)` is
    answered with the original LSNs and `duplicate=True`."""

    shard: int
    records: tuple[bytes, ...]
    client_id: str
    seq: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Read:
    """Committed records from `from_lsn`: at most `max_bytes` of payload, but at least one
    record if there is one. Answered with `Records`."""

    shard: int
    from_lsn: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Tail:
    """A `Read` that, at the end of the log, waits up to `wait_ms` for a record at or after
    `from_lsn` (long-poll). Answered with `Records`, empty if none arrived in time."""

    shard: int
    from_lsn: int
    max_bytes: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Discard every LSN below `lsn`, under lease `epoch` (fenced like an `Append`: 0 for
    writers that do not fence, accepted only while no lease was ever granted). Answered
    with `TruncatedTo`."""

    shard: int
    lsn: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class AcquireLease:
    """Take (or confirm) the shard's write lease at `epoch` (>= 1) for `holder`."""

    shard: int
    holder: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Status:
    shard: int


Request = Authenticate | Append | Read | Tail | Truncate | AcquireLease | Status


# --- Responses -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authenticated:
    pass


@dataclass(frozen=True, slots=True)
class Appended:
    """The batch holds LSNs `[first_lsn, first_lsn + count)`; `duplicate` for a retry."""

    first_lsn: int
    count: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Records:
    """Records `[first_lsn, next_lsn)` (so `next_lsn == first_lsn + len(records)`), with
    `first_lsn` the request's `from_lsn`. At the end of the log: no records and
    `next_lsn == first_lsn == from_lsn`."""

    records: tuple[bytes, ...]
    first_lsn: int
    next_lsn: int


@dataclass(frozen=True, slots=True)
class TruncatedTo:
    """The first retained LSN after the truncate (also when it was a no-op)."""

    first_lsn: int


@dataclass(frozen=True, slots=True)
class LeaseGranted:
    holder: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """Retained LSNs are `[first_lsn, next_lsn)`; `leader` is None when none is known.

    `is_leader` true: answered by the shard's leader after a barrier through the log
    committed in `term` (a majority followed it then; every committed LSN is applied).
    False: the answering replica's own view, possibly stale (its `leader` and `term` are
    what it last heard; its LSNs may lag)."""

    shard: int
    leader: str | None
    term: int
    first_lsn: int
    next_lsn: int
    commit_index: int
    is_leader: bool


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A refused request. The optional fields go with one code each and are None otherwise:
    `leader_hint` with NOT_LEADER (None if unknown), `first_lsn` with TRUNCATED (required),
    `current_epoch` with STALE_EPOCH and NOT_LEASE_HOLDER (required) and `current_holder`
    with those two (None when no lease was ever granted)."""

    code: ErrorCode
    message: str
    leader_hint: str | None = None
    first_lsn: int | None = None
    current_holder: str | None = None
    current_epoch: int | None = None


Response = (
    Authenticated | Appended | Records | TruncatedTo | LeaseGranted | ShardStatus | ErrorResponse
)


# --- Op codes ------------------------------------------------------------------------------

OP_INVALID = 0  # reserved: a zeroed body never decodes to a request
OP_AUTHENTICATE = 1
OP_APPEND = 2
OP_READ = 3
OP_TAIL = 4
OP_TRUNCATE = 5
OP_ACQUIRE_LEASE = 6
OP_STATUS = 7

# Response tags live apart from request ops (64 and up), so a body sent the wrong way never
# decodes as a message of the other direction, and hex dumps tell them apart at a glance.
TAG_AUTHENTICATED = 65
TAG_APPENDED = 66
TAG_RECORDS = 67
TAG_TRUNCATED_TO = 68
TAG_LEASE_GRANTED = 69
TAG_SHARD_STATUS = 70
TAG_ERROR = 127

REQUEST_OPS: dict[type[Request], int] = {
    Authenticate: OP_AUTHENTICATE,
    Append: OP_APPEND,
    Read: OP_READ,
    Tail: OP_TAIL,
    Truncate: OP_TRUNCATE,
    AcquireLease: OP_ACQUIRE_LEASE,
    Status: OP_STATUS,
}
RESPONSE_TAGS: dict[type[Response], int] = {
    Authenticated: TAG_AUTHENTICATED,
    Appended: TAG_APPENDED,
    Records: TAG_RECORDS,
    TruncatedTo: TAG_TRUNCATED_TO,
    LeaseGranted: TAG_LEASE_GRANTED,
    ShardStatus: TAG_SHARD_STATUS,
    ErrorResponse: TAG_ERROR,
}
_REQUEST_BY_OP: dict[int, type[Request]] = {op: cls for cls, op in REQUEST_OPS.items()}
_RESPONSE_BY_TAG: dict[int, type[Response]] = {tag: cls for cls, tag in RESPONSE_TAGS.items()}
_ERROR_CODES = frozenset(int(code) for code in ErrorCode)
assert OP_INVALID not in _REQUEST_BY_OP
assert 0 not in _ERROR_CODES
assert not set(_REQUEST_BY_OP) & set(_RESPONSE_BY_TAG)
assert all(0 < code < 128 for code in (*_REQUEST_BY_OP, *_RESPONSE_BY_TAG))  # 1-byte fixints


# --- Public codec --------------------------------------------------------------------------


def encode_request(
    request_id: int, msg: Request, limits: WireLimits = DEFAULT_WIRE_LIMITS
) -> bytes:
    """The whole frame of a request. `BadRequest` (or `RequestTooLarge`) for a request that
    breaks a rule; request id 0 is reserved (see `decode_response`)."""
    assert 1 <= request_id <= U64_MAX
    if type(msg) is Append and _append_fields_ok(
        msg.shard, msg.records, msg.client_id, msg.seq, msg.epoch, limits
    ):  # the hot path: the same rules, checked in one pass (see _append_fields_ok)
        body = _pack((OP_APPEND, msg.shard, msg.records, msg.client_id, msg.seq, msg.epoch))
        return encode_frame(FrameKind.REQUEST, request_id, body, limits)
    problem = request_problem(msg, limits)
    if problem is not None:
        raise problem
    body = _pack((REQUEST_OPS[type(msg)], *_field_values(msg)))
    return encode_frame(FrameKind.REQUEST, request_id, body, limits)


def decode_request(frame: Frame, limits: WireLimits = DEFAULT_WIRE_LIMITS) -> Request:
    """The request in a frame.

    `WrongFrameKind` (a `ProtocolError`: close the connection) for a response frame;
    `BadRequest`, `UnknownOp` or `RequestTooLarge` for a body that is not a valid request:
    answer `frame.request_id` with `ErrorResponse(exc.code, exc.reason)` and keep serving.
    """
    if frame.kind != FrameKind.REQUEST:
        raise WrongFrameKind(FrameKind.REQUEST, frame.kind)
    if frame.request_id == 0:
        raise BadRequest("request id 0 is reserved")
    body = _unpack(frame.body, limits)
    if isinstance(body, str):
        raise BadRequest(body)
    if not body:
        raise BadRequest("empty body array")
    op, values = body[0], body[1:]
    if type(op) is int and op == OP_APPEND and len(values) == 5:
        shard, records, client_id, seq, epoch = values
        if _append_fields_ok(shard, records, client_id, seq, epoch, limits):  # the hot path
            return Append(shard, records, client_id, seq, epoch)  # type: ignore[arg-type]
    if type(op) is not int:
        raise BadRequest(f"op is a {type(op).__name__}, not an integer")
    cls = _REQUEST_BY_OP.get(op)
    if cls is None:
        raise UnknownOp(op)
    if cls is Truncate and len(values) == 2:
        values = (*values, 0)  # an earlier client's body, without the epoch: epoch 0
    reason = _shape_problem(cls, values)
    if reason is not None:
        raise BadRequest(reason)
    construct: Callable[..., Request] = cls
    msg = construct(*values)
    problem = request_problem(msg, limits)
    if problem is not None:
        raise problem
    return msg


def encode_response(
    request_id: int, msg: Response, limits: WireLimits = DEFAULT_WIRE_LIMITS
) -> bytes:
    """The whole frame of a response to `request_id`. Request id 0 answers no request: only
    an `ErrorResponse` may carry it (a server's last word before it closes a connection on a
    `ProtocolError`). `BadResponse` for a response that breaks a rule (a server bug)."""
    assert 0 <= request_id <= U64_MAX
    if type(msg) is Appended and request_id:
        return encode_appended(request_id, msg.first_lsn, msg.count, msg.duplicate, limits)
    problem = response_problem(msg, limits)
    if problem is None and request_id == 0 and not isinstance(msg, ErrorResponse):
        problem = BadResponse("request id 0 is reserved for ErrorResponse")
    if problem is not None:
        raise problem
    body = _pack((RESPONSE_TAGS[type(msg)], *_field_values(msg)))
    return encode_frame(FrameKind.RESPONSE, request_id, body, limits)


def decode_response(frame: Frame, limits: WireLimits = DEFAULT_WIRE_LIMITS) -> Response:
    """The response in a frame. `WrongFrameKind` (close) for a request frame; `BadResponse`
    for a body that is not a valid response: fail the request `frame.request_id` (0: a
    connection-level error) and keep the connection."""
    if frame.kind != FrameKind.RESPONSE:
        raise WrongFrameKind(FrameKind.RESPONSE, frame.kind)
    body = _unpack(frame.body, limits)
    if isinstance(body, str):
        raise BadResponse(body)
    if not body:
        raise BadResponse("empty body array")
    tag, values = body[0], body[1:]
    if type(tag) is int and tag == TAG_APPENDED and frame.request_id and len(values) == 3:
        first_lsn, count, duplicate = values
        if _appended_fields_ok(first_lsn, count, duplicate, limits):  # the hot path
            return Appended(first_lsn, count, duplicate)  # type: ignore[arg-type]
    if type(tag) is not int:
        raise BadResponse(f"tag is a {type(tag).__name__}, not an integer")
    cls = _RESPONSE_BY_TAG.get(tag)
    if cls is None:
        raise BadResponse(f"unknown response tag {tag}")
    reason = _shape_problem(cls, values)
    if reason is not None:
        raise BadResponse(reason)
    if cls is ErrorResponse:
        code = values[0]
        assert type(code) is int
        if code not in _ERROR_CODES:
            raise BadResponse(f"unknown error code {code}")
        values = (ErrorCode(code), *values[1:])
    construct: Callable[..., Response] = cls
    msg = construct(*values)
    problem = response_problem(msg, limits)
    if problem is None and frame.request_id == 0 and not isinstance(msg, ErrorResponse):
        problem = BadResponse("request id 0 is reserved for ErrorResponse")
    if problem is not None:
        raise problem
    return msg


def encode_appended(
    request_id: int,
    first_lsn: int,
    count: int,
    duplicate: bool,
    limits: WireLimits = DEFAULT_WIRE_LIMITS,
) -> bytes:
    """`encode_response(request_id, Appended(first_lsn, count, duplicate))` without building
    the message: the server's answer to every append. The same bytes and the same rules."""
    assert 1 <= request_id <= U64_MAX
    if not _appended_fields_ok(first_lsn, count, duplicate, limits):
        problem = response_problem(Appended(first_lsn, count, duplicate), limits)
        assert problem is not None
        raise problem
    body = _pack((TAG_APPENDED, first_lsn, count, duplicate))
    return encode_frame(FrameKind.RESPONSE, request_id, body, limits)


# --- Rules ---------------------------------------------------------------------------------


# The hot paths (an Append going in, an Appended coming out) check their rules in one pass
# of plain comparisons instead of the general shape-then-rules walk below, which costs
# several microseconds a message. They only ever accept: a message they do not accept takes
# the general path, which finds the precise reason. test_messages.py checks, with
# hypothesis, that they accept exactly what the general rules accept.


def _append_fields_ok(
    shard: object,
    records: object,
    client_id: object,
    seq: object,
    epoch: object,
    limits: WireLimits,
) -> bool:
    if not (
        type(shard) is int
        and 0 <= shard <= U32_MAX
        and type(seq) is int
        and 0 <= seq <= U64_MAX
        and type(epoch) is int
        and 0 <= epoch <= U64_MAX
        and type(client_id) is str
        and type(records) is tuple
        and len(records) <= limits.append_records_max
    ):
        return False
    try:
        client_id_bytes = len(client_id.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if not 1 <= client_id_bytes <= limits.client_id_bytes_max:
        return False
    record_bytes_max = limits.record_bytes_max
    total_bytes = 0
    for record in records:
        if type(record) is not bytes or len(record) > record_bytes_max:
            return False
        total_bytes += len(record)
    return total_bytes <= limits.append_bytes_max


def _appended_fields_ok(
    first_lsn: object, count: object, duplicate: object, limits: WireLimits
) -> bool:
    return (
        type(first_lsn) is int
        and 1 <= first_lsn <= U64_MAX
        and type(count) is int
        and 0 <= count <= limits.append_records_max
        and type(duplicate) is bool
    )


def request_problem(msg: object, limits: WireLimits = DEFAULT_WIRE_LIMITS) -> BadRequest | None:
    """Why `msg` is not a valid request (types, ranges, limits), or None."""
    cls = type(msg)
    if cls not in REQUEST_OPS:
        return BadRequest(f"not a request: {cls.__name__}")
    reason = _shape_problem(cls, _field_values(msg))
    if reason is not None:
        return BadRequest(reason)
    match msg:
        case Authenticate(token):
            reason = _str_problem("token", token, 1, limits.token_bytes_max)
        case Append(shard, records, client_id, seq, epoch):
            too_large = _append_too_large(records, limits)
            if too_large is not None:
                return too_large
            reason = (
                _shard_problem(shard)
                or _str_problem("client_id", client_id, 1, limits.client_id_bytes_max)
                or _int_problem("seq", seq, 0, U64_MAX)
                or _int_problem("epoch", epoch, 0, U64_MAX)
            )
        case Read(shard, from_lsn, max_bytes):
            reason = (
                _shard_problem(shard)
                or _int_problem("from_lsn", from_lsn, 1, U64_MAX)
                or _int_problem("max_bytes", max_bytes, 1, limits.read_bytes_max)
            )
        case Tail(shard, from_lsn, max_bytes, wait_ms):
            reason = (
                _shard_problem(shard)
                or _int_problem("from_lsn", from_lsn, 1, U64_MAX)
                or _int_problem("max_bytes", max_bytes, 1, limits.read_bytes_max)
                or _int_problem("wait_ms", wait_ms, 0, limits.tail_wait_ms_max)
            )
        case Truncate(shard, lsn, epoch):
            reason = (
                _shard_problem(shard)
                or _int_problem("lsn", lsn, 0, U64_MAX)
                or _int_problem("epoch", epoch, 0, U64_MAX)
            )
        case AcquireLease(shard, holder, epoch):
            # Epoch 0 means "no lease was ever granted"; a lease is always at epoch >= 1.
            reason = (
                _shard_problem(shard)
                or _str_problem("holder", holder, 1, limits.holder_bytes_max)
                or _int_problem("epoch", epoch, 1, U64_MAX)
            )
        case Status(shard):
            reason = _shard_problem(shard)
    return None if reason is None else BadRequest(f"{cls.__name__}: {reason}")


def response_problem(msg: object, limits: WireLimits = DEFAULT_WIRE_LIMITS) -> BadResponse | None:
    """Why `msg` is not a valid response (types, ranges, limits), or None."""
    cls = type(msg)
    if cls not in RESPONSE_TAGS:
        return BadResponse(f"not a response: {cls.__name__}")
    reason = _shape_problem(cls, _field_values(msg))
    if reason is not None:
        return BadResponse(reason)
    reason = None
    match msg:
        case Appended(first_lsn, count, _duplicate):
            reason = _int_problem("first_lsn", first_lsn, 1, U64_MAX) or _int_problem(
                "count", count, 0, limits.append_records_max
            )
        case Records(records, first_lsn, next_lsn):
            reason = (
                _records_reply_problem(records, limits)
                or _int_problem("first_lsn", first_lsn, 1, U64_MAX)
                or _int_problem("next_lsn", next_lsn, 1, U64_MAX)
            )
            if reason is None and next_lsn != first_lsn + len(records):
                reason = (
                    f"next_lsn {next_lsn} is not first_lsn {first_lsn} + {len(records)} records"
                )
        case TruncatedTo(first_lsn):
            reason = _int_problem("first_lsn", first_lsn, 1, U64_MAX)
        case LeaseGranted(holder, epoch):
            reason = _str_problem("holder", holder, 1, limits.holder_bytes_max) or _int_problem(
                "epoch", epoch, 1, U64_MAX
            )
        case ShardStatus(shard, leader, term, first_lsn, next_lsn, commit_index, _is_leader):
            reason = (
                _shard_problem(shard)
                or _optional_str_problem("leader", leader, limits.node_id_bytes_max)
                or _int_problem("term", term, 0, U64_MAX)
                or _int_problem("first_lsn", first_lsn, 1, U64_MAX)
                or _int_problem("next_lsn", next_lsn, first_lsn, U64_MAX)
                or _int_problem("commit_index", commit_index, 0, U64_MAX)
            )
        case ErrorResponse():
            reason = _error_response_problem(msg, limits)
    return None if reason is None else BadResponse(f"{cls.__name__}: {reason}")


def _error_response_problem(msg: ErrorResponse, limits: WireLimits) -> str | None:
    code = msg.code
    if not isinstance(code, ErrorCode):
        return f"code {code!r} is not an ErrorCode"
    reason = _str_problem("message", msg.message, 0, limits.error_message_bytes_max)
    if reason is not None:
        return reason
    fenced = code in (ErrorCode.STALE_EPOCH, ErrorCode.NOT_LEASE_HOLDER)
    if code == ErrorCode.NOT_LEADER:
        reason = _optional_str_problem("leader_hint", msg.leader_hint, limits.node_id_bytes_max)
    elif msg.leader_hint is not None:
        return f"leader_hint goes with NOT_LEADER only, not {code.name}"
    if reason is not None:
        return reason
    if code == ErrorCode.TRUNCATED:
        if msg.first_lsn is None:
            return "TRUNCATED requires first_lsn"
        reason = _int_problem("first_lsn", msg.first_lsn, 1, U64_MAX)
    elif msg.first_lsn is not None:
        return f"first_lsn goes with TRUNCATED only, not {code.name}"
    if reason is not None:
        return reason
    if fenced:
        if msg.current_epoch is None:
            return f"{code.name} requires current_epoch"
        return _int_problem("current_epoch", msg.current_epoch, 0, U64_MAX) or (
            _optional_str_problem("current_holder", msg.current_holder, limits.holder_bytes_max)
        )
    if msg.current_epoch is not None or msg.current_holder is not None:
        return (
            "current_holder and current_epoch go with STALE_EPOCH and NOT_LEASE_HOLDER "
            f"only, not {code.name}"
        )
    return None


def _shard_problem(shard: int) -> str | None:
    return _int_problem("shard", shard, 0, U32_MAX)


def _int_problem(name: str, value: int, lo: int, hi: int) -> str | None:
    """A range check, [lo, hi] inclusive (the type was checked before)."""
    if lo <= value <= hi:
        return None
    return f"{name} must be in [{lo}, {hi}], got {value}"


def _str_problem(name: str, value: str, bytes_min: int, bytes_max: int) -> str | None:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{name} is not encodable as UTF-8 (lone surrogate)"
    if size < bytes_min:
        return f"{name} must not be empty"
    if size > bytes_max:
        return f"{name} is {size} bytes of UTF-8, over the limit of {bytes_max}"
    return None


def _optional_str_problem(name: str, value: str | None, bytes_max: int) -> str | None:
    return None if value is None else _str_problem(name, value, 1, bytes_max)


def _append_too_large(records: tuple[bytes, ...], limits: WireLimits) -> RequestTooLarge | None:
    if len(records) > limits.append_records_max:
        return RequestTooLarge("append_records_max", len(records), limits.append_records_max)
    total_bytes = 0
    for record in records:
        if len(record) > limits.record_bytes_max:
            return RequestTooLarge("record_bytes_max", len(record), limits.record_bytes_max)
        total_bytes += len(record)
    if total_bytes > limits.append_bytes_max:
        return RequestTooLarge("append_bytes_max", total_bytes, limits.append_bytes_max)
    return None


def _records_reply_problem(records: tuple[bytes, ...], limits: WireLimits) -> str | None:
    if len(records) > limits.read_records_max:
        return f"{len(records)} records, over read_records_max ({limits.read_records_max})"
    total_bytes = sum(len(record) for record in records)
    if total_bytes > limits.read_bytes_max:
        return f"{total_bytes} record bytes, over read_bytes_max ({limits.read_bytes_max})"
    return None


# --- Shapes: the type of every field, from the dataclass annotations ------------------------


def _is_int(value: object) -> bool:
    return type(value) is int  # not bool: True never stands for 1


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _is_bytes_tuple(value: object) -> bool:
    return type(value) is tuple and all(type(record) is bytes for record in value)


def _is_optional_str(value: object) -> bool:
    return value is None or type(value) is str


def _is_optional_int(value: object) -> bool:
    return value is None or type(value) is int


def _is_error_code(value: object) -> bool:
    # An int on the wire; an ErrorCode in a message (the codec converts, and checks the
    # value against the enum separately so an unknown code gets its own reason).
    return type(value) is int or type(value) is ErrorCode


_TYPE_CHECKS: dict[str, tuple[Callable[[object], bool], str]] = {
    "int": (_is_int, "an integer"),
    "str": (_is_str, "a str"),
    "bool": (_is_bool, "a bool"),
    "tuple[bytes, ...]": (_is_bytes_tuple, "an array of bin"),
    "str | None": (_is_optional_str, "a str or nil"),
    "int | None": (_is_optional_int, "an integer or nil"),
    "ErrorCode": (_is_error_code, "an integer"),
}

# Per message class: (field name, check, what the check wants), in declaration order.
_SHAPES: dict[type, tuple[tuple[str, Callable[[object], bool], str], ...]] = {
    cls: tuple((field.name, *_TYPE_CHECKS[str(field.type)]) for field in dataclasses.fields(cls))
    for cls in (*REQUEST_OPS, *RESPONSE_TAGS)
}


def _field_values(msg: object) -> tuple[object, ...]:
    """The body fields of a message, in declaration order (ErrorCode packed as its int)."""
    values = tuple(getattr(msg, name) for name, _check, _wants in _SHAPES[type(msg)])
    return tuple(int(v) if type(v) is ErrorCode else v for v in values)


def _shape_problem(cls: type, values: tuple[object, ...]) -> str | None:
    shape = _SHAPES[cls]
    if len(values) != len(shape):
        return f"{cls.__name__} has {len(shape)} fields, got {len(values)}"
    for (name, check, wants), value in zip(shape, values, strict=True):
        if not check(value):
            return f"{cls.__name__}.{name} must be {wants}, got {type(value).__name__}"
    return None


# --- msgpack -------------------------------------------------------------------------------


def _pack(body: tuple[object, ...]) -> bytes:
    packed = msgpack.packb(body, use_bin_type=True)
    assert isinstance(packed, bytes)
    return packed


def _unpack(body: bytes, limits: WireLimits) -> tuple[object, ...] | str:
    """The array a body holds, or the reason it is not one. Maps and ext types are refused
    (an empty map decodes, and is refused for not being an array); arrays become tuples.

    `max_array_len` stays tight: an element can be one byte, so a body of N bytes could
    otherwise build a tuple of 8 x N bytes of pointers. An array over it is refused here,
    before it is built (BAD_REQUEST, not TOO_LARGE)."""
    options = _DEFAULT_UNPACK_OPTIONS if limits is DEFAULT_WIRE_LIMITS else _unpack_options(limits)
    try:
        decoded = msgpack.unpackb(body, **options)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ValueError covers truncated input, trailing bytes, the limits, bad UTF-8 and the
        # FormatError/StackError subclasses; nothing raw escapes.
        return f"bad msgpack body: {type(exc).__name__}: {exc}"
    if not isinstance(decoded, tuple):
        return f"body is a {type(decoded).__name__}, not an array"
    return decoded


def _unpack_options(limits: WireLimits) -> dict[str, object]:
    return {
        "raw": False,
        "use_list": False,
        "strict_map_key": True,
        "max_str_len": limits.str_bytes_max,
        # Not record_bytes_max: a bin cannot be longer than the body that holds it, and a
        # record over its limit is then reported as RequestTooLarge (TOO_LARGE).
        "max_bin_len": limits.frame_body_bytes_max,
        "max_array_len": limits.array_len_max,
        "max_map_len": 0,
        "max_ext_len": 0,
    }


_DEFAULT_UNPACK_OPTIONS = _unpack_options(DEFAULT_WIRE_LIMITS)  # every message, at the defaults
