"""Error codes of the data-plane protocol, and the errors of its codec.

Two kinds of codec error, kept apart like h11's local and remote protocol errors:

* `ProtocolError`: the byte stream cannot be trusted any more (framing is lost, or the peer
  speaks something else). The connection must be closed; the decoder refuses to go on.
* `MessageError`: one whole, checksummed frame whose body is not a valid message. Framing is
  intact, so the connection survives: a server answers that request with an
  `ErrorResponse(exc.code, exc.reason)` and keeps serving.

The tree:

    WireError
    ├── ProtocolError                          close the connection
    │   ├── BadMagic(magic)                    not our protocol
    │   ├── UnsupportedVersion(version)        another protocol version
    │   ├── HeaderChecksumMismatch             a damaged header
    │   ├── BadHeader(reason)                  checksummed header with an invalid kind or
    │   │                                      non-zero reserved bytes
    │   ├── FrameTooLarge(size, limit,         body length over `frame_body_bytes_max`,
    │   │                 request_id)          refused before the body is buffered
    │   ├── BodyChecksumMismatch(request_id)   a damaged body
    │   ├── ReceiveBufferFull(size, limit)     fed more than the decoder may buffer
    │   ├── TruncatedFrame(buffered_bytes)     the stream ended inside a frame
    │   └── WrongFrameKind(expected, got)      a request where a response belongs, or back
    └── MessageError(reason)                   reply (or fail this request), keep serving
        ├── BadRequest(reason)                 code BAD_REQUEST: missing/ill-typed field,
        │   │                                  value out of range
        │   ├── UnknownOp(op)                  code UNKNOWN_OP
        │   └── RequestTooLarge(what, size,    code TOO_LARGE: an Append over a record or
        │                       limit)         batch limit
        └── BadResponse(reason)                a response the client cannot decode: fail
                                               the request it answers
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """The `code` of an `ErrorResponse`. 0 is reserved and never valid (a zeroed field never
    decodes). Adding a code is a format change: it bumps the protocol version."""

    UNAUTHENTICATED = 1  # no Authenticate yet on this connection, or a wrong token
    BAD_REQUEST = 2  # missing/ill-typed field or value out of range
    UNKNOWN_OP = 3  # an op code this server does not know
    UNKNOWN_SHARD = 4  # this node hosts no such shard
    TOO_LARGE = 5  # a record, a batch, or the frame itself is over its limit
    NOT_LEADER = 6  # a write (or a tail-consistent read) sent to a follower; see leader_hint
    TRUNCATED = 7  # a read below the truncation point; see first_lsn
    STALE_EPOCH = 8  # fenced: the lease moved on; see current_holder / current_epoch
    NOT_LEASE_HOLDER = 9  # the epoch is above the current lease: acquire it first
    DUPLICATE_UNKNOWN = 10  # seq older than anything remembered for the client
    OVERLOADED = 11  # a bounded queue is full: back off and retry
    OUTCOME_UNKNOWN = 12  # the write may or may not have committed: retry with the same seq
    UNAVAILABLE = 13  # replica failed, or the shard has no leader: retry later
    INTERNAL = 14  # a bug in the server


class WireError(Exception):
    """Base of every error raised by the data-plane codec."""


# --- Protocol errors: close the connection -------------------------------------------------


class ProtocolError(WireError):
    """The stream can no longer be parsed: close the connection."""


class BadMagic(ProtocolError):
    def __init__(self, magic: bytes) -> None:
        super().__init__(f"bad frame magic {magic!r}")
        self.magic = magic


class UnsupportedVersion(ProtocolError):
    def __init__(self, version: int) -> None:
        super().__init__(f"unsupported protocol version {version}")
        self.version = version


class HeaderChecksumMismatch(ProtocolError):
    def __init__(self) -> None:
        super().__init__("frame header checksum mismatch")


class BadHeader(ProtocolError):
    """A header whose checksum matched but whose fields are invalid (frame kind 0 or
    unknown, reserved bytes not zero): a bug in the peer, not line noise."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad frame header: {reason}")
        self.reason = reason


class FrameTooLarge(ProtocolError):
    """The header announces a body over the limit. Raised from the header alone, before any
    of the body is buffered. The header was whole, so `request_id` is known: a server may
    answer `TOO_LARGE` for it before closing."""

    def __init__(self, size: int, limit: int, request_id: int = 0) -> None:
        super().__init__(f"frame body of {size} bytes is over the limit of {limit}")
        self.size = size
        self.limit = limit
        self.request_id = request_id


class BodyChecksumMismatch(ProtocolError):
    def __init__(self, request_id: int) -> None:
        super().__init__(f"frame body checksum mismatch (request id {request_id})")
        self.request_id = request_id


class ReceiveBufferFull(ProtocolError):
    """`feed()` would take the buffer past `receive_buffer_bytes_max`. A shell that calls
    `next_frame()` until None after each feed, and feeds at most `feed_bytes_max` at a
    time, never sees this."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"receive buffer would hold {size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit


class TruncatedFrame(ProtocolError):
    """The stream ended (`end_of_stream()`) with part of a frame buffered."""

    def __init__(self, buffered_bytes: int) -> None:
        super().__init__(f"stream ended inside a frame ({buffered_bytes} bytes buffered)")
        self.buffered_bytes = buffered_bytes


class WrongFrameKind(ProtocolError):
    """A response frame given to `decode_request`, or a request to `decode_response`: the
    peer is confused about which end it is."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected a frame of kind {expected}, got kind {got}")
        self.expected = expected
        self.got = got


# --- Message errors: the connection survives -----------------------------------------------


class MessageError(WireError):
    """A whole frame whose body is not a valid message; the connection survives."""

    code = ErrorCode.BAD_REQUEST

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BadRequest(MessageError):
    """A request body with a missing or ill-typed field, or a value out of range. Also
    raised by `encode_request` for a request that may not be sent. Answer with
    `ErrorResponse(exc.code, exc.reason)`."""

    code = ErrorCode.BAD_REQUEST


class UnknownOp(BadRequest):
    code = ErrorCode.UNKNOWN_OP

    def __init__(self, op: int) -> None:
        super().__init__(f"unknown op {op}")
        self.op = op


class RequestTooLarge(BadRequest):
    """An Append over a limit; `what` names it (`record_bytes_max`, `append_bytes_max`,
    `append_records_max`). The client should split the batch."""

    code = ErrorCode.TOO_LARGE

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"request too large: {size} exceeds {what} ({limit})")
        self.what = what
        self.size = size
        self.limit = limit


class BadResponse(MessageError):
    """A response body the client cannot decode (or one `encode_response` refuses). The
    client fails the request with this id; other requests are unaffected."""

    code = ErrorCode.INTERNAL
