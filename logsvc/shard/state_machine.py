"""The shard's replicated state machine: dense LSNs, leases with epochs, exactly-once
appends, monotonic truncation, and snapshots taken at truncation points.

Pure and deterministic: no I/O, no clock, no randomness, no threads. Every replica applies
the same commands in the same raft-index order and ends in byte-identical state (compare
`snapshot()`). It never holds payload bytes: an AppendBatch's records stay in the journal
(the shard store); the state machine only remembers which raft index holds which LSNs.
The caller serializes access (one tick thread applies; readers take the caller's lock).

Rules (docs/decisions/0001-shard-replication.md, "Leases, fencing, dedupe"):

* AcquireLease(holder, epoch) is granted iff `epoch > current_epoch`, or `epoch ==
  current_epoch and holder == current_holder` (an idempotent retry); otherwise
  `StaleEpoch(current)`. A writer fenced at epoch e can never write or re-acquire with e
  again (MatrixOne's "last connect wins", matrixone-wal.md §3.3, cannot happen).
* AppendBatch(client_id, seq, epoch, records), checked in this order:
  1. a retry of a remembered `(client_id, seq)` returns the original LSNs
     (`Appended(duplicate=True)`) whatever its epoch: the batch IS in the log, and telling
     a fenced writer otherwise would make it believe a durable record was lost;
  2. `epoch < current_epoch` -> `StaleEpoch`; `epoch > current_epoch` -> `NotLeaseHolder`
     (epoch 0 is accepted while no lease was ever granted: current epoch 0);
  3. `seq` below the client's forgotten horizon -> `DuplicateUnknown` (see Dedupe);
  4. accepted: the records get LSNs `[next_lsn, next_lsn + count)`. An empty batch is
     accepted with `count == 0` and `first_lsn == next_lsn`, and is remembered for dedupe.
  Refused appends consume no LSN and change nothing.
* AppendGroup(batches) (issue 4's server-side group commit): each batch is applied in
  order exactly as if it were its own AppendBatch entry at the group's raft index (the
  rules above, dedupe against everything before it in the group too), and the result is
  `GroupAppended`, one result per batch. So the accepted batches get consecutive LSNs
  across the group, and refused and duplicate ones consume none.
* Truncate(lsn, epoch): first the epoch, exactly as an append's (rule 2 above):
  `epoch < current_epoch` -> `StaleEpoch`, `epoch > current_epoch` -> `NotLeaseHolder`
  (epoch 0 accepted while no lease was ever granted); a refused truncate changes nothing
  and records no snapshot point. Accepted: `first_lsn = max(first_lsn, min(lsn,
  next_lsn))`; lower or equal is a no-op. The result reports the first retained LSN either
  way. UnfencedTruncate(lsn) (type tag 2, written by builds before truncates carried an
  epoch; never proposed now) is applied as those builds applied it: with no epoch check.
* Barrier(token): changes nothing; reports `next_lsn`.

Dedupe. Per client, up to `dedupe_seqs_per_client` accepted seqs -> `(first_lsn, count)`;
when one more is accepted, the lowest seq is forgotten and the client's `seq_floor`
becomes that seq + 1 (it never decreases: only seqs >= seq_floor are ever accepted).
Invariant: every accepted seq >= seq_floor is remembered. So a seq that is not remembered
and is below seq_floor may have been applied (`DuplicateUnknown`), and one at or above it
was certainly not (accepted), even when it arrives after higher seqs (pipelined batches
retried after a leader change). At most
`dedupe_clients_max` clients are remembered; a new client evicts the least recently active
one. Activity is the position of the client's last accepted append in the order of
application: `(raft index, position of the batch in its entry)`, position 0 for a plain
AppendBatch. The raft index is stored per client and the position is not: the table is
kept in activity order (the clients of one AppendGroup, which share its raft index, in
batch order) and snapshots keep that order, so a restored replica evicts exactly as the
others do. A group therefore evicts exactly as the same batches in separate entries.
Known limit: an evicted client is forgotten entirely, so its retry of a batch accepted
before the eviction is appended again. With the defaults that needs 10,000 other clients
to have appended more recently than its last accepted append, before its retry.

Snapshots (0001, "Truncation is the only compaction"). Applying Truncate at raft index T
records a `SnapshotPoint(T, next_lsn, first_lsn, snapshot())`. `compaction_point()` is
the newest point whose `next_lsn` (as of T) is at or below the current `first_lsn`: every
LSN assigned at or before T is truncated, so no retained record lives in an entry at or
before T, and the journal may be compacted to T with that point's bytes as the Raft
snapshot. Points older than the newest compactable one can never be chosen again
(first_lsn never decreases), so they are dropped. At most `snapshot_points_max` points are
kept: the newest ones, except that the compaction point is never dropped for a newer point
that is not compactable yet (the replica may not have used it yet).

LSN index (0001, "Raft index -> LSN" and "Grouped appends"). One row per run of LSNs that
sit consecutively in one entry's *flat record sequence* (`decode_entry_records`: an
AppendBatch's records; an AppendGroup's records of all its batches in order, refused and
duplicate batches included): `(first_lsn, raft_index, count, offset)`. An AppendBatch entry
gives one row at offset 0 (none when empty or refused); an AppendGroup gives one row per
maximal run of accepted batches with no refused or duplicate records between them (one
row, at offset 0, when nothing was refused). `locate(lsn)` answers in O(log rows) with the
slice of the flat sequence that holds `lsn` and the LSNs after it in the same run.

Snapshot points are not part of `snapshot()`. A replica restored from a snapshot starts
with none: it was restored at a compaction point, so its journal already starts there, and
the next Truncate it applies records the next point. (Including them would nest
snapshots inside snapshots and multiply their size by up to `snapshot_points_max`.)
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from itertools import accumulate
from typing import assert_never

from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Appended,
    AppendGroup,
    AppendResult,
    Barrier,
    BarrierDone,
    Command,
    DuplicateUnknown,
    GroupAppended,
    LeaseGranted,
    NotLeaseHolder,
    Result,
    StaleEpoch,
    Truncate,
    Truncated,
    UnfencedTruncate,
    decode_frame,
    encode_frame,
    is_u64,
    xxh3,
)
from logsvc.shard.errors import (
    LsnNotAssigned,
    LsnTruncated,
    SnapshotCorrupt,
    SnapshotIncompatible,
)
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits

SNAPSHOT_MAGIC = b"LSS"
# Version 1: 10 fields; every index row at offset 0 in a distinct entry, client activities
# distinct. Version 2 (grouped appends): an 11th field, the rows' offsets; rows may share a
# raft index and clients an activity. `snapshot()` writes version 1 whenever the state fits
# it (so replicas that never applied a group still exchange snapshots with older builds)
# and version 2 otherwise; `restore` reads both. See FORMAT.md.
SNAPSHOT_VERSION_1 = 1
SNAPSHOT_VERSION_2 = 2
SNAPSHOT_VERSIONS = (SNAPSHOT_VERSION_1, SNAPSHOT_VERSION_2)
SNAPSHOT_VERSION = SNAPSHOT_VERSION_2  # the newest this build reads and writes
SNAPSHOT_FIELDS = {SNAPSHOT_VERSION_1: 10, SNAPSHOT_VERSION_2: 11}

# Hard format limit: the three entry arrays are msgpack bin32 values (at most 2**32 - 1
# bytes, so about 536 million rows); everything else is a few MiB at the default limits.
SNAPSHOT_BYTES_LIMIT = 3 * (2**32 - 1) + 256 * 1024 * 1024

_U64 = "Q"
assert array(_U64).itemsize == 8


@dataclass(frozen=True, slots=True)
class Lease:
    """The current write lease. `(None, 0)` until a lease is granted (epochs start at 1)."""

    holder: str | None
    epoch: int


@dataclass(frozen=True, slots=True)
class EntrySlice:
    """Where `lsn` (the LSN asked of `locate`) and the LSNs after it in the same entry live:
    `decode_entry_records(entry at raft_index)[offset:offset + count]` are the records of
    LSNs `[lsn, lsn + count)`, `count >= 1`. The next LSN, `lsn + count`, is in another
    slice (maybe of the same entry: an AppendGroup with a refused batch in between)."""

    raft_index: int
    offset: int
    count: int

    @property
    def stop(self) -> int:
        """The end (exclusive) of the slice in the entry's flat record sequence."""
        return self.offset + self.count


@dataclass(frozen=True, slots=True)
class SnapshotPoint:
    """The state right after the Truncate applied at `raft_index`.

    `next_lsn` and `first_lsn` are as of that point; `data` is `snapshot()` then, ready to
    be written as the Raft snapshot when the point becomes compactable."""

    raft_index: int
    next_lsn: int
    first_lsn: int
    data: bytes


@dataclass(slots=True)
class _ClientDedupe:
    # Raft index of its last accepted append. Clients of one AppendGroup share it; their
    # order (batch order) is that of `ShardStateMachine._clients`.
    last_active_raft_index: int
    seq_floor: int  # every accepted seq >= seq_floor is in `seqs`
    seqs: dict[int, tuple[int, int]]  # seq -> (first_lsn, count)


class ShardStateMachine:
    """The deterministic state of one shard. See the module docstring for the rules."""

    def __init__(self, limits: ShardLimits = DEFAULT_SHARD_LIMITS) -> None:
        self._limits = limits
        self._last_applied_raft_index = 0
        self._next_lsn = 1  # dense: the LSN the next accepted record gets
        self._first_lsn = 1  # lowest retained LSN; [first_lsn, next_lsn) are retained
        self._lease = Lease(None, 0)
        # Ordered by activity, least recent first: `move_to_end` on every accepted append,
        # applied after every earlier one, keeps it sorted (by raft index, then by batch
        # position within an AppendGroup).
        self._clients: OrderedDict[str, _ClientDedupe] = OrderedDict()
        # The LSN index: one row per run of LSNs consecutive in one retained entry's flat
        # record sequence (module docstring), in LSN order, so raft indexes never decrease
        # and rows of one entry have increasing offsets with a gap between them. The rows
        # are contiguous in LSN (first_lsns[i] + counts[i] == first_lsns[i + 1]) and the
        # last one ends at next_lsn; the first one holds first_lsn (rows wholly below it
        # are pruned when a Truncate is applied). 32 bytes a row.
        self._entry_first_lsns = array(_U64)
        self._entry_raft_indexes = array(_U64)
        self._entry_counts = array(_U64)
        self._entry_offsets = array(_U64)  # of the run's first record in the flat sequence
        self._points: list[SnapshotPoint] = []

    # --- What callers read ---------------------------------------------------------------

    @property
    def limits(self) -> ShardLimits:
        return self._limits

    @property
    def last_applied_raft_index(self) -> int:
        return self._last_applied_raft_index

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    @property
    def first_lsn(self) -> int:
        return self._first_lsn

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def dedupe_clients_count(self) -> int:
        return len(self._clients)

    @property
    def entries_retained_count(self) -> int:
        """Rows of the LSN index: one per retained append entry with records, plus one per
        extra run of an AppendGroup with a refused batch between accepted ones."""
        return len(self._entry_raft_indexes)

    @property
    def snapshot_points(self) -> tuple[SnapshotPoint, ...]:
        """Recorded points, oldest first."""
        return tuple(self._points)

    def remembered_seqs(self, client_id: str) -> dict[int, tuple[int, int]]:
        """A copy of the dedupe entries of one client: seq -> (first_lsn, count)."""
        client = self._clients.get(client_id)
        return {} if client is None else dict(client.seqs)

    def dedupe_clients(self) -> tuple[str, ...]:
        """Remembered clients, least recently active first (the eviction order)."""
        return tuple(self._clients)

    def lsn_to_raft_index(self, lsn: int) -> tuple[int, int]:
        """`(raft_index, offset)` of the entry holding `lsn`: its record is
        `decode_entry_records(entry)[offset]` (for an AppendBatch entry, `records[offset]`,
        and `records[offset:]` are LSNs `lsn, lsn + 1, ...` as before groups existed). For an
        AppendGroup entry the records after `offset` may belong to refused or duplicate
        batches: read ranges with `locate`, which also gives where the run ends.
        O(log rows). Raises `LsnTruncated` below first_lsn and `LsnNotAssigned` at or past
        next_lsn."""
        where = self.locate(lsn)
        return where.raft_index, where.offset

    def locate(self, lsn: int) -> EntrySlice:
        """The slice of an entry's flat record sequence (`decode_entry_records`) holding
        `lsn` and the LSNs after it in the same run: the read path's lookup. O(log rows).

        Raises `LsnTruncated` below first_lsn and `LsnNotAssigned` at or past next_lsn."""
        if lsn < self._first_lsn:
            raise LsnTruncated(lsn, self._first_lsn)
        if lsn >= self._next_lsn:
            raise LsnNotAssigned(lsn, self._next_lsn)
        row = bisect.bisect_right(self._entry_first_lsns, lsn) - 1
        assert row >= 0
        skip = lsn - self._entry_first_lsns[row]
        count = self._entry_counts[row] - skip
        assert count >= 1
        return EntrySlice(self._entry_raft_indexes[row], self._entry_offsets[row] + skip, count)

    def compaction_point(self) -> SnapshotPoint | None:
        """The newest snapshot point with no retained LSN at or before it, or None.

        The same point is returned until a newer one becomes compactable; the caller
        skips a point at or below the raft index it has already compacted to."""
        for point in reversed(self._points):
            if point.next_lsn <= self._first_lsn:
                return point
        return None

    def state_digest(self) -> int:
        """XXH3-64 of `snapshot()`: equal on replicas that applied the same commands."""
        return xxh3(self.snapshot())

    # --- Applying ------------------------------------------------------------------------

    def apply(self, raft_index: int, command: Command) -> Result:
        """Apply the command of the entry at `raft_index`. Indexes must strictly increase
        (the caller skips entries that are not our commands, so gaps are fine)."""
        assert raft_index > self._last_applied_raft_index
        self._last_applied_raft_index = raft_index
        match command:
            case AppendBatch():
                return self._append(raft_index, command)
            case Truncate(lsn, epoch):
                refused = self._lease_refusal(epoch)
                if refused is not None:
                    return refused  # records no snapshot point: nothing changed
                return self._truncate(raft_index, lsn)
            case UnfencedTruncate(lsn):
                return self._truncate(raft_index, lsn)
            case AcquireLease(holder, epoch):
                return self._acquire_lease(holder, epoch)
            case Barrier(token):
                return BarrierDone(token, self._next_lsn)
            case AppendGroup(batches):
                return self._append_group(raft_index, batches)
            case _:
                assert_never(command)

    def _append_group(self, raft_index: int, batches: tuple[AppendBatch, ...]) -> GroupAppended:
        results: list[AppendResult] = []
        offset = 0  # of the batch's first record in the entry's flat record sequence
        for batch in batches:
            results.append(self._append(raft_index, batch, offset))
            offset += len(batch.records)
        assert offset <= self._limits.records_per_batch_max
        return GroupAppended(tuple(results))

    def _append(self, raft_index: int, command: AppendBatch, offset: int = 0) -> AppendResult:
        """Apply one batch whose records start at `offset` in the entry's flat sequence."""
        client = self._clients.get(command.client_id)
        if client is not None:
            remembered = client.seqs.get(command.seq)
            if remembered is not None:
                return Appended(remembered[0], remembered[1], duplicate=True)
        refused = self._lease_refusal(command.epoch)
        if refused is not None:
            return refused
        if client is not None and command.seq < client.seq_floor:
            return DuplicateUnknown(command.client_id, command.seq, min(client.seqs))

        first_lsn = self._next_lsn
        count = len(command.records)
        assert count <= self._limits.records_per_batch_max
        if count:
            if (
                self._entry_raft_indexes
                and self._entry_raft_indexes[-1] == raft_index
                and self._entry_offsets[-1] + self._entry_counts[-1] == offset
            ):
                # The previous accepted batch of the same group ends right before this one
                # (nothing refused in between): the run goes on, one row for both.
                self._entry_counts[-1] += count
            else:
                self._entry_first_lsns.append(first_lsn)
                self._entry_raft_indexes.append(raft_index)
                self._entry_counts.append(count)
                self._entry_offsets.append(offset)
        self._next_lsn = first_lsn + count
        self._remember(raft_index, command, client, first_lsn, count)
        return Appended(first_lsn, count, duplicate=False)

    def _lease_refusal(self, epoch: int) -> StaleEpoch | NotLeaseHolder | None:
        """Why a write (append or truncate) at `epoch` is refused, or None: the epoch must
        be the current lease's (0 while no lease was ever granted)."""
        lease = self._lease
        if epoch < lease.epoch:
            return StaleEpoch(lease.holder, lease.epoch)
        if epoch > lease.epoch:
            return NotLeaseHolder(lease.holder, lease.epoch)
        return None

    def _remember(
        self,
        raft_index: int,
        command: AppendBatch,
        client: _ClientDedupe | None,
        first_lsn: int,
        count: int,
    ) -> None:
        if client is None:
            if len(self._clients) >= self._limits.dedupe_clients_max:
                self._clients.popitem(last=False)  # the least recently active
            client = _ClientDedupe(raft_index, 0, {})
            self._clients[command.client_id] = client
        else:
            self._clients.move_to_end(command.client_id)
            client.last_active_raft_index = raft_index
        client.seqs[command.seq] = (first_lsn, count)
        if len(client.seqs) > self._limits.dedupe_seqs_per_client:
            lowest = min(client.seqs)
            del client.seqs[lowest]
            client.seq_floor = lowest + 1
        assert len(self._clients) <= self._limits.dedupe_clients_max

    def _truncate(self, raft_index: int, lsn: int) -> Truncated:
        self._first_lsn = max(self._first_lsn, min(lsn, self._next_lsn))
        self._prune_entries()
        self._points.append(
            SnapshotPoint(raft_index, self._next_lsn, self._first_lsn, self.snapshot())
        )
        for position in range(len(self._points) - 1, -1, -1):
            if self._points[position].next_lsn <= self._first_lsn:
                del self._points[:position]  # older points can never be chosen again
                break
        if len(self._points) > self._limits.snapshot_points_max:
            # Drop the oldest point, unless it is the compaction point (which the replica
            # may not have used yet): then the oldest of the others. The newest is always
            # kept (snapshot_points_max >= 2), so a later truncate can always pass one.
            compactable = self._points[0].next_lsn <= self._first_lsn
            del self._points[1 if compactable else 0]
        assert len(self._points) <= self._limits.snapshot_points_max
        return Truncated(self._first_lsn)

    def _prune_entries(self) -> None:
        """Drop the index rows of entries wholly below first_lsn (bounded memory)."""
        if self._first_lsn >= self._next_lsn:
            keep_from = len(self._entry_first_lsns)
        else:
            keep_from = bisect.bisect_right(self._entry_first_lsns, self._first_lsn) - 1
        if keep_from > 0:
            del self._entry_first_lsns[:keep_from]
            del self._entry_raft_indexes[:keep_from]
            del self._entry_counts[:keep_from]
            del self._entry_offsets[:keep_from]

    def _acquire_lease(self, holder: str, epoch: int) -> LeaseGranted | StaleEpoch:
        lease = self._lease
        if epoch > lease.epoch or (epoch == lease.epoch and holder == lease.holder):
            assert epoch >= 1
            self._lease = Lease(holder, epoch)
            return LeaseGranted(holder, epoch)
        return StaleEpoch(lease.holder, lease.epoch)

    # --- Snapshots -----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state (not the snapshot points) in canonical form; see FORMAT.md.
        Version 1 when the state fits it (every index row at offset 0, no two clients active
        at the same raft index), version 2 otherwise."""
        clients = []
        previous_active = 0
        tied = False  # two clients with the same activity raft index: version 2
        for client_id, client in self._clients.items():  # eviction order
            active = client.last_active_raft_index
            assert active >= previous_active
            tied = tied or active == previous_active
            previous_active = active
            seqs = tuple((seq, lsns[0], lsns[1]) for seq, lsns in sorted(client.seqs.items()))
            clients.append((client_id, active, client.seq_floor, seqs))
        # A row at a non-zero offset is version 2. (Two rows of one entry: the second has a
        # non-zero offset, since runs are maximal.)
        offsets = self._entry_offsets
        v2 = tied or offsets.count(0) != len(offsets)
        version = SNAPSHOT_VERSION_2 if v2 else SNAPSHOT_VERSION_1
        body: tuple[object, ...] = (
            self._last_applied_raft_index,
            self._next_lsn,
            self._first_lsn,
            self._lease.holder,
            self._lease.epoch,
            self._limits.dedupe_clients_max,
            self._limits.dedupe_seqs_per_client,
            tuple(clients),
            _u64_le_bytes(self._entry_raft_indexes),
            _u64_le_bytes(self._entry_counts),
        )
        if version == SNAPSHOT_VERSION_2:
            body += (_u64_le_bytes(offsets),)
        assert len(body) == SNAPSHOT_FIELDS[version]
        data = encode_frame(SNAPSHOT_MAGIC, version, body)
        assert len(data) <= SNAPSHOT_BYTES_LIMIT
        return data

    @classmethod
    def restore(
        cls, data: bytes | bytearray | memoryview, limits: ShardLimits = DEFAULT_SHARD_LIMITS
    ) -> ShardStateMachine:
        """The state machine a snapshot describes, with no snapshot points.

        Every invariant is checked, and the bytes must be exactly what `snapshot()` of the
        result gives (canonical form), so restore and snapshot are inverse. Raises
        `SnapshotCorrupt`, or `SnapshotIncompatible` for other dedupe limits."""
        body = decode_frame(
            data,
            SNAPSHOT_MAGIC,
            SNAPSHOT_VERSIONS,
            frame_bytes_max=SNAPSHOT_BYTES_LIMIT,
            str_bytes_max=max(limits.client_id_bytes_max, limits.holder_bytes_max),
            bin_bytes_max=len(data),
            array_len_max=len(data),
        )
        if isinstance(body, str):
            raise SnapshotCorrupt(body)
        machine = cls(limits)
        problem = machine._load(body, data[3])
        if problem is not None:
            raise SnapshotCorrupt(problem)
        if machine.snapshot() != bytes(data):
            raise SnapshotCorrupt("not in canonical form (re-encoding gives other bytes)")
        return machine

    def _load(self, body: tuple[object, ...], version: int) -> str | None:
        """Fill a fresh machine from a decoded body of `version`; the reason it is invalid,
        or None."""
        if len(body) != SNAPSHOT_FIELDS[version]:
            return f"{len(body)} fields, expected {SNAPSHOT_FIELDS[version]}"
        (last_applied, next_lsn, first_lsn, holder, epoch) = body[:5]
        (clients_max, seqs_max, clients, raft_bytes, count_bytes) = body[5:10]
        # Version 1 has no offsets: every row starts its entry.
        offset_bytes = body[10] if version == SNAPSHOT_VERSION_2 else None
        if not (is_u64(clients_max) and is_u64(seqs_max)):
            return "dedupe limits are not integers"
        limits = self._limits
        if (clients_max, seqs_max) != (limits.dedupe_clients_max, limits.dedupe_seqs_per_client):
            raise SnapshotIncompatible(
                f"taken with dedupe_clients_max={clients_max}, dedupe_seqs_per_client="
                f"{seqs_max}; this replica uses {limits.dedupe_clients_max}, "
                f"{limits.dedupe_seqs_per_client}"
            )
        if not (is_u64(last_applied) and is_u64(next_lsn) and is_u64(first_lsn)):
            return "last_applied, next_lsn or first_lsn is not an integer"
        if not 1 <= first_lsn <= next_lsn:
            return f"first_lsn {first_lsn} is not in [1, next_lsn {next_lsn}]"
        if not is_u64(epoch):
            return "lease epoch is not an integer"
        if holder is not None and not (isinstance(holder, str) and holder):
            return "lease holder is neither nil nor a non-empty str"
        if (holder is None) != (epoch == 0):
            return "lease holder and epoch disagree (no holder iff epoch 0)"
        self._last_applied_raft_index = last_applied
        self._next_lsn = next_lsn
        self._first_lsn = first_lsn
        self._lease = Lease(holder, epoch)
        problem = self._load_clients(clients, ties=version == SNAPSHOT_VERSION_2)
        if problem is not None:
            return problem
        return self._load_entries(raft_bytes, count_bytes, offset_bytes)

    def _load_clients(self, clients: object, *, ties: bool) -> str | None:
        """`ties`: clients may share an activity raft index (version 2)."""
        if not isinstance(clients, tuple):
            return "dedupe table is not an array"
        if len(clients) > self._limits.dedupe_clients_max:
            return f"{len(clients)} dedupe clients, over the limit"
        previous_active = 0
        for position, row in enumerate(clients):
            if not (isinstance(row, tuple) and len(row) == 4):
                return f"dedupe client {position} is not a 4-element array"
            client_id, active, seq_floor, seqs = row
            if not (isinstance(client_id, str) and client_id) or client_id in self._clients:
                return f"dedupe client {position}: empty, duplicate or non-str client_id"
            if not (is_u64(active) and is_u64(seq_floor)):
                return f"dedupe client {client_id!r}: activity or seq_floor is not an integer"
            in_order = previous_active <= active if ties else previous_active < active
            if not (in_order and 1 <= active <= self._last_applied_raft_index):
                return f"dedupe client {client_id!r}: activity {active} out of order or range"
            previous_active = active
            remembered = self._load_seqs(seqs, seq_floor)
            if isinstance(remembered, str):
                return f"dedupe client {client_id!r}: {remembered}"
            self._clients[client_id] = _ClientDedupe(active, seq_floor, remembered)
        return None

    def _load_seqs(self, seqs: object, seq_floor: int) -> dict[int, tuple[int, int]] | str:
        seqs_max = self._limits.dedupe_seqs_per_client
        if not (isinstance(seqs, tuple) and 1 <= len(seqs) <= seqs_max):
            return f"seqs are not an array of 1..{seqs_max} entries"
        # The floor only rises when a full table overflows, and it stays full after that.
        if seq_floor > 0 and len(seqs) != seqs_max:
            return "seq_floor is set but the seq table is not full"
        remembered: dict[int, tuple[int, int]] = {}
        previous_seq = seq_floor - 1
        for entry in seqs:
            if not (isinstance(entry, tuple) and len(entry) == 3 and all(map(is_u64, entry))):
                return "a seq entry is not [seq, first_lsn, count]"
            seq, first_lsn, count = entry
            assert isinstance(seq, int)
            assert isinstance(first_lsn, int)
            assert isinstance(count, int)
            if seq <= previous_seq:
                return f"seq {seq} below seq_floor or out of order"
            if count > self._limits.records_per_batch_max:
                return f"seq {seq}: count {count} over records_per_batch_max"
            if first_lsn < 1 or first_lsn + count > self._next_lsn:
                return f"seq {seq}: lsns [{first_lsn}, {first_lsn + count}) not yet assigned"
            remembered[seq] = (first_lsn, count)
            previous_seq = seq
        return remembered

    def _load_entries(
        self, raft_bytes: object, count_bytes: object, offset_bytes: object
    ) -> str | None:
        """`offset_bytes` is None in version 1 (every offset 0)."""
        if offset_bytes is None:
            offset_bytes = bytes(len(raft_bytes)) if isinstance(raft_bytes, bytes) else b""
        if not (
            isinstance(raft_bytes, bytes)
            and isinstance(count_bytes, bytes)
            and isinstance(offset_bytes, bytes)
        ):
            return "entry arrays are not bin"
        if not len(raft_bytes) == len(count_bytes) == len(offset_bytes) or len(raft_bytes) % 8:
            return "entry arrays differ in length or are not whole u64s"
        raft_indexes = _u64_array(raft_bytes)
        counts = _u64_array(count_bytes)
        offsets = _u64_array(offset_bytes)
        records_max = self._limits.records_per_batch_max
        previous_raft_index = 0
        previous_stop = 0  # end of the previous row in its entry's flat record sequence
        for raft_index, count, offset in zip(raft_indexes, counts, offsets, strict=True):
            if raft_index == previous_raft_index != 0:
                # Another run of the same AppendGroup: after the previous one, with at least
                # one refused record between them (runs are maximal).
                if offset <= previous_stop:
                    return f"rows of raft index {raft_index} overlap, touch or are out of order"
            elif not previous_raft_index < raft_index <= self._last_applied_raft_index:
                return f"entry raft index {raft_index} out of order or range"
            if not 1 <= count <= records_max:
                return f"entry at raft index {raft_index} has count {count}"
            if offset + count > records_max:
                return f"entry at raft index {raft_index}: offset {offset} past the entry's end"
            previous_raft_index = raft_index
            previous_stop = offset + count
        total = sum(counts)
        first_of_entries = self._next_lsn - total
        if first_of_entries < 1:
            return "entries hold more LSNs than were assigned"
        if counts and not first_of_entries <= self._first_lsn < first_of_entries + counts[0]:
            return "the oldest retained entry does not hold first_lsn"
        if not counts and self._first_lsn != self._next_lsn:
            return "retained LSNs but no entries"
        self._entry_raft_indexes = raft_indexes
        self._entry_counts = counts
        self._entry_offsets = offsets
        self._entry_first_lsns = array(_U64)
        if counts:
            self._entry_first_lsns.extend(accumulate(counts[:-1], initial=first_of_entries))
        return None


def _u64_le_bytes(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        return values.tobytes()
    swapped = array(_U64, values)
    swapped.byteswap()
    return swapped.tobytes()


def _u64_array(data: bytes) -> array[int]:
    values = array(_U64)
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values
