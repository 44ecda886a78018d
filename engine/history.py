"""An engine's commit history from its retained WAL (issue 24 item 2): WAL entries in, one
`HistoryRow` per commit out. No I/O: `engine/history_cli.py` reads the WAL and the newest
checkpoint's catalog and feeds them here, one entry at a time.

Why a core of its own: what a commit did (tables touched, rows appended and deleted, whether
it was a user's transaction or the engine's own flush, merge or compaction) is a pure reading
of one `TxnEntry`, given two things learned from earlier entries: table names (ids are in the
entries, names only in the `UpdateCatalog` that created them, or in a checkpoint's catalog)
and each live block's level (a rewrite of an L0 block is a flush, of a persisted one a
compaction). Both are kept only for live tables and blocks, so memory follows the engine's
catalog and block count, never the WAL's length.

Reading rules, the same as replay's (engine/replay.py): entries come in DSN order; a second
copy of a transaction (commit_ts at or below one already read) is counted and skipped; a
checkpoint entry (`CheckpointEntry`) is a maintenance row that changes no data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.clock import TS_MAX, ts_isoformat
from engine.wal.entry import (
    Append,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    CreateBlock,
    Delete,
    DropBlock,
    Origin,
    TxnEntry,
    UpdateCatalog,
)

KIND_COMMIT = "commit"
KIND_FLUSH = "flush"
KIND_MERGE = "merge"
KIND_COMPACT = "compact"
KIND_REWRITE = "rewrite"
"""A rewrite of one block whose level the retained history does not tell (it was created
before the WAL's start and is not in the newest checkpoint): a flush or a compaction."""
KIND_CHECKPOINT = "checkpoint"
MAINTENANCE_KINDS = frozenset({KIND_FLUSH, KIND_MERGE, KIND_COMPACT, KIND_REWRITE, KIND_CHECKPOINT})

LEVEL_L0 = 0
"""An L0 block (rows appended in memory); persisted blocks keep `BlockLevel`'s 1 and 2."""


@dataclass(frozen=True, slots=True)
class TableChange:
    """What one entry did to one table. `table` is `db.name`, or `db#ID.table#ID` for a
    table whose name is neither in the retained WAL nor in the newest checkpoint."""

    table: str
    table_id: int
    rows_appended: int = 0
    rows_deleted: int = 0
    catalog: str | None = None
    """"create table", "drop table", "create database" or "drop database"."""
    blocks_in: int = 0
    """A rewrite's input blocks (they leave the table)."""
    blocks_out: int = 0
    """Blocks that enter the table: a rewrite's outputs, or a large transaction's rows."""
    rows_out: int = 0
    """Rows in `blocks_out` (a rewrite moves rows; it appends none)."""


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One commit (or, `kind == "checkpoint"`, one checkpoint: `commit_ts` is then its
    ckp_ts, the newest commit it covers)."""

    dsn: int
    commit_ts: int
    kind: str
    changes: tuple[TableChange, ...]
    origin: tuple[str, int] | None = None
    """A compute node's (client_id, seq) for a commit it sent (issue 15)."""

    @property
    def maintenance(self) -> bool:
        return self.kind in MAINTENANCE_KINDS


@dataclass(frozen=True, slots=True)
class CatalogName:
    """A name the newest checkpoint's catalog gives: a database (`table_id == 0`) or a
    table."""

    db_id: int
    table_id: int
    name: str


@dataclass(frozen=True, slots=True)
class Filter:
    """Which rows to list: commit_ts in [since_ts, until_ts] (both included), touching
    `table` (`db.name`, None: any), maintenance rows only when `maintenance`."""

    since_ts: int = 0
    until_ts: int = TS_MAX
    table: str | None = None
    maintenance: bool = False


@dataclass(slots=True)
class Retained:
    """What the retained WAL held: DSNs [first_dsn, last_dsn] (0, 0: empty), its transactions'
    commit_ts range, and counts."""

    first_dsn: int = 0
    last_dsn: int = 0
    first_commit_ts: int = 0
    last_commit_ts: int = 0
    commits: int = 0
    maintenance: int = 0
    checkpoints: int = 0
    duplicates: int = 0
    listed: int = 0


class History:
    """Feed entries in DSN order (`feed`); each returns its row when the filter keeps it."""

    def __init__(
        self,
        names: Iterable[CatalogName] = (),
        block_levels: Iterable[tuple[int, int, int]] = (),
        row_filter: Filter = Filter(),
    ) -> None:
        """`names`: the newest checkpoint's catalog; `block_levels`: its blocks as
        (table_id, block_id, level), level 0 for an L0 block."""
        self._db_names: dict[int, str] = {}
        self._table_names: dict[int, tuple[int, str]] = {}
        for item in names:
            if item.table_id == 0:
                self._db_names[item.db_id] = item.name
            else:
                self._table_names[item.table_id] = (item.db_id, item.name)
        self._levels: dict[int, dict[int, int]] = {}
        for table_id, block_id, level in block_levels:
            self._levels.setdefault(table_id, {})[block_id] = level
        self.filter = row_filter
        self.retained = Retained()

    @property
    def blocks_tracked(self) -> int:
        """Blocks whose level is remembered: the live tables' live blocks, never more."""
        return sum(len(levels) for levels in self._levels.values())

    def feed(self, dsn: int, entry: TxnEntry | CheckpointEntry) -> HistoryRow | None:
        retained = self.retained
        if retained.first_dsn == 0:
            retained.first_dsn = dsn
        assert dsn > retained.last_dsn, "entries come in DSN order"
        retained.last_dsn = dsn
        if isinstance(entry, CheckpointEntry):
            retained.checkpoints += 1
            return self._keep(HistoryRow(dsn, entry.ckp_ts, KIND_CHECKPOINT, ()))
        if entry.commit_ts <= retained.last_commit_ts:
            retained.duplicates += 1  # a second copy (replay skips it the same way)
            return None
        if retained.first_commit_ts == 0:
            retained.first_commit_ts = entry.commit_ts
        retained.last_commit_ts = entry.commit_ts
        row = self._read(dsn, entry)
        if row.maintenance:
            retained.maintenance += 1
        else:
            retained.commits += 1
        return self._keep(row)

    def _keep(self, row: HistoryRow) -> HistoryRow | None:
        keep = self.filter
        if not keep.since_ts <= row.commit_ts <= keep.until_ts:
            return None
        if row.maintenance and not keep.maintenance:
            return None
        if keep.table is not None and row.kind != KIND_CHECKPOINT:
            changes = tuple(c for c in row.changes if c.table == keep.table)
            if not changes:
                return None
            row = dataclasses.replace(row, changes=changes)
        self.retained.listed += 1
        return row

    def _read(self, dsn: int, entry: TxnEntry) -> HistoryRow:
        changes: dict[int, dict[str, Any]] = {}
        origin: tuple[str, int] | None = None
        created: set[tuple[int, int]] = set()
        dropped: list[DropBlock] = []
        for cmd in entry.commands:
            if isinstance(cmd, CreateBlock):
                created.add((cmd.table_id, cmd.block_id))
            elif isinstance(cmd, DropBlock):
                dropped.append(cmd)
        rewrite = bool(dropped)

        def change(db_id: int, table_id: int) -> dict[str, Any]:
            return changes.setdefault(table_id, {"db_id": db_id})

        def add(fields: dict[str, Any], name: str, count: int) -> None:
            fields[name] = fields.get(name, 0) + count

        for cmd in entry.commands:
            if isinstance(cmd, UpdateCatalog):
                self._learn(cmd)
                key = cmd.table_id if cmd.kind is CatalogKind.TABLE else -cmd.db_id
                op = "create" if cmd.op is CatalogOp.CREATE else "drop"
                what = "table" if cmd.kind is CatalogKind.TABLE else "database"
                change(cmd.db_id, key)["catalog"] = f"{op} {what}"
            elif isinstance(cmd, Append):
                add(change(cmd.db_id, cmd.table_id), "rows_appended", cmd.batch.num_rows)
                levels = self._levels.setdefault(cmd.table_id, {})
                for info in cmd.infos:
                    levels.setdefault(info.block_id, LEVEL_L0)
            elif isinstance(cmd, Delete):
                fields = change(cmd.db_id, cmd.table_id)
                if (cmd.table_id, cmd.block_id) in created:
                    # Rows dead from the block's birth: deletes a rewrite carried onto its
                    # outputs, or rows a large transaction inserted and deleted again.
                    add(fields, "rows_out", -len(cmd.rows))
                else:
                    add(fields, "rows_deleted", len(cmd.rows))
            elif isinstance(cmd, CreateBlock):
                fields = change(cmd.db_id, cmd.table_id)
                add(fields, "blocks_out", 1)
                add(fields, "rows_out", cmd.rows)
            elif isinstance(cmd, DropBlock):
                add(change(cmd.db_id, cmd.table_id), "blocks_in", 1)
            elif isinstance(cmd, Origin):
                origin = (cmd.client_id, cmd.seq)
        kind = self._kind(dropped) if rewrite else KIND_COMMIT
        self._track_blocks(entry, dropped)
        out = []
        for key, fields in sorted(changes.items(), key=lambda item: self._name(item[0], item[1])):
            db_id = fields.pop("db_id")
            if not rewrite and "rows_out" in fields:
                # A large transaction's blocks (engine/spill.py): its rows, appended.
                fields["rows_appended"] = fields.get("rows_appended", 0) + fields.pop("rows_out")
            out.append(TableChange(self._name(key, {"db_id": db_id}), max(key, 0), **fields))
        return HistoryRow(dsn, entry.commit_ts, kind, tuple(out), origin)

    def _kind(self, dropped: list[DropBlock]) -> str:
        if len(dropped) > 1:
            return KIND_MERGE
        level = self._levels.get(dropped[0].table_id, {}).get(dropped[0].block_id)
        if level is None:
            return KIND_REWRITE
        return KIND_FLUSH if level == LEVEL_L0 else KIND_COMPACT

    def _track_blocks(self, entry: TxnEntry, dropped: list[DropBlock]) -> None:
        for cmd in entry.commands:
            if isinstance(cmd, CreateBlock):
                self._levels.setdefault(cmd.table_id, {})[cmd.block_id] = int(cmd.level)
            elif isinstance(cmd, UpdateCatalog) and cmd.op is CatalogOp.DROP:
                if cmd.kind is CatalogKind.TABLE:
                    self._levels.pop(cmd.table_id, None)
                else:
                    for table_id, (db_id, _) in self._table_names.items():
                        if db_id == cmd.db_id:
                            self._levels.pop(table_id, None)
        for cmd in dropped:
            self._levels.get(cmd.table_id, {}).pop(cmd.block_id, None)

    def _learn(self, cmd: UpdateCatalog) -> None:
        """Names are kept after a drop too: ids are never reused, and a later line (or a
        `--table` filter) may still name the dropped table."""
        if cmd.kind is CatalogKind.DATABASE:
            self._db_names[cmd.db_id] = cmd.name
        else:
            self._table_names[cmd.table_id] = (cmd.db_id, cmd.name)

    def _name(self, key: int, fields: dict[str, Any]) -> str:
        db_id = int(fields["db_id"])
        db = self._db_names.get(db_id, f"db#{db_id}")
        if key < 0:  # a database's own change
            return db
        known = self._table_names.get(key)
        return f"{db}.{known[1]}" if known is not None else f"{db}.table#{key}"


# --- output -----------------------------------------------------------------------------------


def change_text(change: TableChange) -> str:
    """`shop.items +1000 -3`, `create table shop.items`, `shop.items 16 blocks -> 1 (4096
    rows)`."""
    parts = []
    if change.catalog is not None:
        parts.append(f"{change.catalog} {change.table}")
    if change.rows_appended or change.rows_deleted:
        parts.append(f"{change.table} +{change.rows_appended} -{change.rows_deleted}")
    if change.blocks_in:
        parts.append(
            f"{change.table} {change.blocks_in} block{'s' if change.blocks_in > 1 else ''} -> "
            f"{change.blocks_out} ({change.rows_out} rows)"
        )
    if not parts:
        parts.append(f"{change.table} +0 -0")
    return ", ".join(parts)


HEADER_TEXT = "commit_ts             wall time (UTC)           dsn       kind        changes"


def row_text(row: HistoryRow) -> str:
    """One line: commit_ts, wall time, DSN, kind, and per table rows appended (+) and deleted
    (-), catalog changes, a rewrite's blocks."""
    if row.kind == KIND_CHECKPOINT:
        details = f"every commit at or before {row.commit_ts} in objects"
    else:
        details = "; ".join(change_text(c) for c in row.changes)
    if row.origin is not None:
        details += f"  [from {row.origin[0]} #{row.origin[1]}]"
    return (
        f"{row.commit_ts:<21} {ts_isoformat(row.commit_ts):<25} {row.dsn:<9} "
        f"{row.kind:<11} {details}"
    )


def row_json(row: HistoryRow) -> dict[str, Any]:
    document: dict[str, Any] = {
        "dsn": row.dsn,
        "kind": row.kind,
        "maintenance": row.maintenance,
        "wall_time": ts_isoformat(row.commit_ts),
    }
    document["ckp_ts" if row.kind == KIND_CHECKPOINT else "commit_ts"] = row.commit_ts
    document["tables"] = [
        {k: v for k, v in dataclasses.asdict(c).items() if v or k in ("table", "table_id")}
        for c in row.changes
    ]
    if row.origin is not None:
        document["origin"] = {"client_id": row.origin[0], "seq": row.origin[1]}
    return document


def retained_json(retained: Retained, cut: str | None) -> dict[str, Any]:
    document: dict[str, Any] = dataclasses.asdict(retained)
    document["first_wall_time"] = (
        ts_isoformat(retained.first_commit_ts) if retained.first_commit_ts else None
    )
    document["cut"] = cut
    return document


def retained_text(retained: Retained, cut: str | None, shown: int | None = None) -> str:
    """The closing line: what was listed (`shown` of them, with a limit), and from where the
    retained history starts."""
    if retained.first_dsn == 0:
        span = "the retained WAL is empty"
    else:
        start = (
            f"commit_ts {retained.first_commit_ts} ({ts_isoformat(retained.first_commit_ts)})"
            if retained.first_commit_ts
            else "no commit"
        )
        span = (
            f"the retained WAL holds DSN {retained.first_dsn}..{retained.last_dsn}: "
            f"{_count(retained.commits, 'commit')} and "
            f"{_count(retained.maintenance + retained.checkpoints, 'maintenance entry')}, "
            f"history from {start}"
        )
    listed = f"{retained.listed} listed" if shown is None else f"{shown} shown of {retained.listed}"
    return f"({listed}; {span}{'; ' + cut if cut else ''})"


def _count(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"
