"""The engine's committed state, and the one function that changes it: `apply(entry)`.

Why one function: a commit becoming visible and replay after a restart run the very same code
on the very same `TxnEntry` values, so what replay rebuilds is what the running engine had
(issue 13 "Restart": a digest taken before a kill -9 equals the one after replay).
`apply_group` is `apply` on consecutive entries, with their appends joined per table (the
commit path's groups; tests/unit/engine/test_group_commit.py checks it against `apply`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import xxhash

from engine import limits
from engine.catalog import Catalog
from engine.storage import (
    ApplyError,
    MetaSource,
    NothingLoaded,
    PersistedBlock,
    PersistedMeta,
    table_scans,
)
from engine.storage.loader import BlockLoader
from engine.wal.entry import (
    Append,
    AppendRows,
    CreateBlock,
    Delete,
    DropBlock,
    Origin,
    TxnEntry,
    UpdateCatalog,
)

_RUN_COMMANDS = (Append, AppendRows, Origin)
"""What an entry that joins a run of `apply_group` holds: rows appended, nothing else."""


def _no_objects(cmd: CreateBlock) -> PersistedMeta:
    raise ApplyError(f"block {cmd.block_id} is in object {cmd.object_name!r}: no object store")


class Origins:
    """The last `ORIGIN_SEQS_PER_CLIENT` commits of the last `ORIGIN_CLIENTS_MAX` clients:
    seq -> commit_ts. Bounded like logsvc's dedupe table: a retry older than that is treated
    as new (the client's window of commits in flight is smaller)."""

    def __init__(self) -> None:
        self._clients: OrderedDict[str, OrderedDict[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def record(self, client_id: str, seq: int, commit_ts: int) -> None:
        seqs = self._clients.pop(client_id, None) or OrderedDict()
        seqs[seq] = commit_ts
        while len(seqs) > limits.ORIGIN_SEQS_PER_CLIENT:
            seqs.popitem(last=False)
        self._clients[client_id] = seqs
        while len(self._clients) > limits.ORIGIN_CLIENTS_MAX:
            self._clients.popitem(last=False)

    def commit_ts(self, client_id: str, seq: int) -> int | None:
        """When the commit `(client_id, seq)` was made, if it is remembered."""
        seqs = self._clients.get(client_id)
        return None if seqs is None else seqs.get(seq)


class EngineState:
    def __init__(self) -> None:
        self.catalog = Catalog()
        self.applied_ts = 0
        """commit_ts of the last applied transaction."""
        self.entries_applied = 0
        self.apply_passes = 0
        """Entries applied on their own plus runs applied at once (`apply_group`)."""
        self.origins = Origins()
        """Recent commits by their compute node's (client_id, seq) (issue 15)."""
        self.pending_meta: dict[tuple[str, int], PersistedMeta] = {}
        """Metadata of blocks the engine wrote and is committing (object, row group)."""
        self.block_created: Callable[[int, PersistedBlock], None] = lambda table_id, block: None
        """Told of every persisted block a CreateBlock adds (the block store counts the
        references to its object)."""
        self.object_meta: MetaSource = _no_objects
        """Where the metadata of any other block comes from: its object's footer (the
        shell sets it once it has an object store)."""

    def apply(self, entry: TxnEntry) -> None:
        """Apply one committed transaction. Raises `ApplyError` when it does not fit (on
        replay: a corrupt log; on the commit path: a bug). Commands apply in the order
        catalog, CreateBlock, Delete, DropBlock, Append (engine/FORMAT.md), whatever their
        order in the entry. An entry that fails half way leaves the state unusable: the
        caller stops."""
        commit_ts = entry.commit_ts
        if commit_ts <= self.applied_ts:
            raise ApplyError(f"commit_ts {commit_ts} is not above the applied {self.applied_ts}")
        catalog = self.catalog
        commands = entry.commands
        for cmd in commands:
            if type(cmd) is UpdateCatalog:
                catalog.apply(cmd, commit_ts)
        for cmd in commands:
            if type(cmd) is CreateBlock:
                data = catalog.live_table(cmd.table_id, commit_ts).data
                self.block_created(cmd.table_id, data.apply_create(cmd, commit_ts, self._meta_of))
        for cmd in commands:
            if type(cmd) is Delete:
                catalog.live_table(cmd.table_id, commit_ts).data.apply_delete(cmd, commit_ts)
        for cmd in commands:
            if type(cmd) is DropBlock:
                catalog.live_table(cmd.table_id, commit_ts).data.apply_drop(cmd, commit_ts)
        for cmd in commands:
            if type(cmd) is Append or type(cmd) is AppendRows:
                data = catalog.live_table(cmd.table_id, commit_ts).data
                data.apply_appends([(commit_ts, cmd)])
            elif type(cmd) is Origin:
                self.origins.record(cmd.client_id, cmd.seq, commit_ts)
        self.applied_ts = commit_ts
        self.entries_applied += 1
        self.apply_passes += 1

    def apply_group(self, entries: Sequence[TxnEntry]) -> None:
        """Apply consecutive committed transactions (commit_ts ascending): the same result as
        `apply` on each in turn. A run of entries that only append rows (the usual commit)
        is applied per table at once: one Arrow batch for the run's rows of each table
        (issue 21: per group, not per transaction). Any other entry applies on its own,
        between the runs, so the order of catalog changes, deletes and drops is kept."""
        run: list[TxnEntry] = []
        for entry in entries:
            if all(type(cmd) in _RUN_COMMANDS for cmd in entry.commands):
                run.append(entry)
                continue
            self._apply_run(run)
            run = []
            self.apply(entry)
        self._apply_run(run)

    def _apply_run(self, run: list[TxnEntry]) -> None:
        if len(run) < 2:
            if run:
                self.apply(run[0])
            return
        catalog = self.catalog
        previous = self.applied_ts
        per_table: dict[int, list[tuple[int, Append | AppendRows]]] = {}
        for entry in run:
            commit_ts = entry.commit_ts
            if commit_ts <= previous:
                raise ApplyError(f"commit_ts {commit_ts} is not above the applied {previous}")
            previous = commit_ts
            for cmd in entry.commands:
                if type(cmd) is Origin:
                    self.origins.record(cmd.client_id, cmd.seq, commit_ts)
                else:
                    assert type(cmd) is Append or type(cmd) is AppendRows
                    catalog.live_table(cmd.table_id, commit_ts)  # live at each commit
                    per_table.setdefault(cmd.table_id, []).append((commit_ts, cmd))
        last_ts = run[-1].commit_ts
        for table_id, appends in per_table.items():
            catalog.live_table(table_id, last_ts).data.apply_appends(appends)
        self.applied_ts = last_ts
        self.entries_applied += len(run)
        self.apply_passes += 1

    def _meta_of(self, cmd: CreateBlock) -> PersistedMeta:
        found = self.pending_meta.pop((cmd.object_name, cmd.row_group), None)
        return found if found is not None else self.object_meta(cmd)

    def digest(self, ts: int, loader: BlockLoader | None) -> str:
        """A hash of everything visible at `ts`: databases, tables with their schemas, and
        every table's rows in key order. Equal states give equal digests. Reads every
        persisted block through `loader` (blocking: a diagnostic, not a hot path)."""
        hasher = xxhash.xxh3_128()
        catalog = self.catalog
        for database in catalog.databases_at(ts):
            hasher.update(f"db {database.name!r}\n".encode())
            for table in catalog.tables_at(database.db_id, ts):
                hasher.update(f"table {table.name!r} {table.schema!r}\n".encode())
                data = table.data
                blocks = data.scan_blocks(ts)
                persisted = [b for b in blocks if isinstance(b, PersistedBlock)]
                if persisted:
                    assert loader is not None
                    pinned = loader.load(persisted, columns=table.schema.names)
                    assert pinned is not None  # (it loads what the cache lacks)
                    try:
                        parts = table_scans.rows_at(data, ts, blocks, pinned)
                    finally:
                        pinned.release()
                else:
                    parts = table_scans.rows_at(data, ts, blocks, NothingLoaded())
                keyed: list[tuple[str, dict[str, object]]] = []
                for part in parts:
                    key_columns = [part.column(i).to_pylist() for i in table.schema.key_indexes]
                    keys = (
                        key_columns[0]
                        if len(key_columns) == 1
                        else list(zip(*key_columns, strict=True))
                    )
                    keyed.extend(zip(map(repr, keys), part.to_pylist(), strict=True))
                keyed.sort(key=lambda pair: pair[0])
                for _, row in keyed:
                    hasher.update(repr(sorted(row.items())).encode())
                    hasher.update(b"\n")
        return hasher.hexdigest()


__all__ = ["ApplyError", "EngineState"]
