"""Small metadata files (small_file.py): the bytes round-trip, every kind of damage is a
typed `SmallFileCorrupt` (never a default), and a replacement is atomic and durable.

How: encode a document and read it back; damage the bytes one way at a time (cut, wrong
magic / version / reserved field, a length past the end or short of it, a flipped bit in
the header, the checksum or the body, a body that is not a JSON object) and assert the
reason; then replace a file on `FaultFS` in trace mode and enumerate every state a power
loss could leave (also torn writes): each holds exactly the old or the new document.
"""

from __future__ import annotations

import json
import random
import struct

import pytest

from logsvc.shard import small_file
from logsvc.shard.small_file import SmallFileCorrupt
from tests.support.faultfs import FaultFS

MAGIC = b"LSVCTEST"
DOC = {"node": "n1", "shards": [1, 2, 3]}


def test_round_trip_and_layout() -> None:
    data = small_file.encode(MAGIC, 3, DOC)
    assert small_file.decode("f", data, MAGIC, 3) == DOC
    assert data[:8] == MAGIC
    assert struct.unpack_from("<HHI", data, 8) == (3, 0, len(data) - small_file.HEADER_BYTES)
    assert json.loads(data[small_file.HEADER_BYTES :]) == DOC


def test_golden_bytes() -> None:
    """The layout of FORMAT.md, byte for byte (a change here is a format change)."""
    data = small_file.encode(b"LSVCMEMB", 1, {"a": 1})
    assert data.hex() == (
        "4c5356434d454d42"  # magic
        "0100"  # version 1
        "0000"  # reserved
        "07000000"  # body length 7
        "c9533618954986e9" + b'{"a":1}'.hex()  # xxh3_64 of bytes [0, 16) + body, little-endian
    )
    assert small_file.decode("f", data, b"LSVCMEMB", 1) == {"a": 1}


def damaged(data: bytes, offset: int, value: int) -> bytes:
    out = bytearray(data)
    out[offset] = value
    return bytes(out)


def rechecked(prefix_and_body: bytes) -> bytes:
    """The bytes with a valid checksum for whatever header and body they hold."""
    header, body = prefix_and_body[:16], prefix_and_body[small_file.HEADER_BYTES :]
    return header + struct.pack("<Q", small_file._checksum(header, body)) + body


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: d[:10], "shorter than the header"),
        (lambda d: b"", "shorter than the header"),
        (lambda d: b"XXXXXXXX" + d[8:], "magic"),
        (lambda d: damaged(d, 8, 2), "version 2"),
        (lambda d: damaged(d, 10, 1), "reserved"),
        (lambda d: d + b"x", "body length"),
        (lambda d: d[:-1], "body length"),
        (lambda d: damaged(d, 12, 0xFF), "body length"),
        (lambda d: damaged(d, 17, d[17] ^ 1), "checksum"),
        (lambda d: damaged(d, len(d) - 2, d[-2] ^ 4), "checksum"),
        (lambda d: rechecked(d[:12] + struct.pack("<I", 3) + d[16:24] + b"[1]"), "object"),
        (lambda d: rechecked(d[:12] + struct.pack("<I", 3) + d[16:24] + b"{x}"), "not JSON"),
        (lambda d: rechecked(d[:12] + struct.pack("<I", 2) + d[16:24] + b"\xff\xfe"), "JSON"),
    ],
)
def test_damage_is_a_typed_error(make: object, reason: str) -> None:
    data = small_file.encode(MAGIC, 1, DOC)
    assert callable(make)
    with pytest.raises(SmallFileCorrupt, match=reason) as caught:
        small_file.decode("/data/placement", make(data), MAGIC, 1)
    assert caught.value.path == "/data/placement"


def test_every_single_bit_flip_is_detected() -> None:
    data = small_file.encode(MAGIC, 1, DOC)
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SmallFileCorrupt):
            small_file.decode("f", bytes(flipped), MAGIC, 1)


def test_read_missing_is_none_and_write_replaces() -> None:
    fs = FaultFS()
    fs.makedirs("/d")
    assert small_file.read(fs, "/d/f", MAGIC, 1) is None
    small_file.write_durably(fs, "/d/f", small_file.encode(MAGIC, 1, {"v": 1}))
    small_file.write_durably(fs, "/d/f", small_file.encode(MAGIC, 1, {"v": 2}))
    assert small_file.read(fs, "/d/f", MAGIC, 1) == {"v": 2}
    assert fs.listdir("/d") == ["f"]  # no temp file left behind


def test_a_stale_temp_file_is_ignored_and_replaced() -> None:
    fs = FaultFS()
    fs.makedirs("/d")
    handle = fs.open_write("/d/f.tmp", create=True)
    handle.write(b"half a file from a crash")
    handle.close()
    small_file.write_durably(fs, "/d/f", small_file.encode(MAGIC, 1, {"v": 1}))
    assert small_file.read(fs, "/d/f", MAGIC, 1) == {"v": 1}
    assert fs.listdir("/d") == ["f"]


def test_written_is_durable() -> None:
    fs = FaultFS()
    fs.makedirs("/d")
    small_file.write_durably(fs, "/d/f", small_file.encode(MAGIC, 1, {"v": 1}))
    fs.power_loss("trunc", random.Random(1))
    assert small_file.read(fs, "/d/f", MAGIC, 1) == {"v": 1}


@pytest.mark.parametrize("first", [True, False])
def test_a_power_loss_at_any_point_leaves_the_old_or_the_new_file(first: bool) -> None:
    fs = FaultFS()
    fs.makedirs("/d")
    old = None if first else {"v": "old"}
    if old is not None:
        small_file.write_durably(fs, "/d/f", small_file.encode(MAGIC, 1, old))
    fs.start_trace()
    new = {"v": "new", "padding": "x" * 300}
    small_file.write_durably(fs, "/d/f", small_file.encode(MAGIC, 1, new))
    seen = []
    for state in fs.crash_states(random.Random(7), torn_variants=4, names=("revert", "keep")):
        found = small_file.read(state, "/d/f", MAGIC, 1)  # never SmallFileCorrupt
        assert found in (old, new)
        seen.append(found)
    assert old in seen and new in seen  # both outcomes are reachable
