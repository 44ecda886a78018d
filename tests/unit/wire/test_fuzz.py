"""Arbitrary bytes never make the codec raise anything but its typed errors, hang, or hold more
memory than its bound.

How: hypothesis feeds (1) arbitrary bytes, in arbitrary chunks, to a `FrameDecoder`; (2)
bytes that start like a frame (the magic and version, or a whole header with a valid
checksum) so the fuzzing reaches past the first checks; (3) arbitrary bodies, inside valid
frames, to `decode_request` and `decode_response`; (4) msgpack arrays of random values with
a plausible op or tag, to reach the field checks. Only `ProtocolError` (from frames) or
`MessageError` (from bodies) may escape; the buffer never exceeds
`receive_buffer_bytes_max`; whatever decodes re-encodes to a frame that decodes the same.
Each example is small and the decoder does a bounded amount of work per byte, so "no hang"
is covered by the suite's timeout.
"""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsvc.wire import (
    BadRequest,
    BadResponse,
    Frame,
    FrameDecoder,
    FrameKind,
    ProtocolError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from logsvc.wire.frames import HEADER_CHECKSUM, HEADER_FIELDS, header_checksum, xxh3
from logsvc.wire.messages import REQUEST_OPS, RESPONSE_TAGS

from .strategies import SMALL

pytestmark = pytest.mark.timeout(60)

_feeds = st.lists(st.binary(max_size=200), max_size=12)


def feed_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[Frame]:
    """Feed and drain like a shell; stop at the first protocol error (the decoder is spent)."""
    frames: list[Frame] = []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            assert decoder.buffered_bytes <= SMALL.receive_buffer_bytes_max
            while (frame := decoder.next_frame()) is not None:
                frames.append(frame)
        decoder.end_of_stream()
    except ProtocolError:
        assert decoder.buffered_bytes == 0
    return frames


@settings(max_examples=400, deadline=None)
@given(_feeds)
def test_arbitrary_bytes_into_the_decoder(chunks: list[bytes]) -> None:
    feed_all(FrameDecoder(SMALL), chunks)


@settings(max_examples=400, deadline=None)
@given(_feeds)
def test_bytes_after_a_good_magic_and_version(chunks: list[bytes]) -> None:
    feed_all(FrameDecoder(SMALL), [b"LSW\x01", *chunks])


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 255),
    st.binary(min_size=3, max_size=3),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1) | st.integers(0, 300),
    st.booleans(),
    _feeds,
)
def test_checksummed_headers_with_arbitrary_fields(
    kind: int,
    reserved: bytes,
    request_id: int,
    body_bytes: int,
    good_body_checksum: bool,
    chunks: list[bytes],
) -> None:
    body = b"".join(chunks)[:body_bytes]
    checksum = xxh3(body) if good_body_checksum else 0
    fields = HEADER_FIELDS.pack(b"LSW", 1, kind, reserved, request_id, body_bytes, checksum)
    data = fields + HEADER_CHECKSUM.pack(header_checksum(fields)) + body
    frames = feed_all(FrameDecoder(SMALL), [data[i : i + 50] for i in range(0, len(data), 50)])
    for frame in frames:
        assert frame.body == body


def decode_and_reencode(frame: Frame) -> None:
    """Decode `frame` both ways; whatever decodes must re-encode to the same message."""
    try:
        request = decode_request(frame, SMALL)
    except BadRequest:
        pass
    else:
        again = encode_request(frame.request_id, request, SMALL)
        assert decode_request(Frame(FrameKind.REQUEST, frame.request_id, again[32:]), SMALL) == (
            request
        )
    response_frame = Frame(FrameKind.RESPONSE, frame.request_id, frame.body)
    try:
        response = decode_response(response_frame, SMALL)
    except BadResponse:
        return
    again = encode_response(frame.request_id, response, SMALL)
    assert decode_response(Frame(FrameKind.RESPONSE, frame.request_id, again[32:]), SMALL) == (
        response
    )


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 3))
def test_arbitrary_bodies(body: bytes, request_id: int) -> None:
    decode_and_reencode(Frame(FrameKind.REQUEST, request_id, body))


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.integers(-2, 20)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=12)
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=8)
_codes = st.sampled_from(sorted({0, 8, 64, 99, *REQUEST_OPS.values(), *RESPONSE_TAGS.values()}))

# Per declared field type: values near and across its edges, and now and then any value.
_near = st.integers(-1, 18) | st.sampled_from([2**32 - 1, 2**32, 2**64 - 1, 1000, 1001])
_text = st.text(max_size=10) | st.just("x" * 33)
_records = st.lists(st.binary(max_size=10), max_size=6)
_BY_TYPE: dict[str, st.SearchStrategy[object]] = {
    "int": _near,
    "str": _text,
    "bool": st.booleans(),
    "tuple[bytes, ...]": _records,
    "str | None": st.none() | _text,
    "int | None": st.none() | _near,
    "ErrorCode": st.integers(0, 16),
}


_CODES: dict[type, int] = {**REQUEST_OPS, **RESPONSE_TAGS}


@st.composite
def shaped_bodies(draw: st.DrawFn) -> list[object]:
    """[op or tag, fields...] shaped like a real message, most fields plausible."""
    cls = draw(st.sampled_from(sorted(_CODES, key=_CODES.__getitem__)))
    fields: list[object] = []
    for field in dataclasses.fields(cls):
        plausible = _BY_TYPE[str(field.type)]
        anything = draw(st.booleans())
        fields.append(draw(plausible | _values if anything else plausible))
    if draw(st.integers(0, 9)) == 0:  # now and then, one field too many or too few
        drop = draw(st.booleans())
        fields = fields[:-1] if fields and drop else [*fields, 0]
    return [_CODES[cls], *fields]


@settings(max_examples=600, deadline=None)
@given(_codes, st.lists(_values, max_size=7), st.integers(0, 2))
def test_random_arrays(code: int, fields: list[object], request_id: int) -> None:
    body = msgpack.packb([code, *fields], use_bin_type=True)
    assert isinstance(body, bytes)
    decode_and_reencode(Frame(FrameKind.REQUEST, request_id, body))


@settings(max_examples=1500, deadline=None)
@given(shaped_bodies(), st.integers(0, 2))
def test_shaped_bodies(body: list[object], request_id: int) -> None:
    packed = msgpack.packb(body, use_bin_type=True)
    assert isinstance(packed, bytes)
    decode_and_reencode(Frame(FrameKind.REQUEST, request_id, packed))
