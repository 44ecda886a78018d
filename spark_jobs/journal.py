"""One logsvc shard replica's journal read offline: every Raft entry, and the LSNs the
shard's own state machine gives its records. Pure over files; never writes, never locks.

Nothing here parses a format: segments are read by the store's `read_segment_records`
(logsvc/store/records.py), pysyncobj's wrapping is opened by `raft.command_of_entry_offline`
(no globals unpickled), commands are decoded by `commands.decode_command`, and LSNs come
from applying each command to a real `ShardStateMachine` (restored from the replica's Raft
snapshot when the journal was compacted), in raft-index order, exactly as the replica did.
That is why a journal is read whole, in order (spark_jobs/inputs.py): a retried append
(same client and seq) gets no new LSN, and a fenced writer's append gets none at all.

The journal may end in entries that were never committed (a replica's uncommitted tail):
offline there is no commit index (it is never persisted: raft/adapter.py hole 13), so they are read
as if committed. The driver's replay rules treat such a tail as trailing records.

Verification (`verify`):
* `true`: damage recovery would refuse is `InputCorrupt(path, offset, reason)`; a torn tail
  of the newest segment ends the journal silently (recovery cuts it: never acknowledged);
* `report`: damage becomes one row (`kind` "corrupt" or "torn_tail", `checksum_ok` false,
  `error`) and ends the journal (past a lost entry no LSN can be known);
* `false`: record checksums are not computed (headers are walked); a command is still
  decoded, and checked, by its own decoder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

from logsvc.shard import snapshot_file
from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Appended,
    AppendGroup,
    Barrier,
    Command,
    GroupAppended,
    LeaseGranted,
    Result,
    Truncate,
    Truncated,
    UnfencedTruncate,
    decode_command,
)
from logsvc.shard.errors import CommandCorrupt, SnapshotCorrupt
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits
from logsvc.shard.raft import entries as raft_entries
from logsvc.shard.state_machine import ShardStateMachine
from logsvc.store import records
from logsvc.store.meta import META_FILE_NAME, decode_meta
from spark_jobs.errors import InputCorrupt
from spark_jobs.inputs import JOURNAL_DIR, SNAPSHOT_FILE, journal_segments, read_segment_live
from spark_jobs.verify import (
    KIND_CORRUPT,
    KIND_TORN,
    VERIFY_FALSE,
    VERIFY_MODES,
    VERIFY_REPORT,
    VERIFY_TRUE,
)

_COMMAND_KINDS: dict[type, str] = {
    AppendBatch: "append_batch",
    AppendGroup: "append_group",
    AcquireLease: "acquire_lease",
    Truncate: "truncate",
    UnfencedTruncate: "unfenced_truncate",
    Barrier: "barrier",
}
# A segment file larger than the format allows is not read (it could exhaust memory).
SEGMENT_BYTES_READ_MAX = records.SEGMENT_BYTES_LIMIT


@dataclass(slots=True)
class RaftEntry:
    """One Raft entry of a replica's journal (or one damage row, `kind` torn_tail/corrupt).

    `records` counts the entry's flat record sequence; `lsn_first`/`lsn_count` are the LSNs
    the state machine gave some of them (None/0: none, or unknown for entries already in the
    restored snapshot); `outcome` says why (accepted, duplicate, refused, partial, granted,
    applied, in_snapshot). `accepted` holds (lsn, record bytes) when asked for."""

    segment: str
    offset_bytes: int
    raft_index: int | None
    term: int | None
    kind: str
    outcome: str | None
    records: int
    lsn_first: int | None
    lsn_count: int
    payload_bytes: int
    checksum: int | None
    checksum_ok: bool
    error: str | None
    accepted: tuple[tuple[int, bytes], ...] = ()
    truncated_lsn: int | None = None  # an applied truncate: every LSN <= this is dropped


@dataclass(frozen=True, slots=True)
class JournalState:
    """What the state machine held after the last entry read."""

    first_lsn: int
    next_lsn: int
    log_start_raft_index: int


def read_journal(
    shard_dir: str,
    *,
    verify: str = VERIFY_TRUE,
    want_records: bool = False,
    limits: ShardLimits = DEFAULT_SHARD_LIMITS,
    end_state: list[JournalState] | None = None,
) -> Iterator[RaftEntry]:
    """Every Raft entry of the replica in `shard_dir` (`<data_dir>/shards/<id>`), in order.
    `end_state`, when given, receives the state machine's bounds once the journal is read.
    `limits` must be the node's shard limits (the dedupe table decides which retries get no
    LSN); offline the defaults are assumed."""
    assert verify in VERIFY_MODES
    journal = os.path.join(shard_dir, JOURNAL_DIR)
    segments = journal_segments(journal)
    log_start = _log_start(journal, segments)
    machine, applied_upto = _initial_machine(shard_dir, log_start, limits)
    if machine.first_lsn > 1:  # restored from a snapshot taken after a truncate
        yield RaftEntry(
            SNAPSHOT_FILE,
            0,
            applied_upto,
            None,
            "snapshot",
            "applied",
            0,
            None,
            0,
            0,
            None,
            True,
            None,
            truncated_lsn=machine.first_lsn - 1,
        )
    expected: int | None = None
    for position, (first_index, name, _) in enumerate(segments):
        following = segments[position + 1][0] if position + 1 < len(segments) else None
        if following is not None and following <= log_start:
            continue  # wholly below the log start: recovery deletes it
        path = os.path.join(journal, name)
        newest = following is None
        if expected is not None and first_index != expected:
            reason = f"gap or missing segment: expected first index {expected}"
            yield from _damage(path, name, 0, reason, KIND_CORRUPT, verify)
            break
        data, read = read_segment(path, first_index, newest, verify != VERIFY_FALSE)
        stopped = False
        for view, checksum in zip(read.records, read.checksums, strict=True):
            if view.index < log_start:
                continue
            payload = data[view.payload_offset_bytes : view.end_bytes]
            entry = _entry(name, view, checksum, payload, machine, applied_upto, want_records)
            yield entry
            if entry.kind == KIND_CORRUPT:
                if verify == VERIFY_TRUE:
                    raise InputCorrupt(path, view.offset_bytes, entry.error or "corrupt")
                stopped = True
                break
        if stopped:
            break
        if read.end == records.END_TORN:
            if verify == VERIFY_REPORT:
                yield _damage_row(name, read.end_offset_bytes, read.end_reason, KIND_TORN)
            break
        if read.end == records.END_CORRUPT:
            yield from _damage(
                path,
                name,
                read.end_offset_bytes,
                read.end_reason or "corrupt",
                KIND_CORRUPT,
                verify,
            )
            break
        expected = read.first_index + len(read.records)
    if end_state is not None:
        end_state.append(JournalState(machine.first_lsn, machine.next_lsn, log_start))


def _log_start(journal: str, segments: list[tuple[int, str, int]]) -> int:
    path = os.path.join(journal, META_FILE_NAME)
    if not os.path.exists(path):
        if segments:
            raise InputCorrupt(path, 0, "segments exist but meta is missing")
        return 1
    meta = decode_meta(_read_file(path))
    if isinstance(meta, tuple):
        offset, reason = meta
        raise InputCorrupt(path, offset, reason)
    return meta.first_index


def _initial_machine(
    shard_dir: str, log_start: int, limits: ShardLimits
) -> tuple[ShardStateMachine, int]:
    """A fresh state machine for a journal that starts at index 1; otherwise the one the
    replica's snapshot holds, and the raft index it is the state after."""
    if log_start <= 1:
        return ShardStateMachine(limits), 0
    path = os.path.join(shard_dir, SNAPSHOT_FILE)
    if not os.path.exists(path):
        raise InputCorrupt(
            path,
            0,
            f"the journal is compacted (starts at raft index {log_start}) but the "
            "snapshot is missing: its LSNs cannot be known",
        )
    try:
        snapshot = snapshot_file.decode(_read_file(path))
        machine = ShardStateMachine.restore(snapshot.state, limits)
    except (snapshot_file.SnapshotFileCorrupt, SnapshotCorrupt) as exc:
        raise InputCorrupt(path, 0, str(exc)) from None
    return machine, snapshot.last.index


def _entry(
    segment: str,
    view: records.RecordView,
    checksum: int,
    payload: bytes,
    machine: ShardStateMachine,
    applied_upto: int,
    want_records: bool,
) -> RaftEntry:
    row = RaftEntry(
        segment,
        view.offset_bytes,
        view.index,
        view.term,
        raft_entries.journal_entry_kind(payload),
        None,
        0,
        None,
        0,
        len(payload),
        checksum,
        True,
        None,
    )
    if row.kind != raft_entries.JOURNAL_ENTRY_REGULAR:
        return row
    try:
        encoded = raft_entries.command_of_entry_offline(payload)
        assert encoded is not None
        command = decode_command(encoded)
    except (raft_entries.JournalEntryUndecodable, CommandCorrupt) as exc:
        row.kind, row.checksum_ok, row.error = KIND_CORRUPT, False, str(exc)
        return row
    row.kind = _COMMAND_KINDS[type(command)]
    flat = _flat_records(command)
    row.records = len(flat)
    if view.index <= applied_upto:
        row.outcome = "in_snapshot"
        return row
    result = machine.apply(view.index, command)
    if isinstance(result, Truncated) and result.first_lsn > 1:
        row.truncated_lsn = result.first_lsn - 1
    runs = _lsn_runs(command, result)
    row.outcome = _outcome(command, result, runs)
    if runs:
        row.lsn_first = runs[0][1]
        row.lsn_count = sum(count for _, _, count in runs)
        if want_records:
            row.accepted = tuple(
                (first_lsn + i, flat[offset + i])
                for offset, first_lsn, count in runs
                for i in range(count)
            )
    return row


def _flat_records(command: Command) -> tuple[bytes, ...]:
    """The entry's flat record sequence (commands.decode_entry_records, from the decoded
    command instead of decoding its bytes a second time)."""
    if isinstance(command, AppendBatch):
        return command.records
    if isinstance(command, AppendGroup):
        return tuple(chain.from_iterable(batch.records for batch in command.batches))
    return ()


def _lsn_runs(command: Command, result: Result) -> list[tuple[int, int, int]]:
    """(offset in the flat sequence, first LSN, count) of every accepted batch."""
    if isinstance(result, Appended):
        return [] if result.duplicate or not result.count else [(0, result.first_lsn, result.count)]
    if isinstance(result, GroupAppended):
        assert isinstance(command, AppendGroup)
        runs = []
        offset = 0
        for batch, outcome in zip(command.batches, result.results, strict=True):
            if isinstance(outcome, Appended) and not outcome.duplicate and outcome.count:
                runs.append((offset, outcome.first_lsn, outcome.count))
            offset += len(batch.records)
        return runs
    return []


def _outcome(command: Command, result: Result, runs: list[tuple[int, int, int]]) -> str:
    if isinstance(result, Appended):
        return "duplicate" if result.duplicate else "accepted"
    if isinstance(result, GroupAppended):
        accepted = sum(1 for r in result.results if isinstance(r, Appended) and not r.duplicate)
        if accepted == len(result.results):
            return "accepted"
        return "partial" if accepted else "refused"
    if isinstance(result, (LeaseGranted, Truncated)) or isinstance(command, Barrier):
        return "granted" if isinstance(result, LeaseGranted) else "applied"
    return "refused"


def _damage(
    path: str, segment: str, offset: int, reason: str, kind: str, verify: str
) -> Iterator[RaftEntry]:
    if verify == VERIFY_TRUE and kind == KIND_CORRUPT:
        raise InputCorrupt(path, offset, reason)
    yield _damage_row(segment, offset, reason, kind)


def _damage_row(segment: str, offset: int, reason: str | None, kind: str) -> RaftEntry:
    return RaftEntry(segment, offset, None, None, kind, None, 0, None, 0, 0, None, False, reason)


def read_segment(
    path: str, first_index: int, newest: bool, verify: bool
) -> tuple[bytes, records.SegmentRecords]:
    """A journal segment's bytes and records; the newest read again on damage
    (`inputs.read_segment_live`). The record levels and the inventory read through it.
    Damage: "corrupt" with checksums; without them any end but "clean" (as
    `records.segment_frames` says for a file WAL)."""

    def read() -> tuple[bytes, records.SegmentRecords]:
        data = _read_file(path)
        read_records = records.read_segment_records(
            data,
            first_index,
            newest=newest,
            payload_bytes_max=records.PAYLOAD_BYTES_LIMIT,
            verify=verify,
        )
        return data, read_records

    def damaged(found: tuple[bytes, records.SegmentRecords]) -> bool:
        if verify:
            return found[1].end == records.END_CORRUPT
        return found[1].end != records.END_CLEAN

    return read_segment_live(read, damaged, newest)


def _read_file(path: str) -> bytes:
    try:
        size = os.path.getsize(path)
        if size > SEGMENT_BYTES_READ_MAX:
            raise InputCorrupt(path, 0, f"{size} bytes: larger than any segment can be")
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InputCorrupt(path, 0, f"cannot read: {exc.strerror}") from None
