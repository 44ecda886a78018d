"""The engine's committed changes, from its WAL's records: pure (records in, change rows out;
no client, no Spark). The shell is spark_jobs/stream_changes_source.py.

Why each rule:

* Only committed transactions: the engine logs a transaction only once it commits (engine/
  FORMAT.md: "one committed transaction is exactly one entry", type AC), so every entry is a
  commit; nothing is rolled back later.
* Commit order = DSN order: the engine makes commits visible in WAL order (ARCHITECTURE.md §1)
  and the driver hands entries out in DSN order, which is not LSN order (out-of-order
  completions, retried copies, skip records after a writer's restart). The driver's own replay
  core (`tae_driver.replay.Replayer`) turns records in LSN order into entries in DSN order, so
  its rules are the ones the engine replays with.
* Micro-batch boundaries sit where nothing is pending (`resolved`): every record read is
  applied, discarded or a copy. An offset is then `(lsn, dsn, applied)`: records <= lsn read,
  DSNs <= dsn handed out; a new Replayer resumes there exactly (`resolved_dsn`). Records read
  past the last resolved point are read again by the next batch.
* Schemas come from the catalog commands in the log (`UpdateCatalog`). A table created below
  the log's truncation point (its schema only in a checkpoint) is refused with
  `ChangesRefused`: this stream does not read checkpoints.

Changes (one row each), in DSN order and command order within a transaction:

    op               table     key                columns
    create_database  db        null               null
    drop_database    db        null               null
    create_table     db.t      key columns JSON   {"columns": [[name, type, nullable]...]}
    drop_table       db.t      null               null
    insert           db.t      the key, JSON      the row, JSON (engine/json_rows.py's values)
    delete           db.t      the key, JSON      null (block_id, row_offset name the row too)
    insert_block     db.t      null               {"object", "row_group", "rows"}

A key is written the same way for an insert and a delete of the same row: the key column's
JSON value, or a JSON array of them in key order for a compound key. A delete's key comes from
the WAL's DeleteKeys command (engine/FORMAT.md, entry version 3, issue 23); it is null for a
delete logged without keys: by a build before version 3, or by a transaction that deleted more
than `DELETE_KEYS_LOGGED_MAX` rows or whose keys did not fit its entry (engine/limits.py); its
`(block_id, row_offset)` still names the row. `insert_block` is a large transaction's rows
written straight to an object (decision 0006; a CreateBlock without a DropBlock in its entry):
its rows are not in the log, so they are not emitted one by one (a consumer reads the object);
rows the same transaction deleted again come as deletes of that block, with their keys. Flush,
merge and compaction (CreateBlock with DropBlock) move rows without changing them and give no
change: not their CreateBlocks, nor the deletes they carry onto their outputs (those rows'
deletes were emitted from the entries that deleted them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.json_rows import json_lines, json_value
from engine.schema import Schema
from engine.wal.batch import KIND_DAMAGED, decode_entries
from engine.wal.entry import (
    Append,
    CatalogKind,
    CatalogOp,
    CreateBlock,
    Delete,
    DropBlock,
    TxnEntry,
    UpdateCatalog,
)
from spark_jobs.errors import BadInput, ChangesRefused, InputCorrupt
from tae_driver.backend import Record
from tae_driver.errors import ReplayError
from tae_driver.replay import Apply, Finished, ReplayDecision, Replayer, Wait

CHANGES_DDL = (
    "table string, op string, key string, columns string, commit_ts long, dsn long, "
    "lsn long, block_id long, row_offset long"
)
Change = tuple[str, str, str | None, str | None, int, int, int, int | None, int | None]


@dataclass(frozen=True, slots=True)
class ChangesOffset:
    lsn: int
    """Every record with an LSN <= this was read."""
    dsn: int
    """Every DSN <= this was handed out (or skipped as a truncated prefix)."""
    applied: bool
    """Some entry was handed out: a missing DSN below a safe one is now a hole."""

    def to_json(self) -> dict[str, Any]:
        return {"lsn": self.lsn, "dsn": self.dsn, "applied": self.applied}

    @staticmethod
    def from_json(raw: object) -> ChangesOffset:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise BadInput(f"change offset {raw!r}: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise BadInput(f'change offset {raw!r}: expected {{"lsn", "dsn", "applied"}}')
        lsn, dsn, applied = raw.get("lsn"), raw.get("dsn"), raw.get("applied")
        for name, value in (("lsn", lsn), ("dsn", dsn)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadInput(f"change offset: {name} {value!r} is not a whole number >= 0")
        if not isinstance(applied, bool):
            raise BadInput(f"change offset: applied {applied!r} is not true or false")
        assert isinstance(lsn, int) and isinstance(dsn, int)
        return ChangesOffset(lsn, dsn, applied)


@dataclass(slots=True)
class _Table:
    db_id: int
    name: str  # "db.table"
    schema: Schema


class Catalog:
    """Databases and tables by id, with changes since the last resolved point kept apart
    (`commit` keeps them, `rollback` drops them: records past the end of a batch are read
    again by the next one)."""

    def __init__(self) -> None:
        self.databases: dict[int, str] = {}
        self.tables: dict[int, _Table] = {}
        self._databases_new: dict[int, str | None] = {}
        self._tables_new: dict[int, _Table | None] = {}

    def database(self, db_id: int) -> str | None:
        if db_id in self._databases_new:
            return self._databases_new[db_id]
        return self.databases.get(db_id)

    def table(self, table_id: int) -> _Table | None:
        if table_id in self._tables_new:
            return self._tables_new[table_id]
        return self.tables.get(table_id)

    def set_database(self, db_id: int, name: str | None) -> None:
        self._databases_new[db_id] = name

    def set_table(self, table_id: int, table: _Table | None) -> None:
        self._tables_new[table_id] = table

    def commit(self) -> None:
        for db_id, db_name in self._databases_new.items():
            if db_name is None:
                self.databases.pop(db_id, None)
            else:
                self.databases[db_id] = db_name
        for table_id, table in self._tables_new.items():
            if table is None:
                self.tables.pop(table_id, None)
            else:
                self.tables[table_id] = table
        self.rollback()

    def rollback(self) -> None:
        self._databases_new = {}
        self._tables_new = {}


class ChangeReader:
    """Records of one shard in LSN order in (`offer`), changes out in DSN order, handed over
    at resolved points (`cut`). `first_lsn`: the log's first retained LSN, for errors."""

    def __init__(
        self, start: ChangesOffset, catalog: Catalog, first_lsn: int, *, rows: bool = True
    ) -> None:
        self._replayer = Replayer(
            truncated_lsn=start.lsn, resolved_dsn=start.dsn, resolved_applied=start.applied
        )
        self._catalog = catalog
        self._first_lsn = first_lsn
        self._rows = rows
        self._changes: list[Change] = []  # since the last cut
        self.point = start

    @property
    def last_lsn(self) -> int:
        return self._replayer.last_lsn

    @property
    def resolved(self) -> bool:
        return self._replayer.pending_records == 0

    @property
    def changes_waiting(self) -> int:
        return len(self._changes)

    def offer(self, lsn: int, payload: bytes) -> None:
        replayer = self._replayer
        try:
            replayer.offer(Record(lsn, payload))
            while True:
                step = replayer.step(at_end=False)
                if isinstance(step, Wait):
                    return
                assert not isinstance(step, Finished)
                assert isinstance(step, Apply)
                self._apply(step)
                replayer.decided([ReplayDecision.APPLY] * len(step.entries))
        except ReplayError as exc:
            raise ChangesRefused(f"the WAL breaks a replay rule: {exc}") from None

    def cut(self) -> list[Change]:
        """The changes up to here, which must be a resolved point; `point` moves here."""
        assert self.resolved
        replayer = self._replayer
        self._catalog.commit()
        self.point = ChangesOffset(replayer.last_lsn, replayer.last_dsn, replayer.applied_any)
        out, self._changes = self._changes, []
        return out

    def abandon(self) -> None:
        """Forget what was read past `point` (the next batch reads it again)."""
        self._catalog.rollback()
        self._changes = []

    def _apply(self, step: Apply) -> None:
        dsns = list(range(step.start_dsn, step.start_dsn + len(step.entries)))
        decoded = decode_entries(step.entries, dsns)
        for index, dsn in enumerate(dsns):
            if decoded.kinds[index] == KIND_DAMAGED:
                raise InputCorrupt(
                    f"logsvc LSN {step.lsn}", 0, f"DSN {dsn}: {decoded.errors[index]}"
                )
            if not decoded.is_txn[index]:
                continue  # a checkpoint entry: no change of its own
            entry = decoded.entry(index)
            assert isinstance(entry, TxnEntry)
            self._entry(entry, dsn, step.lsn)

    def _entry(self, entry: TxnEntry, dsn: int, lsn: int) -> None:
        moves_rows = any(isinstance(cmd, DropBlock) for cmd in entry.commands)
        ts = entry.commit_ts
        out = self._changes
        for cmd in entry.commands:
            if isinstance(cmd, UpdateCatalog):
                self._catalog_command(cmd, ts, dsn, lsn)
            elif isinstance(cmd, Append):
                table = self._table(cmd.table_id, dsn)
                if self._rows:
                    self._inserts(table, cmd, ts, dsn, lsn)
            elif isinstance(cmd, Delete):
                table = self._table(cmd.table_id, dsn)
                if self._rows and not moves_rows:
                    self._deletes(table, cmd, ts, dsn, lsn)
            elif isinstance(cmd, CreateBlock) and not moves_rows:
                table = self._table(cmd.table_id, dsn)
                if self._rows:
                    where = {
                        "object": cmd.object_name,
                        "row_group": cmd.row_group,
                        "rows": cmd.rows,
                    }
                    out.append(
                        (
                            table.name,
                            "insert_block",
                            None,
                            json.dumps(where),
                            ts,
                            dsn,
                            lsn,
                            cmd.block_id,
                            None,
                        )
                    )

    def _catalog_command(self, cmd: UpdateCatalog, ts: int, dsn: int, lsn: int) -> None:
        catalog = self._catalog
        if cmd.kind is CatalogKind.DATABASE:
            catalog.set_database(cmd.db_id, cmd.name if cmd.op is CatalogOp.CREATE else None)
            op = "create_database" if cmd.op is CatalogOp.CREATE else "drop_database"
            if self._rows:
                self._changes.append((cmd.name, op, None, None, ts, dsn, lsn, None, None))
            return
        db_name = catalog.database(cmd.db_id)
        if db_name is None:
            raise self._unknown(f"database {cmd.db_id} (of table {cmd.name!r})", dsn)
        name = f"{db_name}.{cmd.name}"
        if cmd.op is CatalogOp.CREATE:
            assert cmd.schema is not None
            catalog.set_table(cmd.table_id, _Table(cmd.db_id, name, cmd.schema))
            if self._rows:
                key = json.dumps(list(cmd.schema.primary_key))
                columns = json.dumps(
                    {"columns": [[c.name, c.type, c.nullable] for c in cmd.schema.columns]}
                )
                self._changes.append((name, "create_table", key, columns, ts, dsn, lsn, None, None))
        else:
            catalog.set_table(cmd.table_id, None)
            if self._rows:
                self._changes.append((name, "drop_table", None, None, ts, dsn, lsn, None, None))

    def _table(self, table_id: int, dsn: int) -> _Table:
        table = self._catalog.table(table_id)
        if table is None:
            raise self._unknown(f"table {table_id}", dsn)
        return table

    def _unknown(self, what: str, dsn: int) -> ChangesRefused:
        return ChangesRefused(
            f"DSN {dsn} uses {what}, whose create is not in the retained log (it starts at "
            f"LSN {self._first_lsn}; below it the engine's checkpoints hold the catalog, which "
            "this stream does not read): start the stream before the engine's first "
            "checkpoint truncates the log, or read that table's history from its checkpoint "
            "with `python -m spark_jobs replay_as_of`"
        )

    def _deletes(self, table: _Table, cmd: Delete, ts: int, dsn: int, lsn: int) -> None:
        out = self._changes
        block_id = cmd.block_id
        if cmd.keys is None:  # an old entry, or too many keys to log (the docstring)
            for offset in cmd.rows:
                out.append((table.name, "delete", None, None, ts, dsn, lsn, block_id, offset))
            return
        compound = len(cmd.keys.columns) > 1
        for offset, value in zip(cmd.rows, cmd.keys.values, strict=True):
            key = json.dumps([json_value(v) for v in value] if compound else json_value(value))
            out.append((table.name, "delete", key, None, ts, dsn, lsn, block_id, offset))

    def _inserts(self, table: _Table, cmd: Append, ts: int, dsn: int, lsn: int) -> None:
        key_names = table.schema.primary_key
        lines = json_lines(pa.Table.from_batches([cmd.batch]))
        infos = iter(cmd.infos)
        info = next(infos)
        taken = 0
        for line in lines:
            while taken == info.rows:
                info, taken = next(infos), 0
            row = json.loads(line)
            key_values = [row[k] for k in key_names]
            key = json.dumps(key_values[0] if len(key_values) == 1 else key_values)
            self._changes.append(
                (table.name, "insert", key, line, ts, dsn, lsn, info.block_id, info.offset + taken)
            )
            taken += 1
