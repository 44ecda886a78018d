"""The store's metadata file: Raft term and vote, and the log start (first index).

Raft requires currentTerm and votedFor on stable storage before a vote request or reply
leaves the node (Raft paper, Figure 2); the log start must survive even when the segment
files below it are deleted later. Both live in one small file, `meta`, replaced atomically:

    write meta.tmp -> fdatasync(meta.tmp) -> rename(meta.tmp, meta) -> fsync(directory)

A torn write can only tear `meta.tmp`, which is never read (a leftover one is deleted on
open), so the last good `meta` survives every crash: the "equivalent" of two alternating
files. A `meta` that fails its checksum was damaged at rest, not torn; it is reported as
corruption and never replaced by an older value, since going back in term or vote could
allow a second vote in the same term.

Format (little-endian), see FORMAT.md:

    magic "LOGSVMET" | version u16 | flags u16 (bit 0: has vote) | voted_for_bytes u32
    | term u64 | first_index u64 | voted_for[voted_for_bytes] (UTF-8)
    | checksum u64 = xxh3_64(all previous bytes)
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from logsvc.store.errors import Corruption, io_error
from logsvc.store.fs import FileSystem
from logsvc.store.records import xxh3

META_FILE_NAME = "meta"
META_TMP_FILE_NAME = "meta.tmp"
META_MAGIC = b"LOGSVMET"
META_VERSION = 1
META_FIXED = struct.Struct("<8sHHIQQ")
META_CHECKSUM = struct.Struct("<Q")
VOTED_FOR_BYTES_MAX = 1024  # a node id; anything longer is a bug or corruption
FLAG_HAS_VOTE = 1


@dataclass(frozen=True, slots=True)
class Meta:
    term: int = 0
    voted_for: str | None = None
    first_index: int = 1


def encode_meta(meta: Meta) -> bytes:
    assert meta.term >= 0
    assert meta.first_index >= 1
    vote = b"" if meta.voted_for is None else meta.voted_for.encode("utf-8")
    assert len(vote) <= VOTED_FOR_BYTES_MAX
    flags = 0 if meta.voted_for is None else FLAG_HAS_VOTE
    body = (
        META_FIXED.pack(META_MAGIC, META_VERSION, flags, len(vote), meta.term, meta.first_index)
        + vote
    )
    return body + META_CHECKSUM.pack(xxh3(body))


def decode_meta(data: bytes) -> Meta | tuple[int, str]:
    """The metadata, or (offset, reason) describing why the bytes are not whole."""
    if len(data) < META_FIXED.size + META_CHECKSUM.size:
        return 0, f"meta file is {len(data)} bytes, shorter than its fixed part"
    magic, version, flags, vote_bytes, term, first_index = META_FIXED.unpack_from(data, 0)
    if magic != META_MAGIC:
        return 0, f"bad meta magic {magic!r}"
    end = META_FIXED.size + vote_bytes
    if vote_bytes > VOTED_FOR_BYTES_MAX or len(data) != end + META_CHECKSUM.size:
        return 12, f"meta length fields disagree with the file size ({len(data)} bytes)"
    (checksum,) = META_CHECKSUM.unpack_from(data, end)
    if checksum != xxh3(data[:end]):
        return end, "meta checksum mismatch"
    if version != META_VERSION:
        return 8, f"unknown meta format version {version} (this build reads {META_VERSION})"
    if flags & ~FLAG_HAS_VOTE or first_index < 1 or (not flags and vote_bytes):
        return 10, "meta fields out of range"
    try:
        voted_for = data[META_FIXED.size : end].decode("utf-8") if flags else None
    except UnicodeDecodeError:
        return META_FIXED.size, "voted_for is not UTF-8"
    return Meta(term=term, voted_for=voted_for, first_index=first_index)


def load_meta(fs: FileSystem, dir_path: str) -> Meta | None:
    """The saved metadata, None for a directory that never saved any."""
    path = os.path.join(dir_path, META_FILE_NAME)
    if not fs.exists(path):
        return None
    try:
        data = fs.read_file(path)
    except OSError as exc:
        raise io_error(exc, "read", path) from exc
    decoded = decode_meta(data)
    if isinstance(decoded, tuple):
        offset, reason = decoded
        raise Corruption(path, offset, reason)
    return decoded


def save_meta(fs: FileSystem, dir_path: str, meta: Meta) -> None:
    """Replace the metadata durably; on return the new value survives power loss."""
    tmp_path = os.path.join(dir_path, META_TMP_FILE_NAME)
    path = os.path.join(dir_path, META_FILE_NAME)
    op = "unlink"
    try:
        if fs.exists(tmp_path):
            fs.unlink(tmp_path)
        op = "write"
        handle = fs.open_write(tmp_path, create=True)
        try:
            handle.write(encode_meta(meta))
            op = "fdatasync"
            handle.fdatasync()
        finally:
            handle.close()
        op = "rename"
        fs.rename(tmp_path, path)
        op = "fsync_dir"
        fs.fsync_dir(dir_path)
    except OSError as exc:
        raise io_error(exc, op, path) from exc
