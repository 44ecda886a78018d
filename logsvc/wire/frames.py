"""Frames of the data-plane protocol, and a sans-I/O frame decoder.

Pure code, no I/O (like h11): the connection shell feeds received bytes in and takes whole
frames out. `FORMAT.md` beside this file is the specification.

All integers are little-endian; checksums are XXH3-64, seed 0.

    frame  := header body
    header (32 bytes):
        magic "LSW" | version u8 | kind u8 | reserved 3 zero | request_id u64
        | body_bytes u32 | body_checksum u64 = xxh3_64(body)
        | header_checksum u32 = low 32 bits of xxh3_64(header bytes 0..28)
    body   := body_bytes bytes (a msgpack message, see messages.py)

The decoder checks, in order, as soon as the bytes are there: the magic (on every prefix,
so garbage fails at its first byte), the version (after 4 bytes, so a peer with another
header layout is told "unsupported version", not "checksum mismatch"), then with the whole
header: its checksum, the kind and reserved bytes, and the body length against the limit,
all before any of the body is buffered; with the whole body: its checksum.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple, NoReturn

import xxhash

from logsvc.wire.errors import (
    BadHeader,
    BadMagic,
    BodyChecksumMismatch,
    FrameTooLarge,
    HeaderChecksumMismatch,
    ProtocolError,
    ReceiveBufferFull,
    TruncatedFrame,
    UnsupportedVersion,
)
from logsvc.wire.limits import DEFAULT_WIRE_LIMITS, FRAME_HEADER_BYTES, U64_MAX, WireLimits

# Public names; the errors FrameDecoder raises are re-exported for callers that import this
# module alone (the package `logsvc.wire` exports everything).
__all__ = [
    "FRAME_MAGIC",
    "PROTOCOL_VERSION",
    "BadHeader",
    "BadMagic",
    "BodyChecksumMismatch",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "FrameTooLarge",
    "HeaderChecksumMismatch",
    "ProtocolError",
    "ReceiveBufferFull",
    "TruncatedFrame",
    "UnsupportedVersion",
    "encode_frame",
    "header_checksum",
    "xxh3",
]

FRAME_MAGIC = b"LSW"
PROTOCOL_VERSION = 1

# magic, version, kind, reserved, request_id, body_bytes, body_checksum: the checksummed part.
HEADER_FIELDS = struct.Struct("<3sBB3sQIQ")
HEADER_CHECKSUM = struct.Struct("<I")
assert HEADER_FIELDS.size + HEADER_CHECKSUM.size == FRAME_HEADER_BYTES == 32
_HEADER = struct.Struct("<3sBB3sQIQI")  # the whole header, for the decoder: one unpack
assert _HEADER.size == FRAME_HEADER_BYTES
# Where the version byte is: checked before the rest of the header has arrived.
VERSION_OFFSET = len(FRAME_MAGIC)
_RESERVED = b"\0\0\0"
_MAGIC_AND_VERSION = FRAME_MAGIC + bytes([PROTOCOL_VERSION])
_U32_MASK = 0xFFFF_FFFF


class FrameKind(IntEnum):
    """Kind 0 is reserved and never valid, so a zeroed header never parses."""

    REQUEST = 1
    RESPONSE = 2


_KINDS = {int(kind): kind for kind in FrameKind}


class Frame(NamedTuple):
    """One whole frame whose header and body checksums matched. (A named tuple, not a
    frozen dataclass: every request and answer makes one, and a tuple is built in half the
    time.)"""

    kind: FrameKind
    request_id: int
    body: bytes


# The hot paths call xxhash directly (a wrapper call per checksum is measurable there).
_xxh3_64 = xxhash.xxh3_64_intdigest


def xxh3(data: bytes | bytearray | memoryview) -> int:
    return _xxh3_64(data)


def header_checksum(fields: bytes | bytearray | memoryview) -> int:
    """The header checksum: XXH3-64 of the 28 bytes before it, truncated to its low 32 bits
    (a 2**-32 chance to miss random damage to 28 bytes; TCP's own checksum is weaker)."""
    return xxh3(fields) & _U32_MASK


def encode_frame(
    kind: FrameKind, request_id: int, body: bytes, limits: WireLimits = DEFAULT_WIRE_LIMITS
) -> bytes:
    """header | body. The caller (the message codec) keeps bodies within the limit."""
    assert kind in (FrameKind.REQUEST, FrameKind.RESPONSE)
    assert 0 <= request_id <= U64_MAX
    assert len(body) <= limits.frame_body_bytes_max
    fields = HEADER_FIELDS.pack(
        FRAME_MAGIC, PROTOCOL_VERSION, kind, _RESERVED, request_id, len(body), _xxh3_64(body)
    )
    return b"".join((fields, HEADER_CHECKSUM.pack(_xxh3_64(fields) & _U32_MASK), body))


class _Header(NamedTuple):
    kind: FrameKind
    request_id: int
    body_bytes: int
    body_checksum: int


class FrameDecoder:
    """Bytes in (`feed`), whole frames out (`next_frame`), in order; no I/O.

    Use: after each `feed(data)`, call `next_frame()` until it returns None (more bytes
    needed). Any `ProtocolError` is final: the stream is lost, the connection must be
    closed, and every later call raises the same error again. When the peer closes, call
    `end_of_stream()`: it raises `TruncatedFrame` if a frame was cut short.

    Memory: the buffer never holds more than `limits.receive_buffer_bytes_max` (one whole
    frame plus one feed): `feed` raises `ReceiveBufferFull` rather than grow past it, and a
    header announcing a body over `frame_body_bytes_max` raises `FrameTooLarge` before any
    of that body is buffered.
    """

    __slots__ = ("_buffer", "_error", "_header", "_limits")

    def __init__(self, limits: WireLimits = DEFAULT_WIRE_LIMITS) -> None:
        self._limits = limits
        # Bytes received and not yet returned as frames. `del buffer[:n]` is cheap in
        # CPython (a bytearray moves its start), so consumed frames are dropped at once.
        self._buffer = bytearray()
        self._header: _Header | None = None  # the pending frame's header, once validated
        self._error: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes. Raises `ReceiveBufferFull` (nothing is added) if they would
        take the buffer past its bound."""
        self._raise_if_failed()
        size = len(self._buffer) + len(data)
        if size > self._limits.receive_buffer_bytes_max:
            self._fail(ReceiveBufferFull(size, self._limits.receive_buffer_bytes_max))
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes are fed."""
        self._raise_if_failed()
        header = self._header or self._parse_header()
        if header is None:
            return None
        self._header = header
        end = FRAME_HEADER_BYTES + header.body_bytes
        buffer = self._buffer
        if len(buffer) < end:
            return None
        body = bytes(buffer[FRAME_HEADER_BYTES:end])
        if _xxh3_64(body) != header.body_checksum:
            self._fail(BodyChecksumMismatch(header.request_id))
        del buffer[:end]
        self._header = None
        return Frame(header.kind, header.request_id, body)

    def end_of_stream(self) -> None:
        """The peer closed its side. Raises `TruncatedFrame` if part of a frame is left."""
        self._raise_if_failed()
        if self._buffer:
            self._fail(TruncatedFrame(len(self._buffer)))

    def _parse_header(self) -> _Header | None:
        buffer = self._buffer
        if not buffer.startswith(_MAGIC_AND_VERSION):
            # A short prefix, or a stream that is not ours: these fail or wait for bytes.
            # (A buffer that starts with magic and version, the usual case, passed both.)
            prefix = bytes(buffer[: len(FRAME_MAGIC)])
            if prefix != FRAME_MAGIC[: len(prefix)]:
                self._fail(BadMagic(prefix))
            if len(buffer) <= VERSION_OFFSET:
                return None
            self._fail(UnsupportedVersion(buffer[VERSION_OFFSET]))
        if len(buffer) < FRAME_HEADER_BYTES:
            return None
        _magic, _version, kind, reserved, request_id, body_bytes, body_checksum, checksum = (
            _HEADER.unpack_from(buffer)
        )
        if checksum != _xxh3_64(bytes(buffer[: HEADER_FIELDS.size])) & _U32_MASK:
            self._fail(HeaderChecksumMismatch())
        frame_kind = _KINDS.get(kind)
        if frame_kind is None:
            self._fail(BadHeader(f"frame kind {kind}"))
        if reserved != _RESERVED:
            self._fail(BadHeader(f"reserved bytes {reserved.hex()} are not zero"))
        if body_bytes > self._limits.frame_body_bytes_max:
            self._fail(FrameTooLarge(body_bytes, self._limits.frame_body_bytes_max, request_id))
        return _Header(frame_kind, request_id, body_bytes, body_checksum)

    def _fail(self, error: ProtocolError) -> NoReturn:
        """Record `error` as final (every later call raises it again) and raise it."""
        self._error = error
        self._buffer.clear()  # nothing more will be parsed: release the memory now
        self._header = None
        raise error

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
