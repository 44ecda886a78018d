"""The catalog: databases and tables with MVCC timestamps (create@, delete@).

Why (seed "Catalog", shared/reference/tae-engine.md): the catalog is versioned like the data,
so a snapshot at `ts` sees the databases and tables that existed at `ts`, and a table dropped
and created again under the same name is two entries. An entry is visible at `ts` when
`create_ts <= ts < delete_ts`. While a transaction creates or drops an entry, the change lives
in its workspace (the seed's UncommitTS); it reaches the catalog when the transaction becomes
visible, stamped with its commit_ts. Blocks (and, with issue 14, objects/segments) hang under
each table in its `TableData`.

Ids are unique for the life of the engine (never reused, also across restarts: replay raises
the allocator past every id it sees).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.schema import Schema
from engine.storage import ApplyError, TableData
from engine.wal.entry import CatalogKind, CatalogOp, UpdateCatalog

TS_NEVER = (1 << 64) - 1
"""delete_ts of an entry that is not dropped."""


@dataclass(slots=True, eq=False)
class DatabaseEntry:
    db_id: int
    name: str
    create_ts: int
    delete_ts: int = TS_NEVER

    def visible(self, ts: int) -> bool:
        return self.create_ts <= ts < self.delete_ts


@dataclass(slots=True, eq=False)
class TableEntry:
    table_id: int
    db_id: int
    name: str
    schema: Schema
    create_ts: int
    delete_ts: int = TS_NEVER
    data: TableData = field(init=False)

    def __post_init__(self) -> None:
        self.data = TableData(self.name, self.schema)

    def visible(self, ts: int) -> bool:
        return self.create_ts <= ts < self.delete_ts


class Catalog:
    def __init__(self) -> None:
        self.databases: dict[int, DatabaseEntry] = {}
        self.tables: dict[int, TableEntry] = {}
        self._db_names: dict[str, list[DatabaseEntry]] = {}
        self._table_names: dict[tuple[int, str], list[TableEntry]] = {}
        self._tables_of: dict[int, list[TableEntry]] = {}
        self._next_id = 1

    @property
    def next_id(self) -> int:
        return self._next_id

    @next_id.setter
    def next_id(self, value: int) -> None:
        assert value >= self._next_id
        self._next_id = value

    def restore_database(self, db_id: int, name: str, create_ts: int) -> DatabaseEntry:
        """A database live at a checkpoint (engine/checkpoint/plan.py `restore`)."""
        assert db_id not in self.databases
        entry = DatabaseEntry(db_id, name, create_ts)
        self.databases[db_id] = entry
        self._db_names.setdefault(name, []).append(entry)
        self._seen_id(db_id)
        return entry

    def restore_table(
        self, table_id: int, db_id: int, name: str, schema: Schema, create_ts: int
    ) -> TableEntry:
        """A table live at a checkpoint."""
        assert table_id not in self.tables and db_id in self.databases
        entry = TableEntry(table_id, db_id, name, schema, create_ts)
        self.tables[table_id] = entry
        self._table_names.setdefault((db_id, name), []).append(entry)
        self._tables_of.setdefault(db_id, []).append(entry)
        self._seen_id(table_id)
        return entry

    def allocate_id(self) -> int:
        allocated = self._next_id
        self._next_id += 1
        return allocated

    def _seen_id(self, entry_id: int) -> None:
        self._next_id = max(self._next_id, entry_id + 1)

    # --- lookups at a timestamp ---------------------------------------------------------------

    def database(self, name: str, ts: int) -> DatabaseEntry | None:
        for entry in reversed(self._db_names.get(name, ())):
            if entry.visible(ts):
                return entry
        return None

    def table(self, db_id: int, name: str, ts: int) -> TableEntry | None:
        for entry in reversed(self._table_names.get((db_id, name), ())):
            if entry.visible(ts):
                return entry
        return None

    def databases_at(self, ts: int) -> list[DatabaseEntry]:
        return sorted((e for e in self.databases.values() if e.visible(ts)), key=lambda e: e.name)

    def tables_at(self, db_id: int, ts: int) -> list[TableEntry]:
        return sorted(
            (e for e in self._tables_of.get(db_id, ()) if e.visible(ts)), key=lambda e: e.name
        )

    # --- applying committed commands ---------------------------------------------------------

    def apply(self, cmd: UpdateCatalog, commit_ts: int) -> None:
        if cmd.kind is CatalogKind.DATABASE:
            self._apply_database(cmd, commit_ts)
        else:
            self._apply_table(cmd, commit_ts)

    def _apply_database(self, cmd: UpdateCatalog, commit_ts: int) -> None:
        if cmd.table_id != 0 or cmd.schema is not None:
            raise ApplyError(f"database command for {cmd.name!r} carries a table")
        if cmd.op is CatalogOp.CREATE:
            if cmd.db_id in self.databases:
                raise ApplyError(f"database id {cmd.db_id} created twice")
            if self.database(cmd.name, commit_ts) is not None:
                raise ApplyError(f"database {cmd.name!r} created while one is live")
            entry = DatabaseEntry(cmd.db_id, cmd.name, commit_ts)
            self.databases[cmd.db_id] = entry
            self._db_names.setdefault(cmd.name, []).append(entry)
            self._seen_id(cmd.db_id)
            return
        entry_or_none = self.databases.get(cmd.db_id)
        if entry_or_none is None or not entry_or_none.visible(commit_ts):
            raise ApplyError(f"drop of database id {cmd.db_id}, which is not live")
        if self.tables_at(cmd.db_id, commit_ts):
            raise ApplyError(f"drop of database {cmd.name!r} while it has tables")
        entry_or_none.delete_ts = commit_ts

    def _apply_table(self, cmd: UpdateCatalog, commit_ts: int) -> None:
        database = self.databases.get(cmd.db_id)
        if database is None or not database.visible(commit_ts):
            raise ApplyError(f"table {cmd.name!r} in database id {cmd.db_id}, which is not live")
        if cmd.op is CatalogOp.CREATE:
            if cmd.schema is None:
                raise ApplyError(f"create of table {cmd.name!r} without a schema")
            if cmd.table_id in self.tables or cmd.table_id in self.databases:
                raise ApplyError(f"table id {cmd.table_id} created twice")
            if self.table(cmd.db_id, cmd.name, commit_ts) is not None:
                raise ApplyError(f"table {cmd.name!r} created while one is live")
            entry = TableEntry(cmd.table_id, cmd.db_id, cmd.name, cmd.schema, commit_ts)
            self.tables[cmd.table_id] = entry
            self._table_names.setdefault((cmd.db_id, cmd.name), []).append(entry)
            self._tables_of.setdefault(cmd.db_id, []).append(entry)
            self._seen_id(cmd.table_id)
            return
        table = self.tables.get(cmd.table_id)
        if table is None or not table.visible(commit_ts) or table.db_id != cmd.db_id:
            raise ApplyError(f"drop of table id {cmd.table_id}, which is not live")
        table.delete_ts = commit_ts

    def live_table(self, table_id: int, ts: int) -> TableEntry:
        table = self.tables.get(table_id)
        if table is None or not table.visible(ts):
            raise ApplyError(f"table id {table_id} is not live at {ts}")
        return table
