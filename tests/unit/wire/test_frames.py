"""The frame decoder returns exactly the frames that were encoded, however the bytes arrive,
and reports every damaged, oversized or foreign stream as a typed `ProtocolError`.

How: a stream of frames is fed whole, byte by byte, and in hypothesis-chosen chunk sizes,
and must give the same frames; a real frame is truncated at every length and has every
byte flipped, and each position must give the error FORMAT.md's table names for it;
headers with a valid checksum but a bad version, kind, reserved bytes or oversized length
are built by hand (the oversized one is fed alone: `FrameTooLarge` must come from the
header, before any body); the receive-buffer bound and the "spent after an error" rule are
checked with small limits. No sockets.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsvc.wire import (
    DEFAULT_WIRE_LIMITS,
    FRAME_HEADER_BYTES,
    BadHeader,
    BadMagic,
    BodyChecksumMismatch,
    Frame,
    FrameDecoder,
    FrameKind,
    FrameTooLarge,
    HeaderChecksumMismatch,
    ProtocolError,
    ReceiveBufferFull,
    TruncatedFrame,
    UnsupportedVersion,
    encode_frame,
)
from logsvc.wire.frames import HEADER_CHECKSUM, HEADER_FIELDS, header_checksum, xxh3

from .strategies import SMALL

FRAMES = [
    Frame(FrameKind.REQUEST, 1, b"\x91\x07"),
    Frame(FrameKind.RESPONSE, 1, b""),
    Frame(FrameKind.REQUEST, 2**64 - 1, bytes(range(256)) * 3),
    Frame(FrameKind.RESPONSE, 0, b"LSW\x01" * 10),  # body bytes that look like a header
]
STREAM = b"".join(encode_frame(f.kind, f.request_id, f.body) for f in FRAMES)
ONE = encode_frame(FrameKind.REQUEST, 7, b"\x92\x07\xa5hello")


def header(
    *,
    body_bytes: int,
    body_checksum: int = 0,
    version: int = 1,
    kind: int = 1,
    reserved: bytes = b"\0\0\0",
    request_id: int = 9,
    magic: bytes = b"LSW",
) -> bytes:
    """A 32-byte header with a correct header checksum over any field values."""
    fields = HEADER_FIELDS.pack(
        magic, version, kind, reserved, request_id, body_bytes, body_checksum
    )
    return fields + HEADER_CHECKSUM.pack(header_checksum(fields))


def drain(decoder: FrameDecoder) -> list[Frame]:
    frames = []
    while (frame := decoder.next_frame()) is not None:
        frames.append(frame)
    return frames


def decode_in_chunks(data: bytes, cuts: list[int]) -> list[Frame]:
    decoder = FrameDecoder()
    frames: list[Frame] = []
    lo = 0
    for hi in [*sorted(cuts), len(data)]:
        decoder.feed(data[lo:hi])
        frames += drain(decoder)
        lo = hi
    decoder.end_of_stream()
    assert decoder.buffered_bytes == 0
    return frames


# --- Whole streams, however they arrive ------------------------------------------------------


def test_whole_stream() -> None:
    assert decode_in_chunks(STREAM, []) == FRAMES


def test_byte_by_byte() -> None:
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for position in range(len(STREAM)):
        decoder.feed(STREAM[position : position + 1])
        frames += drain(decoder)
    assert frames == FRAMES
    decoder.end_of_stream()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=40))
def test_random_chunks_give_the_same_frames(cuts: list[int]) -> None:
    assert decode_in_chunks(STREAM, cuts) == FRAMES


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.builds(
            Frame,
            st.sampled_from(FrameKind),
            st.integers(0, 2**64 - 1),
            st.binary(max_size=300),
        ),
        max_size=6,
    ),
    st.data(),
)
def test_any_frames_in_any_chunks(frames: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(f.kind, f.request_id, f.body) for f in frames)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    assert decode_in_chunks(stream, cuts) == frames


def test_memoryview_and_bytearray_feeds() -> None:
    decoder = FrameDecoder()
    decoder.feed(memoryview(STREAM)[:10])
    decoder.feed(bytearray(STREAM[10:]))
    assert drain(decoder) == FRAMES


def test_out_of_order_request_ids_are_passed_through() -> None:
    stream = b"".join(encode_frame(FrameKind.RESPONSE, rid, b"\x90") for rid in (3, 1, 2))
    assert [f.request_id for f in decode_in_chunks(stream, [])] == [3, 1, 2]


# --- Corruption of a real frame ----------------------------------------------------------------


@pytest.mark.parametrize("length", range(len(ONE)))
def test_truncated_frame_waits_then_reports_at_end_of_stream(length: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(ONE[:length])
    assert decoder.next_frame() is None
    if length == 0:
        decoder.end_of_stream()  # a clean close between frames
        return
    with pytest.raises(TruncatedFrame) as caught:
        decoder.end_of_stream()
    assert caught.value.buffered_bytes == length


def expected_error(position: int) -> type[ProtocolError]:
    """FORMAT.md's table: which error a damaged byte at `position` gives."""
    if position < 3:
        return BadMagic
    if position == 3:
        return UnsupportedVersion
    if position < FRAME_HEADER_BYTES:
        return HeaderChecksumMismatch  # kind, reserved, request id, length, checksums
    return BodyChecksumMismatch


@pytest.mark.parametrize("flip", [0x01, 0x80, 0xFF])
@pytest.mark.parametrize("position", range(len(ONE)))
def test_flipped_byte_is_reported_where_it_is(position: int, flip: int) -> None:
    damaged = bytearray(ONE)
    damaged[position] ^= flip
    decoder = FrameDecoder()
    decoder.feed(bytes(damaged))
    with pytest.raises(expected_error(position)):
        decoder.next_frame()


def test_flipped_length_byte_is_a_header_checksum_mismatch_without_waiting() -> None:
    damaged = bytearray(ONE)
    damaged[16] ^= 0x40  # body_bytes + 64: without the header checksum it would wait
    decoder = FrameDecoder()
    decoder.feed(bytes(damaged[:FRAME_HEADER_BYTES]))
    with pytest.raises(HeaderChecksumMismatch):
        decoder.next_frame()


def test_body_checksum_mismatch_names_the_request() -> None:
    damaged = ONE[:-1] + bytes([ONE[-1] ^ 1])
    decoder = FrameDecoder()
    decoder.feed(damaged)
    with pytest.raises(BodyChecksumMismatch) as caught:
        decoder.next_frame()
    assert caught.value.request_id == 7


def test_oversize_length_is_refused_from_the_header_alone() -> None:
    limit = DEFAULT_WIRE_LIMITS.frame_body_bytes_max
    decoder = FrameDecoder()
    decoder.feed(header(body_bytes=limit + 1, request_id=42))
    with pytest.raises(FrameTooLarge) as caught:
        decoder.next_frame()
    assert (caught.value.size, caught.value.limit, caught.value.request_id) == (
        limit + 1,
        limit,
        42,
    )
    assert decoder.buffered_bytes == 0  # released, and never asked for the body


def test_largest_u32_length_is_refused_from_the_header_alone() -> None:
    decoder = FrameDecoder(SMALL)
    decoder.feed(header(body_bytes=2**32 - 1))
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


def test_length_at_the_limit_is_accepted() -> None:
    body = b"\xc0" * SMALL.frame_body_bytes_max
    decoder = FrameDecoder(SMALL)
    decoder.feed(encode_frame(FrameKind.REQUEST, 1, body, SMALL))
    frame = decoder.next_frame()
    assert frame is not None
    assert frame.body == body


@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_version_is_reported_after_four_bytes(version: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(b"LSW" + bytes([version]))
    with pytest.raises(UnsupportedVersion) as caught:
        decoder.next_frame()
    assert caught.value.version == version


def test_unknown_version_with_a_valid_header_checksum() -> None:
    decoder = FrameDecoder()
    decoder.feed(header(body_bytes=0, version=2))
    with pytest.raises(UnsupportedVersion):
        decoder.next_frame()


@pytest.mark.parametrize("kind", [0, 3, 255])
def test_invalid_kind_with_a_valid_header_checksum(kind: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(header(body_bytes=0, kind=kind))
    with pytest.raises(BadHeader, match=f"frame kind {kind}"):
        decoder.next_frame()


def test_nonzero_reserved_bytes_with_a_valid_header_checksum() -> None:
    decoder = FrameDecoder()
    decoder.feed(header(body_bytes=0, reserved=b"\0\1\0"))
    with pytest.raises(BadHeader, match="reserved"):
        decoder.next_frame()


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00",  # a TLS ClientHello
        bytes(64),  # zeros
        b"L",  # a good prefix, then ...
        b"LS\0",
    ],
)
def test_garbage_is_a_bad_magic(garbage: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(garbage)
    if garbage == b"L":
        assert decoder.next_frame() is None  # still a prefix of the magic
        decoder.feed(b"X")
    with pytest.raises(BadMagic):
        decoder.next_frame()


def test_zeroed_header_after_a_good_frame() -> None:
    decoder = FrameDecoder()
    decoder.feed(ONE + bytes(FRAME_HEADER_BYTES))
    assert decoder.next_frame() is not None
    with pytest.raises(BadMagic):
        decoder.next_frame()


def test_magic_checked_before_the_rest_of_the_header() -> None:
    decoder = FrameDecoder()
    decoder.feed(header(body_bytes=0, magic=b"LSX"))
    with pytest.raises(BadMagic) as caught:
        decoder.next_frame()
    assert caught.value.magic == b"LSX"


# --- The decoder after an error, and its buffer bound ---------------------------------------


def test_an_error_is_final() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"XYZ")
    with pytest.raises(BadMagic) as first:
        decoder.next_frame()
    with pytest.raises(BadMagic) as again:
        decoder.next_frame()
    assert again.value is first.value
    with pytest.raises(BadMagic):
        decoder.feed(ONE)
    with pytest.raises(BadMagic):
        decoder.end_of_stream()
    assert decoder.buffered_bytes == 0


def test_feeding_past_the_buffer_bound_is_refused() -> None:
    bound = SMALL.receive_buffer_bytes_max
    assert bound == FRAME_HEADER_BYTES + SMALL.frame_body_bytes_max + SMALL.feed_bytes_max
    decoder = FrameDecoder(SMALL)
    decoder.feed(header(body_bytes=SMALL.frame_body_bytes_max))  # waits for a full body
    decoder.feed(bytes(bound - FRAME_HEADER_BYTES))  # exactly at the bound: accepted
    assert decoder.buffered_bytes == bound
    with pytest.raises(ReceiveBufferFull) as caught:
        decoder.feed(b"x")
    assert (caught.value.size, caught.value.limit) == (bound + 1, bound)
    assert decoder.buffered_bytes == 0


def test_a_draining_shell_never_reaches_the_buffer_bound() -> None:
    body = b"\xc0" * SMALL.frame_body_bytes_max
    stream = encode_frame(FrameKind.REQUEST, 1, body, SMALL) * 20
    decoder = FrameDecoder(SMALL)
    count = 0
    for lo in range(0, len(stream), SMALL.feed_bytes_max):
        decoder.feed(stream[lo : lo + SMALL.feed_bytes_max])
        assert decoder.buffered_bytes <= SMALL.receive_buffer_bytes_max
        count += len(drain(decoder))
    assert count == 20


def test_checksums_cover_what_format_md_says() -> None:
    data = ONE
    assert int.from_bytes(data[20:28], "little") == xxh3(data[FRAME_HEADER_BYTES:])
    assert int.from_bytes(data[28:32], "little") == xxh3(data[:28]) & 0xFFFF_FFFF
