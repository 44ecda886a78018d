"""One segment file of a shard store as the store holds it in memory (used by segment_set.py):
its record offsets, term runs, and how much of it is buffered, written and synced."""

from __future__ import annotations

import array
import bisect
from dataclasses import dataclass

from logsvc.store.fs import WritableFile


@dataclass(slots=True, eq=False)
class Segment:
    first_index: int
    path: str
    offsets: array.array[int]  # file offset of each record
    term_runs: list[tuple[int, int]]  # (first index, term) where the term changes
    size_bytes: int  # logical end: header + every record, including buffered ones
    written_bytes: int  # handed to the OS
    synced_bytes: int  # covered by a returned fdatasync
    pending: bytearray  # encoded, not yet written (starts with the header if not on disk)
    on_disk: bool
    file: WritableFile | None = None

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.offsets) - 1

    def term_at(self, index: int) -> int:
        position = bisect.bisect_right(self.term_runs, (index, 2**64)) - 1
        assert position >= 0
        return self.term_runs[position][1]

    def record_end(self, index: int) -> int:
        position = index - self.first_index + 1
        return self.offsets[position] if position < len(self.offsets) else self.size_bytes

    def cut(self, index: int) -> int:
        """Forget records from `index` on; return the new size."""
        position = index - self.first_index
        new_size = self.offsets[position]
        del self.offsets[position:]
        while self.term_runs and self.term_runs[-1][0] >= index:
            self.term_runs.pop()
        self.size_bytes = new_size
        return new_size
