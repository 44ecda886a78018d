"""The snapshot file shipped to a lagging follower, received from the leader, and written
durably (hole 4), over the file-system port instead of pysyncobj's plain file calls."""

from __future__ import annotations

import logging
import os
from typing import Any

from logsvc.failpoints import failpoint
from logsvc.shard import small_file
from logsvc.shard.raft.config import RaftFatal
from logsvc.store.fs import FileSystem, ReadableFile

log = logging.getLogger("logsvc.raft")

# A chunked entry larger than this cannot be one of ours (the store caps a record at
# record_payload_bytes_max, 256 MiB at most): the chunks are refused as corrupt.
TRANSMISSION_BYTES_MAX = 2 * (256 * 1024 * 1024)


class _SnapshotTransfer:
    """Stands in for pysyncobj's Serializer where our SyncObj still uses it: shipping the
    snapshot file to a lagging follower in chunks, and receiving one. Over the file-system
    port, and a received snapshot is written durably (temp file, fdatasync, rename,
    directory fsync) before pysyncobj loads it. Compaction is ours (hole 6), so pysyncobj's
    serialize/deserialize paths are never taken."""

    def __init__(self, fs: FileSystem, path: str, chunk_bytes: int) -> None:
        self._fs = fs
        self._path = path
        self._chunk_bytes = chunk_bytes
        self._outgoing: dict[Any, tuple[ReadableFile, int]] = {}  # node -> (file, offset)
        self._incoming: bytearray | None = None

    # pysyncobj API (names are theirs) ----------------------------------------------------

    def getTransmissionData(self, node: Any) -> tuple[bytes, bool, bool] | None:
        sending = self._outgoing.pop(node, None)
        if sending is None:
            try:
                sending = (self._fs.open_read(self._path), 0)
            except OSError as exc:
                log.error("cannot open the snapshot %s to ship it: %s", self._path, exc)
                return None
        handle, offset = sending
        try:
            data = handle.pread(offset, self._chunk_bytes)
        except OSError as exc:
            log.error("cannot read the snapshot %s to ship it: %s", self._path, exc)
            handle.close()
            return None
        is_last = not data
        if is_last:
            handle.close()
        else:
            self._outgoing[node] = (handle, offset + len(data))
        return data, offset == 0, is_last

    def setTransmissionData(self, data: tuple[bytes, bool, bool] | None) -> bool:
        """True once a whole snapshot was received and is durable at `path`."""
        if data is None:
            return False
        chunk, is_first, is_last = data
        if is_first:
            self._incoming = bytearray()
        elif self._incoming is None:
            return False  # joined mid-transmission: wait for the next one
        self._incoming += chunk
        if len(self._incoming) > TRANSMISSION_BYTES_MAX:
            raise RaftFatal(f"a received snapshot exceeded {TRANSMISSION_BYTES_MAX} bytes")
        if not is_last:
            return False
        received, self._incoming = bytes(self._incoming), None
        _write_durably(self._fs, self._path, received)
        return True

    def cancelTransmisstion(self, node: Any) -> None:
        sending = self._outgoing.pop(node, None)
        if sending is not None:
            sending[0].close()


def _never_called(*_args: object) -> Any:
    raise AssertionError("pysyncobj's serializer path is replaced by logsvc's compaction")


def _write_durably(fs: FileSystem, path: str, data: bytes) -> None:
    """A snapshot file, replaced atomically and durably."""
    small_file.write_durably(
        fs, path, data, before_rename=lambda: failpoint("raft_snapshot_before_rename")
    )


def _make_durable(fs: FileSystem, path: str) -> None:
    """A snapshot pysyncobj received and renamed into place (without any fsync)."""
    handle = fs.open_write(path, create=False)
    try:
        handle.fdatasync()
    finally:
        handle.close()
    fs.fsync_dir(os.path.dirname(path) or ".")


# ------------------------------------------------------------------------ the node
