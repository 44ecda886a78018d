"""replay_as_of's pure core, shared by the local and the Spark engine: which WAL records to
replay, the catalog as of a timestamp, and the base state replay starts from.

The model is Delta Lake's (spark.md §2): state(T) = base + the log entries with
base.ckp_ts < commit_ts <= T. Rows are keyed by (table, block_id, offset): an Append only
adds keys and a Delete is a tombstone, so "latest wins" is a union plus an anti-join with
no global order; only the catalog is order-sensitive, and it is small: it is replayed on the
driver by the engine's own `Catalog`.

**Which records** (`plan_replay`, from the record level of one log: one shard replica, or the
file WAL). These are tae_driver's replay rules (tae_driver/replay.py), stated over sets:

1. a record at or below the backend's truncated LSN (a TRUNCATE frame) is gone, as the
   driver never reads it, whatever bytes are still on disk; a SKIP record removes the
   copies it names by (start DSN, LSN);
2. copies of one DSN range must be byte-identical records (the driver's own rule: "same
   DSNs with other bytes" is `ReplayOverlapError`); two copies that differ, or records whose
   DSN ranges overlap without being equal, fail the job (`CopiesDisagree`). The copy with
   the lowest LSN is the one replayed;
3. the DSNs must run without a gap from the first one the log still holds, and that first
   one must be at most the base's `ckp_dsn + 1` (1 with no checkpoint): otherwise the
   entries in between are gone and the job is refused (`ReplayRefused`), as the engine
   refuses to open. A gap at or below the highest safe DSN any record published is lost
   acknowledged data (`LogHole`); above it, the records after the gap are trailing (a crash
   mid-window; never acknowledged) and are left out, as the driver leaves them out. A DSN
   whose first copy is at a higher LSN than a record whose safe DSN covers it is a hole too
   (a safe DSN vouches for copies at lower LSNs; a later copy means the vouched-for one was
   lost), though that later copy's bytes survive: the driver, reading in LSN order, meets the
   safe DSN before the copy and refuses there, so the plan refuses the same log;
4. an entry with `commit_ts <= ckp_ts` is in the base already and is skipped, whatever its
   DSN (truncation is never exact); after it, the engine applies an entry only if its
   commit_ts is above every earlier one (a repeated transaction is ignored: engine.py
   `_replay_wal`); `repeated_dsns` finds those.

**The base state** (`BaseState`, read by spark_jobs/checkpoints.py): the newest complete
checkpoint with `ckp_ts <= TS`, or nothing (ckp_ts 0, ckp_dsn 0: replay from DSN 1). Its
catalog seeds `replay_catalog`; its blocks' rows (minus its delta deletes) are unioned with
the replayed rows by both engines. Refusals: a TS below every retained checkpoint when the
WAL no longer starts at DSN 1, and a checkpoint whose tail is gone (the WAL's first DSN above
its `ckp_dsn + 1`).

**The rows at TS** (both engines, as sets keyed by `(table, block_id, offset)`): every block
alive at TS (in the base and not dropped by a replayed DropBlock, created by a replayed
CreateBlock and not dropped, or an L0 block receiving replayed Appends) contributes its rows
(from the Appends, the dump, or the object's row group, offsets 0..rows-1), minus the
offsets deleted at or before TS (the base's deltas and the replayed Deletes). The commands of
one entry apply in the order catalog, CreateBlock, Delete, DropBlock, Append
(engine/FORMAT.md), but as sets of effects at or before TS their order does not matter: a
Delete may name a block the same entry creates, and a dropped block loses every row.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from engine.catalog import Catalog
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.plan import restore_catalog
from engine.schema import Schema
from engine.storage import ApplyError
from engine.wal.entry import CatalogKind, CatalogOp, UpdateCatalog
from spark_jobs.checkpoints import Checkpoint
from spark_jobs.errors import CopiesDisagree, LogHole, ReplayFailed, ReplayRefused
from spark_jobs.schemas import schema_from_json


@dataclass(frozen=True, slots=True)
class BaseState:
    """What replay starts from: a checkpoint, or nothing."""

    checkpoint: Checkpoint | None = None
    why_none: str = "there is no checkpoint"
    """With no checkpoint: why (for the refusal of a truncated WAL)."""
    ignored: tuple[str, ...] = ()
    """Checkpoint directories without a manifest (cut by a crash, or retired), ignored."""

    @property
    def ckp_ts(self) -> int:
        return 0 if self.checkpoint is None else self.checkpoint.ckp_ts

    @property
    def ckp_dsn(self) -> int:
        return 0 if self.checkpoint is None else self.checkpoint.ckp_dsn

    def describe(self) -> dict[str, object]:
        ignored = list(self.ignored)
        if self.checkpoint is None:
            return {"checkpoint": None, "ckp_ts": 0, "ckp_dsn": 0, "ignored": ignored}
        manifest = self.checkpoint.manifest
        return {
            "ignored": ignored,
            "checkpoint": manifest.name,
            "kind": manifest.kind,
            "ckp_ts": manifest.ckp_ts,
            "ckp_dsn": manifest.ckp_dsn,
            "blocks": manifest.block_count,
            "live_rows": manifest.live_rows,
        }


EMPTY_BASE = BaseState()


@dataclass(frozen=True, slots=True)
class DriverRecord:
    """One backend record of the log, as the record level describes it."""

    lsn: int
    start_dsn: int
    count: int  # 0: a safe marker
    safe_dsn: int
    checksum: int


@dataclass(frozen=True, slots=True, eq=False)
class LsnSet:
    """Record LSNs of one log, in a size that does not grow with the log when the records run
    on (issue 23: a `set[int]` took ~70-100 bytes a record, a 1 GB worker ~3.7M records):
    the LSNs `listed` (sorted, distinct), and `span_count` more, which are the log's records
    of the set's kind with an LSN in `(span_after, span_upto]` (kept LSNs: the records
    holding entries; truncated ones: every record), less the LSNs `excluded` (sorted,
    distinct, in the span: the copies a streamed plan does not replay, plan_stream.py). A
    span's LSNs are the log's to say, so membership is asked of LSNs of that kind only (a
    chunk's entries' records); `span_count` is how many the set holds, exclusions taken."""

    listed: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    span_after: int = 0
    span_upto: int = 0
    span_count: int = 0
    excluded: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        assert self.span_count >= 0
        assert self.span_count == 0 or self.span_upto > self.span_after
        assert self.span_count == 0 or not len(self.listed)  # one form or the other
        assert self.span_count or not len(self.excluded)  # exclusions from a span only
        excluded = self.excluded
        assert not len(excluded) or int(excluded[0]) > self.span_after
        assert not len(excluded) or int(excluded[-1]) <= self.span_upto
        assert len(excluded) < 2 or bool((excluded[1:] > excluded[:-1]).all())

    @staticmethod
    def of(lsns: Iterable[int]) -> LsnSet:
        return LsnSet(np.unique(np.fromiter(lsns, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self.listed) + self.span_count

    def __contains__(self, lsn: object) -> bool:
        assert isinstance(lsn, int)
        return bool(self.contains(np.array([lsn], dtype=np.int64))[0])

    def contains(self, lsns: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per LSN of `lsns` (records of the set's kind), whether the set holds it: one
        vectorised step, whatever the set's size."""
        if self.span_count:
            held: npt.NDArray[np.bool_] = (lsns > self.span_after) & (lsns <= self.span_upto)
            if len(self.excluded):
                return held & ~_sorted_holds(self.excluded, lsns)
            return held
        return _sorted_holds(self.listed, lsns)

    def __iter__(self) -> Iterator[int]:
        """The listed LSNs (a span's are not known here: a plan's tests list them)."""
        assert not self.span_count, "a span of LSNs is not listed"
        return iter(self.listed.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, set | frozenset):
            return not self.span_count and set(self.listed.tolist()) == other
        if not isinstance(other, LsnSet):
            return NotImplemented
        return (
            (self.span_after, self.span_upto, self.span_count)
            == (other.span_after, other.span_upto, other.span_count)
            and bool(np.array_equal(self.listed, other.listed))
            and bool(np.array_equal(self.excluded, other.excluded))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.span_count:
            less = f" less {self.excluded.tolist()}" if len(self.excluded) else ""
            return f"LsnSet({self.span_count} in ({self.span_after}, {self.span_upto}]{less})"
        return f"LsnSet({self.listed.tolist()})"


def _sorted_holds(
    sorted_lsns: npt.NDArray[np.int64], lsns: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Per LSN of `lsns`, whether `sorted_lsns` (sorted, distinct) holds it."""
    if not len(sorted_lsns):
        return np.zeros(len(lsns), dtype=np.bool_)
    at = np.searchsorted(sorted_lsns, lsns)
    found: npt.NDArray[np.bool_] = sorted_lsns[np.minimum(at, len(sorted_lsns) - 1)] == lsns
    return found


@dataclass(slots=True)
class ReplayPlan:
    kept_lsns: LsnSet = field(default_factory=LsnSet)
    first_dsn: int = 1
    last_dsn: int = 0  # every DSN in [first_dsn, last_dsn] is read from kept_lsns
    truncated_lsns: LsnSet = field(default_factory=LsnSet)
    duplicate_lsns: LsnSet = field(default_factory=LsnSet)
    skipped_lsns: LsnSet = field(default_factory=LsnSet)
    trailing_lsns: LsnSet = field(default_factory=LsnSet)
    safe_dsn: int = 0

    def describe(self) -> dict[str, object]:
        return {
            "first_dsn": self.first_dsn,
            "last_dsn": self.last_dsn,
            "records_replayed": len(self.kept_lsns),
            "duplicate_copies_ignored": len(self.duplicate_lsns),
            "records_skipped_by_skip_records": len(self.skipped_lsns),
            "trailing_records_ignored": len(self.trailing_lsns),
            "truncated_records_ignored": len(self.truncated_lsns),
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
    plan = ReplayPlan()
    kept: set[int] = set()
    truncated: set[int] = set()
    duplicate: set[int] = set()
    skipped: set[int] = set()
    trailing: set[int] = set()
    skip_set = set(skips)
    by_range: dict[tuple[int, int], DriverRecord] = {}
    safe_by_lsn: list[tuple[int, int]] = []  # (lsn, safe_dsn) of every record read, rising
    for record in sorted(records, key=lambda r: r.lsn):
        if record.lsn <= truncated_lsn:
            truncated.add(record.lsn)
            continue
        plan.safe_dsn = max(plan.safe_dsn, record.safe_dsn)
        safe_by_lsn.append((record.lsn, record.safe_dsn))
        if record.count == 0:
            continue
        if (record.start_dsn, record.lsn) in skip_set:
            skipped.add(record.lsn)
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
            duplicate.add(record.lsn)
    ranges = sorted(by_range.items())
    needed = base.ckp_dsn + 1
    first_dsn = ranges[0][0][0] if ranges else None
    refused = start_refused(where, first_dsn, truncated_lsn, base)
    if refused is not None:
        raise refused
    plan.first_dsn = first_dsn or needed
    vouched = _SafeByLsn(safe_by_lsn)
    expected = plan.first_dsn
    trailing_from: int | None = None
    for (start, end), record in ranges:
        if trailing_from is not None:
            trailing.add(record.lsn)
            continue
        if start < expected:
            raise CopiesDisagree(
                f"{where}: the record at LSN {record.lsn} holds DSNs {start}-{end}, which "
                f"overlap DSNs already held by another record (up to {expected - 1})"
            )
        if start > expected:
            if expected <= plan.safe_dsn:
                raise LogHole(
                    f"{where}: DSN {expected} is missing but a record says every DSN up to "
                    f"{plan.safe_dsn} was durable: acknowledged data is lost"
                )
            trailing_from = expected
            trailing.add(record.lsn)
            continue
        earlier = vouched.before(record.lsn)
        if earlier is not None and earlier[1] >= start and start > base.ckp_dsn:
            lost = (
                f"DSN {start} is missing below LSN {earlier[0]}, whose record says every DSN "
                f"up to {earlier[1]} was durable at a lower LSN; its only copy is at LSN "
                f"{record.lsn}"
            )
            if start > plan.first_dsn:
                raise LogHole(f"{where}: {lost}: a record the log acknowledged was lost")
            # The log's first DSNs: the driver skips them as a truncated prefix (its
            # engine's checkpoint must hold them), and no checkpoint here does.
            covering = (
                f"{base.why_none} at or below the timestamp"
                if base.checkpoint is None
                else f"checkpoint {base.checkpoint.manifest.name} holds DSNs up to "
                f"{base.ckp_dsn} only"
            )
            raise ReplayRefused(
                f"{where}: {lost}, so the driver reads the log as starting after it, and "
                f"{covering}: this timestamp cannot be answered"
            )
        kept.add(record.lsn)
        expected = end + 1
    plan.last_dsn = expected - 1
    plan.kept_lsns, plan.truncated_lsns = LsnSet.of(kept), LsnSet.of(truncated)
    plan.duplicate_lsns, plan.skipped_lsns = LsnSet.of(duplicate), LsnSet.of(skipped)
    plan.trailing_lsns = LsnSet.of(trailing)
    return plan


def start_refused(
    where: str, first_dsn: int | None, truncated_lsn: int, base: BaseState
) -> ReplayRefused | None:
    """Rules 1 and 3's refusals of where a log starts (its first live DSN, None when it holds
    no entry), or None: shared by `plan_replay` and the streamed plan (plan_stream.py), so a
    refusal reads the same whichever made it."""
    needed = base.ckp_dsn + 1
    if base.checkpoint is None and truncated_lsn > 0 and first_dsn != 1:
        return ReplayRefused(
            f"{where}: the WAL was truncated up to LSN {truncated_lsn} and "
            + ("holds no entry" if first_dsn is None else f"starts at DSN {first_dsn}")
            + f", and {base.why_none} at or below the timestamp: the entries before it are "
            "gone, so this timestamp cannot be answered"
        )
    if first_dsn is not None and first_dsn > needed:
        if base.checkpoint is None:
            return ReplayRefused(
                f"{where}: the WAL starts at DSN {first_dsn} (DSNs 1-{first_dsn - 1} are gone) "
                f"and {base.why_none} at or below the timestamp: it cannot be answered"
            )
        return ReplayRefused(
            f"{where}: checkpoint {base.checkpoint.manifest.name} (ckp_ts {base.ckp_ts}) "
            f"needs the WAL from DSN {needed}, but the WAL starts at DSN {first_dsn}: the "
            "entries in between are gone (the WAL was truncated past this checkpoint; a "
            "newer timestamp, from a newer checkpoint, may still be answered)"
        )
    return None


@dataclass(frozen=True, slots=True)
class RecordArrays:
    """The backend records of one log as arrays, one value per record (any order, each LSN
    once): what `plan_replay_arrays` reads, the fields of `DriverRecord`."""

    lsns: npt.NDArray[np.int64]
    start_dsns: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]
    safe_dsns: npt.NDArray[np.int64]
    checksums: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.lsns)

    def records(self) -> list[DriverRecord]:
        return [
            DriverRecord(*fields)
            for fields in zip(
                self.lsns.tolist(),
                self.start_dsns.tolist(),
                self.counts.tolist(),
                self.safe_dsns.tolist(),
                self.checksums.tolist(),
                strict=True,
            )
        ]


def plan_replay_arrays(
    found: RecordArrays,
    skips: Iterable[tuple[int, int]],
    truncated_lsn: int,
    where: str,
    base: BaseState = EMPTY_BASE,
) -> ReplayPlan:
    """`plan_replay` of the records `found`, whole-log steps instead of one per record (issue
    23: ~15 us a record, a fifth of a clean replay), for what a clean log is: no skip record
    naming one of them, no two copies of a DSN range, the ranges running on without gap or
    overlap from an allowed first DSN, no safe DSN vouching for a copy at a higher LSN. Any
    other log is planned by `plan_replay` itself, record by record, so its plan and every
    error and message are that function's (tests/unit/spark_jobs/test_plan_arrays.py)."""
    skip_list = list(skips)
    order = np.argsort(found.lsns, kind="stable")
    lsns = found.lsns[order]
    assert len(lsns) < 2 or bool((lsns[1:] > lsns[:-1]).all()), "an LSN given twice"
    starts, counts = found.start_dsns[order], found.counts[order]
    safe = found.safe_dsns[order]
    cut = int(np.searchsorted(lsns, truncated_lsn, side="right"))  # LSNs <= truncated_lsn
    live_lsns, live_starts, live_counts = lsns[cut:], starts[cut:], counts[cut:]
    live_safe = safe[cut:]
    held = live_counts > 0
    if skip_list:
        skipped = {lsn for start_dsn, lsn in skip_list}
        if any(lsn in skipped for lsn in live_lsns[held].tolist()):
            return plan_replay(found.records(), skip_list, truncated_lsn, where, base)
    range_at = np.flatnonzero(held)  # positions in LSN order of the records holding entries
    by_start = range_at[np.argsort(live_starts[range_at], kind="stable")]
    range_starts = live_starts[by_start]
    range_ends = range_starts + live_counts[by_start] - 1
    needed = base.ckp_dsn + 1
    first_dsn = int(range_starts[0]) if len(by_start) else None
    # Each earlier record's highest safe DSN, for every record: the vouching of rule 3.
    vouched_before = np.maximum.accumulate(np.concatenate(([-1], live_safe[:-1])))
    clean = (
        not (base.checkpoint is None and truncated_lsn > 0 and first_dsn != 1)
        and (first_dsn is None or first_dsn <= needed)
        and bool((range_starts[1:] == range_ends[:-1] + 1).all())
        and not bool(
            (
                (vouched_before[by_start] >= range_starts)
                & (by_start > 0)
                & (range_starts > base.ckp_dsn)
            ).any()
        )
    )
    if not clean:
        return plan_replay(found.records(), skip_list, truncated_lsn, where, base)
    plan = ReplayPlan()
    plan.truncated_lsns = LsnSet(lsns[:cut])
    plan.safe_dsn = max(0, int(live_safe.max(initial=0)))
    plan.kept_lsns = LsnSet(np.sort(live_lsns[by_start]))
    plan.first_dsn = first_dsn or needed
    plan.last_dsn = int(range_ends[-1]) if len(by_start) else plan.first_dsn - 1
    return plan


class _SafeByLsn:
    """The highest safe DSN published at an LSN below a given one, and where: (lsn, safe) of
    the records read, in LSN order, as prefix maxima."""

    __slots__ = ("_best", "_lsns")

    def __init__(self, safe_by_lsn: list[tuple[int, int]]) -> None:
        self._lsns = [lsn for lsn, _ in safe_by_lsn]
        self._best: list[tuple[int, int]] = []
        for lsn, safe in safe_by_lsn:
            if not self._best or safe > self._best[-1][1]:
                self._best.append((lsn, safe))
            else:
                self._best.append(self._best[-1])

    def before(self, lsn: int) -> tuple[int, int] | None:
        """(lsn, safe) of the first record with the highest safe DSN below `lsn`, or None."""
        at = bisect.bisect_left(self._lsns, lsn)
        return self._best[at - 1] if at else None


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


def replay_catalog(
    commands: Iterable[CatalogCommand], as_of: int, where: str, base: BaseState = EMPTY_BASE
) -> list[LiveTable]:
    """The tables live at `as_of`: the base's catalog (restored as the engine restores a
    checkpoint's), then the catalog commands in DSN order, through the engine's own
    `Catalog`."""
    catalog = Catalog()
    if base.checkpoint is not None:
        manifest = base.checkpoint.manifest
        try:
            restore_catalog(catalog, base.checkpoint.catalog, manifest.next_id, manifest.catalog)
        except CheckpointCorrupt as exc:
            raise ReplayFailed(f"{where}: checkpoint {manifest.catalog}: {exc.reason}") from None
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
