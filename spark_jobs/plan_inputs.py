"""What replay_as_of's plan of one log reads (spark_jobs/replay.py rules 1-3), gathered as a
reader passes the log's backend records: `StreamInput` (a `PlanStream`, plan_stream.py:
constant memory, the plan of a clean log) and `PlanInput` (every record held, the plan of any
log, up to REPLAY_PLAN_RECORDS_MAX records); `plan_from_records` from the audit level's
narrow columns (`PLAN_COLUMNS`) tries the first, then the second. `stream_records` reads a
log's records alone into a `PlanStream`; `stream_upto` reads the records at or below a
truncated LSN again, for a `PlanStream`'s `prefix`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import replay
from spark_jobs.errors import ReplayRefused
from spark_jobs.filters import Range
from spark_jobs.inputs import BACKEND_FILE, Unit
from spark_jobs.limits import REPLAY_PLAN_RECORDS_MAX
from spark_jobs.plan_stream import PlanStream
from spark_jobs.records import DriverRecord, driver_records, record_fields
from spark_jobs.segment_buffers import SEGMENT_BUFFERS
from spark_jobs.verify import VERIFY_REPORT
from spark_jobs.walread_segments import SegmentRecords, segment_records


def plan_from_records(
    records: pa.Table, where: str, base: replay.BaseState = replay.EMPTY_BASE
) -> replay.ReplayPlan:
    """The replay plan from the audit level of one log (one row per backend record; shared
    with the Spark engine, which collects the same narrow columns): streamed over its
    columns when the log is clean (plan_stream.py), else record by record (`PlanInput`,
    up to REPLAY_PLAN_RECORDS_MAX records)."""
    narrow = records.select(PLAN_COLUMNS)
    streamed = _stream_table(narrow, base)
    prefix = None
    if streamed.needs_prefix():
        lsns = pc.fill_null(narrow.column("lsn"), 0)
        prefix = _stream_table(narrow.filter(pc.less_equal(lsns, streamed.truncated_lsn)), base)
    plan = streamed.plan(where, base, prefix)
    if plan is not None:
        return plan
    refuse_past_records_max(narrow.num_rows, where)
    gathered = PlanInput(where)
    for batch in narrow.to_batches(max_chunksize=65_536):
        for row in batch.to_pylist():
            _add_row(gathered, row)
    return gathered.plan(where, base)


def _stream_table(narrow: pa.Table, base: replay.BaseState) -> PlanStream:
    """A `PlanStream` shown the audit level's rows in their order (the reader's)."""
    stream = PlanStream(base.ckp_dsn)
    kinds = narrow.column("kind")
    held = pc.is_in(kinds, pa.array(["entry", "marker"]))
    found = narrow.filter(held)

    def ints(name: str) -> npt.NDArray[np.int64]:
        return np.asarray(found.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)

    if found.num_rows:
        stream.add_arrays(
            ints("lsn"),
            ints("record_start_dsn"),
            ints("record_count"),
            ints("safe_dsn"),
            ints("record_checksum"),
        )
    truncates = narrow.filter(pc.equal(kinds, "truncate")).column("lsn").to_pylist()
    for lsn in truncates:
        stream.add_truncate(lsn)
    skips = narrow.filter(pc.equal(kinds, "skip"))
    for row in skips.select(["skip_dsns", "skip_lsns"]).to_pylist():
        stream.add_skips(zip(row["skip_dsns"], row["skip_lsns"], strict=True))
    return stream


def refuse_past_records_max(count: int, where: str) -> None:
    """`ReplayRefused` when a record-by-record plan would hold more than the limit."""
    if count > REPLAY_PLAN_RECORDS_MAX:
        raise ReplayRefused(
            f"{where}: the log is not clean (copies, skip records, gaps or records out of "
            "LSN order: run lsn_audit) and its plan would be made record by record over "
            f"more than REPLAY_PLAN_RECORDS_MAX ({REPLAY_PLAN_RECORDS_MAX}) records "
            "(spark_jobs/limits.py: one worker's memory); repair the log, or replay as of a "
            "timestamp whose checkpoint lets the log be truncated first"
        )


PLAN_COLUMNS = [
    "kind",
    "lsn",
    "record_start_dsn",
    "record_count",
    "safe_dsn",
    "record_checksum",
    "skip_dsns",
    "skip_lsns",
]


def plan_from_rows(
    rows: Iterable[dict[str, Any]], where: str, base: replay.BaseState = replay.EMPTY_BASE
) -> replay.ReplayPlan:
    gathered = PlanInput(where)
    for row in rows:
        _add_row(gathered, row)
    return gathered.plan(where, base)


def _add_row(gathered: PlanInput, row: dict[str, Any]) -> None:
    gathered.add(
        row["kind"],
        row["lsn"],
        row["record_start_dsn"],
        row["record_count"],
        row["safe_dsn"],
        row["record_checksum"],
        row["skip_dsns"],
        row["skip_lsns"],
    )


class PlanInput:
    """What the record-by-record replay plan reads of each backend record of one log: the
    audit level's narrow columns (`PLAN_COLUMNS`, as rows)."""

    __slots__ = ("by_lsn", "held", "skips", "truncated", "where")

    def __init__(self, where: str = "log") -> None:
        self.where = where
        self.held = 0  # records added: refused past REPLAY_PLAN_RECORDS_MAX
        self.by_lsn: dict[int, replay.DriverRecord] = {}
        self.skips: list[tuple[int, int]] = []
        self.truncated = 0

    def add(
        self,
        kind: str,
        lsn: int | None,
        start_dsn: int | None,
        count: int | None,
        safe_dsn: int | None,
        checksum: int | None,
        skip_dsns: Iterable[int],
        skip_lsns: Iterable[int],
    ) -> None:
        if kind in ("entry", "marker"):
            assert lsn is not None and start_dsn is not None and count is not None
            assert safe_dsn is not None and checksum is not None
            self.held += 1
            refuse_past_records_max(self.held, self.where)
            self.by_lsn[lsn] = replay.DriverRecord(lsn, start_dsn, count, safe_dsn, checksum)
        elif kind == "skip":
            self.skips.extend(zip(skip_dsns, skip_lsns, strict=True))
        elif kind == "truncate":
            assert lsn is not None
            self.truncated = max(self.truncated, lsn)

    def plan(self, where: str, base: replay.BaseState) -> replay.ReplayPlan:
        """The plan of every record added, record by record, a later record of one LSN
        replacing an earlier one."""
        return replay.plan_replay(self.by_lsn.values(), self.skips, self.truncated, where, base)


class StreamInput:
    """A `PlanStream` shown the records as a reader passes them (entries.RecordSink), mapped
    as the audit level maps them (records.record_fields: one mapping for both)."""

    __slots__ = ("stream",)

    def __init__(self, ckp_dsn: int) -> None:
        self.stream = PlanStream(ckp_dsn)

    def add_record(self, found: DriverRecord) -> None:
        fields = record_fields(found)
        lsn = found.rec.lsn
        if fields.kind in ("entry", "marker"):
            assert lsn is not None
            assert fields.start_dsn is not None and fields.record_count is not None
            assert fields.safe_dsn is not None and fields.checksum is not None
            self.stream.add_one(
                lsn, fields.start_dsn, fields.record_count, fields.safe_dsn, fields.checksum
            )
        elif fields.kind == "skip":
            self.stream.add_skips(fields.skip_pairs or ())
        elif fields.kind == "truncate":
            assert lsn is not None
            self.stream.add_truncate(lsn)

    def add_records(self, found: SegmentRecords) -> None:
        self.stream.add_arrays(
            found.lsns, found.start_dsns, found.counts, found.safe_dsns, found.checksums
        )
        if len(found.truncate_lsns):
            self.stream.add_truncate(int(found.truncate_lsns.max()))


def stream_records(units: Iterable[Unit], verify: str, ckp_dsn: int) -> PlanStream:
    """Every record of `units` shown to a `PlanStream` (records only, no entry decoded): a
    clean segment's at once as arrays, any other unit's record by record, as `entry_chunks`
    shows its sink (spark_jobs/entries.py)."""
    sink = StreamInput(ckp_dsn)
    for unit in units:
        if unit.backend == BACKEND_FILE and verify != VERIFY_REPORT:
            with SEGMENT_BUFFERS.lease(unit.path) as data:
                found = segment_records(unit, data, verify, Range())
                if found is not None:
                    sink.add_records(found)
                    continue
        for record in driver_records(unit, verify, Range(), split=False):
            sink.add_record(record)
    return sink.stream


def stream_upto(units: Iterable[Unit], verify: str, truncated_lsn: int, ckp_dsn: int) -> PlanStream:
    """The records at or below `truncated_lsn` shown to a `PlanStream` of their own (records
    only, no entry decoded), the units read in order up to the first one reaching past it:
    with the file backend, the head of the segment holding the truncated LSN (the segments
    wholly below it are deleted)."""
    sink = StreamInput(ckp_dsn)
    for unit in units:
        if _records_upto(unit, verify, truncated_lsn, sink):
            break
    return sink.stream


def _records_upto(unit: Unit, verify: str, truncated_lsn: int, sink: StreamInput) -> bool:
    """`unit`'s records at or below `truncated_lsn` shown to `sink`; whether it holds a
    record past it."""
    if unit.backend == BACKEND_FILE and verify != VERIFY_REPORT:
        with SEGMENT_BUFFERS.lease(unit.path) as data:
            found = segment_records(unit, data, verify, Range())
            if found is not None:
                cut = found.lsns <= truncated_lsn
                sink.stream.add_arrays(
                    found.lsns[cut],
                    found.start_dsns[cut],
                    found.counts[cut],
                    found.safe_dsns[cut],
                    found.checksums[cut],
                )
                return not bool(cut.all())
    for record in driver_records(unit, verify, Range(), split=False):
        if record.rec.lsn is not None and record.rec.lsn > truncated_lsn:
            return True
        sink.add_record(record)
    return False
