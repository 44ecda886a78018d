"""The wire format matches the checked-in golden vectors and FORMAT.md, byte for byte.

How: encoding fixed messages must give exactly the frames in `golden/` (one per message
kind, and one per ErrorResponse shape); decoding those frames through a `FrameDecoder` must
give the messages back; the header fields sit where FORMAT.md's table says; and the hex
dumps of FORMAT.md's worked examples are the golden bytes. A failure here means the format
changed: bump PROTOCOL_VERSION and add new vectors instead of editing these.

The one compatible change within version 1 so far, Truncate's `epoch` (FORMAT.md): it has a
new vector, `request_truncate_epoch_v1.hex`; the earlier 3-element body,
`request_truncate_v1.hex`, is kept unchanged as a decode-only vector (it must still decode,
to epoch 0, and now re-encodes to the 4-element body).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

import logsvc.wire
from logsvc.wire import (
    AcquireLease,
    Append,
    Appended,
    Authenticate,
    Authenticated,
    ErrorCode,
    ErrorResponse,
    FrameDecoder,
    FrameKind,
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
)
from logsvc.wire.frames import xxh3

GOLDEN = Path(__file__).parent / "golden"
FORMAT_MD = Path(logsvc.wire.__file__).parent / "FORMAT.md"


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text())


REQUEST_VECTORS: list[tuple[str, int, Request]] = [
    ("request_authenticate_v1.hex", 1, Authenticate("s3cret")),
    ("request_append_v1.hex", 1, Append(1, (b"hello", b""), "c1", 7, 2)),
    ("request_read_v1.hex", 2, Read(1, 10, 65_536)),
    ("request_tail_v1.hex", 3, Tail(1, 12, 65_536, 5_000)),
    ("request_truncate_epoch_v1.hex", 4, Truncate(1, 11, 2)),
    ("request_acquire_lease_v1.hex", 5, AcquireLease(1, "tn-1", 3)),
    ("request_status_v1.hex", 6, Status(1)),
]

# Bodies of earlier clients that still decode (FORMAT.md), but are no longer encoded.
DECODE_ONLY_REQUEST_VECTORS: list[tuple[str, int, Request]] = [
    ("request_truncate_v1.hex", 4, Truncate(1, 11, 0)),
]

RESPONSE_VECTORS: list[tuple[str, int, Response]] = [
    ("response_authenticated_v1.hex", 1, Authenticated()),
    ("response_appended_v1.hex", 1, Appended(10, 2, False)),
    ("response_records_v1.hex", 2, Records((b"hello", b""), 10, 12)),
    ("response_records_end_v1.hex", 3, Records((), 12, 12)),
    ("response_truncated_to_v1.hex", 4, TruncatedTo(11)),
    ("response_lease_granted_v1.hex", 5, LeaseGranted("tn-1", 3)),
    (
        "response_shard_status_v1.hex",
        6,
        ShardStatus(1, "127.0.0.1:7001", 4, 11, 12, 57, True),
    ),
    (
        "response_error_not_leader_v1.hex",
        7,
        ErrorResponse(ErrorCode.NOT_LEADER, "not the leader", leader_hint="127.0.0.1:7002"),
    ),
    (
        "response_error_truncated_v1.hex",
        8,
        ErrorResponse(ErrorCode.TRUNCATED, "lsn 3 is truncated", first_lsn=11),
    ),
    (
        "response_error_stale_epoch_v1.hex",
        9,
        ErrorResponse(ErrorCode.STALE_EPOCH, "fenced", current_holder="tn-2", current_epoch=4),
    ),
    (
        "response_error_connection_v1.hex",
        0,
        ErrorResponse(ErrorCode.BAD_REQUEST, "bad frame magic b'GET'"),
    ),
]


def only_frame(data: bytes) -> logsvc.wire.Frame:
    decoder = FrameDecoder()
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame is not None
    assert decoder.next_frame() is None
    assert decoder.buffered_bytes == 0
    return frame


@pytest.mark.parametrize(("name", "request_id", "msg"), REQUEST_VECTORS)
def test_request_vectors(name: str, request_id: int, msg: Request) -> None:
    assert encode_request(request_id, msg) == golden(name)
    frame = only_frame(golden(name))
    assert (frame.kind, frame.request_id) == (FrameKind.REQUEST, request_id)
    assert decode_request(frame) == msg


@pytest.mark.parametrize(("name", "request_id", "msg"), DECODE_ONLY_REQUEST_VECTORS)
def test_decode_only_request_vectors(name: str, request_id: int, msg: Request) -> None:
    frame = only_frame(golden(name))
    assert (frame.kind, frame.request_id) == (FrameKind.REQUEST, request_id)
    assert decode_request(frame) == msg
    assert encode_request(request_id, msg) != golden(name)  # the current form has the epoch


def test_truncate_bodies_are_where_format_md_says() -> None:
    # Earlier clients: array(3), op 5, shard 1, lsn 11. Now: array(4), ..., epoch 2.
    assert golden("request_truncate_v1.hex")[32:] == b"\x93\x05\x01\x0b"
    assert golden("request_truncate_epoch_v1.hex")[32:] == b"\x94\x05\x01\x0b\x02"


@pytest.mark.parametrize(("name", "request_id", "msg"), RESPONSE_VECTORS)
def test_response_vectors(name: str, request_id: int, msg: Response) -> None:
    assert encode_response(request_id, msg) == golden(name)
    frame = only_frame(golden(name))
    assert (frame.kind, frame.request_id) == (FrameKind.RESPONSE, request_id)
    assert decode_response(frame) == msg


def test_every_message_kind_has_a_vector() -> None:
    kinds = {type(msg) for _, _, msg in REQUEST_VECTORS + RESPONSE_VECTORS}
    assert kinds == set(logsvc.wire.messages.REQUEST_OPS) | set(logsvc.wire.messages.RESPONSE_TAGS)
    vectors = REQUEST_VECTORS + DECODE_ONLY_REQUEST_VECTORS + RESPONSE_VECTORS
    listed = {name for name, _, _ in vectors}
    assert listed == {path.name for path in GOLDEN.glob("*.hex")}


def test_header_fields_are_where_format_md_says() -> None:
    data = golden("request_append_v1.hex")
    assert len(data) == 50
    assert data[0:3] == b"LSW"
    assert data[3] == 1  # version
    assert data[4] == 1  # kind: request
    assert data[5:8] == b"\0\0\0"  # reserved
    assert int.from_bytes(data[8:16], "little") == 1  # request id
    assert int.from_bytes(data[16:20], "little") == 18 == len(data) - 32  # body bytes
    assert struct.unpack_from("<Q", data, 20) == (xxh3(data[32:]),) == (0x76E3B16415F98031,)
    assert struct.unpack_from("<I", data, 28) == (xxh3(data[0:28]) & 0xFFFFFFFF,)
    assert data[28:32] == bytes.fromhex("bfa495da")


def test_append_body_is_where_format_md_says() -> None:
    body = golden("request_append_v1.hex")[32:]
    assert body[0] == 0x96  # array(6)
    assert body[1] == 2  # op: Append
    assert body[2] == 1  # shard 1
    assert body[3:13] == b"\x92\xc4\x05hello\xc4\x00"  # array(2): bin(5) "hello", bin(0)
    assert body[13:16] == b"\xa2c1"  # str(2) "c1"
    assert body[16:18] == b"\x07\x02"  # seq 7, epoch 2


def test_appended_body_is_where_format_md_says() -> None:
    data = golden("response_appended_v1.hex")
    assert len(data) == 37
    assert data[4] == 2  # kind: response
    assert data[32:] == b"\x94\x42\x0a\x02\xc2"  # array(4), tag 66, first_lsn 10, count 2, false


def format_md_dumps() -> list[bytes]:
    """The bytes of every hex dump in FORMAT.md ("0000: 4c 53 ..." lines), one per block."""
    dumps: list[bytes] = []
    current: bytearray | None = None
    for line in FORMAT_MD.read_text().splitlines():
        match = re.match(r"^([0-9a-f]{4}): ((?:[0-9a-f]{2} ?)+)", line)
        if match is None:
            if current is not None:
                dumps.append(bytes(current))
                current = None
            continue
        if current is None:
            current = bytearray()
        assert int(match.group(1), 16) == len(current), f"offset of {line!r}"
        current += bytes.fromhex(match.group(2))
    if current is not None:
        dumps.append(bytes(current))
    return dumps


def test_format_md_worked_examples_are_the_golden_bytes() -> None:
    assert format_md_dumps() == [
        golden("request_append_v1.hex"),
        golden("response_appended_v1.hex"),
    ]
