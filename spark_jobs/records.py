"""The two lowest levels of every reader: backend records (a file WAL segment's frames, or a logsvc
shard replica's accepted records) and the driver records in them, each decoded once, here, with
the verify rules every level shares (spark_jobs/walread.py describes them):

* `backend_records`: one `BackendRecord` per frame or accepted record, a TRUNCATE, or damage
  (`verify=true` raises `InputCorrupt` at damaged framing, `report` yields it as a record of kind
  `corrupt` or `torn_tail`, `false` skips the backend's checksums);
* `driver_records`: the same, each payload decoded by `tae_driver.record.decode`; a record
  that does not decode raises `InputCorrupt` unless verify is `report` (then it comes with
  `decoded=None` and the reason). With `split=False` (verify `true` or `false` only) an
  ENTRIES record comes as an `EntriesBody`, checked but for the walk of its entries, which
  the reader does for many records at once and reports with `record_corrupt`
  (spark_jobs/entries.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Range
from spark_jobs.inputs import BACKEND_FILE, Unit, read_segment_live
from spark_jobs.verify import KIND_CORRUPT, KIND_TORN, VERIFY_FALSE, VERIFY_REPORT, VERIFY_TRUE
from tae_driver.backends import segment as file_segment
from tae_driver.errors import CorruptRecord, StorageCorruption
from tae_driver.record import (
    DecodedRecord,
    EntriesBody,
    SkipRecord,
    decode,
    decode_unsplit,
    payload_checksum,
)


@dataclass(frozen=True, slots=True)
class BackendRecord:
    segment: str
    offset_bytes: int
    lsn: int | None
    raft_index: int | None
    payload: bytes | None  # None: a TRUNCATE frame or damage
    kind: str  # "record", "truncate", KIND_TORN, KIND_CORRUPT
    error: str | None = None


def backend_records(unit: Unit, verify: str) -> Iterator[BackendRecord]:
    if unit.backend == BACKEND_FILE:
        try:
            frames = segment_frames(unit, verify != VERIFY_FALSE)
        except StorageCorruption as exc:  # a bad segment header
            if verify == VERIFY_TRUE:
                raise InputCorrupt(unit.path, exc.offset_bytes, exc.reason) from None
            yield BackendRecord(
                unit.segment, exc.offset_bytes, None, None, None, KIND_CORRUPT, exc.reason
            )
            return
        for at in frames.frames:
            frame = at.frame
            if frame.frame_type is file_segment.FrameType.RECORD:
                yield BackendRecord(unit.segment, at.offset, frame.lsn, None, frame.body, "record")
            else:
                yield BackendRecord(unit.segment, at.offset, frame.lsn, None, None, "truncate")
        if frames.end == file_segment.END_CORRUPT:
            if verify == VERIFY_TRUE:
                raise InputCorrupt(unit.path, frames.end_offset, frames.end_reason or "corrupt")
            yield BackendRecord(
                unit.segment, frames.end_offset, None, None, None, KIND_CORRUPT, frames.end_reason
            )
        elif frames.end == file_segment.END_TORN and verify == VERIFY_REPORT:
            yield BackendRecord(
                unit.segment, frames.end_offset, None, None, None, KIND_TORN, frames.end_reason
            )
        return
    from spark_jobs.journal import read_journal  # logsvc's reader: for a journal only

    for entry in read_journal(unit.path, verify=verify, want_records=True):
        if entry.truncated_lsn is not None:
            yield BackendRecord(
                entry.segment,
                entry.offset_bytes,
                entry.truncated_lsn,
                entry.raft_index,
                None,
                "truncate",
            )
            continue
        if entry.kind in (KIND_TORN, KIND_CORRUPT):
            yield BackendRecord(
                entry.segment,
                entry.offset_bytes,
                None,
                entry.raft_index,
                None,
                entry.kind,
                entry.error,
            )
            continue
        for lsn, record in entry.accepted:
            yield BackendRecord(
                entry.segment, entry.offset_bytes, lsn, entry.raft_index, record, "record"
            )


def segment_frames(unit: Unit, verify: bool) -> file_segment.SegmentFrames:
    """The frames of a file WAL segment; the newest read again on damage
    (`inputs.read_segment_live`). The record levels and the inventory read through it.
    Damage: "corrupt" with checksums (a tear with whole frames after it); without them a
    torn header shows only as an early end, so any end but "clean"."""

    def damaged(frames: file_segment.SegmentFrames) -> bool:
        if verify:
            return frames.end == file_segment.END_CORRUPT
        return frames.end != file_segment.END_CLEAN

    return read_segment_live(
        lambda: file_segment.read_segment_frames(
            read_file(unit.path), unit.path, newest=unit.newest, verify=verify
        ),
        damaged,
        unit.newest,
    )


def read_file(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InputCorrupt(path, 0, f"cannot read: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class DriverRecord:
    """A backend record and, when it holds a payload, the driver record decoded from it."""

    rec: BackendRecord
    decoded: DecodedRecord | EntriesBody | None
    """None: no payload (a TRUNCATE or damaged framing), or a payload that does not decode.
    An `EntriesBody` only from `driver_records(split=False)`."""
    error: str | None = None
    """Why the payload does not decode (verify `report` only)."""


class DecodeCount:
    """Driver records decoded by this process so far. Every reader decodes here, so the
    difference across a piece of work is how many records it read: the Spark engine reports
    it per task, which is how a test proves each log is read once."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


DECODES = DecodeCount()


def driver_records(
    unit: Unit, verify: str, lsns: Range, *, split: bool = True
) -> Iterator[DriverRecord]:
    """Every backend record of `unit` whose LSN `lsns` holds, with its driver record decoded
    (the one place that does; a record outside `lsns` is not decoded, so its damage is not
    seen). `split=False`: ENTRIES records come unsplit (`EntriesBody`); the caller walks
    their bodies and names a body that does not parse with `record_corrupt` (verify
    `report`, which yields damage as rows as it is read, always splits)."""
    lazy = not split and verify != VERIFY_REPORT
    for rec in backend_records(unit, verify):
        if not lsns.holds(rec.lsn):
            continue
        if rec.payload is None:
            yield DriverRecord(rec, None)
            continue
        DECODES.total += 1
        try:
            decoded = decode_unsplit(rec.payload) if lazy else decode(rec.payload)
        except CorruptRecord as exc:
            if verify != VERIFY_REPORT:
                raise record_corrupt(unit, rec, exc) from None
            yield DriverRecord(rec, None, _reason(rec, exc))
            continue
        yield DriverRecord(rec, decoded)


def record_corrupt(unit: Unit, rec: BackendRecord, exc: CorruptRecord) -> InputCorrupt:
    """The error for a driver record that does not decode (verify `true` or `false`)."""
    return InputCorrupt(unit.path, rec.offset_bytes, _reason(rec, exc))


def _reason(rec: BackendRecord, exc: CorruptRecord) -> str:
    return f"driver record at LSN {rec.lsn}: {exc}"


class RecordFields(NamedTuple):  # a tuple: made once per record on every read of a log
    """What the audit level (walread `_audit_level`: one row per backend record) and the
    replay plan (plan_inputs.PlanInput) read of one record: `record_fields` is the one
    mapping from a DriverRecord to them, so the two reads of a log cannot disagree."""

    kind: str
    """"entry", "marker" (no entries), "skip", "truncate", KIND_TORN or KIND_CORRUPT (damaged
    framing, or a payload that does not decode)."""
    start_dsn: int | None  # skip: 0; no payload or damage: None
    record_count: int | None  # entries, or skip pairs; no payload or damage: None
    safe_dsn: int | None  # skip: 0; no payload or damage: None
    checksum: int | None
    """The record's checksum field as a signed BIGINT (schemas.signed64); None without a
    decoded payload."""
    skip_pairs: tuple[tuple[int, int], ...]  # (DSN, LSN) of a skip record; else empty
    error: str | None


_TWO_63, _TWO_64 = 1 << 63, 1 << 64


def record_fields(found: DriverRecord) -> RecordFields:
    rec, decoded = found.rec, found.decoded
    if rec.payload is None:
        return RecordFields(rec.kind, None, None, None, None, (), rec.error)
    if decoded is None:
        return RecordFields(KIND_CORRUPT, None, None, None, None, (), found.error)
    checksum = payload_checksum(rec.payload)
    checksum = checksum - _TWO_64 if checksum >= _TWO_63 else checksum
    if isinstance(decoded, SkipRecord):
        pairs = decoded.pairs
        return RecordFields("skip", 0, len(pairs), 0, checksum, pairs, None)
    kind = "entry" if decoded.count else "marker"
    return RecordFields(
        kind, decoded.start_dsn, decoded.count, decoded.safe_dsn, checksum, (), None
    )
