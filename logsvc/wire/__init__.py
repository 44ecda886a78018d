"""The data-plane protocol as a pure codec (sans-I/O, like h11): frames and messages.

`FORMAT.md` beside this file is the byte-exact specification. A connection shell does:

    decoder = FrameDecoder()
    decoder.feed(received_bytes)
    while (frame := decoder.next_frame()) is not None:
        request = decode_request(frame)   # server; a client calls decode_response
        ...
        transport.write(encode_response(frame.request_id, response))

`ProtocolError` from the decoder (or `WrongFrameKind` from decode_*) means the stream is
lost: close the connection. `MessageError` (`BadRequest`, `UnknownOp`, `RequestTooLarge`,
`BadResponse`) concerns one frame only: answer or fail that request and go on. The exception
tree is drawn in `errors.py`.
"""

from __future__ import annotations

from logsvc.wire.errors import (
    BadHeader,
    BadMagic,
    BadRequest,
    BadResponse,
    BodyChecksumMismatch,
    ErrorCode,
    FrameTooLarge,
    HeaderChecksumMismatch,
    MessageError,
    ProtocolError,
    ReceiveBufferFull,
    RequestTooLarge,
    TruncatedFrame,
    UnknownOp,
    UnsupportedVersion,
    WireError,
    WrongFrameKind,
)
from logsvc.wire.frames import (
    FRAME_MAGIC,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameKind,
    encode_frame,
)
from logsvc.wire.limits import DEFAULT_WIRE_LIMITS, FRAME_HEADER_BYTES, WireLimits
from logsvc.wire.messages import (
    AcquireLease,
    Append,
    Appended,
    Authenticate,
    Authenticated,
    ErrorResponse,
    LeaseGranted,
    Read,
    Records,
    Request,
    Response,
    ShardStatus,
    Status,
    Tail,
    Truncate,
    TruncatedTo,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    request_problem,
    response_problem,
)

__all__ = [
    "DEFAULT_WIRE_LIMITS",
    "FRAME_HEADER_BYTES",
    "FRAME_MAGIC",
    "PROTOCOL_VERSION",
    "AcquireLease",
    "Append",
    "Appended",
    "Authenticate",
    "Authenticated",
    "BadHeader",
    "BadMagic",
    "BadRequest",
    "BadResponse",
    "BodyChecksumMismatch",
    "ErrorCode",
    "ErrorResponse",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "FrameTooLarge",
    "HeaderChecksumMismatch",
    "LeaseGranted",
    "MessageError",
    "ProtocolError",
    "Read",
    "ReceiveBufferFull",
    "Records",
    "Request",
    "RequestTooLarge",
    "Response",
    "ShardStatus",
    "Status",
    "Tail",
    "Truncate",
    "TruncatedFrame",
    "TruncatedTo",
    "UnknownOp",
    "UnsupportedVersion",
    "WireError",
    "WireLimits",
    "WrongFrameKind",
    "decode_request",
    "decode_response",
    "encode_frame",
    "encode_request",
    "encode_response",
    "request_problem",
    "response_problem",
]
