"""The engine's WAL entries and commands, as values (the codec is `engine/wal/codec.py`, the
bytes are documented in `engine/FORMAT.md`).

The seed's Transaction Entry (shared/reference/seeds "WAL Practical"): a transaction context
(StartTS, CommitTS, Memo = what the transaction touched) and a list of commands:

* `UpdateCatalog`: Dest (database or table id) + EntryNode (create@ or delete@ = the entry's
  commit_ts; a created table's schema);
* `Append`: AppendInfo list (where the rows land: block and offset) + Batch (Arrow);
* `Delete`: Destination (table and block) + delete mask (a roaring bitmap of row offsets),
  and (version 3, issue 23) the deleted rows' primary keys, as MatrixOne's tombstones carry
  them: a reader of the log alone (the change stream) can say which rows died;
* `CreateBlock` / `DropBlock`: a persisted block (an object's row group) enters or leaves a
  table: flush, merge and compaction transactions, and large transactions (decision 0006).

Entry types follow the seed's table (004_*): `AC` (0x10) a whole committed transaction and
`CKP` (0x40) a checkpoint record; PC/UC (0x11/0x12) are reserved for large transactions
(issue 14). One transaction is exactly one entry, so after a crash it is wholly in the log or
wholly absent.

Numbers: `commit_ts`/`start_ts` are hybrid-clock timestamps (engine/clock.py); ids are the
catalog's; the DSN is the driver's and is not stored in the entry (the driver's record
carries it).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyroaring import FrozenBitMap

from engine.rows import SmallRows
from engine.schema import Schema


class EntryType(enum.IntEnum):
    AC = 0x10
    """A full committed transaction."""
    CKP = 0x40
    """A checkpoint: everything with commit_ts <= ckp_ts is in the checkpoint objects."""


class CatalogKind(enum.IntEnum):
    DATABASE = 1
    TABLE = 2


class CatalogOp(enum.IntEnum):
    CREATE = 1
    DROP = 2


@dataclass(frozen=True, slots=True)
class UpdateCatalog:
    """Create or drop a database (`table_id == 0`, `schema is None`) or a table. The
    create@/delete@ timestamp is the entry's commit_ts. `name` is the entry's name (for a
    drop too, so the log alone tells what was dropped)."""

    kind: CatalogKind
    op: CatalogOp
    db_id: int
    table_id: int
    name: str
    schema: Schema | None


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Rows [offset, offset + rows) of block `block_id` receive the next `rows` rows of the
    command's batch."""

    block_id: int
    offset: int
    rows: int


@dataclass(frozen=True, slots=True)
class Append:
    """Rows appended to a table. The infos cover the batch's rows in order, exactly."""

    db_id: int
    table_id: int
    infos: tuple[AppendInfo, ...]
    batch: pa.RecordBatch


@dataclass(frozen=True, slots=True)
class AppendRows:
    """An `Append` whose rows are still Python values (engine/rows.py): what the commit path
    builds for a small insert. It is written as the same bytes as the `Append` of
    `rows.batch()` (AppendColumns), so a decoder only ever sees `Append`; it never comes out
    of the codec."""

    db_id: int
    table_id: int
    infos: tuple[AppendInfo, ...]
    rows: SmallRows

    def as_append(self) -> Append:
        return Append(self.db_id, self.table_id, self.infos, self.rows.batch())


@dataclass(frozen=True, slots=True)
class DeletedKeys:
    """The primary keys of a Delete's rows (engine/FORMAT.md "DeleteKeys", version 3).

    `columns` are the table's key columns in key order, (name, type name) each
    (`Schema.key_columns`); `values[i]` is the key of the i-th smallest offset of the
    command's `rows`, in the form `engine.schema.batch_keys` gives (a scalar for a one-column
    key, a tuple for a compound one; date32 a `datetime.date`, timestamp[us] a naive
    `datetime.datetime`)."""

    columns: tuple[tuple[str, str], ...]
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    """Rows deleted from one block of a table: `rows` holds their offsets in the block.

    `keys`: their primary keys (`DeletedKeys`, one per row in offset order), which a user
    transaction's commit logs for every row it deletes (engine/txn.py `plan`). None in
    entries older than version 3, in a rewrite's carried deletes (they repeat deletes logged
    before, with their keys: engine/rewrite_commit.py), and when the keys would not fit the
    entry (engine/FORMAT.md "DeleteKeys": past `DELETE_KEYS_LOGGED_MAX` rows or
    `TXN_ENTRY_BYTES_MAX` bytes). Rows are named by `rows` either way; the keys change
    nothing a replay does."""

    db_id: int
    table_id: int
    block_id: int
    rows: FrozenBitMap
    keys: DeletedKeys | None = None


class BlockLevel(enum.IntEnum):
    """Where a persisted block sits (decision 0006): L1 a sorted block of its own object (a
    flush of an L0 block, or the rows of a large transaction), L2 one block of a merged
    segment object sorted across its blocks."""

    L1 = 1
    L2 = 2


@dataclass(frozen=True, slots=True)
class CreateBlock:
    """A persisted block enters the table at the entry's commit_ts: `rows` rows, row group
    `row_group` of the object `object_name` (an L1 object has one row group, an L2 segment
    several). Written by flush, merge and compaction transactions and by large transactions
    (decision 0006); the object was durable before the entry was logged."""

    db_id: int
    table_id: int
    block_id: int
    level: BlockLevel
    object_name: str
    row_group: int
    rows: int


@dataclass(frozen=True, slots=True)
class DropBlock:
    """A block leaves the table at the entry's commit_ts: its rows now live in the blocks the
    same entry creates (a flush, merge or compaction). Readers at earlier timestamps still
    read it."""

    db_id: int
    table_id: int
    block_id: int


@dataclass(frozen=True, slots=True)
class Origin:
    """Who asked for this transaction: a compute node's `(client_id, seq)` (issue 15). It
    changes no data; replay (and a standby TN tailing the log) remembers it, so a commit
    retried after a TN failover finds its first outcome instead of running twice."""

    client_id: str
    seq: int


Command = UpdateCatalog | Append | AppendRows | Delete | CreateBlock | DropBlock | Origin


@dataclass(frozen=True, slots=True)
class MemoItem:
    """What a transaction touched: a table's block (`block_id > 0`), a table's definition or
    a database (`block_id == 0`; `table_id == 0` for a database)."""

    db_id: int
    table_id: int
    block_id: int


@dataclass(frozen=True, slots=True)
class TxnEntry:
    """Entry type AC: one committed transaction. `memo` is sorted and has no repeats."""

    start_ts: int
    commit_ts: int
    memo: tuple[MemoItem, ...]
    commands: tuple[Command, ...]


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    """Entry type CKP: a checkpoint covering every commit with commit_ts <= `ckp_ts`, written
    to `location` (an object name; issue 14 writes these). `truncate_dsn` is the DSN up to
    which the WAL may be truncated once this entry is durable."""

    ckp_ts: int
    truncate_dsn: int
    location: str


Entry = TxnEntry | CheckpointEntry


def without_delete_keys(entry: TxnEntry) -> TxnEntry | None:
    """`entry` with its Deletes' keys left out, or None when none has keys: what the commit
    logs when the keys would take the entry past `TXN_ENTRY_BYTES_MAX` (a large delete never
    fails for its keys; engine/FORMAT.md "DeleteKeys")."""
    if not any(type(cmd) is Delete and cmd.keys is not None for cmd in entry.commands):
        return None
    commands = tuple(
        Delete(cmd.db_id, cmd.table_id, cmd.block_id, cmd.rows) if type(cmd) is Delete else cmd
        for cmd in entry.commands
    )
    return TxnEntry(entry.start_ts, entry.commit_ts, entry.memo, commands)


def memo_of(commands: Sequence[Command]) -> tuple[MemoItem, ...]:
    """The memo of an entry of `commands`: every (database, table, block) they touch."""
    if len(commands) == 1:  # most entries: one small insert into one block (issue 21)
        (only,) = commands
        if (type(only) is Append or type(only) is AppendRows) and len(only.infos) == 1:
            return (MemoItem(only.db_id, only.table_id, only.infos[0].block_id),)
    items = set()
    for cmd in commands:
        if isinstance(cmd, (Append, AppendRows)):
            for info in cmd.infos:
                items.add((cmd.db_id, cmd.table_id, info.block_id))
        elif not isinstance(cmd, Origin):
            items.add((cmd.db_id, cmd.table_id, getattr(cmd, "block_id", 0)))
    return tuple(MemoItem(*item) for item in sorted(items))
