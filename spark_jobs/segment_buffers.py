"""Segment files read into a reused buffer (issue 23): reading a 64 MiB segment into a new
`bytes` object maps fresh memory each time (one page fault per 4 KiB page, the pages zeroed
by the kernel, then copied into), which cost ~0.5 us a page on the development machine: ~0.8
CPU-s of a 10M-entry replay (1.6 GB of segments), more than the copy itself. A buffer kept
between segments is faulted in once.

`SegmentBuffers.lease(path)` gives the file's bytes as a read-only memoryview of a buffer the
caller holds until it leaves the `with` block; the buffer then goes back to the pool and the
next lease overwrites it. So a leased view must not outlive its block: whatever a reader
keeps of a segment (a chunk's bytes, a record's payload) is copied out of it while it is
leased (spark_jobs/entries.py). Two leases at once (two readers interleaved) get two buffers;
at most one idle buffer is kept, of at most SEGMENT_BUFFER_BYTES_MAX.

A file that grows while it is read (a live writer appending) is read as `read_file` reads
it, to its end at that time: the buffer has one byte more than the file's size at open, and
a read that fills it is finished the plain way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from spark_jobs.errors import InputCorrupt
from spark_jobs.limits import SEGMENT_BUFFER_BYTES_MAX

BUFFER_ROUND_BYTES = 4 << 20
"""A buffer's size is the file's rounded up to a multiple of this (a segment past its
nominal size by up to a record, 2 MiB, still fits the buffer made for an earlier one)."""


class SegmentBuffers:
    """A pool of at most one idle buffer (bytearray) segment files are read into."""

    __slots__ = ("_idle",)

    def __init__(self) -> None:
        self._idle: list[bytearray] = []

    @contextmanager
    def lease(self, path: str) -> Iterator[memoryview]:
        """The bytes of the file at `path` (raises InputCorrupt naming it when it cannot be
        read, as `records.read_file`), valid until the block ends."""
        buffer: bytearray | None = None
        try:
            with open(path, "rb", buffering=0) as file:
                size = os.fstat(file.fileno()).st_size
                buffer = self._take(size + 1)
                view = memoryview(buffer)[: size + 1]
                got = 0
                while got < len(view):
                    read = file.readinto(view[got:])
                    if not read:
                        break
                    got += read
                if got == len(view):  # grew since it was opened: the rest, as read_file
                    buffer = bytearray(view[:got]) + file.read()
                    view = memoryview(buffer)
                    got = len(buffer)
        except OSError as exc:
            if buffer is not None:
                self._give(buffer)
            raise InputCorrupt(path, 0, f"cannot read: {exc.strerror}") from None
        try:
            # Not released at the end: a view a caller made of it (numpy's frombuffer) may
            # live on a little; the buffer is only ever written in place, never resized.
            yield view[:got].toreadonly()
        finally:
            self._give(buffer)

    def _take(self, size: int) -> bytearray:
        if self._idle and len(self._idle[-1]) >= size:
            return self._idle.pop()
        self._idle.clear()  # too small: let go rather than hold two
        # Rounded up: a writer's segments differ by up to a record past their nominal size
        # (64 MiB + up to 2 MiB), and a buffer made for the first must hold the next ones.
        return bytearray(-(-size // BUFFER_ROUND_BYTES) * BUFFER_ROUND_BYTES)

    def _give(self, buffer: bytearray) -> None:
        if not self._idle and len(buffer) <= SEGMENT_BUFFER_BYTES_MAX:
            self._idle.append(buffer)


SEGMENT_BUFFERS = SegmentBuffers()
"""The process's pool (the local engine's one reader, or a Spark worker's current task)."""
