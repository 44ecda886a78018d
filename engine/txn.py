"""Transactions: a workspace over a snapshot, and the handle a caller writes tables through.

Why a workspace (seed "Transaction Processing"): a transaction prepares its writes without
blocking anyone; they stay private until the commit makes them visible. Reads see the
snapshot at `start_ts` (every commit with commit_ts <= start_ts, all visible by construction,
engine/pipeline.py) plus the transaction's own writes. That is snapshot isolation: no dirty
reads, no lost updates (first committer wins), no read skew, no phantoms; write skew is
allowed (two transactions that read overlapping data and write disjoint rows both commit).

An operation that raises leaves the workspace as it was before the call and the transaction
usable (its checks all run before it changes anything). Only `commit()` ends a transaction;
a commit that raises has rolled it back.

The commit itself is the engine's (engine/engine.py); this module turns a workspace into a
`CommitPlan`: the keys for the conflict check and the WAL commands.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap, FrozenBitMap

from engine import conflicts, limits, scan, snapshot_reads, spill
from engine.catalog import Catalog, DatabaseEntry, TableEntry
from engine.conflicts import BulkInsert, ConflictKey, RowWrite
from engine.errors import (
    AlreadyExists,
    BadInput,
    DuplicateKey,
    NotFound,
    SchemaError,
    TxnClosed,
    TxnTooLarge,
)
from engine.limits import TxnLimits
from engine.rows import SmallRows, small_rows
from engine.schema import Key, Schema, batch_keys, check_name, normalize_key, to_batch
from engine.snapshot_reads import BlockReader
from engine.spill import Spill, SpillWriter
from engine.wal.entry import CatalogKind, CatalogOp, Delete, DeletedKeys, UpdateCatalog
from engine.workspace import CommitPlan, LiveKeys, TableWrites


class TxnHost(BlockReader, Protocol):
    """What a transaction needs of what it runs on: the engine (engine/engine.py), a compute
    node (engine/cn/node.py) or a historical state (engine/time_travel.py). A port, so that
    this module imports none of them (issue 21: the engine's import cycle)."""

    txn_limits: TxnLimits

    @property
    def catalog(self) -> Catalog:
        """The catalog the transaction's snapshot reads (every version of it)."""
        ...

    @property
    def spill_writer(self) -> SpillWriter | None:
        """Where a large transaction's rows are written before its commit (None: it never
        spills; it holds them in memory up to its limits)."""
        ...

    async def commit_txn(self, txn: Transaction) -> None:
        """Commit `txn` (ending it: committed, or rolled back with the error raised)."""
        ...

    def txn_ended(self, txn: Transaction) -> None:
        """`txn` no longer counts as open (it pins nothing any more)."""
        ...

    def discard_objects(self, names: list[str]) -> None:
        """Objects a transaction wrote and will never commit (its spills)."""
        ...

    def check_not_closed(self) -> None:
        """Raise `EngineClosed` once the host is closed."""
        ...


class TxnState(enum.Enum):
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"
    UNKNOWN = "outcome unknown"
    """The WAL failed while the commit was in flight: it may be durable; replay decides."""


class Transaction:
    """Begin with `engine.begin()` or `async with engine.transaction() as txn`."""

    def __init__(
        self, host: TxnHost, start_ts: int, *, read_only: bool = False, registered: bool = True
    ) -> None:
        self.host = host
        """What the transaction runs on (the engine, a compute node, a historical state)."""
        self._registered = registered
        """Counted among the engine's open transactions (snapshots are not)."""
        self._catalog: Catalog = host.catalog
        self.start_ts = start_ts
        self.commit_ts: int | None = None
        self.read_only = read_only
        self.state = TxnState.OPEN
        self._new_dbs: dict[str, DatabaseEntry] = {}
        self._dropped_dbs: set[int] = set()
        self._new_tables: dict[tuple[int, str], TableEntry] = {}
        self._dropped_tables: set[int] = set()
        self._catalog_commands: list[UpdateCatalog] = []
        self._writes: dict[int, TableWrites] = {}
        self._guards: set[ConflictKey] = set()
        self._marks: set[ConflictKey] = set()
        self._limits: TxnLimits = host.txn_limits
        self._bytes = 0
        self._deletes = 0
        self._delete_keys_dropped = False
        """More than `DELETE_KEYS_LOGGED_MAX` rows deleted: the deletes log no keys."""
        self._spilled_rows = 0
        self._inserted_rows = 0
        """Rows inserted so far (spilled or not): at most `TXN_SPILL_ROWS_MAX`."""
        self._spill_ids = 0
        """Placeholder block ids of spills count down from here (negative: never a table's)."""
        self._spill_names: list[str] = []
        self.origin: tuple[str, int] | None = None
        """A compute node's (client_id, seq) for this transaction (engine/writeset.py)."""
        self.busy = asyncio.Lock()
        """One operation at a time: an operation that loads persisted blocks awaits between
        its checks and its changes to the workspace, so two at once could both pass."""
        self.ddl_count = 0
        """DDL operations so far; table handles re-check their table when it moves."""

    def __repr__(self) -> str:
        return f"<Transaction start_ts={self.start_ts} {self.state.value}>"

    # --- lifecycle ----------------------------------------------------------------------------

    async def commit(self) -> None:
        """Make every write durable and visible; returns once it is both. Raises a
        `TxnError` (WriteConflict, DuplicateKey, TxnTooLarge) after rolling back, or
        `WalFailed` when the WAL failed (the outcome is then decided by replay)."""
        self.check_open()
        async with self.busy:
            await self.host.commit_txn(self)

    async def rollback(self) -> None:
        if self.state is TxnState.OPEN:
            self.end(TxnState.ROLLED_BACK)

    def end(self, state: TxnState) -> None:
        """The host ends the transaction (its commit's outcome); callers use `commit()` or
        `rollback()`."""
        if self.state in (TxnState.OPEN, TxnState.COMMITTING) and self._registered:
            self.host.txn_ended(self)
        if state is TxnState.ROLLED_BACK and self._spill_names:
            self.host.discard_objects(self._spill_names)
            self._spill_names = []
        self.state = state
        self._writes.clear()
        self._new_tables.clear()

    def check_open(self) -> None:
        if self.state is not TxnState.OPEN:
            raise TxnClosed(f"transaction is {self.state.value}")
        self.host.check_not_closed()

    def _check_writable(self) -> None:
        self.check_open()
        if self.read_only:
            raise BadInput("a snapshot is read-only")

    # --- catalog in this transaction's view ------------------------------------------------

    def _database(self, name: str) -> DatabaseEntry:
        entry = self._new_dbs.get(name)
        if entry is None:
            entry = self._catalog.database(name, self.start_ts)
            if entry is not None and entry.db_id in self._dropped_dbs:
                entry = None
        if entry is None:
            raise NotFound(f"no database {name!r}")
        return entry

    def _table(self, db: str, name: str) -> TableEntry:
        database = self._database(db)
        entry = self._new_tables.get((database.db_id, name))
        if entry is None:
            entry = self._catalog.table(database.db_id, name, self.start_ts)
            if entry is not None and entry.table_id in self._dropped_tables:
                entry = None
        if entry is None:
            raise NotFound(f"no table {db}.{name}")
        return entry

    def databases(self) -> list[str]:
        self.check_open()
        names = {e.name for e in self._catalog.databases_at(self.start_ts)}
        names = {n for n in names if self._visible_db(n)} | set(self._new_dbs)
        return sorted(names)

    def _visible_db(self, name: str) -> bool:
        try:
            self._database(name)
        except NotFound:
            return False
        return True

    def tables(self, db: str) -> list[str]:
        self.check_open()
        database = self._database(db)
        names = {
            e.name
            for e in self._catalog.tables_at(database.db_id, self.start_ts)
            if e.table_id not in self._dropped_tables
        }
        names |= {name for (db_id, name) in self._new_tables if db_id == database.db_id}
        return sorted(names)

    def schema(self, db: str, name: str) -> Schema:
        self.check_open()
        return self._table(db, name).schema

    async def create_database(self, name: str) -> None:
        self._check_writable()
        self.ddl_count += 1
        check_name("database", name)
        if self._visible_db(name):
            raise AlreadyExists(f"database {name!r} exists")
        db_id = self._catalog.allocate_id()
        self._new_dbs[name] = DatabaseEntry(db_id, name, create_ts=0)
        self._catalog_commands.append(
            UpdateCatalog(CatalogKind.DATABASE, CatalogOp.CREATE, db_id, 0, name, None)
        )
        key = conflicts.catalog_db_name(name)
        self._guards.add(key)
        self._marks.add(key)

    async def drop_database(self, name: str) -> None:
        """Drop a database and every table in it."""
        self._check_writable()
        self.ddl_count += 1
        database = self._database(name)
        for table in self.tables(name):
            self._drop_table(database, self._table(name, table))
        self._new_dbs.pop(name, None)
        self._dropped_dbs.add(database.db_id)
        self._catalog_commands.append(
            UpdateCatalog(CatalogKind.DATABASE, CatalogOp.DROP, database.db_id, 0, name, None)
        )
        self._guards.update(
            (
                conflicts.catalog_db_name(name),
                conflicts.catalog_db_drop(database.db_id),
                conflicts.catalog_db_ddl(database.db_id),
            )
        )
        self._marks.update(
            (conflicts.catalog_db_name(name), conflicts.catalog_db_drop(database.db_id))
        )

    async def create_table(self, db: str, name: str, schema: Schema) -> None:
        self._check_writable()
        self.ddl_count += 1
        if not isinstance(schema, Schema):
            raise SchemaError(f"schema must be an engine.Schema, not {type(schema).__name__}")
        check_name("table", name)
        database = self._database(db)
        try:
            self._table(db, name)
        except NotFound:
            pass
        else:
            raise AlreadyExists(f"table {db}.{name} exists")
        table_id = self._catalog.allocate_id()
        entry = TableEntry(table_id, database.db_id, name, schema, create_ts=0)
        self._new_tables[(database.db_id, name)] = entry
        self._catalog_commands.append(
            UpdateCatalog(
                CatalogKind.TABLE, CatalogOp.CREATE, database.db_id, table_id, name, schema
            )
        )
        name_key = conflicts.catalog_table_name(database.db_id, name)
        self._guards.update((name_key, conflicts.catalog_db_drop(database.db_id)))
        self._marks.update((name_key, conflicts.catalog_db_ddl(database.db_id)))

    async def drop_table(self, db: str, name: str) -> None:
        self._check_writable()
        database = self._database(db)
        self._drop_table(database, self._table(db, name))

    def _drop_table(self, database: DatabaseEntry, table: TableEntry) -> None:
        self.ddl_count += 1
        self._new_tables.pop((database.db_id, table.name), None)
        self._dropped_tables.add(table.table_id)
        writes = self._writes.pop(table.table_id, None)
        if writes is not None:
            self._bytes -= writes.bytes
            self._deletes -= len(writes.deleted)
        self._catalog_commands.append(
            UpdateCatalog(
                CatalogKind.TABLE, CatalogOp.DROP, database.db_id, table.table_id, table.name, None
            )
        )
        name_key = conflicts.catalog_table_name(database.db_id, table.name)
        drop_key = conflicts.catalog_table_drop(table.table_id)
        self._guards.update(
            (
                name_key,
                drop_key,
                conflicts.catalog_table_rows(table.table_id),
                conflicts.catalog_db_drop(database.db_id),
            )
        )
        self._marks.update((name_key, drop_key, conflicts.catalog_db_ddl(database.db_id)))

    def table(self, db: str, name: str) -> TableHandle:
        """The table `db.name` as this transaction sees it (`NotFound` if it does not)."""
        self.check_open()
        return TableHandle(self, db, name, self._table(db, name))

    # --- rows -----------------------------------------------------------------------------------

    # What `TableHandle` calls: one operation at a time (`busy`); `_insert`, `_delete`,
    # `_update` and `_get` do the work (a compute node's transaction extends them).

    async def insert_into(self, handle: TableHandle, rows: object) -> int:
        async with self.busy:
            return await self._insert(handle, rows)

    async def delete_from(self, handle: TableHandle, keys: Iterable[object]) -> int:
        async with self.busy:
            return await self._delete(handle, keys)

    async def update_in(
        self, handle: TableHandle, keys: Iterable[object], values: dict[str, object]
    ) -> int:
        async with self.busy:
            return await self._update(handle, keys, values)

    async def get_from(self, handle: TableHandle, key: object) -> dict[str, Any] | None:
        async with self.busy:
            return await self._get(handle, key)

    def table_writes(self, table_id: int) -> TableWrites | None:
        """This transaction's writes to the table (engine/scan.py reads them)."""
        return self._writes.get(table_id)

    def check_handle(self, handle: TableHandle) -> None:
        """The handle's table is still the one this transaction sees under its name.
        Only this transaction's own DDL can change that (its snapshot is fixed), so the
        lookup runs again only after DDL in it."""
        if handle.ddl_seen == self.ddl_count:
            return
        current = self._table(handle.db, handle.name)
        if current is not handle.entry:
            raise NotFound(f"table {handle.db}.{handle.name} was dropped or replaced")
        handle.ddl_seen = self.ddl_count

    def _ensure_writes(self, entry: TableEntry) -> TableWrites:
        writes = self._writes.get(entry.table_id)
        if writes is None:
            writes = TableWrites(entry)
            self._writes[entry.table_id] = writes
        return writes

    async def _insert(self, handle: TableHandle, rows: object) -> int:
        self._check_writable()
        self.check_handle(handle)
        entry = handle.entry
        data = entry.data
        batch: pa.RecordBatch | SmallRows
        # Only a table's first insert in the transaction stays Python values (engine/rows.py):
        # values take several times the memory of Arrow buffers, so a transaction of many
        # inserts keeps at most one such part per table and is bounded as it was.
        first = entry.table_id not in self._writes or not self._writes[entry.table_id].batches
        small = small_rows(entry.schema, data.arrow_schema, rows) if first else None
        if small is not None:
            batch = small
            size = small.size_bytes()
            keys = small.primary_keys()
        else:
            arrow = to_batch(entry.schema, data.arrow_schema, rows, handle.qualified)
            if arrow.num_rows == 0:
                return 0
            batch = arrow
            size = arrow.get_total_buffer_size()
            keys = batch_keys(entry.schema, arrow)
        self._check_insert_size(batch.num_rows, size)
        writes = self._writes.get(entry.table_id)
        seen: set[Key] = set()
        outside: list[Key] = []
        spills = writes.spills if writes is not None else []
        deleted = writes.deleted.contains_many(keys) if writes is not None else None
        for at, key in enumerate(keys):
            if key in seen or (writes is not None and key in writes.inserted):
                raise DuplicateKey(handle.qualified, key)
            if spills and writes is not None and writes.spilled(key) is not None:
                raise DuplicateKey(handle.qualified, key)
            seen.add(key)
            if deleted is None or not deleted[at]:
                outside.append(key)
        spilling = self.host.spill_writer is not None
        for key, version in zip(
            outside,
            await snapshot_reads.versions_at(self.host, entry, outside, self.start_ts),
            strict=True,
        ):
            if version is not None:
                raise DuplicateKey(handle.qualified, key)
        writes = self._ensure_writes(entry)
        batch_no = len(writes.batches)
        writes.batches.append(batch)
        writes.bytes += size
        self._bytes += size
        for row_no, key in enumerate(keys):
            writes.inserted[key] = (batch_no, row_no)
        rows_inserted: int = batch.num_rows
        self._inserted_rows += rows_inserted
        if spilling and writes.bytes > self._limits.spill_bytes:
            await self._spill(writes)
        return rows_inserted

    def _check_insert_size(self, rows: int, size_bytes: int | None) -> None:
        """Refuse, before any work, an insert (or an update's new versions) that would take
        the transaction past its row limit, or past its workspace without an object store
        (`size_bytes` None: not known yet)."""
        txn_limits = self._limits
        if self._inserted_rows + rows > txn_limits.rows_max:
            raise TxnTooLarge("txn_spill_rows_max", self._inserted_rows + rows, txn_limits.rows_max)
        if size_bytes is None or self.host.spill_writer is not None:
            return
        if self._bytes + size_bytes > txn_limits.workspace_bytes_max:
            raise TxnTooLarge(
                "txn_workspace_bytes_max",
                self._bytes + size_bytes,
                txn_limits.workspace_bytes_max,
            )

    def _check_delete_size(self, keys: int) -> None:
        """Refuse, before any lookup, a delete (or update) of `keys` keys that could take
        the transaction past its delete limit (counted as asked: a key that turns out not
        to be live counts too, so the refusal never comes after the work)."""
        if self._deletes + keys > self._limits.deletes_max:
            raise TxnTooLarge("txn_deletes_max", self._deletes + keys, self._limits.deletes_max)

    async def _spill(self, writes: TableWrites) -> None:
        """Write the table's inserted rows to an object now (engine/spill.py); the workspace
        keeps their sorted keys. Runs with the transaction's lock held (one operation at a
        time), so nothing changes the workspace meanwhile."""
        batch = writes.live_inserts()
        if batch is None:
            return
        entry = writes.entry
        rows = spill.sort_rows(entry.schema, pa.Table.from_batches([batch]))
        self._spill_ids -= 1 << 20  # more blocks than one object can hold
        writer = self.host.spill_writer
        assert writer is not None, "a spill without a spill writer"
        made = await spill.write_spill(writer, entry, rows, self._spill_ids)
        writes.spills.append(made)
        self._spill_names.extend(w.object_name for w in made.written)
        self._spilled_rows += made.rows
        self._bytes -= writes.bytes
        writes.batches.clear()
        writes.inserted.clear()
        writes.bytes = 0

    def _normalized_keys(self, handle: TableHandle, keys: Iterable[object]) -> list[Key]:
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            raise SchemaError(f"{handle.qualified}: keys must be a list, not {type(keys).__name__}")
        out: list[Key] = []
        seen: set[Key] = set()
        for key in keys:
            normalized = normalize_key(handle.entry.schema, key, handle.qualified)
            if normalized not in seen:
                seen.add(normalized)
                out.append(normalized)
        return out

    async def _delete(self, handle: TableHandle, keys: Iterable[object]) -> int:
        self._check_writable()
        self.check_handle(handle)
        entry = handle.entry
        normalized = self._normalized_keys(handle, keys)
        self._check_delete_size(len(normalized))
        found = await self._find_live(entry, normalized)
        return self._delete_found(entry, found)

    async def _find_live(self, entry: TableEntry, keys: list[Key]) -> LiveKeys:
        """Where each of `keys` (normalized, distinct) is live in this transaction's view:
        its own inserts, its spills, or the snapshot (keys live nowhere are left out)."""
        writes = self._writes.get(entry.table_id)
        found = LiveKeys()
        if writes is None:
            outside = keys
        else:
            outside = []
            deleted = writes.deleted.contains_many(keys)
            for at, key in enumerate(keys):
                if key in writes.inserted:
                    found.own.append(key)
                elif writes.spills and (place := writes.spilled(key)):
                    found.spilled.append((key, *place))
                elif not deleted[at]:
                    outside.append(key)
        versions = await snapshot_reads.versions_at(self.host, entry, outside, self.start_ts)
        for key, version in zip(outside, versions, strict=True):
            if version is not None:
                found.snapshot_keys.append(key)
                found.snapshot.append(version)
        return found

    def _delete_found(self, entry: TableEntry, found: LiveKeys) -> int:
        """Delete rows `_find_live` found (cannot fail: every check ran before)."""
        count = len(found.own) + len(found.spilled) + len(found.snapshot)
        if not count:
            return 0
        writes = self._ensure_writes(entry)
        for key in found.own:
            del writes.inserted[key]
        for _, spill_of, position in found.spilled:
            spill_of.deleted.add(position)
        writes.deleted.add_new(found.snapshot_keys)
        by_block = writes.deleted_by_block
        for version in found.snapshot:
            masks = by_block.get(version.block_id)
            if masks is None:
                masks = by_block[version.block_id] = BitMap()
            masks.add(version.offset)
        self._deletes += len(found.snapshot)
        if self._delete_keys_dropped:
            return count
        if self._deletes > limits.DELETE_KEYS_LOGGED_MAX:
            self._delete_keys_dropped = True  # memory bounded: the deletes log no keys
            for table_writes in self._writes.values():
                table_writes.deleted_keys.clear()
        else:
            writes.record_deleted_keys(found.snapshot_keys, found.snapshot)
        return count

    async def _get(self, handle: TableHandle, key: object) -> dict[str, Any] | None:
        self.check_open()
        self.check_handle(handle)
        entry = handle.entry
        normalized = normalize_key(entry.schema, key, handle.qualified)
        writes = self._writes.get(entry.table_id)
        if writes is not None:
            if normalized in writes.inserted:
                return writes.own_row(normalized)
            found = writes.spilled(normalized) if writes.spills else None
            if found is not None:
                return await snapshot_reads.spilled_row(self.host, entry, *found)
            if normalized in writes.deleted:
                return None
        (version,) = await snapshot_reads.versions_at(self.host, entry, [normalized], self.start_ts)
        return None if version is None else await snapshot_reads.row_at(self.host, entry, version)

    async def _update(
        self, handle: TableHandle, keys: Iterable[object], values: dict[str, object]
    ) -> int:
        """A delete of each row and an insert of its new version. The sizes are checked
        from the keys before any lookup; the snapshot's rows are read per block as Arrow
        columns and their new versions inserted as batches, so a large update spills like a
        large insert (issue 20: 300,000 rows took 31 s and then failed on the 1 MiB
        workspace, a `get` and a dict per row)."""
        self._check_writable()
        self.check_handle(handle)
        entry = handle.entry
        if not isinstance(values, dict) or not values:
            raise SchemaError(f"{handle.qualified}: update values must be a non-empty dict")
        for column in values:
            if not isinstance(column, str) or column not in entry.schema.names:
                raise SchemaError(f"{handle.qualified}: unknown column {column!r}")
            if column in entry.schema.primary_key:
                raise SchemaError(
                    f"{handle.qualified}: cannot update key column {column!r}; "
                    "delete the row and insert the new one"
                )
        normalized = self._normalized_keys(handle, keys)
        self._check_delete_size(len(normalized))
        self._check_insert_size(len(normalized), None)
        found = await self._find_live(entry, normalized)
        writes = self._writes.get(entry.table_id)
        rows: list[dict[str, Any]] = []
        if writes is not None:
            rows.extend(writes.own_row(key) for key in found.own)
        for _, spill_of, position in found.spilled:
            rows.append(await snapshot_reads.spilled_row(self.host, entry, spill_of, position))
        snapshot = await snapshot_reads.rows_at(self.host, entry, found.snapshot)
        if not rows and snapshot.num_rows == 0:
            return 0
        qualified = handle.qualified
        arrow_schema = entry.data.arrow_schema
        template = rows[0] if rows else snapshot.slice(0, 1).to_pylist()[0]
        one = to_batch(entry.schema, arrow_schema, [{**template, **values}], qualified)
        batches = []
        if rows:
            batches.append(
                to_batch(entry.schema, arrow_schema, [{**r, **values} for r in rows], qualified)
            )
        if snapshot.num_rows:
            zeros = pa.array(np.zeros(snapshot.num_rows, dtype=np.int64))
            for column in values:
                at = snapshot.schema.get_field_index(column)
                snapshot = snapshot.set_column(at, column, one.column(column).take(zeros))
            batches.extend(
                to_batch(entry.schema, arrow_schema, b, qualified)
                for b in snapshot.to_batches(max_chunksize=limits.BLOCK_ROWS_MAX * 16)
            )
        size = sum(b.get_total_buffer_size() for b in batches)
        self._check_insert_size(sum(b.num_rows for b in batches), size)
        # Every check passed: the deletes and inserts cannot fail now (but for the object
        # store under a spill, which fails the transaction's commit as any spill does).
        deleted = self._delete_found(entry, found)
        inserted = 0
        for batch in batches:
            inserted += await self._insert(handle, batch)
        assert inserted == deleted
        return inserted

    def appends_rows(self) -> bool:
        """The workspace inserts rows (its commit may wait for memory, engine/maintenance.py)."""
        return any(writes.inserted for writes in self._writes.values())

    # --- the commit plan ----------------------------------------------------------------------

    def plan(self) -> CommitPlan:
        """What the host's commit needs of the workspace: its keys and WAL commands."""
        rows: list[RowWrite] = []
        guards = set(self._guards)
        marks = set(self._marks)
        appends: list[tuple[TableEntry, pa.RecordBatch | SmallRows]] = []
        deletes: list[Delete] = []
        spills: list[tuple[TableEntry, Spill]] = []
        bulk: list[BulkInsert] = []
        for table_id, writes in self._writes.items():
            entry = writes.entry
            if not writes.inserted and not writes.deleted and not writes.spills:
                continue
            bulk_deleted = len(writes.deleted) > limits.TXN_BULK_KEYS_MIN
            for spilled in writes.spills:
                if spilled.live_rows:
                    spills.append((entry, spilled))
                if bulk_deleted:
                    continue  # the spill's keys and the deleted ones are both checked whole
                for key in writes.deleted:  # updated: the new row is in the spill
                    if spilled.position(key) is not None:
                        rows.append(RowWrite((table_id, key), False, True))
            guards.add(conflicts.catalog_table_drop(table_id))
            guards.add(conflicts.catalog_db_drop(entry.db_id))
            marks.add(conflicts.catalog_table_rows(table_id))
            if not writes.deleted:  # inserts only (most commits): each key insert-only
                rows.extend([RowWrite((table_id, key), True, True) for key in writes.inserted])
            else:
                inserted = list(writes.inserted)
                for key, deleted in zip(
                    inserted, writes.deleted.contains_many(inserted), strict=True
                ):
                    rows.append(RowWrite((table_id, key), not deleted, True))
            if bulk_deleted:
                keys = writes.deleted.sorted_keys()
                bulk.append(BulkInsert(table_id, keys, live_after=False))
            elif writes.deleted:
                for key in writes.deleted:
                    if key not in writes.inserted:
                        rows.append(RowWrite((table_id, key), False, False))
            key_columns = entry.schema.key_columns
            for block_id in sorted(writes.deleted_by_block):
                mask = FrozenBitMap(writes.deleted_by_block[block_id])
                logged_keys = None
                if not self._delete_keys_dropped:
                    logged_keys = DeletedKeys(key_columns, writes.keys_of_block(block_id))
                    assert len(logged_keys.values) == len(mask)
                deletes.append(Delete(entry.db_id, table_id, block_id, mask, logged_keys))
            batch = writes.live_rows()
            if batch is not None:
                appends.append((entry, batch))
        return CommitPlan(
            rows, guards, marks, list(self._catalog_commands), appends, deletes, spills, bulk
        )


class TableHandle:
    """A table as one transaction sees it. Methods are coroutines so that the same code runs
    unchanged against a remote engine (issue 15)."""

    __slots__ = ("db", "ddl_seen", "entry", "name", "txn")

    def __init__(self, txn: Transaction, db: str, name: str, entry: TableEntry) -> None:
        self.txn = txn
        self.db = db
        self.name = name
        self.entry = entry
        """The table's catalog entry, as the transaction saw it when it made the handle."""
        self.ddl_seen = txn.ddl_count
        """The transaction's DDL count when `entry` was last checked (`check_handle`)."""

    @property
    def qualified(self) -> str:
        return f"{self.db}.{self.name}"

    @property
    def schema(self) -> Schema:
        return self.entry.schema

    async def insert(self, rows: object) -> int:
        """Insert rows (a pyarrow Table or RecordBatch, a list of dicts, or one dict).
        Returns how many. `DuplicateKey` if a key is live in this transaction's view."""
        return await self.txn.insert_into(self, rows)

    async def delete(self, keys: Iterable[object]) -> int:
        """Delete the rows with these primary keys (tuples for a compound key). Keys that
        are not live are ignored; returns how many rows were deleted."""
        return await self.txn.delete_from(self, keys)

    async def update(self, keys: Iterable[object], values: dict[str, object]) -> int:
        """Set `values` (non-key columns) in the rows with these keys: a delete of each row
        and an insert of its new version. Returns how many rows were updated."""
        return await self.txn.update_in(self, keys, values)

    async def get(self, key: object) -> dict[str, Any] | None:
        return await self.txn.get_from(self, key)

    def check(self) -> None:
        """Raise unless the transaction is open and the table is still the one it sees
        (engine/scan.py's `ScannedTable`)."""
        self.txn.check_open()
        self.txn.check_handle(self)

    async def scan(
        self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None
    ) -> pa.Table:
        """Rows visible to the transaction, filtered, with the columns asked for (all by
        default). Row order is unspecified."""
        async with self.txn.busy:
            return await scan.scan(self.txn, self, columns, filter)


T = TypeVar("T", bound=Transaction)


class TransactionScope(Generic[T]):
    """The `async with` of `Engine.transaction()` and `ComputeNode.transaction()`: begins,
    commits on normal exit (unless the transaction already ended), rolls back on an
    exception. A class, not an asynccontextmanager: it runs once per transaction, and a
    generator-based manager costs several microseconds."""

    __slots__ = ("_begin", "_txn")

    def __init__(self, begin: Callable[[], Awaitable[T]]) -> None:
        self._begin = begin
        self._txn: T | None = None

    async def __aenter__(self) -> T:
        self._txn = await self._begin()
        return self._txn

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        txn = self._txn
        assert txn is not None
        if exc_type is not None:
            await txn.rollback()
        elif txn.state is TxnState.OPEN:
            await txn.commit()
