"""The message codec round-trips every valid request and response, and reports every bad body
as a typed, non-fatal `MessageError` carrying the right `ErrorCode`.

How: hypothesis round trips (encode, feed the frame through a `FrameDecoder`, decode, compare)
for every message kind; tables of invalid messages that `encode_*` refuses and of bodies,
with valid frames around them, that `decode_*` refuses, each with the exception type, its
code and a piece of its reason; the limits at their edges (small limits, and the default
largest Append and Records reply, which must fit in one frame); the limit relations
`WireLimits.validate()` enforces.
"""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from logsvc.wire import (
    DEFAULT_WIRE_LIMITS,
    AcquireLease,
    Append,
    Appended,
    Authenticate,
    Authenticated,
    BadRequest,
    BadResponse,
    ErrorCode,
    ErrorResponse,
    Frame,
    FrameDecoder,
    FrameKind,
    LeaseGranted,
    MessageError,
    Read,
    Records,
    Request,
    RequestTooLarge,
    Response,
    ShardStatus,
    Status,
    Tail,
    Truncate,
    TruncatedTo,
    UnknownOp,
    WireLimits,
    WrongFrameKind,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    messages,
    request_problem,
    response_problem,
)
from logsvc.wire.limits import KIB, MIB
from logsvc.wire.messages import REQUEST_OPS

from .strategies import SMALL, U32_MAX, U64_MAX, request_ids, requests, responses


def through_decoder(data: bytes, limits: WireLimits = DEFAULT_WIRE_LIMITS) -> Frame:
    decoder = FrameDecoder(limits)
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame is not None
    assert decoder.buffered_bytes == 0
    return frame


def packed(body: object) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    assert isinstance(data, bytes)
    return data


def request_frame(body: object, request_id: int = 1) -> Frame:
    raw = body if isinstance(body, bytes) else packed(body)
    return Frame(FrameKind.REQUEST, request_id, raw)


def response_frame(body: object, request_id: int = 1) -> Frame:
    raw = body if isinstance(body, bytes) else packed(body)
    return Frame(FrameKind.RESPONSE, request_id, raw)


def ill_typed(cls: Any, *args: Any) -> Any:
    """A message built with values of the wrong type (what mypy would refuse)."""
    return cls(*args)


# --- Round trips -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(request_ids, requests)
def test_requests_round_trip(request_id: int, msg: Request) -> None:
    frame = through_decoder(encode_request(request_id, msg))
    assert (frame.kind, frame.request_id) == (FrameKind.REQUEST, request_id)
    assert decode_request(frame) == msg


@settings(max_examples=300, deadline=None)
@given(request_ids, responses)
def test_responses_round_trip(request_id: int, msg: Response) -> None:
    frame = through_decoder(encode_response(request_id, msg))
    assert (frame.kind, frame.request_id) == (FrameKind.RESPONSE, request_id)
    decoded = decode_response(frame)
    assert decoded == msg
    assert type(decoded) is type(msg)
    if isinstance(decoded, ErrorResponse):
        assert type(decoded.code) is ErrorCode


EDGES: list[Request | Response] = [
    Append(U32_MAX, (), "c", 0, 0),
    Append(0, (b"\0" * 8 * MIB, b"x" * (7 * MIB)), "é" * 128, U64_MAX, U64_MAX),
    Read(0, U64_MAX, 16 * MIB),
    Tail(0, 1, 1, 0),
    Tail(0, 1, 1, 60_000),
    Truncate(0, 0),
    Truncate(U32_MAX, U64_MAX, U64_MAX),
    AcquireLease(0, "h" * 256, U64_MAX),
    Authenticate("t" * 1024),
    Records((), U64_MAX, U64_MAX),
    Records((b"",) * 65_536, 1, 65_537),
    Appended(1, 0, True),
    ShardStatus(U32_MAX, None, 0, 5, 5, 0, False),
    ErrorResponse(ErrorCode.NOT_LEADER, "", leader_hint=None),
    ErrorResponse(ErrorCode.NOT_LEASE_HOLDER, "x" * 4096, current_epoch=0),
    ErrorResponse(ErrorCode.INTERNAL, "é" * 2048),
]


@pytest.mark.parametrize("msg", EDGES, ids=lambda msg: type(msg).__name__)
def test_values_at_the_edges_round_trip(msg: Request | Response) -> None:
    if isinstance(msg, Request):
        assert decode_request(through_decoder(encode_request(U64_MAX, msg))) == msg
    else:
        assert decode_response(through_decoder(encode_response(U64_MAX, msg))) == msg


def test_largest_append_and_records_reply_fit_in_one_frame() -> None:
    limits = DEFAULT_WIRE_LIMITS
    per_record = limits.append_bytes_max // limits.append_records_max
    append = Append(
        U32_MAX,
        (b"a" * per_record,) * limits.append_records_max,
        "c" * limits.client_id_bytes_max,
        U64_MAX,
        U64_MAX,
    )
    data = encode_request(U64_MAX, append)
    assert len(data) - 32 <= limits.append_body_bytes_max <= limits.frame_body_bytes_max
    assert decode_request(through_decoder(data)) == append

    per_record = limits.read_bytes_max // limits.read_records_max
    count = limits.read_records_max
    reply = Records((b"r" * per_record,) * count, U64_MAX - count, U64_MAX)
    data = encode_response(U64_MAX, reply)
    assert len(data) - 32 <= limits.records_body_bytes_max <= limits.frame_body_bytes_max
    assert decode_response(through_decoder(data)) == reply


def test_one_record_over_max_bytes_fits_a_records_reply() -> None:
    # A read returns at least one record, even one larger than its max_bytes (FORMAT.md).
    reply = Records((b"x" * DEFAULT_WIRE_LIMITS.record_bytes_max,), 1, 2)
    assert decode_response(through_decoder(encode_response(1, reply))) == reply


# --- Requests that may not be encoded, and bodies that do not decode ------------------------

# Bad values that a body can carry just as well: refused by encode and by decode.
BAD_REQUESTS: list[tuple[Any, type[BadRequest], str]] = [
    (Authenticate(""), BadRequest, "token must not be empty"),
    (Authenticate("t" * 17), BadRequest, "over the limit of 16"),
    (ill_typed(Authenticate, b"tok"), BadRequest, "Authenticate.token must be a str"),
    (Append(-1, (), "c", 0, 0), BadRequest, "shard must be in"),
    (Append(U32_MAX + 1, (), "c", 0, 0), BadRequest, "shard must be in"),
    (Append(True, (), "c", 0, 0), BadRequest, "Append.shard must be an integer, got bool"),
    (ill_typed(Append, 0, (b"x", "y"), "c", 0, 0), BadRequest, "must be an array of bin"),
    (Append(0, (), "", 0, 0), BadRequest, "client_id must not be empty"),
    (Append(0, (), "c" * 9, 0, 0), BadRequest, "client_id is 9 bytes"),
    (Append(0, (), "c", -1, 0), BadRequest, "seq must be in"),
    (Append(0, (b"",) * 5, "c", 0, 0), RequestTooLarge, "append_records_max"),
    (Append(0, (b"x" * 9,), "c", 0, 0), RequestTooLarge, "record_bytes_max"),
    (Append(0, (b"x" * 8,) * 3, "c", 0, 0), RequestTooLarge, "append_bytes_max"),
    (Read(0, 0, 1), BadRequest, "from_lsn must be in [1,"),
    (Read(0, 1, 0), BadRequest, "max_bytes must be in [1, 16]"),
    (Read(0, 1, 17), BadRequest, "max_bytes must be in [1, 16]"),
    (Tail(0, 1, 1, -1), BadRequest, "wait_ms must be in [0, 1000]"),
    (Tail(0, 1, 1, 1001), BadRequest, "wait_ms must be in [0, 1000]"),
    (Truncate(0, -1), BadRequest, "lsn must be in"),
    (ill_typed(Truncate, 0, 1.0), BadRequest, "Truncate.lsn must be an integer, got float"),
    (Truncate(0, 1, -1), BadRequest, "epoch must be in"),
    (ill_typed(Truncate, 0, 1, True), BadRequest, "Truncate.epoch must be an integer, got bool"),
    (AcquireLease(0, "h", 0), BadRequest, "epoch must be in [1,"),
    (AcquireLease(0, "", 1), BadRequest, "holder must not be empty"),
    (ill_typed(Status, None), BadRequest, "Status.shard must be an integer, got NoneType"),
]

# Bad values that a msgpack body cannot carry (or carries as a valid value): encode only.
BAD_REQUESTS_ENCODE_ONLY: list[tuple[Any, type[BadRequest], str]] = [
    (Authenticate("\ud800"), BadRequest, "lone surrogate"),
    (ill_typed(Append, 0, [b"x"], "c", 0, 0), BadRequest, "must be an array of bin"),
    (ill_typed(Append, 0, (bytearray(b"x"),), "c", 0, 0), BadRequest, "must be an array of bin"),
    (Append(0, (), "c", 0, U64_MAX + 1), BadRequest, "epoch must be in"),
    (Truncate(0, 1, U64_MAX + 1), BadRequest, "epoch must be in"),
    (Authenticated(), BadRequest, "not a request: Authenticated"),
]


@pytest.mark.parametrize(("msg", "error", "reason"), BAD_REQUESTS + BAD_REQUESTS_ENCODE_ONLY)
def test_encode_request_refuses(msg: Any, error: type[BadRequest], reason: str) -> None:
    with pytest.raises(error, match=re.escape(reason)) as caught:
        encode_request(1, msg, SMALL)
    assert type(caught.value) is error
    assert type(request_problem(msg, SMALL)) is error


@pytest.mark.parametrize(("msg", "error", "reason"), BAD_REQUESTS)
def test_decode_request_refuses_the_same_values(
    msg: Any, error: type[BadRequest], reason: str
) -> None:
    """The same bad values, written straight into a body (bypassing encode's checks)."""
    fields = [getattr(msg, name) for name in type(msg).__slots__]
    frame = request_frame([REQUEST_OPS[type(msg)], *fields])
    with pytest.raises(error, match=re.escape(reason)) as caught:
        decode_request(frame, SMALL)
    assert type(caught.value) is error


BAD_REQUEST_BODIES: list[tuple[bytes | object, type[BadRequest], str]] = [
    (b"", BadRequest, "bad msgpack body"),
    (b"\xc1", BadRequest, "bad msgpack body"),  # never used in msgpack
    (b"\x92\x07", BadRequest, "bad msgpack body"),  # truncated array
    (packed([7, 0]) + b"\x00", BadRequest, "bad msgpack body"),  # trailing bytes
    (b"\xdd\xff\xff\xff\xff", BadRequest, "bad msgpack body"),  # array of 4G elements
    (b"\xdb\xff\xff\xff\xff", BadRequest, "bad msgpack body"),  # str of 4G bytes
    (b"\xc6\xff\xff\xff\xff", BadRequest, "bad msgpack body"),  # bin of 4G bytes
    (b"\xa2\xff\xfe", BadRequest, "bad msgpack body"),  # invalid UTF-8
    (b"\x91" * 100_000 + b"\x07", BadRequest, "bad msgpack body"),  # nesting too deep
    (packed({"op": 7}), BadRequest, "bad msgpack body"),  # a map
    (b"\xd4\x01\x00", BadRequest, "bad msgpack body"),  # an ext
    (b"\x80", BadRequest, "not an array"),  # an empty map
    (packed(7), BadRequest, "not an array"),
    (packed("Status"), BadRequest, "not an array"),
    (packed([]), BadRequest, "empty body array"),
    (packed([True, 0]), BadRequest, "op is a bool"),
    (packed(["status", 0]), BadRequest, "op is a str"),
    (packed([None]), BadRequest, "op is a NoneType"),
    (packed([0]), UnknownOp, "unknown op 0"),
    (packed([8, 0]), UnknownOp, "unknown op 8"),
    (packed([66, 1, 1, False]), UnknownOp, "unknown op 66"),  # a response tag
    (packed([-1]), UnknownOp, "unknown op -1"),
    (packed([7]), BadRequest, "Status has 1 fields, got 0"),
    (packed([7, 0, 0]), BadRequest, "Status has 1 fields, got 2"),
    (packed([7, [0]]), BadRequest, "Status.shard must be an integer, got tuple"),
    (packed([7, 1.0]), BadRequest, "Status.shard must be an integer, got float"),
    (packed([7, False]), BadRequest, "Status.shard must be an integer, got bool"),
    (packed([1, b"token"]), BadRequest, "Authenticate.token must be a str, got bytes"),
    (packed([2, 0, ["x"], "c", 0, 0]), BadRequest, "records must be an array of bin"),
    (packed([2, 0, [[b"x"]], "c", 0, 0]), BadRequest, "records must be an array of bin"),
    (packed([2, 0, b"x", "c", 0, 0]), BadRequest, "records must be an array of bin"),
    (packed([2, 0, [], "c", 0, -5]), BadRequest, "epoch must be in"),
    (packed([5, 0]), BadRequest, "Truncate has 3 fields, got 1"),
    (packed([5, 0, 1, 2, 3]), BadRequest, "Truncate has 3 fields, got 4"),
    (packed([5, 0, -1]), BadRequest, "lsn must be in"),  # an earlier client's body, checked
    (packed([5, 0, 1.0]), BadRequest, "Truncate.lsn must be an integer, got float"),
    (packed([2, 0, [b""] * 70_000, "c", 0, 0]), BadRequest, "bad msgpack body"),  # array limit
    (packed([2, 0, [b"x" * (9 * MIB)], "c", 0, 0]), RequestTooLarge, "record_bytes_max"),
    (packed([1, "t" * (5 * KIB)]), BadRequest, "bad msgpack body"),  # str limit
]


@pytest.mark.parametrize(("body", "error", "reason"), BAD_REQUEST_BODIES)
def test_decode_request_refuses_bad_bodies(
    body: object, error: type[BadRequest], reason: str
) -> None:
    frame = request_frame(body)
    with pytest.raises(error, match=re.escape(reason)) as caught:
        decode_request(frame)
    assert type(caught.value) is error


def test_message_errors_carry_their_error_code() -> None:
    assert BadRequest("x").code == ErrorCode.BAD_REQUEST
    assert UnknownOp(9).code == ErrorCode.UNKNOWN_OP
    assert RequestTooLarge("record_bytes_max", 9, 8).code == ErrorCode.TOO_LARGE
    assert issubclass(UnknownOp, MessageError)
    assert issubclass(RequestTooLarge, BadRequest)
    assert BadRequest("why").reason == "why"


def test_request_id_zero_is_reserved() -> None:
    with pytest.raises(BadRequest, match="request id 0"):
        decode_request(request_frame([7, 0], request_id=0))
    with pytest.raises(AssertionError):
        encode_request(0, Status(0))


def test_frames_of_the_wrong_kind_are_protocol_errors() -> None:
    with pytest.raises(WrongFrameKind):
        decode_request(response_frame([7, 0]))
    with pytest.raises(WrongFrameKind):
        decode_response(request_frame([65]))


def test_an_earlier_clients_truncate_body_decodes_as_epoch_0() -> None:
    """`[5, shard, lsn]`, from before Truncate had an epoch (FORMAT.md): still a Truncate,
    at epoch 0, which re-encodes with the epoch."""
    decoded = decode_request(request_frame([5, 3, 11]))
    assert decoded == Truncate(3, 11, 0)
    assert decode_request(through_decoder(encode_request(1, decoded))) == decoded
    assert encode_request(1, decoded) == encode_request(1, Truncate(3, 11))


def test_non_canonical_integers_are_accepted() -> None:
    # 0xcf = uint64: shard 1 written in 9 bytes instead of 1.
    body = b"\x92\x07\xcf" + (1).to_bytes(8, "big")
    assert decode_request(request_frame(body)) == Status(1)


# --- Responses -----------------------------------------------------------------------------

BAD_RESPONSES: list[tuple[Any, str]] = [
    (Appended(0, 1, False), "first_lsn must be in [1,"),
    (Appended(1, 5, False), "count must be in [0, 4]"),
    (ill_typed(Appended, 1, 1, 1), "Appended.duplicate must be a bool, got int"),
    (Records((b"a",), 5, 5), "next_lsn 5 is not first_lsn 5 + 1 records"),
    (Records((), 5, 6), "next_lsn 6 is not first_lsn 5 + 0 records"),
    (Records((b"",) * 5, 1, 6), "5 records, over read_records_max (4)"),
    (Records((b"x" * 8,) * 3, 1, 4), "24 record bytes, over read_bytes_max (16)"),
    (Records((), U64_MAX + 1, U64_MAX + 1), "first_lsn must be in"),
    (TruncatedTo(0), "first_lsn must be in [1,"),
    (LeaseGranted("h", 0), "epoch must be in [1,"),
    (LeaseGranted("h" * 9, 1), "holder is 9 bytes"),
    (ShardStatus(0, "", 0, 1, 1, 0, True), "leader must not be empty"),
    (ShardStatus(0, None, 0, 6, 5, 0, True), "next_lsn must be in [6,"),
    (ill_typed(ShardStatus, 0, None, 0, 1, 1, 0, 1), "ShardStatus.is_leader must be a bool"),
    (ill_typed(ErrorResponse, 5, "int, not ErrorCode"), "code 5 is not an ErrorCode"),
    (ErrorResponse(ErrorCode.INTERNAL, "x" * 33), "message is 33 bytes"),
    (ErrorResponse(ErrorCode.UNAVAILABLE, "", leader_hint="n1"), "leader_hint goes with"),
    (ErrorResponse(ErrorCode.NOT_LEADER, "", leader_hint=""), "leader_hint must not be empty"),
    (ErrorResponse(ErrorCode.TRUNCATED, ""), "TRUNCATED requires first_lsn"),
    (ErrorResponse(ErrorCode.TRUNCATED, "", first_lsn=0), "first_lsn must be in [1,"),
    (ErrorResponse(ErrorCode.BAD_REQUEST, "", first_lsn=3), "first_lsn goes with TRUNCATED"),
    (ErrorResponse(ErrorCode.STALE_EPOCH, "", current_holder="h"), "requires current_epoch"),
    (ErrorResponse(ErrorCode.OVERLOADED, "", current_epoch=1), "go with STALE_EPOCH"),
    (ErrorResponse(ErrorCode.OVERLOADED, "", current_holder="h"), "go with STALE_EPOCH"),
    (Status(1), "not a response: Status"),
]


@pytest.mark.parametrize(("msg", "reason"), BAD_RESPONSES)
def test_encode_response_refuses(msg: Any, reason: str) -> None:
    with pytest.raises(BadResponse, match=re.escape(reason)):
        encode_response(1, msg, SMALL)
    assert isinstance(response_problem(msg, SMALL), BadResponse)


BAD_RESPONSE_BODIES: list[tuple[object, str]] = [
    (b"\xc1", "bad msgpack body"),
    (packed([]), "empty body array"),
    (packed([True]), "tag is a bool"),
    (packed([64]), "unknown response tag 64"),
    (packed([7, 0]), "unknown response tag 7"),  # a request op
    (packed([65, 0]), "Authenticated has 0 fields, got 1"),
    (packed([66, 1, 1, 0]), "Appended.duplicate must be a bool, got int"),
    (packed([67, [b"a"], 1, 1]), "next_lsn 1 is not first_lsn 1 + 1 records"),
    (packed([127, 0, "", None, None, None, None]), "unknown error code 0"),
    (packed([127, 99, "", None, None, None, None]), "unknown error code 99"),
    (packed([127, True, "", None, None, None, None]), "ErrorResponse.code must be an integer"),
    (packed([127, 7, "", None, None, None, None]), "TRUNCATED requires first_lsn"),
    (packed([127, 7, "", None, 3]), "ErrorResponse has 6 fields, got 4"),
    (packed([70, 1, b"n1", 1, 1, 1, 1, True]), "ShardStatus.leader must be a str or nil"),
]


@pytest.mark.parametrize(("body", "reason"), BAD_RESPONSE_BODIES)
def test_decode_response_refuses_bad_bodies(body: object, reason: str) -> None:
    with pytest.raises(BadResponse, match=re.escape(reason)):
        decode_response(response_frame(body), SMALL)


def test_request_id_zero_is_for_error_responses_only() -> None:
    error = ErrorResponse(ErrorCode.BAD_REQUEST, "bad frame magic")
    assert decode_response(through_decoder(encode_response(0, error))) == error
    with pytest.raises(BadResponse, match="reserved for ErrorResponse"):
        encode_response(0, Authenticated())
    with pytest.raises(BadResponse, match="reserved for ErrorResponse"):
        decode_response(response_frame([65], request_id=0))


# --- Limits ----------------------------------------------------------------------------------


def test_default_limits_follow_the_shard_limits() -> None:
    from logsvc.shard.limits import DEFAULT_SHARD_LIMITS as SHARD

    limits = DEFAULT_WIRE_LIMITS
    assert limits.append_records_max == SHARD.records_per_batch_max
    assert limits.record_bytes_max == SHARD.record_bytes_max
    assert limits.append_bytes_max == SHARD.batch_bytes_max
    assert limits.client_id_bytes_max == SHARD.client_id_bytes_max
    assert limits.holder_bytes_max == SHARD.holder_bytes_max


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"append_bytes_max": 16 * MIB}, "append_bytes_max"),
        ({"record_bytes_max": 9 * MIB}, "record_bytes_max"),
        ({"client_id_bytes_max": 257}, "client_id_bytes_max"),
        ({"read_bytes_max": 1 * MIB}, "read_bytes_max"),
        ({"frame_body_bytes_max": 16 * MIB}, "frame_body_bytes_max"),
        ({"frame_body_bytes_max": 2**32}, "frame_body_bytes_max"),
        ({"feed_bytes_max": 0}, "feed_bytes_max"),
        ({"tail_wait_ms_max": True}, "tail_wait_ms_max"),
        ({"record_bytes_max": 2, "append_bytes_max": 1}, "record_bytes_max"),
    ],
)
def test_validate_names_the_broken_limit(changes: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        WireLimits(**changes).validate()


# --- The hot paths accept exactly what the general rules accept ------------------------------

# Values around every edge of an Append's and an Appended's rules under SMALL: types that
# msgpack could also deliver (bool, float, str for bytes, list for tuple), ranges at and
# past their limits, UTF-8 that cannot be encoded.
_any_int = st.one_of(
    st.integers(-2, 3),
    st.integers(U32_MAX - 1, U32_MAX + 1),
    st.integers(U64_MAX - 1, U64_MAX + 1),
    st.booleans(),
    st.floats(0, 3),
)
_any_str = st.one_of(st.text(max_size=4), st.just("\ud800"), st.binary(max_size=4), st.none())
_any_records = st.one_of(
    st.lists(st.one_of(st.binary(max_size=10), st.text(max_size=2)), max_size=6).map(tuple),
    st.lists(st.binary(max_size=4), max_size=2),
    st.none(),
)


@settings(max_examples=2000)
@given(_any_int, _any_records, _any_str, _any_int, _any_int)
def test_the_append_fast_path_accepts_exactly_the_valid_appends(
    shard: Any, records: Any, client_id: Any, seq: Any, epoch: Any
) -> None:
    fast = messages._append_fields_ok(shard, records, client_id, seq, epoch, SMALL)
    general = messages.request_problem(Append(shard, records, client_id, seq, epoch), SMALL)
    assert fast == (general is None), general


@settings(max_examples=1000)
@given(_any_int, _any_int, st.one_of(st.booleans(), st.integers(0, 1), st.none()))
def test_the_appended_fast_path_accepts_exactly_the_valid_answers(
    first_lsn: Any, count: Any, duplicate: Any
) -> None:
    fast = messages._appended_fields_ok(first_lsn, count, duplicate, SMALL)
    general = messages.response_problem(Appended(first_lsn, count, duplicate), SMALL)
    assert fast == (general is None), general


@settings(max_examples=1000)
@given(_any_int, _any_records, _any_str, _any_int, _any_int)
def test_an_append_body_decodes_or_fails_as_the_general_path_says(
    shard: Any, records: Any, client_id: Any, seq: Any, epoch: Any
) -> None:
    try:
        body = msgpack.packb([2, shard, records, client_id, seq, epoch], use_bin_type=True)
    except (OverflowError, UnicodeEncodeError, TypeError):
        assume(False)  # not something a peer could send
    frame = Frame(FrameKind.REQUEST, 1, body)
    general = messages.request_problem(
        Append(shard, tuple(records) if type(records) is list else records, client_id, seq, epoch),
        SMALL,
    )
    if general is None:
        assert decode_request(frame, SMALL) == Append(shard, tuple(records), client_id, seq, epoch)
    else:
        with pytest.raises(BadRequest):
            decode_request(frame, SMALL)


def test_an_append_with_a_float_op_is_not_taken_for_an_append() -> None:
    body = msgpack.packb([2.0, 1, (b"x",), "c", 1, 0], use_bin_type=True)
    with pytest.raises(BadRequest, match="op is a float"):
        decode_request(Frame(FrameKind.REQUEST, 1, body))


def test_encode_appended_is_encode_response_of_appended() -> None:
    assert messages.encode_appended(9, 5, 2, False) == encode_response(9, Appended(5, 2, False))
    with pytest.raises(BadResponse, match="first_lsn"):
        messages.encode_appended(9, 0, 2, False)
