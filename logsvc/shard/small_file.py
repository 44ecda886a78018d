"""Small metadata files: checksummed, versioned, replaced atomically and durably.

Two files use this: a shard replica's membership file (membership.py) and a node's
placement file (logsvc/node/placement.py). Each is a few hundred bytes to a few KiB, read
once at start and rewritten whole on a (rare) change.

Layout (little-endian), documented with the other shard formats in FORMAT.md:

    offset  size  field
    0       8     magic       one per kind of file (b"LSVCMEMB", b"LSVCPLAC")
    8       2     version     u16, of the body's schema (each kind has its own)
    10      2     reserved    u16, 0
    12      4     body_len    u32, at most BODY_BYTES_MAX
    16      8     checksum    u64, xxh3_64 of bytes [0, 16) followed by the body
    24      ...   body        body_len bytes of UTF-8 JSON: one object

Anything else (short, wrong magic, unknown version, a length past the end, trailing
bytes, a checksum mismatch, a body that is not a JSON object) is `SmallFileCorrupt`,
never a default: these files say which shards a node hosts and with whom, and guessing
would let a node rejoin a shard it left, or start one with the wrong peers.

Replacing (`write_durably`): write `<path>.tmp`, fdatasync it, rename it over `<path>`,
fsync the directory (ARCHITECTURE.md §3 rule 4). A crash at any point leaves either the
old file or the new one under `<path>` (rename is atomic), never a mix; a stale
`<path>.tmp` is removed by the next write and never read.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from typing import Any, Final

import xxhash

from logsvc.store.fs import FileSystem

HEADER = struct.Struct("<8sHHIQ")
HEADER_BYTES: Final = HEADER.size
# The largest body: far above what a membership (6 addresses x 16 records) or a node's
# placement (4,096 shards) needs, small enough to read whole without a second thought.
BODY_BYTES_MAX: Final = 1024 * 1024
TMP_SUFFIX: Final = ".tmp"

assert HEADER_BYTES == 24


class SmallFileCorrupt(Exception):
    """The file exists but is not a valid file of the expected kind and version."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _checksum(header_prefix: bytes, body: bytes) -> int:
    digest = xxhash.xxh3_64()
    digest.update(header_prefix)
    digest.update(body)
    return int(digest.intdigest())


def encode(magic: bytes, version: int, document: dict[str, Any]) -> bytes:
    assert len(magic) == 8
    assert 0 < version < 2**16
    body = json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")
    assert len(body) <= BODY_BYTES_MAX, f"a small file body of {len(body)} bytes"
    prefix = HEADER.pack(magic, version, 0, len(body), 0)[:16]
    return prefix + struct.pack("<Q", _checksum(prefix, body)) + body


def decode(path: str, data: bytes, magic: bytes, version: int) -> dict[str, Any]:
    """The body of a file of kind `magic` at `version`, or SmallFileCorrupt."""
    if len(data) < HEADER_BYTES:
        raise SmallFileCorrupt(path, f"{len(data)} bytes, shorter than the header")
    found_magic, found_version, reserved, body_len, checksum = HEADER.unpack_from(data)
    if found_magic != magic:
        raise SmallFileCorrupt(path, f"magic {found_magic!r}, expected {magic!r}")
    if found_version != version:
        raise SmallFileCorrupt(path, f"version {found_version}, this build reads {version}")
    if reserved != 0:
        raise SmallFileCorrupt(path, f"reserved field {reserved}, expected 0")
    if body_len > BODY_BYTES_MAX or HEADER_BYTES + body_len != len(data):
        raise SmallFileCorrupt(
            path, f"body length {body_len} does not match the file's {len(data)} bytes"
        )
    body = data[HEADER_BYTES:]
    if _checksum(data[:16], body) != checksum:
        raise SmallFileCorrupt(path, "checksum mismatch")
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SmallFileCorrupt(path, f"body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise SmallFileCorrupt(path, "body is not a JSON object")
    return document


def read(fs: FileSystem, path: str, magic: bytes, version: int) -> dict[str, Any] | None:
    """The body, None when the file does not exist, SmallFileCorrupt when it is bad. An
    OSError reading it propagates (the caller cannot tell what the file holds)."""
    if not fs.exists(path):
        return None
    return decode(path, fs.read_file(path), magic, version)


def write_durably(
    fs: FileSystem,
    path: str,
    data: bytes,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Replace `path` with `data`: temp file, fdatasync, rename, directory fsync.
    `before_rename` runs once the temp file is durable (a failpoint, for crash tests)."""
    tmp = path + TMP_SUFFIX
    if fs.exists(tmp):
        fs.unlink(tmp)
    handle = fs.open_write(tmp, create=True)
    try:
        handle.write(data)
        handle.fdatasync()
    finally:
        handle.close()
    if before_rename is not None:
        before_rename()
    fs.rename(tmp, path)
    fs.fsync_dir(os.path.dirname(path) or ".")
