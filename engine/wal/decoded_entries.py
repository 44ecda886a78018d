"""What `decode_entries` (engine/wal/batch.py) gives back: per entry its kind (`KIND_FAST`:
decoded into columns, `KIND_ONE`: decoded by `decode_entry`, `KIND_DAMAGED`: refused), and
the rows of the fast-path entries as one Arrow batch per table and group (`TableRows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.errors import WalCorruption
from engine.wal.entry import Append, AppendInfo, CheckpointEntry, MemoItem, TxnEntry

Entry = TxnEntry | CheckpointEntry

KIND_FAST = 0
"""The entry is a one-append transaction decoded into `DecodedEntries.tables`."""
KIND_ONE = 1
"""The entry was decoded by `decode_entry`: in `DecodedEntries.entries`."""
KIND_DAMAGED = 2
"""`decode_entry` refused it: the error is in `DecodedEntries.errors`."""


@dataclass(frozen=True, slots=True)
class TableRows:
    """Rows appended to table `table_id` by fast-path entries, in entry order; every array has
    one value per row."""

    table_id: int
    entries: npt.NDArray[np.int64]
    """The index (in the call's input) of each row's entry."""
    block_ids: npt.NDArray[np.uint64]
    offsets: npt.NDArray[np.uint64]
    """Each row's place in its block (its info's offset plus its index among the info's rows)."""
    columns: pa.RecordBatch


@dataclass(slots=True)
class DecodedEntries:
    """What `decode_entries` found, entry by entry (index = position in its input)."""

    dsns: npt.NDArray[np.int64]
    kinds: npt.NDArray[np.int8]
    """KIND_FAST, KIND_ONE or KIND_DAMAGED per entry."""
    start_ts: npt.NDArray[np.uint64]
    commit_ts: npt.NDArray[np.uint64]
    """A transaction's timestamps (fast or not); 0 for checkpoints and damage."""
    is_txn: npt.NDArray[np.bool_]
    """A transaction entry (fast or decoded one by one), not a checkpoint nor damage."""
    tables: list[TableRows]
    entries: dict[int, Entry]
    errors: dict[int, WalCorruption]
    # Per entry, for fast-path entries (zero elsewhere): the memo item and the command's
    # db_id, to give the entry back whole (`entry`).
    memo: npt.NDArray[np.uint64]
    db_ids: npt.NDArray[np.uint64]

    def __len__(self) -> int:
        return len(self.kinds)

    def entry(self, index: int) -> Entry:
        """Entry `index` as `decode_entry` gives it (raises its WalCorruption). Slow for fast-path
        entries (it rebuilds the objects): for tests and rare readers."""
        kind = self.kinds[index]
        if kind == KIND_DAMAGED:
            raise self.errors[index]
        if kind == KIND_ONE:
            return self.entries[index]
        for rows in self.tables:
            found = np.flatnonzero(rows.entries == index)
            if len(found):
                first, count = int(found[0]), len(found)
                batch = rows.columns.slice(first, count)
                info = AppendInfo(int(rows.block_ids[first]), int(rows.offsets[first]), count)
                db_id, table_id, block_id = (int(v) for v in self.memo[index])
                append = Append(int(self.db_ids[index]), rows.table_id, (info,), batch)
                return TxnEntry(
                    int(self.start_ts[index]),
                    int(self.commit_ts[index]),
                    (MemoItem(db_id, table_id, block_id),),
                    (append,),
                )
        raise AssertionError(f"entry {index} is fast but has no rows")
