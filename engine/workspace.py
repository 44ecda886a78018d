"""A transaction's workspace: its writes to each table, and what its commit takes from them.

Why apart from engine/txn.py: these are the nouns the workspace holds (rows inserted, keys
deleted, spills) and the plan a commit is made from; `Transaction` (engine/txn.py) is the
operations over them and the checks each runs first. engine/scan.py reads a table's writes.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import pyarrow as pa
from pyroaring import BitMap

from engine.catalog import TableEntry
from engine.conflicts import BulkInsert, ConflictKey, RowWrite
from engine.keyset import KeySet
from engine.rows import SmallRows
from engine.schema import Key
from engine.spill import Spill
from engine.storage import RowVersion
from engine.wal.entry import Delete, UpdateCatalog


class TableWrites:
    """One table's writes in a workspace."""

    __slots__ = (
        "batches",
        "bytes",
        "deleted",
        "deleted_by_block",
        "deleted_keys",
        "entry",
        "inserted",
        "spills",
    )

    def __init__(self, entry: TableEntry) -> None:
        self.entry = entry
        self.batches: list[pa.RecordBatch | SmallRows] = []
        """Inserts in order: Arrow batches, or a small insert's values (engine/rows.py)."""
        self.inserted: dict[Key, tuple[int, int]] = {}
        """Keys inserted by this transaction and still live in it -> (batch, row)."""
        self.deleted = KeySet()
        """Keys live in the snapshot that this transaction deleted (their rows are in
        `deleted_by_block`)."""
        self.deleted_by_block: dict[int, BitMap] = {}
        self.deleted_keys: dict[int, tuple[array[int], list[Key]]] = {}
        """block_id -> (offsets, keys) of the rows in `deleted_by_block`, in the order they
        were deleted, for the WAL's DeleteKeys (issue 23). Emptied for good when the
        transaction deletes more than `limits.DELETE_KEYS_LOGGED_MAX` rows
        (`Transaction._delete_found`): its deletes are then logged without keys."""
        self.bytes = 0
        self.spills: list[Spill] = []
        """Inserted rows already written to objects (a large transaction, engine/spill.py)."""

    def record_deleted_keys(self, keys: list[Key], versions: list[RowVersion]) -> None:
        """Remember the keys of deleted snapshot rows, by block and offset."""
        by_block = self.deleted_keys
        for key, version in zip(keys, versions, strict=True):
            found = by_block.get(version.block_id)
            if found is None:
                found = by_block[version.block_id] = (array("H"), [])
            found[0].append(version.offset)
            found[1].append(key)

    def keys_of_block(self, block_id: int) -> tuple[Key, ...]:
        """The keys of the rows deleted from `block_id`, in offset order (a Delete's
        `DeletedKeys.values`)."""
        offsets, keys = self.deleted_keys[block_id]
        if len(keys) == 1:
            return (keys[0],)
        order = sorted(range(len(keys)), key=offsets.__getitem__)
        return tuple(keys[at] for at in order)

    def spilled(self, key: Key) -> tuple[Spill, int] | None:
        """The spill holding `key` live in this transaction, and its position."""
        for written in self.spills:
            position = written.position(key)
            if position is not None:
                return written, position
        return None

    def live_inserts(self) -> pa.RecordBatch | None:
        """The inserted rows still live in the transaction, as one batch."""
        if not self.inserted:
            return None
        batches = [b if type(b) is pa.RecordBatch else b.batch() for b in self.batches]
        if len(batches) == 1 and len(self.inserted) == batches[0].num_rows:
            return batches[0]
        table = pa.Table.from_batches(batches, schema=self.entry.data.arrow_schema)
        if len(self.inserted) != table.num_rows:
            starts = [0]
            for batch in batches:
                starts.append(starts[-1] + batch.num_rows)
            keep = sorted(starts[b] + r for b, r in self.inserted.values())
            table = table.take(pa.array(keep, type=pa.uint32()))
        combined: list[pa.RecordBatch] = table.combine_chunks().to_batches()
        assert len(combined) == 1
        return combined[0]

    def live_rows(self) -> pa.RecordBatch | SmallRows | None:
        """`live_inserts`, but a lone small insert stays values (the commit path encodes it
        without Arrow)."""
        batches = self.batches
        if len(batches) == 1 and len(self.inserted) == batches[0].num_rows:
            return batches[0]
        return self.live_inserts()

    def own_row(self, key: Key) -> dict[str, object]:
        batch_no, row_no = self.inserted[key]
        batch = self.batches[batch_no]
        if isinstance(batch, SmallRows):
            return batch.row(row_no)
        rows: list[dict[str, object]] = batch.slice(row_no, 1).to_pylist()
        return rows[0]


@dataclass(slots=True)
class LiveKeys:
    """Where keys a delete or update names are live (engine/txn.py `_find_live`)."""

    own: list[Key] = field(default_factory=list)
    """Inserted by this transaction, still in its workspace."""
    spilled: list[tuple[Key, Spill, int]] = field(default_factory=list)
    """Inserted by this transaction and spilled: (key, spill, position)."""
    snapshot_keys: list[Key] = field(default_factory=list)
    snapshot: list[RowVersion] = field(default_factory=list)
    """Live in the snapshot: keys and their versions, in the same order."""


@dataclass(slots=True)
class CommitPlan:
    """What a commit needs from the workspace."""

    rows: list[RowWrite]
    guards: set[ConflictKey]
    marks: set[ConflictKey]
    catalog_commands: list[UpdateCatalog]
    appends: list[tuple[TableEntry, pa.RecordBatch | SmallRows]]
    deletes: list[Delete]
    spills: list[tuple[TableEntry, Spill]]
    bulk: list[BulkInsert] = field(default_factory=list)
    """Keys for the conflict check as sorted arrays: the deletes of tables where this
    transaction deleted more than `TXN_BULK_KEYS_MIN` rows (its spills carry their own)."""

    @property
    def empty(self) -> bool:
        return not (self.catalog_commands or self.appends or self.deletes or self.spills)
