"""The readers: one unit (a file WAL segment, or a logsvc shard replica) in, Arrow batches of a
level's schema (spark_jobs/schemas.py) out. Pure Python and pyarrow; the Spark Data Sources
(sources.py) and the local engine (local.py, local_replay.py) both call `read_unit`.

Layers, each decoded by the code that owns the format (never a second parser), each once:

    backend record   file WAL frame: tae_driver.backends.segment.read_segment_frames
                     logsvc record:  spark_jobs.journal (store reader + shard state machine)
                     -> spark_jobs.records.backend_records
    driver record    tae_driver.record.decode  (ENTRIES: DSNs and entries; SKIP: pairs)
                     -> spark_jobs.records.driver_records (its verify rules, once)
    engine entry     engine.wal.codec.decode_entry  (AC transaction, CKP checkpoint), or many
                     at once: engine.wal.batch.decode_entries -> spark_jobs.entries

Levels: `segment` (inventory, no payload decoded), `raft` (logsvc_segments: Raft entries),
`record` (per DSN copy, marker, skip pair, truncate, damage; no engine decoding), `audit`
(one narrow row per backend record: its DSN range and entry checksums; what lsn_audit and
replay's plan read), `entry` (plus the transaction context), `command` (one row per command:
spark_jobs/commands.py; without batches, many entries at a time), `rows` (one table's appended
rows, typed, with their row ids: option `table_id` and its schema; spark_jobs/rows.py).

Damage: with verify `true` it is `InputCorrupt`; with `report` a row of kind `corrupt` or
`torn_tail` (`checksum_ok` false, `error` the reason) and the unit's reading goes on where it
still can (after a bad driver record or entry; not past bad framing); `false` skips the
backend's own checksums (the driver and engine decoders always check theirs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import xxhash

from engine.errors import WalCorruption
from engine.schema import Schema
from engine.wal.codec import decode_entry
from engine.wal.entry import (
    Append,
    CheckpointEntry,
    Delete,
    TxnEntry,
    UpdateCatalog,
)
from spark_jobs import schemas
from spark_jobs.commands import command_level_unbatched, command_rows
from spark_jobs.errors import BadInput, InputCorrupt
from spark_jobs.filters import Bounds
from spark_jobs.inputs import BACKEND_FILE, JOURNAL_DIR, Unit, journal_segments
from spark_jobs.jobs import JobParams
from spark_jobs.records import (
    BackendRecord,
    DriverRecord,
    driver_records,
    read_file,
    record_fields,
    segment_frames,
)
from spark_jobs.rows import rows_level
from spark_jobs.schemas import signed64
from spark_jobs.verify import KIND_CORRUPT, VERIFY_MODES, VERIFY_REPORT, VERIFY_TRUE
from tae_driver.backends import segment as file_segment
from tae_driver.record import EntriesRecord, SkipRecord, payload_checksum

LEVEL_SEGMENT = "segment"
LEVEL_RAFT = "raft"
LEVEL_RECORD = "record"
LEVEL_ENTRY = "entry"
LEVEL_COMMAND = "command"
LEVEL_ROWS = "rows"
LEVEL_AUDIT = "audit"
LEVELS = (
    LEVEL_SEGMENT,
    LEVEL_RAFT,
    LEVEL_RECORD,
    LEVEL_AUDIT,
    LEVEL_ENTRY,
    LEVEL_COMMAND,
    LEVEL_ROWS,
)
AUDIT_RECORDS_MAX = 1024
"""Rows (backend records) per batch of level audit: at most 1024 x 50 entry checksums."""
_TWO_63, _TWO_64 = 1 << 63, 1 << 64  # schemas.signed64, inlined where it runs per entry
# Rows per Arrow batch handed out: bounds the memory of one batch (a command row may carry
# an Arrow IPC batch of up to an entry's 2 MiB).
BATCH_ROWS_MAX = 4096


@dataclass(frozen=True, slots=True)
class ReadOptions:
    level: str
    verify: str = VERIFY_TRUE
    bounds: Bounds = field(default_factory=Bounds)
    table_id: int | None = None  # level rows
    table_schema: Schema | None = None  # level rows
    for_spark: bool = False  # level rows: widen unsigned columns (schemas.rows_schema)
    # Level command: False leaves `batch_ipc` and `cmd_bytes` null, which saves encoding
    # every batch for readers that do not want the rows (replay's catalog and deletes pass).
    batches: bool = True
    # Level audit: False leaves `entry_checksums` empty, which saves hashing every entry for
    # readers that want only the records (replay's plan).
    entry_checksums: bool = True

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise BadInput(f"level {self.level!r}: one of {', '.join(LEVELS)}")
        if self.verify not in VERIFY_MODES:
            raise BadInput(f"verify {self.verify!r}: one of {', '.join(VERIFY_MODES)}")
        if self.level == LEVEL_ROWS and (self.table_id is None or self.table_schema is None):
            raise BadInput("level rows needs a table_id and its table schema")

    def schema(self) -> pa.Schema:
        if self.level == LEVEL_ROWS:
            assert self.table_schema is not None
            return schemas.rows_schema(self.table_schema, for_spark=self.for_spark)
        return {
            LEVEL_SEGMENT: schemas.SEGMENT,
            LEVEL_RAFT: schemas.RAFT_ENTRY,
            LEVEL_RECORD: schemas.RECORD,
            LEVEL_AUDIT: schemas.AUDIT,
            LEVEL_ENTRY: schemas.ENTRY,
            LEVEL_COMMAND: schemas.COMMAND,
        }[self.level]


class _Batcher:
    """Collects row tuples and hands out Arrow batches of at most BATCH_ROWS_MAX rows."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows: list[tuple[object, ...]] = []

    def add(self, row: tuple[object, ...]) -> pa.RecordBatch | None:
        self.rows.append(row)
        return self.flush() if len(self.rows) >= BATCH_ROWS_MAX else None

    def flush(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        columns = list(zip(*self.rows, strict=True))
        self.rows = []
        arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def read_level(params: JobParams, options: ReadOptions) -> pa.Table:
    batches = [batch for unit in params.units() for batch in read_unit(unit, options)]
    return pa.Table.from_batches(batches, schema=options.schema())


def read_unit(unit: Unit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Every batch of `options.level` for one unit, filtered by `options.bounds`."""
    if options.level == LEVEL_SEGMENT:
        yield from _emit(options.schema(), _segment_rows(unit, options.verify))
    elif options.level == LEVEL_RAFT:
        if unit.backend == BACKEND_FILE:
            raise BadInput("logsvc_segments reads logsvc node directories, not a file WAL")
        yield from _emit(options.schema(), _raft_rows(unit, options))
    elif options.level == LEVEL_ROWS:
        assert options.table_id is not None
        yield from rows_level(
            unit, options.verify, options.bounds, options.table_id, options.schema()
        )
    elif options.level == LEVEL_RECORD:
        yield from _record_level(unit, options)
    elif options.level == LEVEL_AUDIT:
        yield from _audit_level(unit, options)
    elif options.level == LEVEL_COMMAND and not options.batches:
        yield from command_level_unbatched(unit, options.verify, options.bounds)
    else:
        yield from _emit(options.schema(), _wal_rows(unit, options))


def _emit(schema: pa.Schema, rows: Iterator[tuple[object, ...]]) -> Iterator[pa.RecordBatch]:
    batcher = _Batcher(schema)
    for row in rows:
        batch = batcher.add(row)
        if batch is not None:
            yield batch
    batch = batcher.flush()
    if batch is not None:
        yield batch


# --- level segment (inventory) ----------------------------------------------------------------


def _segment_rows(unit: Unit, verify: str) -> Iterator[tuple[object, ...]]:
    """One row per segment file, from a header walk (`verify=false` semantics whatever is
    asked: the inventory decodes no payload and computes no checksum)."""
    del verify
    # The newest segment of a log a running engine or node is writing is read again where
    # a read saw damage (`inputs.read_segment_live`): an inventory beside a live writer
    # reports its end as the record levels would, not a write in progress as corruption.
    if unit.backend == BACKEND_FILE:
        frames = segment_frames(unit, verify=False)
        lsns = [
            f.frame.lsn
            for f in frames.frames
            if f.frame.frame_type is file_segment.FrameType.RECORD
        ]
        truncates = [
            f.frame.lsn
            for f in frames.frames
            if f.frame.frame_type is file_segment.FrameType.TRUNCATE
        ]
        yield (
            unit.replica,
            unit.shard,
            unit.backend,
            unit.segment,
            unit.size_bytes,
            "lsn",
            frames.base_lsn,
            lsns[-1] if lsns else frames.base_lsn - 1,
            len(lsns),
            max(truncates) if truncates else None,
            None,
            frames.end,
            frames.end_offset,
            frames.end_reason,
        )
        return
    from spark_jobs.journal import read_segment  # loads logsvc: journal inputs only

    journal = os.path.join(unit.path, JOURNAL_DIR)
    segments = journal_segments(journal)
    log_start = _log_start_quiet(journal)
    for position, (first_index, name, size) in enumerate(segments):
        _, read = read_segment(
            os.path.join(journal, name), first_index, position == len(segments) - 1, False
        )
        yield (
            unit.replica,
            unit.shard,
            unit.backend,
            name,
            size,
            "raft_index",
            first_index,
            first_index + len(read.records) - 1,
            len(read.records),
            None,
            log_start,
            read.end,
            read.end_offset_bytes,
            read.end_reason,
        )


def _log_start_quiet(journal: str) -> int | None:
    from logsvc.store.meta import META_FILE_NAME, decode_meta

    path = os.path.join(journal, META_FILE_NAME)
    if not os.path.exists(path):
        return None
    meta = decode_meta(read_file(path))
    return None if isinstance(meta, tuple) else meta.first_index


# --- level raft (logsvc_segments) -------------------------------------------------------------


def _raft_rows(unit: Unit, options: ReadOptions) -> Iterator[tuple[object, ...]]:
    from spark_jobs.journal import read_journal  # logsvc's reader: for a journal only

    for entry in read_journal(unit.path, verify=options.verify):
        yield (
            unit.replica,
            unit.shard,
            entry.segment,
            entry.offset_bytes,
            entry.raft_index,
            entry.term,
            entry.kind,
            entry.outcome,
            entry.records,
            entry.lsn_first,
            entry.lsn_count,
            entry.payload_bytes,
            None if entry.checksum is None else signed64(entry.checksum),
            entry.checksum_ok,
            entry.error,
        )


# --- levels record, entry, command -------------------------------------------------------------


def _wal_rows(unit: Unit, options: ReadOptions) -> Iterator[tuple[object, ...]]:
    level = options.level
    bounds = options.bounds
    lsn_range, dsn_range, ts_range = (
        bounds.range("lsn"),
        bounds.range("dsn"),
        bounds.range("commit_ts"),
    )
    width = len(schemas.ENTRY) - len(schemas.RECORD)
    blank_entry = (None,) * width
    row: tuple[object, ...]
    for found in driver_records(unit, options.verify, lsn_range):
        rec, decoded = found.rec, found.decoded
        head = (unit.replica, unit.shard, rec.segment, rec.offset_bytes, rec.lsn, rec.raft_index)
        if rec.payload is None:
            if level != LEVEL_COMMAND and dsn_range.unbounded and ts_range.unbounded:
                ok = rec.kind == "truncate"
                row = (*head, rec.kind, *(None,) * 10, ok, rec.error)
                yield row if level == LEVEL_RECORD else (*row, *blank_entry)
            continue
        if decoded is None:
            reason = found.error
            if level != LEVEL_COMMAND and dsn_range.unbounded and ts_range.unbounded:
                row = (*head, KIND_CORRUPT, *(None,) * 10, False, reason)
                yield row if level == LEVEL_RECORD else (*row, *blank_entry)
            continue
        record_checksum = signed64(payload_checksum(rec.payload))
        if isinstance(decoded, SkipRecord):  # one row per pair
            if level != LEVEL_COMMAND and dsn_range.unbounded and ts_range.unbounded:
                for dsn, lsn in decoded.pairs:
                    row = (
                        *head,
                        "skip",
                        0,
                        len(decoded.pairs),
                        0,
                        record_checksum,
                        None,
                        None,
                        None,
                        None,
                        dsn,
                        lsn,
                        True,
                        None,
                    )
                    yield row if level == LEVEL_RECORD else (*row, *blank_entry)
            continue
        assert isinstance(decoded, EntriesRecord)  # driver_records splits unless asked not to
        record_head = (decoded.start_dsn, decoded.count, decoded.safe_dsn, record_checksum)
        if decoded.count == 0:
            if level != LEVEL_COMMAND and dsn_range.unbounded and ts_range.unbounded:
                row = (
                    *head,
                    "marker",
                    *record_head,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    True,
                    None,
                )
                yield row if level == LEVEL_RECORD else (*row, *blank_entry)
            continue
        for index, payload in enumerate(decoded.entries):
            dsn = decoded.start_dsn + index
            if not dsn_range.holds(dsn):
                continue
            entry_checksum = signed64(xxhash.xxh3_64_intdigest(payload))
            base = (
                *head,
                "entry",
                *record_head,
                dsn,
                index,
                len(payload),
                entry_checksum,
                None,
                None,
            )
            if level == LEVEL_RECORD:
                yield (*base, True, None)
                continue
            try:
                entry = decode_entry(payload, dsn)
            except WalCorruption as exc:
                if options.verify != VERIFY_REPORT:
                    raise InputCorrupt(unit.path, rec.offset_bytes, str(exc)) from None
                if level == LEVEL_ENTRY and ts_range.unbounded:
                    yield (*base, False, str(exc), *blank_entry)
                continue
            if isinstance(entry, CheckpointEntry):
                if level == LEVEL_ENTRY and ts_range.unbounded:
                    yield (
                        *base,
                        True,
                        None,
                        "checkpoint",
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        entry.ckp_ts,
                        entry.truncate_dsn,
                        entry.location,
                    )
                continue
            if not ts_range.holds(entry.commit_ts):
                continue
            if level == LEVEL_ENTRY:
                yield (*base, True, None, *_txn_fields(entry))
            else:
                yield from command_rows(unit, rec, dsn, entry_checksum, entry, options.batches)


def _txn_fields(entry: TxnEntry) -> tuple[object, ...]:
    catalog = appends = deletes = 0
    rows_appended = rows_deleted = 0
    for cmd in entry.commands:
        if isinstance(cmd, UpdateCatalog):
            catalog += 1
        elif isinstance(cmd, Append):
            appends += 1
            rows_appended += cmd.batch.num_rows
        elif isinstance(cmd, Delete):
            deletes += 1
            rows_deleted += len(cmd.rows)
    memo = [{"db_id": m.db_id, "table_id": m.table_id, "block_id": m.block_id} for m in entry.memo]
    return (
        "txn",
        entry.start_ts,
        entry.commit_ts,
        memo,
        catalog,
        appends,
        deletes,
        rows_appended,
        rows_deleted,
        None,
        None,
        None,
    )


# --- level record, columnar ------------------------------------------------------------------


class _Columns:
    """The record-shaped levels built a column at a time: a driver record adds, per column,
    one value for all its rows (a run) or a list of per-row integers, instead of a tuple per
    row (phase 1's `_Batcher`, which cost more than the decoding it served). Runs become
    columns through numpy (`np.repeat`), lists are extended in C. Columns the level's schema
    does not have are dropped as they come. Batches hold at most BATCH_ROWS_MAX +
    RECORD_ENTRIES_MAX rows (a record's rows are never split)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.names = schema.names
        self._clear()

    def _clear(self) -> None:
        self.values: dict[str, list[object]] = {name: [] for name in self.names}
        self.counts: dict[str, list[int]] = {name: [] for name in self.names}
        self.rows = 0

    def add(self, count: int, values: dict[str, object], lists: dict[str, list[int]]) -> None:
        """`count` rows: `lists` give a value per row, `values` one value for all, every
        other column null. Every run holds at least one row, so a column of as many values as
        rows is one value a row (`_column`)."""
        if count == 0:
            return
        ones = None
        for name in self.names:
            given = lists.get(name)
            if given is not None:
                assert len(given) == count
                if ones is None:
                    ones = [1] * count
                self.values[name].extend(given)
                self.counts[name].extend(ones)
            else:
                self.values[name].append(values.get(name))
                self.counts[name].append(count)
        self.rows += count

    def take(self) -> pa.RecordBatch | None:
        if not self.rows:
            return None
        arrays = [self._column(f) for f in self.schema]
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _column(self, field: pa.Field) -> pa.Array:
        values, counts = self.values[field.name], np.asarray(self.counts[field.name])
        if len(values) == self.rows:  # one value a row already
            return pa.array(values, type=field.type)
        # Runs: the distinct run values once, then indices repeated (strings, bools and
        # integers alike; a null run repeats a null).
        run_values = pa.array(values, type=field.type)
        return run_values.take(pa.array(np.repeat(np.arange(len(values)), counts)))


def _record_level(unit: Unit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Level record (the same rows as `_wal_rows` would give, column by column)."""
    bounds = options.bounds
    lsn_range, dsn_range = bounds.range("lsn"), bounds.range("dsn")
    plain = dsn_range.unbounded and bounds.range("commit_ts").unbounded
    out = _Columns(options.schema())
    xxh3 = xxhash.xxh3_64_intdigest
    for found in driver_records(unit, options.verify, lsn_range):
        rec, decoded = found.rec, found.decoded
        head: dict[str, object] = {
            "replica": unit.replica,
            "shard": unit.shard,
            "segment": rec.segment,
            "offset_bytes": rec.offset_bytes,
            "lsn": rec.lsn,
            "raft_index": rec.raft_index,
        }
        if rec.payload is None:
            if plain:
                ok = rec.kind == "truncate"
                out.add(1, {**head, "kind": rec.kind, "checksum_ok": ok, "error": rec.error}, {})
        else:
            if decoded is None:
                if plain:
                    values = {
                        **head,
                        "kind": KIND_CORRUPT,
                        "checksum_ok": False,
                        "error": found.error,
                    }
                    out.add(1, values, {})
                continue
            head["record_checksum"] = signed64(payload_checksum(rec.payload))
            head["checksum_ok"] = True
            if isinstance(decoded, SkipRecord):
                if plain:
                    pairs = decoded.pairs
                    head.update(kind="skip", record_start_dsn=0, record_count=len(pairs))
                    head["safe_dsn"] = 0
                    lists: dict[str, list[int]] = {
                        "skip_dsn": [dsn for dsn, _ in pairs],
                        "skip_lsn": [lsn for _, lsn in pairs],
                    }
                    out.add(len(pairs), head, lists)
            else:
                assert isinstance(decoded, EntriesRecord)  # split: driver_records' default
                head["record_start_dsn"] = decoded.start_dsn
                head["record_count"] = decoded.count
                head["safe_dsn"] = decoded.safe_dsn
                if decoded.count == 0:
                    if plain:
                        out.add(1, {**head, "kind": "marker"}, {})
                else:
                    head["kind"] = "entry"
                    first = decoded.start_dsn
                    payloads = decoded.entries
                    if dsn_range.unbounded:
                        out.add(
                            decoded.count,
                            head,
                            {
                                "dsn": list(range(first, first + decoded.count)),
                                "entry_index": list(range(decoded.count)),
                                "entry_bytes": [len(p) for p in payloads],
                                "entry_checksum": [
                                    h - _TWO_64 if h >= _TWO_63 else h for h in map(xxh3, payloads)
                                ],
                            },
                        )
                    else:
                        kept = [i for i in range(decoded.count) if dsn_range.holds(first + i)]
                        out.add(
                            len(kept),
                            head,
                            {
                                "dsn": [first + i for i in kept],
                                "entry_index": list(kept),
                                "entry_bytes": [len(payloads[i]) for i in kept],
                                "entry_checksum": [signed64(xxh3(payloads[i])) for i in kept],
                            },
                        )
        if out.rows >= BATCH_ROWS_MAX:
            batch = out.take()
            assert batch is not None
            yield batch
    batch = out.take()
    if batch is not None:
        yield batch


def _audit_level(unit: Unit, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Level audit: one row per backend record (schemas.AUDIT). Bounds: `lsn` only (the
    level has no dsn or commit_ts column)."""
    lsn_range = options.bounds.range("lsn")
    scalars: dict[str, list[object]] = {
        name: []
        for name in (
            "segment",
            "offset_bytes",
            "lsn",
            "kind",
            "start",
            "count",
            "safe",
            "checksum",
            "error",
        )
    }
    checksums: list[int] = []
    checksum_ends: list[int] = [0]
    skip_dsns: list[int] = []
    skip_lsns: list[int] = []
    skip_ends: list[int] = [0]
    xxh3 = xxhash.xxh3_64_intdigest

    def row(found: DriverRecord) -> None:
        fields = record_fields(found)
        scalars["segment"].append(found.rec.segment)
        scalars["offset_bytes"].append(found.rec.offset_bytes)
        scalars["lsn"].append(found.rec.lsn)
        scalars["kind"].append(fields.kind)
        scalars["start"].append(fields.start_dsn)
        scalars["count"].append(fields.record_count)
        scalars["safe"].append(fields.safe_dsn)
        scalars["checksum"].append(fields.checksum)
        scalars["error"].append(fields.error)
        if fields.skip_pairs:
            skip_dsns.extend(dsn for dsn, _ in fields.skip_pairs)
            skip_lsns.extend(lsn for _, lsn in fields.skip_pairs)
        elif fields.kind == "entry" and options.entry_checksums:
            assert isinstance(found.decoded, EntriesRecord)
            checksums.extend(
                h - _TWO_64 if h >= _TWO_63 else h for h in map(xxh3, found.decoded.entries)
            )
        checksum_ends.append(len(checksums))
        skip_ends.append(len(skip_dsns))

    def take() -> pa.RecordBatch:
        rows = len(scalars["lsn"])
        arrays = [
            pa.array([unit.replica] * rows, pa.string()),
            pa.array([unit.shard] * rows, pa.int32()),
            pa.array(scalars["segment"], pa.string()),
            pa.array(scalars["offset_bytes"], pa.int64()),
            pa.array(scalars["lsn"], pa.int64()),
            pa.array(scalars["kind"], pa.string()),
            pa.array(scalars["start"], pa.int64()),
            pa.array(scalars["count"], pa.int32()),
            pa.array(scalars["safe"], pa.int64()),
            pa.array(scalars["checksum"], pa.int64()),
            _lists(checksum_ends, checksums),
            _lists(skip_ends, skip_dsns),
            _lists(skip_ends, skip_lsns),
            pa.array(scalars["error"], pa.string()),
        ]
        for column in scalars.values():
            column.clear()
        for values in (checksums, skip_dsns, skip_lsns):
            values.clear()
        del checksum_ends[1:], skip_ends[1:]
        return pa.RecordBatch.from_arrays(arrays, schema=schemas.AUDIT)

    for found in driver_records(unit, options.verify, lsn_range):
        row(found)
        if len(scalars["lsn"]) >= AUDIT_RECORDS_MAX:
            yield take()
    if scalars["lsn"]:
        yield take()


def _lists(ends: list[int], values: list[int]) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), pa.array(values, pa.int64()))


# --- level rows (one table's appended rows, typed) --------------------------------------------


def txn_entries(unit: Unit, options: ReadOptions) -> Iterator[tuple[BackendRecord, int, TxnEntry]]:
    """(backend record, DSN, entry) of every transaction entry passing the bounds, with the
    command level's damage rules (report mode skips damage: other levels list it)."""
    bounds = options.bounds
    lsn_range, dsn_range, ts_range = (
        bounds.range("lsn"),
        bounds.range("dsn"),
        bounds.range("commit_ts"),
    )
    for found in driver_records(unit, options.verify, lsn_range):
        rec, decoded = found.rec, found.decoded
        if not isinstance(decoded, EntriesRecord):
            continue
        for index, payload in enumerate(decoded.entries):
            dsn = decoded.start_dsn + index
            if not dsn_range.holds(dsn):
                continue
            try:
                entry = decode_entry(payload, dsn)
            except WalCorruption as exc:
                if options.verify != VERIFY_REPORT:
                    raise InputCorrupt(unit.path, rec.offset_bytes, str(exc)) from None
                continue
            if isinstance(entry, TxnEntry) and ts_range.holds(entry.commit_ts):
                yield rec, dsn, entry
