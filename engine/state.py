"""The engine's committed state, and the one function that changes it: `apply(entry)`.

Why one function: a commit becoming visible and replay after a restart run the very same code
on the very same `TxnEntry` values, so what replay rebuilds is what the running engine had
(issue 13 "Restart": a digest taken before a kill -9 equals the one after replay).
"""

from __future__ import annotations

import xxhash

from engine.catalog import Catalog
from engine.storage import ApplyError
from engine.wal.entry import Append, Delete, TxnEntry, UpdateCatalog


class EngineState:
    def __init__(self) -> None:
        self.catalog = Catalog()
        self.applied_ts = 0
        """commit_ts of the last applied transaction."""
        self.entries_applied = 0

    def apply(self, entry: TxnEntry) -> None:
        """Apply one committed transaction. Raises `ApplyError` when it does not fit (on
        replay: a corrupt log; on the commit path: a bug). Commands are checked in order and
        an entry that fails half way leaves the state unusable: the caller stops."""
        commit_ts = entry.commit_ts
        if commit_ts <= self.applied_ts:
            raise ApplyError(f"commit_ts {commit_ts} is not above the applied {self.applied_ts}")
        catalog = self.catalog
        for cmd in entry.commands:
            if isinstance(cmd, UpdateCatalog):
                catalog.apply(cmd, commit_ts)
            elif isinstance(cmd, Append):
                catalog.live_table(cmd.table_id, commit_ts).data.apply_append(cmd, commit_ts)
            else:
                assert isinstance(cmd, Delete)
                catalog.live_table(cmd.table_id, commit_ts).data.apply_delete(cmd, commit_ts)
        self.applied_ts = commit_ts
        self.entries_applied += 1

    def digest(self, ts: int) -> str:
        """A hash of everything visible at `ts`: databases, tables with their schemas, and
        every table's rows in key order. Equal states give equal digests."""
        hasher = xxhash.xxh3_128()
        catalog = self.catalog
        for database in catalog.databases_at(ts):
            hasher.update(f"db {database.name!r}\n".encode())
            for table in catalog.tables_at(database.db_id, ts):
                hasher.update(f"table {table.name!r} {table.schema!r}\n".encode())
                data = table.data
                rows = []
                for key in sorted(data.keys, key=repr):
                    version = data.version_at(key, ts)
                    if version is not None:
                        rows.append(data.row(version))
                for row in rows:
                    hasher.update(repr(sorted(row.items())).encode())
                    hasher.update(b"\n")
        return hasher.hexdigest()


__all__ = ["ApplyError", "EngineState"]
