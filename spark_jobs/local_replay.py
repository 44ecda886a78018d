"""replay_as_of, one log at a time (`replay_log`): the plain-Python engine (`--engine local`,
spark_jobs/local.py) runs it for each log, the Spark engine in one task per log
(spark_engine.per_log). The plan from the audit level (spark_jobs/replay.py), then the
plan's entries replayed as they are read, many at a time (spark_jobs/entries.py: one-append
transactions as columns), rule 4 and TS as arrays, and each live table's rows at TS from the
base checkpoint's objects, the replayed CreateBlocks and the appended rows, minus deletes and
dropped blocks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.checkpoint.layout import LEVEL_L0_DUMP
from engine.objects.store import ObjectStore
from engine.wal.batch import KIND_ONE, DecodedEntries
from engine.wal.entry import (
    Append,
    CreateBlock,
    Delete,
    DropBlock,
    Origin,
    TxnEntry,
    UpdateCatalog,
)
from engine.wal.from_numpy import arrow_array
from spark_jobs import checkpoints, output, replay, spill
from spark_jobs.entries import entry_chunks
from spark_jobs.errors import BadInput, InputCorrupt, ReplayFailed, ReplayRefused
from spark_jobs.filters import Range
from spark_jobs.jobs import JobParams, JobResult
from spark_jobs.limits import REPLAY_ROWS_HELD_BYTES_MAX, REPLAY_UNSORTED_ENTRIES_MAX
from spark_jobs.plan_inputs import (
    StreamInput,
    plan_from_records,
    refuse_past_records_max,
    stream_records,
    stream_upto,
)
from spark_jobs.schemas import schema_to_json
from spark_jobs.verify import VERIFY_TRUE
from spark_jobs.walread import (
    LEVEL_AUDIT,
    LEVEL_COMMAND,
    ReadOptions,
    read_level,
    txn_entries,
)


def logs_of(params: JobParams) -> list[tuple[str, int]]:
    """The (replica, shard) logs replay reads: exactly one replica per shard."""
    units = params.units()
    replicas_by_shard: dict[int, set[str]] = defaultdict(set)
    for unit in units:
        replicas_by_shard[unit.shard].add(unit.replica)
    for shard, replicas in replicas_by_shard.items():
        if len(replicas) > 1:
            raise BadInput(
                f"shard {shard} has {len(replicas)} replicas in the input ({sorted(replicas)}): "
                "replay reads one replica per shard (its dedup by DSN would merge replicas); "
                "choose one with --replica (one whose lsn_audit is clean)"
            )
    if not replicas_by_shard:
        raise BadInput("no log in the input")
    return sorted((next(iter(r)), shard) for shard, r in replicas_by_shard.items())


def base_of(
    params: JobParams, shard: int, as_of: int
) -> tuple[ObjectStore | None, replay.BaseState]:
    """The objects store of `shard`'s engine (None when it has none) and the base state
    for `as_of` (spark_jobs/checkpoints.py `choose_base`)."""
    directory = params.objects_dir(shard)
    store = None if directory is None else checkpoints.open_store(directory)
    choice = checkpoints.choose_base(store, as_of)
    return store, replay.BaseState(choice.checkpoint, choice.why_none(), choice.ignored)


SOURCE_CHECKPOINT, SOURCE_CREATED, SOURCE_APPENDED = 0, 1, 2
SEQ_SOURCE_SHIFT = 48
"""A row's `seq` (spark_jobs/spill.py: the order of rows with one key) is its source, then
its arrival: the order in which the rows of all sources were concatenated before."""


class _TableChanges:
    """What the replayed entries (ckp_ts < commit_ts <= TS) do to one table: its appended
    rows and deleted keys (spill.SortedRuns: held up to `bytes_max` each, then written to
    local disk sorted), its created and dropped blocks."""

    def __init__(self, bytes_max: int, spill_dir: spill.SpillDir, where: str) -> None:
        self.where = where
        self.rows = spill.SortedRuns(bytes_max, spill_dir, where, with_rows=True)
        self.deleted = spill.SortedRuns(bytes_max, spill_dir, where, with_rows=False)
        self.created: list[CreateBlock] = []
        self.dropped: set[int] = set()
        self._arrived = 0
        self._pending: list[pa.RecordBatch] = []
        self._pending_runs: list[tuple[int, int, int]] = []
        self._pending_bytes = 0

    def seqs(self, source: int, count: int) -> npt.NDArray[np.int64]:
        first = self._arrived
        self._arrived += count
        base = np.int64(source << SEQ_SOURCE_SHIFT)
        return base + np.arange(first, first + count, dtype=np.int64)

    def add_rows_at(self, source: int, keys: npt.NDArray[np.uint64], rows: pa.Table) -> None:
        self.flush_appends()
        self.rows.add(keys, self.seqs(source, len(keys)), rows)

    def append(self, cmd: Append) -> None:
        """One Append command's rows (entries decoded one by one); gathered BATCHES_PACKED_AT
        at a time (a one-row batch alone costs ~6 KB of objects), or a quarter of the bound's
        bytes, whichever comes first (they count towards it once added)."""
        self._pending.append(cmd.batch)
        self._pending_runs.extend((i.block_id, i.offset, i.rows) for i in cmd.infos)
        self._pending_bytes += cmd.batch.nbytes
        if (
            len(self._pending) >= BATCHES_PACKED_AT
            or self._pending_bytes >= self.rows.bytes_max // 4
        ):
            self.flush_appends()

    def flush_appends(self) -> None:
        if not self._pending:
            return
        runs = np.asarray(self._pending_runs, dtype=np.int64).reshape(-1, 3)
        rows = pa.Table.from_batches(self._pending).combine_chunks()
        self._pending, self._pending_runs, self._pending_bytes = [], [], 0
        per_run = runs[:, 2]
        ids = np.repeat(runs[:, 0], per_run)
        starts = np.repeat(np.cumsum(per_run) - per_run, per_run)
        offsets = np.repeat(runs[:, 1], per_run) + np.arange(len(starts)) - starts
        self.rows.add(_keys(ids, offsets, self.where), self.seqs(SOURCE_APPENDED, len(ids)), rows)

    def add_rows(
        self,
        block_ids: npt.NDArray[np.uint64],
        offsets: npt.NDArray[np.uint64],
        rows: pa.RecordBatch,
    ) -> None:
        """Rows of many one-append entries at once (engine.wal.batch), one run per row."""
        keys = _keys(block_ids, offsets, self.where)
        self.add_rows_at(SOURCE_APPENDED, keys, pa.Table.from_batches([rows]))

    def delete(self, keys: npt.NDArray[np.uint64]) -> None:
        self.deleted.add(keys, np.zeros(len(keys), dtype=np.int64))


BATCHES_PACKED_AT = 4096
"""Append batches of one table (entries decoded one by one) gathered before they are added
as one part."""

ROWS_HELD_BYTES_MAX = REPLAY_ROWS_HELD_BYTES_MAX
"""spark_jobs/limits.py, unless the job's `rows_held_bytes` says otherwise."""


class _Replayed:
    """Rule 4 and the entries' effects, one entry at a time in DSN order (replay.py), so that
    a log is not held in memory whole: an entry whose commit_ts is not above every earlier
    one's is a repeated transaction; one past TS changes nothing."""

    def __init__(self, as_of: int, where: str, params: JobParams) -> None:
        self.as_of = as_of
        self.where = where
        self.held_bytes = params.rows_held_bytes or ROWS_HELD_BYTES_MAX
        self.catalog: list[replay.CatalogCommand] = []
        self.spill_dir = spill.SpillDir("spark_jobs-replay-")
        self.changes: dict[int, _TableChanges] = {}
        self.replayed = 0
        self.repeated = 0
        self._highest = -1
        self._last_dsn = -1

    def table(self, table_id: int) -> _TableChanges:
        found = self.changes.get(table_id)
        if found is None:
            where = f"{self.where} table id {table_id}"
            found = _TableChanges(self.held_bytes, self.spill_dir, where)
            self.changes[table_id] = found
        return found

    def in_order(self, dsn: int) -> bool:
        return dsn > self._last_dsn

    def add(self, dsn: int, entry: TxnEntry) -> None:
        assert dsn > self._last_dsn, (dsn, self._last_dsn)
        self._last_dsn = dsn
        if entry.commit_ts <= self._highest:
            self.repeated += 1
            return
        self._highest = entry.commit_ts
        if entry.commit_ts > self.as_of:
            return
        self.replayed += 1
        self._apply(dsn, entry)

    def chunk_in_order(self, dsns: npt.NDArray[np.int64]) -> bool:
        return not len(dsns) or (dsns[0] > self._last_dsn and bool(np.all(np.diff(dsns) > 0)))

    def first_met(self, dsns: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per DSN of a chunk's, whether it is above every DSN before it (this chunk's and
        every one added): the first copy of each DSN met, rising."""
        before = np.maximum.accumulate(np.concatenate(([self._last_dsn], dsns[:-1])))
        found: npt.NDArray[np.bool_] = dsns > before
        return found

    def add_chunk(self, decoded: DecodedEntries, chosen: npt.NDArray[np.int64]) -> None:
        """`add` for the entries `chosen` (indexes into `decoded`, transactions, DSNs rising
        past every earlier one): rule 4 and TS as arrays, then the one-append entries' rows
        by table at once and every other entry one by one, in DSN order."""
        if not len(chosen):
            return
        dsns = decoded.dsns[chosen]
        assert self.chunk_in_order(dsns)
        self._last_dsn = int(dsns[-1])
        commit = decoded.commit_ts[chosen]
        highest = np.maximum.accumulate(commit)
        before = np.empty_like(highest)
        before[0] = max(self._highest, 0)
        before[1:] = np.maximum(highest[:-1], before[0])
        repeated = commit <= before
        self.repeated += int(repeated.sum())
        self._highest = max(self._highest, int(highest[-1]))
        applied = np.zeros(len(decoded), dtype=np.bool_)
        applied[chosen[~repeated & (commit <= self.as_of)]] = True
        self.replayed += int(applied.sum())
        for index in np.flatnonzero(applied & (decoded.kinds == KIND_ONE)).tolist():
            entry = decoded.entries[index]
            assert isinstance(entry, TxnEntry)
            self._apply(int(decoded.dsns[index]), entry)
        for rows in decoded.tables:
            keep = applied[rows.entries]
            if keep.all():
                self.table(rows.table_id).add_rows(rows.block_ids, rows.offsets, rows.columns)
            elif keep.any():
                self.table(rows.table_id).add_rows(
                    rows.block_ids[keep], rows.offsets[keep], rows.columns.filter(arrow_array(keep))
                )

    def _apply(self, dsn: int, entry: TxnEntry) -> None:
        for index, cmd in enumerate(entry.commands):
            if isinstance(cmd, UpdateCatalog):
                self.catalog.append(
                    replay.CatalogCommand(
                        dsn,
                        index,
                        entry.commit_ts,
                        cmd.kind.name.lower(),
                        cmd.op.name.lower(),
                        cmd.db_id,
                        cmd.table_id,
                        cmd.name,
                        None if cmd.schema is None else schema_to_json(cmd.schema),
                    )
                )
            elif isinstance(cmd, Append):
                self.table(cmd.table_id).append(cmd)
            elif isinstance(cmd, Delete):
                offsets = np.asarray(cmd.rows.to_array(), dtype=np.uint64)
                self.table(cmd.table_id).delete(_key(cmd.block_id, offsets, self.where))
            elif isinstance(cmd, CreateBlock):
                self.table(cmd.table_id).created.append(cmd)
            elif isinstance(cmd, DropBlock):
                self.table(cmd.table_id).dropped.add(cmd.block_id)
            else:
                assert isinstance(cmd, Origin)  # who asked (issue 15): no data


def replay_as_of(params: JobParams, directory: str | None = None) -> JobResult:
    """Every log's replay, in turn. With a run `directory`, each log's tables are written
    there as soon as that log is replayed (`result.written`) and let go before the next
    log is read, so the process holds one log's rows at a time, not every log's (issue 23:
    memory that does not grow with the number of logs; the Spark engine's per-log tasks
    write theirs the same way); without one (tests, callers that want the tables) they are
    `result.tables`."""
    assert params.as_of is not None
    result = JobResult()
    logs_summary = []
    for replica, shard in logs_of(params):
        summary, tables = replay_log(params, replica, shard)
        if directory is None:
            result.tables.update(tables)
        else:
            for name, table in tables.items():
                result.written[name] = output.write_table(directory, name, table)
        del tables  # before the next log's replay, not after it
        logs_summary.append(summary)
    result.summary = replay_summary(params.as_of, logs_summary)
    result.lines = replay_lines(result.summary)
    return result


def replay_log(
    params: JobParams, replica: str, shard: int
) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """One log's replay (`replica`'s copy of `shard`): its summary and its live tables by
    output name (`shard-<shard>/<db>/<table>`). The unit of both engines: the local engine
    runs it for each log in turn, the Spark engine once per log, each in its own task."""
    assert params.as_of is not None
    as_of = params.as_of
    verify = params.verify or VERIFY_TRUE
    where = f"replica {replica} shard {shard}"
    scope = JobParams(
        params.job,
        params.inputs,
        frozenset({shard}),
        frozenset({replica}),
        rows_held_bytes=params.rows_held_bytes,
    )
    store, base = base_of(params, shard, as_of)
    # Every entry of the plan is read (not only those at or below TS): the newest
    # commit in the log says whether TS is past it, and rule 4 needs every earlier entry.
    options = ReadOptions(
        LEVEL_COMMAND, verify, scope.bounds().with_range("commit_ts", lo=base.ckp_ts + 1)
    )
    one_pass = _replay_one_pass(scope, options, as_of, where, base)
    if one_pass is not None:
        plan, replayed, newest_commit_ts = one_pass
    else:
        audit = ReadOptions(LEVEL_AUDIT, verify, entry_checksums=False)
        streamed = _plan_streamed(scope, verify, where, base)
        if streamed is None:  # record by record, holding the audit level whole
            streamed = plan_from_records(read_level(scope, audit), where, base)
        plan = streamed
        replayed, newest_commit_ts = _replay_log(scope, options, plan, as_of, where)
    newest_commit_ts = max(newest_commit_ts, base.ckp_ts)
    catalog, changes = replayed.catalog, replayed.changes
    live = replay.replay_catalog(catalog, as_of, where, base)
    if store is None and any(t.created for t in changes.values()):
        raise BadInput(
            f"{where}: the WAL names persisted blocks (CreateBlock) but no objects "
            "directory was given or found: --objects"
        )
    tables: dict[str, pa.Table | spill.SpilledTable] = {}
    tables_summary = {}
    spilled_runs = held_peak = 0
    for table in live:
        found = changes.get(table.table_id) or _TableChanges(
            replayed.held_bytes, replayed.spill_dir, where
        )
        data = _live_rows(store, base, table, found)
        spilled_runs += found.rows.spilled + found.deleted.spilled
        held_peak = max(held_peak, found.rows.peak_held_bytes, found.deleted.peak_held_bytes)
        name = f"shard-{shard}/{table.db_name}/{table.name}"
        tables[name] = data
        tables_summary[f"{table.db_name}.{table.name}"] = data.num_rows
    summary = {
        "replica": replica,
        "shard": shard,
        "base": base.describe(),
        **plan.describe(),
        "entries_replayed": replayed.replayed,
        "repeated_transactions_ignored": replayed.repeated,
        "newest_commit_ts": newest_commit_ts,
        "tables": tables_summary,
        "rows_spilled_runs": spilled_runs,
        "rows_held_bytes_peak": held_peak,
    }
    return summary, tables


def _plan_streamed(
    scope: JobParams, verify: str, where: str, base: replay.BaseState
) -> replay.ReplayPlan | None:
    """The streamed plan (plan_stream.py) from a read of the log's records alone (a clean
    segment's as arrays), none held, for a log one read could not replay (a copy with other
    bytes than the first one met, a skip record naming a range's first copy); or None,
    refused when the record-by-record plan would pass REPLAY_PLAN_RECORDS_MAX, before the
    audit level is read whole (issue 23: ~250 MiB for 1M records). Damage: None, so that
    the record-by-record path names it, as it always did."""
    try:
        stream = stream_records(scope.units(), verify, base.ckp_dsn)
        prefix = None
        if stream.needs_prefix():
            prefix = stream_upto(scope.units(), verify, stream.truncated_lsn, base.ckp_dsn)
    except (InputCorrupt, ReplayFailed):
        return None
    plan = stream.plan(where, base, prefix)
    if plan is None:
        refuse_past_records_max(stream.records, where)
    return plan


def _replay_log(
    scope: JobParams, options: ReadOptions, plan: replay.ReplayPlan, as_of: int, where: str
) -> tuple[_Replayed, int]:
    """The plan's entries of one log replayed as they are read (many at a time: spark_jobs/
    entries.py), and its newest commit_ts. A log not read in DSN order (not seen so far) is
    read again, held and sorted."""
    replayed = _Replayed(as_of, where, scope)
    newest = 0
    dsns = Range(plan.first_dsn, plan.last_dsn)
    for unit in scope.units():
        for chunk in entry_chunks(unit, options.verify, options.bounds.range("lsn"), dsns):
            decoded = chunk.decoded
            chosen = np.flatnonzero(
                _transactions(decoded, options) & plan.kept_lsns.contains(chunk.lsns)
            )
            if not replayed.chunk_in_order(decoded.dsns[chosen]):
                return _replay_log_sorted(scope, options, plan, as_of, where)
            if len(chosen):
                newest = max(newest, int(decoded.commit_ts[chosen].max()))
            replayed.add_chunk(decoded, chosen)
    return replayed, newest


def _transactions(decoded: DecodedEntries, options: ReadOptions) -> npt.NDArray[np.bool_]:
    """The chunk's transaction entries whose commit_ts the options' bounds hold."""
    ts_range = options.bounds.range("commit_ts")
    ts_lo = ts_range.lo or 0
    ts_hi = (1 << 64) - 1 if ts_range.hi is None else ts_range.hi
    mask: npt.NDArray[np.bool_] = (
        decoded.is_txn & (decoded.commit_ts >= ts_lo) & (decoded.commit_ts <= ts_hi)
    )
    return mask


def _replay_one_pass(
    scope: JobParams, options: ReadOptions, as_of: int, where: str, base: replay.BaseState
) -> tuple[replay.ReplayPlan, _Replayed, int] | None:
    """`_replay_log` in one read of the log instead of two (the plan's records, then its
    entries): every entry is replayed as if the plan kept it, while the records are shown to
    a streaming plan (plan_stream.py: a few numbers, whatever the log's size); the result
    stands when that plan replays every DSN that was replayed, from records with the bytes
    replayed, which is what a clean log gives (rules 1-3 of spark_jobs/replay.py drop nothing
    from it but a truncated prefix, whose records are read again alone), and a log with
    copies of its original's bytes too: only the first copy of each DSN met is replayed
    (plan_stream.py: the streamed plan keeps a record with those bytes). Otherwise (copies
    with other bytes, entries out of DSN order, any damage) None: the caller reads the log
    twice, as the plan says, and that path alone names errors, so they are what they always
    were."""
    if not options.bounds.range("lsn").unbounded:
        return None
    gathered = StreamInput(base.ckp_dsn)
    replayed = _Replayed(as_of, where, scope)
    newest = 0
    lsn_replayed_min: int | None = None
    dsn_lo = dsn_hi = None
    try:
        for unit in scope.units():
            chunks = entry_chunks(unit, options.verify, Range(), Range(), gathered)
            for chunk in chunks:
                decoded = chunk.decoded
                chosen = np.flatnonzero(_transactions(decoded, options))
                if not len(chosen):
                    continue
                dsns = decoded.dsns[chosen]
                if not replayed.chunk_in_order(dsns):
                    # Copies (DSNs met before): only the first met of each DSN is replayed,
                    # which is the plan's when it has no copy with other bytes (below).
                    if gathered.stream.cannot_plan():
                        return None  # out of DSN order for another reason: read twice
                    first_met = replayed.first_met(dsns)
                    chosen, dsns = chosen[first_met], dsns[first_met]
                    if not len(chosen):
                        continue
                dsn_lo = int(dsns[0]) if dsn_lo is None else dsn_lo
                dsn_hi = int(dsns[-1])
                lowest = int(chunk.lsns[chosen].min())
                if lsn_replayed_min is None or lowest < lsn_replayed_min:
                    lsn_replayed_min = lowest
                newest = max(newest, int(decoded.commit_ts[chosen].max()))
                replayed.add_chunk(decoded, chosen)
        stream = gathered.stream
        prefix = None
        if stream.needs_prefix():
            prefix = stream_upto(scope.units(), options.verify, stream.truncated_lsn, base.ckp_dsn)
    except (InputCorrupt, ReplayFailed):
        return None
    plan = stream.plan(where, base, prefix)
    if plan is None:
        # Planned record by record next: refused now when past the limit, before the
        # audit level of a log of that size is read whole.
        refuse_past_records_max(stream.records, where)
        return None
    if stream.differing_copies:
        return None  # a DSN's first copy met may not be the one the plan replays
    if dsn_lo is not None:
        assert dsn_hi is not None and lsn_replayed_min is not None
        if dsn_lo < plan.first_dsn or dsn_hi > plan.last_dsn:
            return None
        # The streamed plan keeps the entry records of a span of LSNs less copies (its kept
        # set has no other form): every DSN replayed came from an original in it (or one a
        # skip record names, whose copy with the same bytes it keeps) when the lowest
        # LSN replayed is in the span.
        kept = plan.kept_lsns
        if not kept.span_count or lsn_replayed_min <= kept.span_after:
            return None  # an entry replayed from a record the plan does not keep
    return plan, replayed, newest


def _replay_log_sorted(
    scope: JobParams, options: ReadOptions, plan: replay.ReplayPlan, as_of: int, where: str
) -> tuple[_Replayed, int]:
    held: list[tuple[int, TxnEntry]] = []
    for unit in scope.units():
        for rec, dsn, entry in txn_entries(unit, options):
            if rec.lsn in plan.kept_lsns and plan.first_dsn <= dsn <= plan.last_dsn:
                if len(held) >= REPLAY_UNSORTED_ENTRIES_MAX:
                    raise ReplayRefused(
                        f"{where}: the log's entries are not in DSN order, and replaying "
                        "them holds every one until all are read: more than "
                        f"REPLAY_UNSORTED_ENTRIES_MAX ({REPLAY_UNSORTED_ENTRIES_MAX}) entries "
                        "(spark_jobs/limits.py: one worker's memory); the driver writes in "
                        "DSN order, so this log was pieced together: rewrite it in DSN order"
                    )
                held.append((dsn, entry))
    replayed = _Replayed(as_of, where, scope)
    newest = 0
    for dsn, entry in sorted(held, key=lambda pair: pair[0]):
        newest = max(newest, entry.commit_ts)
        if replayed.in_order(dsn):
            replayed.add(dsn, entry)
        else:  # a second copy of a DSN: a repeated transaction (rule 4)
            replayed.repeated += 1
    return replayed, newest


def replay_summary(as_of: int, logs_summary: list[dict[str, Any]]) -> dict[str, Any]:
    newest = max((log["newest_commit_ts"] for log in logs_summary), default=0)
    return {
        "as_of": as_of,
        "newest_commit_ts": newest,
        "as_of_after_newest_commit": as_of > newest,
        "logs": logs_summary,
    }


def replay_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for log in summary["logs"]:
        tables = ", ".join(f"{name} {rows} rows" for name, rows in log["tables"].items())
        base = log["base"]
        start = (
            "no checkpoint"
            if base["checkpoint"] is None
            else f"checkpoint ckp_ts {base['ckp_ts']} ({base['kind']}, {base['blocks']} blocks)"
        )
        lines.append(
            f"replay_as_of {summary['as_of']}: replica {log['replica']} shard {log['shard']}: "
            f"{start} + {log['entries_replayed']} WAL entries (DSNs {log['first_dsn']}-"
            f"{log['last_dsn']} read from {log['records_replayed']} records); "
            f"{len(log['tables'])} live table(s): {tables or 'none'}"
        )
    if summary["as_of_after_newest_commit"]:
        lines.append(
            f"note: --as-of is after the newest commit ({summary['newest_commit_ts']}) in the "
            "log and its checkpoints: this is the last state they hold, not a promise that "
            "nothing was committed since"
        )
    return lines


KEY_OFFSET_BITS = 32  # offsets are u32 (engine/FORMAT.md Append info)


def _key(block_id: int, offsets: npt.NDArray[np.uint64], where: str) -> npt.NDArray[np.uint64]:
    """(block_id, offset) as one uint64, for numpy set operations."""
    if block_id >= 1 << (64 - KEY_OFFSET_BITS):
        raise ReplayFailed(f"{where}: block id {block_id} too large for this reader")
    return (np.uint64(block_id) << np.uint64(KEY_OFFSET_BITS)) | offsets.astype(np.uint64)


def _live_rows(
    store: ObjectStore | None,
    base: replay.BaseState,
    table: replay.LiveTable,
    changes: _TableChanges,
) -> pa.Table | spill.SpilledTable:
    """The table's rows at TS (replay.py "The rows at TS"), ordered by (block_id, offset):
    the base checkpoint's blocks and the created ones (each read and added in turn), then the
    appended rows already held or spilled, less deletes and dropped blocks (spill.py)."""
    arrow = table.schema.to_arrow()
    where = f"table {table.db_name}.{table.name}"
    changes.rows.schema = arrow
    changes.flush_appends()

    def persisted(source: int, block_id: int, rows: pa.Table) -> None:
        ids = np.full(rows.num_rows, block_id, np.int64)
        keys = _keys(ids, np.arange(rows.num_rows, dtype=np.int64), where)
        changes.add_rows_at(source, keys, rows)

    if base.checkpoint is not None:
        assert store is not None
        blocks = [
            b
            for b in base.checkpoint.blocks_of(table.table_id)
            if b.block_id not in changes.dropped
        ]
        for block in blocks:
            rows = checkpoints.block_rows(
                store,
                table.schema,
                block.object,
                block.row_group,
                block.rows,
                dump=block.level == LEVEL_L0_DUMP,
            )
            persisted(SOURCE_CHECKPOINT, block.block_id, rows)
        for block_id, gone in checkpoints.deleted_offsets(store, blocks, base.ckp_ts).items():
            changes.delete(_key(block_id, gone.astype(np.uint64), where))
    for created in changes.created:
        if created.block_id in changes.dropped:
            continue
        assert store is not None
        rows = checkpoints.block_rows(
            store, table.schema, created.object_name, created.row_group, created.rows, dump=False
        )
        persisted(SOURCE_CREATED, created.block_id, rows)
    return spill.live_table(changes.rows, changes.deleted, changes.dropped, arrow)


def _keys(
    block_ids: npt.NDArray[Any], offsets: npt.NDArray[Any], where: str
) -> npt.NDArray[np.uint64]:
    """(block_id, offset) of each row as one uint64 (spill.key_of)."""
    ids = block_ids.astype(np.uint64)  # a negative id (none is) would be large here
    if len(ids) and int(ids.max()) >= 1 << (64 - KEY_OFFSET_BITS):
        raise ReplayFailed(f"{where}: block id {int(ids.max())} too large for this reader")
    return spill.key_of(ids, offsets)
