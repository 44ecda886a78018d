"""replay_as_of's pure core, shared by the local and the Spark engine: which WAL records to
replay, the catalog as of a timestamp, and the base state replay starts from.

The model is Delta Lake's (spark.md §2): state(T) = base + the log entries with
base.ckpt_ts < commit_ts <= T. Rows are keyed by (table, block_id, offset): an Append only
adds keys and a Delete is a tombstone, so "latest wins" is a union plus an anti-join with
no global order; only the catalog is order-sensitive, and it is small: it is replayed on the
driver by the engine's own `Catalog`.

**Which records** (`plan_replay`, from the record level of one log: one shard replica, or the
file WAL). These are tae_driver's replay rules (tae_driver/replay.py), stated over sets:

1. a SKIP record removes the copies it names by (start DSN, LSN);
2. copies of one DSN range must be byte-identical records (the driver's own rule: "same
   DSNs with other bytes" is `ReplayOverlapError`); two copies that differ, or records whose
   DSN ranges overlap without being equal, fail the job (`CopiesDisagree`). The copy with
   the lowest LSN is the one replayed;
3. the DSNs must run from 1 (the base's truncate DSN + 1, once checkpoints exist) without a
   gap. A gap at or below the highest safe DSN any record published is lost acknowledged
   data (`LogHole`); above it, the records after the gap are trailing (a crash mid-window;
   never acknowledged) and are left out, as the driver leaves them out;
4. the engine applies an entry only if its commit_ts is above every earlier one (a repeated
   transaction is ignored: engine.py `_replay_wal`); `repeated_dsns` finds those.

**The base state.** Phase 1 has none (the engine writes no checkpoint yet: issue 14), so the
base is `EMPTY_BASE`: nothing applied, ckpt_ts 0, truncate DSN 0. A log that was truncated
(a TRUNCATE at any LSN, or DSNs that do not start at 1) cannot be replayed from the empty
base: `ReplayRefused`. Issue 14's checkpoint (Parquet objects + a JSON manifest: ckpt_ts, per-
shard truncate DSN, catalog snapshot, file list) plugs in as another `BaseState`: its catalog
seeds `replay_catalog`, its rows are unioned with the replayed appends (and anti-joined with
the replayed deletes) by both engines, and `plan_replay` starts the DSN run at its
truncate DSN + 1 and filters commit_ts > ckpt_ts; the refusal becomes "T below the oldest
retained checkpoint".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.catalog import Catalog
from engine.schema import Schema
from engine.storage import ApplyError
from engine.wal.entry import CatalogKind, CatalogOp, UpdateCatalog
from spark_jobs.errors import CopiesDisagree, LogHole, ReplayFailed, ReplayRefused
from spark_jobs.schemas import schema_from_json


@dataclass(frozen=True, slots=True)
class BaseState:
    """What replay starts from: a checkpoint, or nothing (phase 1)."""

    ckpt_ts: int
    truncate_dsn: int
    description: str


EMPTY_BASE = BaseState(ckpt_ts=0, truncate_dsn=0, description="none (replayed from DSN 1)")


@dataclass(frozen=True, slots=True)
class DriverRecord:
    """One backend record of the log, as the record level describes it."""

    lsn: int
    start_dsn: int
    count: int  # 0: a safe marker
    safe_dsn: int
    checksum: int


@dataclass(slots=True)
class ReplayPlan:
    kept_lsns: set[int] = field(default_factory=set)
    last_dsn: int = 0  # every DSN in [1, last_dsn] is replayed from kept_lsns
    duplicate_lsns: set[int] = field(default_factory=set)
    skipped_lsns: set[int] = field(default_factory=set)
    trailing_lsns: set[int] = field(default_factory=set)
    safe_dsn: int = 0

    @property
    def excluded_lsns(self) -> set[int]:
        return self.duplicate_lsns | self.skipped_lsns | self.trailing_lsns

    def describe(self) -> dict[str, object]:
        return {
            "last_dsn": self.last_dsn,
            "records_replayed": len(self.kept_lsns),
            "duplicate_copies_ignored": len(self.duplicate_lsns),
            "records_skipped_by_skip_records": len(self.skipped_lsns),
            "trailing_records_ignored": len(self.trailing_lsns),
            "safe_dsn": self.safe_dsn,
        }


def plan_replay(
    records: Iterable[DriverRecord],
    skips: Iterable[tuple[int, int]],
    truncated_lsn: int,
    where: str,
    base: BaseState = EMPTY_BASE,
) -> ReplayPlan:
    """Rules 1-3 of the module doc for one log (`where` names it in errors)."""
    if truncated_lsn > 0 and base is EMPTY_BASE:
        raise ReplayRefused(
            f"{where}: the WAL was truncated up to LSN {truncated_lsn}, so the entries before "
            "it are gone; replay needs the checkpoint that covers them, and phase 1 reads no "
            "checkpoint (issue 14): no timestamp can be answered from this log alone"
        )
    plan = ReplayPlan()
    skip_set = set(skips)
    by_range: dict[tuple[int, int], DriverRecord] = {}
    for record in sorted(records, key=lambda r: r.lsn):
        plan.safe_dsn = max(plan.safe_dsn, record.safe_dsn)
        if record.count == 0:
            continue
        if (record.start_dsn, record.lsn) in skip_set:
            plan.skipped_lsns.add(record.lsn)
            continue
        key = (record.start_dsn, record.start_dsn + record.count - 1)
        first = by_range.get(key)
        if first is None:
            by_range[key] = record
        elif first.checksum != record.checksum:
            raise CopiesDisagree(
                f"{where}: DSNs {key[0]}-{key[1]} have two different copies (LSN {first.lsn} "
                f"and LSN {record.lsn}: record checksums differ) and no skip record discards "
                "either: the log diverged; run lsn_audit"
            )
        else:
            plan.duplicate_lsns.add(record.lsn)
    expected = base.truncate_dsn + 1
    trailing_from: int | None = None
    for (start, end), record in sorted(by_range.items()):
        if trailing_from is not None:
            plan.trailing_lsns.add(record.lsn)
            continue
        if start < expected:
            raise CopiesDisagree(
                f"{where}: the record at LSN {record.lsn} holds DSNs {start}-{end}, which "
                f"overlap DSNs already held by another record (up to {expected - 1})"
            )
        if start > expected:
            if expected == base.truncate_dsn + 1 and base is EMPTY_BASE:
                raise ReplayRefused(
                    f"{where}: the log starts at DSN {start}: DSNs {expected}-{start - 1} are "
                    "not in it (truncated); replay needs a checkpoint (phase 1 reads none)"
                )
            if expected <= plan.safe_dsn:
                raise LogHole(
                    f"{where}: DSN {expected} is missing but a record says every DSN up to "
                    f"{plan.safe_dsn} was durable: acknowledged data is lost"
                )
            trailing_from = expected
            plan.trailing_lsns.add(record.lsn)
            continue
        plan.kept_lsns.add(record.lsn)
        expected = end + 1
    plan.last_dsn = expected - 1
    return plan


def repeated_dsns(entries: Iterable[tuple[int, int]]) -> set[int]:
    """Rule 4: the DSNs whose commit_ts is not above every earlier DSN's (dsn, commit_ts)."""
    repeated = set()
    highest = -1
    for dsn, commit_ts in sorted(entries):
        if commit_ts <= highest:
            repeated.add(dsn)
        highest = max(highest, commit_ts)
    return repeated


# --- the catalog ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CatalogCommand:
    """A catalog command of the command level (in the entry at `dsn`)."""

    dsn: int
    cmd_index: int
    commit_ts: int
    kind: str  # "database" | "table"
    op: str  # "create" | "drop"
    db_id: int
    table_id: int
    name: str
    schema_json: str | None


@dataclass(frozen=True, slots=True)
class LiveTable:
    db_id: int
    db_name: str
    table_id: int
    name: str
    schema: Schema


def replay_catalog(commands: Iterable[CatalogCommand], as_of: int, where: str) -> list[LiveTable]:
    """The tables live at `as_of`, by replaying the catalog commands in DSN order through the
    engine's own `Catalog`."""
    catalog = Catalog()
    for cmd in sorted(commands, key=lambda c: (c.dsn, c.cmd_index)):
        update = UpdateCatalog(
            CatalogKind.DATABASE if cmd.kind == "database" else CatalogKind.TABLE,
            CatalogOp.CREATE if cmd.op == "create" else CatalogOp.DROP,
            cmd.db_id,
            cmd.table_id,
            cmd.name,
            None if cmd.schema_json is None else schema_from_json(cmd.schema_json),
        )
        try:
            catalog.apply(update, cmd.commit_ts)
        except ApplyError as exc:
            raise ReplayFailed(f"{where}: DSN {cmd.dsn} does not apply: {exc}") from None
    live = []
    for database in catalog.databases_at(as_of):
        for table in catalog.tables_at(database.db_id, as_of):
            live.append(
                LiveTable(database.db_id, database.name, table.table_id, table.name, table.schema)
            )
    return live
