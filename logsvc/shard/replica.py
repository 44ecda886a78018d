"""One replica of one shard: the shard store, the Raft node and the state machine, wired.

    proposals (any thread) --> RaftNode (tick thread) --> apply() --> ShardStateMachine
    reads (any thread) ------> state machine's LSN index --> shard store (journal entries)

The API here is synchronous and bounded in time (the data plane, issue 4, wraps it for its
event loop). Only the leader accepts proposals; a follower answers `NotLeader` with the
leader it knows, so clients redirect instead of having pysyncobj forward commands (whose
outcome a forwarder cannot learn for sure). Reads of committed LSNs are served from the
local replica's applied state: committed ranges are immutable (ARCHITECTURE.md §6).

Results of appends, truncates and leases are computed by the state machine on every
replica identically; the caller gets the leader's.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logsvc.events import ReplicaEvents
from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Barrier,
    Command,
    Result,
    Truncate,
    UnfencedTruncate,
    decode_command,
    decode_entry_records,
    encode_command,
)
from logsvc.shard.errors import (
    CommandCorrupt,
    CommandInvalid,
    LsnNotAssigned,
    LsnTruncated,
    ShardError,
)
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits
from logsvc.shard.raft.config import FailReason, RaftConfig, RaftFatal
from logsvc.shard.raft.journal import command_of_entry
from logsvc.shard.raft.node import RaftNode
from logsvc.shard.scheduler import RaftScheduler
from logsvc.shard.state_machine import ShardStateMachine
from logsvc.store import (
    DEFAULT_LIMITS,
    Compacted,
    Corruption,
    ShardStore,
    StoreFailed,
    StoreLimits,
)
from logsvc.store.fs import FileSystem
from logsvc.store.journal import NodeJournal

log = logging.getLogger("logsvc.shard")

PROPOSAL_TIMEOUT_S_DEFAULT = 10.0
READ_RECORDS_MAX = 65_536  # records per read: a reply must stay a bounded size
# Proposed commands kept for their own apply (ShardReplica._proposed): several times the
# proposals a data plane keeps in flight (4 by default), each at most one Raft entry.
PROPOSED_CACHED_MAX = 64
PROPOSED_CACHED_BYTES_MAX = 32 * 1024 * 1024
MEMBERSHIP_TIMEOUT_S_DEFAULT = 30.0


class NotLeader(ShardError):
    """Only the leader accepts writes; `leader_hint` is the leader this replica knows."""

    def __init__(self, leader_hint: str | None) -> None:
        super().__init__(f"not the leader; leader is {leader_hint or 'unknown'}")
        self.leader_hint = leader_hint


class OutcomeUnknown(ShardError):
    """The command may or may not have been applied (timeout, leader change). Retrying an
    append with the same (client_id, seq) is safe: the state machine deduplicates it."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"outcome unknown: {reason}")
        self.reason = reason


class Overloaded(ShardError):
    """The Raft command queue is full: nothing was queued; retry later."""


class ReplicaFailed(ShardError):
    """The replica stopped (store failure, bad snapshot): it serves nothing until restarted."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"replica failed: {cause}")
        self.cause = cause


class MembershipChangeInProgress(ShardError):
    """One membership change at a time per shard (pysyncobj's own guard is dead code)."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    data_dir: str  # holds journal/ (the shard store) and snapshot
    raft: RaftConfig
    store_limits: StoreLimits = DEFAULT_LIMITS
    shard_limits: ShardLimits = DEFAULT_SHARD_LIMITS
    # The store's file-system port (journal and snapshot); None = the real one. Tests pass
    # a fault-injecting double (tests/support/faultfs.py, tests/chaos/).
    file_system: FileSystem | None = None
    # Who this replica is, for the event log (logsvc/events.py); "" / 0 in unit tests.
    node_id: str = ""
    shard: int = 0
    # The deterministic simulator only (tests/chaos/dst/); None in production.
    simulated: SimulatedRuntime | None = None
    # The node's Raft scheduler (one per node: scheduler.py); None: the replica gets a
    # private one (tests that run single replicas). Unused by simulated replicas.
    raft_scheduler: RaftScheduler | None = None
    # The node's shared journal (docs/decisions/0011-shared-journal.md); None: the store
    # makes its appends durable in its own files.
    node_journal: NodeJournal | None = None


@dataclass(frozen=True, slots=True)
class SimulatedRuntime:
    """For the deterministic simulator only: the replica runs no thread of its own. Its
    store starts no syncer (the Raft tick's one sync per tick is then the only sync) and
    reads `clock_ms`; Raft talks through `transport_base`, a `raft.patches.TransportBase` subclass
    (an in-memory network). Such a replica is never `start()`ed: the simulator calls
    `tick()` on its own thread, after pointing pysyncobj's clock at its virtual one
    (`raft.patches.set_monotonic_clock`)."""

    transport_base: type
    clock_ms: Callable[[], float]


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Records `[first_lsn, next_lsn)`; at the end of the log, none and `next_lsn == lsn`."""

    records: tuple[bytes, ...]
    first_lsn: int
    next_lsn: int


@dataclass(slots=True)
class _Waiter:
    result: object = None
    reason: int = -1
    event: threading.Event = field(default_factory=threading.Event)


class ShardReplica:
    """Create, `start()`, use, `close()`. Thread-safe. Its Raft runs on the node's
    scheduler (`ReplicaConfig.raft_scheduler`), its store syncs on that tick."""

    def __init__(self, config: ReplicaConfig) -> None:
        self._config = config
        self._limits = config.shard_limits
        if config.file_system is None:
            os.makedirs(config.data_dir, exist_ok=True)
        else:  # the snapshot lives here too: the port's own directory, not the host's
            config.file_system.makedirs(config.data_dir)
        self._events = ReplicaEvents(config.node_id, config.shard)
        simulated = config.simulated
        try:
            self._store = ShardStore.open(
                os.path.join(config.data_dir, "journal"),
                fs=config.file_system,
                limits=config.store_limits,
                clock_ms=None if simulated is None else simulated.clock_ms,
                # The Raft tick syncs the store once per tick, on the tick's own thread
                # (the scheduler's worker): no syncer thread per replica.
                background_sync=False,
                journal=config.node_journal,
            )
        except Corruption as exc:
            self._events.emit("corruption", detail=str(exc))
            raise
        _emit_opened(self._events, self._store)
        self._machine = ShardStateMachine(config.shard_limits)
        self._machine_lock = threading.Lock()
        # Commands this replica proposed, by their encoding, until applied: the leader then
        # applies the object it encoded instead of decoding the same bytes again (a group
        # of 256 appends costs about 0.35 ms to decode, a dict lookup about 15 us). Bounded:
        # the oldest is dropped past PROPOSED_CACHED_MAX / PROPOSED_CACHED_BYTES_MAX (a lost
        # leadership never applies them); a command not found here is decoded, as on a
        # follower.
        self._proposed: OrderedDict[bytes, Command] = OrderedDict()
        self._proposed_bytes = 0
        self._proposed_lock = threading.Lock()
        self._membership_lock = threading.Lock()
        self._apply_listeners: list[Callable[[int], None]] = []
        try:
            raft_config = config.raft
            if raft_config.snapshot_path != os.path.join(config.data_dir, "snapshot"):
                raft_config = _with_snapshot_path(raft_config, config.data_dir)
            self._node = RaftNode(
                raft_config,
                self._store,
                self,
                config.file_system,
                self._events,
                transport_base=None if simulated is None else simulated.transport_base,
                raft_scheduler=None if simulated is not None else config.raft_scheduler,
            )
        except RaftFatal as exc:
            self._events.emit("corruption", detail=str(exc))
            self._store.close()
            raise
        except BaseException:
            self._store.close()
            raise
        self._node.on_fatal(self._on_fatal)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        assert self._config.simulated is None, "a simulated replica is ticked by its caller"
        self._node.start()

    def tick(self) -> bool:
        """Simulator only (`SimulatedRuntime`): one Raft tick on the caller's thread; False
        once the replica has stopped on a fatal error."""
        assert self._config.simulated is not None
        return self._node.tick_once(0.0)

    def close(self) -> None:
        self._node.stop()
        self._store.close()

    def kill(self) -> None:
        """Stop as kill -9 would: nothing more is written (crash tests)."""
        self._node.stop()
        self._store.abandon()

    # ------------------------------------------------------------------ writes

    def append(
        self,
        client_id: str,
        seq: int,
        records: tuple[bytes, ...],
        *,
        epoch: int = 0,
        timeout_s: float = PROPOSAL_TIMEOUT_S_DEFAULT,
    ) -> Result:
        return self.propose(AppendBatch(client_id, seq, epoch, records), timeout_s)

    def truncate(
        self, lsn: int, *, epoch: int = 0, timeout_s: float = PROPOSAL_TIMEOUT_S_DEFAULT
    ) -> Result:
        """Fenced like an append: `StaleEpoch` / `NotLeaseHolder` unless `epoch` is the
        current lease's (0 while no lease was ever granted)."""
        return self.propose(Truncate(lsn, epoch), timeout_s)

    def acquire_lease(
        self, holder: str, epoch: int, *, timeout_s: float = PROPOSAL_TIMEOUT_S_DEFAULT
    ) -> Result:
        return self.propose(AcquireLease(holder, epoch), timeout_s)

    def barrier(self, token: int = 0, *, timeout_s: float = PROPOSAL_TIMEOUT_S_DEFAULT) -> Result:
        """Through the log: once it returns, every write committed before it is applied
        here (a quorum-checked read point; there is no ReadIndex in pysyncobj)."""
        return self.propose(Barrier(token), timeout_s)

    def propose(self, command: Command, timeout_s: float) -> Result:
        assert timeout_s > 0
        waiter = _Waiter()

        def done(outcome: Result | ShardError) -> None:
            waiter.result = outcome
            waiter.event.set()

        self.submit(command, done)
        if not waiter.event.wait(timeout_s):
            raise OutcomeUnknown(f"no answer within {timeout_s} s")
        if isinstance(waiter.result, ShardError):
            raise waiter.result
        return waiter.result  # type: ignore[return-value]

    def submit(self, command: Command, done: Callable[[Result | ShardError], None]) -> None:
        """Propose without waiting: `done(result or typed error)` runs on the Raft tick
        thread once the command is applied here or failed. Raises at once (NotLeader,
        ReplicaFailed, CommandInvalid/TooLarge) when it cannot even be queued. An
        `UnfencedTruncate` is refused (`CommandInvalid`): it is only ever decoded from the
        entries of earlier builds, so no truncate of this build bypasses the lease."""
        if isinstance(command, UnfencedTruncate):
            raise CommandInvalid("an UnfencedTruncate is never proposed: use Truncate(lsn, epoch)")
        self._check_alive()
        if not self._node.is_leader:
            raise NotLeader(self._node.leader)
        encoded = encode_command(command, self._limits)
        self._remember_proposed(encoded, command)

        def on_raft(result: object, reason: int) -> None:
            waiter = _Waiter(result=result, reason=reason)
            try:
                done(_result_or_raise(waiter, self._node.leader))
            except ShardError as exc:
                done(exc)

        self._node.propose(encoded, on_raft)

    def add_apply_listener(self, listener: Callable[[int], None]) -> None:
        """Call `listener(next_lsn)` on the tick thread after every applied command (tail
        reads wake on it). It must be quick and must not call back into the replica."""
        self._apply_listeners.append(listener)

    # ------------------------------------------------------------------ reads

    def read(self, lsn: int, max_bytes: int, records_max: int = READ_RECORDS_MAX) -> ReadResult:
        """Committed records from `lsn`: at most `records_max` of them and `max_bytes` of
        payload, but at least one if any. `LsnTruncated` below the first retained LSN."""
        assert records_max >= 1
        assert lsn >= 1
        self._check_alive()
        records: list[bytes] = []
        budget = max_bytes
        next_lsn = lsn
        cached_index = -1  # one group entry may hold several runs of LSNs
        cached: tuple[bytes, ...] = ()
        while True:
            with self._machine_lock:
                try:
                    where = self._machine.locate(next_lsn)
                except LsnNotAssigned:
                    break
            if where.raft_index != cached_index:
                try:
                    [entry] = self._store.read(where.raft_index, where.raft_index + 1, 0)
                except Corruption as exc:
                    self._events.emit("corruption", detail=str(exc))
                    raise
                except Compacted:
                    # The journal is only ever compacted to a snapshot point whose every LSN
                    # a committed truncate covers; the state machine has just not applied
                    # that truncate yet (restored from the point's snapshot at a restart, or
                    # compacted during this read). Found by the simulator (tests/chaos/dst/).
                    if records:
                        return ReadResult(tuple(records), lsn, next_lsn)
                    raise LsnTruncated(next_lsn, self._first_lsn_in_journal(next_lsn)) from None
                command = command_of_entry(entry.payload)
                assert command is not None, f"raft index {where.raft_index} holds no command"
                cached_index = where.raft_index
                cached = decode_entry_records(command, self._limits)
            if where.offset + where.count > len(cached):
                # The state machine and the journal disagree (an entry replaced under a
                # disk that lied about a sync): an error, not an endless loop on this LSN.
                end = where.offset + where.count
                reason = (
                    f"raft index {where.raft_index} holds {len(cached)} records; lsn"
                    f" {next_lsn} maps to its records [{where.offset}, {end})"
                )
                self._events.emit("corruption", detail=reason)
                raise CommandCorrupt(reason)
            for record in cached[where.offset : where.offset + where.count]:
                if records and (len(record) > budget or len(records) >= records_max):
                    return ReadResult(tuple(records), lsn, next_lsn)
                records.append(record)
                budget -= len(record)
                next_lsn += 1
        return ReadResult(tuple(records), lsn, next_lsn)

    def _first_lsn_in_journal(self, lsn: int) -> int:
        """The lowest LSN above `lsn` (whose entry was compacted away) that the journal
        still holds; the next LSN if none."""
        first_index = self._store.first_index
        with self._machine_lock:
            machine = self._machine
            lo, hi = max(lsn + 1, machine.first_lsn), machine.next_lsn  # answer in [lo, hi]
            while lo < hi:
                middle = (lo + hi) // 2
                if machine.locate(middle).raft_index >= first_index:
                    hi = middle
                else:
                    lo = middle + 1
        return lo

    # ------------------------------------------------------------------ status

    @property
    def store(self) -> ShardStore:
        return self._store

    @property
    def shard_limits(self) -> ShardLimits:
        return self._limits

    @property
    def node(self) -> RaftNode:
        return self._node

    @property
    def address(self) -> str:
        return self._node.self_address

    @property
    def is_leader(self) -> bool:
        return self._node.is_leader

    def status(self) -> dict[str, Any]:
        with self._machine_lock:
            machine = self._machine
            lease = machine.lease
            status: dict[str, Any] = {
                "next_lsn": machine.next_lsn,
                "first_lsn": machine.first_lsn,
                "lease_holder": lease.holder,
                "lease_epoch": lease.epoch,
                "last_applied_raft_index": machine.last_applied_raft_index,
                "state_digest": machine.state_digest(),
            }
        stats = self._store.stats()
        status.update(
            {
                "address": self.address,
                "leader": self._node.leader,
                "is_leader": self._node.is_leader,
                "term": self._node.term,
                "commit_index": self._node.commit_index,
                "journal_first_index": stats.first_index,
                "journal_last_index": stats.last_index,
                "journal_durable_index": stats.durable_index,
                "journal_physical_first_index": stats.physical_first_index,
                "failed": self._node.fatal is not None,
            }
        )
        return status

    # ------------------------------------------------------------------ membership

    def add_member(self, address: str, timeout_s: float = MEMBERSHIP_TIMEOUT_S_DEFAULT) -> None:
        self._change_membership(self._node.add_member, address, timeout_s)

    def remove_member(self, address: str, timeout_s: float = MEMBERSHIP_TIMEOUT_S_DEFAULT) -> None:
        self._change_membership(self._node.remove_member, address, timeout_s)

    def _change_membership(
        self,
        change: Callable[[str, Callable[[object, int], None]], None],
        address: str,
        timeout_s: float,
    ) -> None:
        if not self._membership_lock.acquire(blocking=False):
            raise MembershipChangeInProgress("another membership change is in progress")
        try:
            if not self._node.is_leader:
                raise NotLeader(self._node.leader)
            waiter = _Waiter()

            def done(result: object, reason: int) -> None:
                waiter.result, waiter.reason = result, reason
                waiter.event.set()

            change(address, done)
            if not waiter.event.wait(timeout_s):
                raise OutcomeUnknown(f"membership change not committed within {timeout_s} s")
            _result_or_raise(waiter, self._node.leader)
        finally:
            self._membership_lock.release()

    # ------------------------------------------------------------------ RaftHandler

    def apply(self, raft_index: int, encoded: bytes) -> object:
        with self._proposed_lock:
            # Equal bytes decode to the command that was encoded (the codec round-trips).
            proposed = self._proposed.pop(encoded, None) if self._proposed else None
            if proposed is not None:
                self._proposed_bytes -= len(encoded)
        try:
            command = proposed if proposed is not None else decode_command(encoded, self._limits)
        except CommandCorrupt as exc:
            # Only our encoder writes commands, so this is damage or replicas configured
            # with different limits. Skipping it could diverge from replicas that applied
            # it: stop instead.
            raise RaftFatal(f"raft index {raft_index}: undecodable command: {exc}") from exc
        with self._machine_lock:
            result = self._machine.apply(raft_index, command)
            next_lsn = self._machine.next_lsn
        for listener in self._apply_listeners:
            listener(next_lsn)
        return result

    def compaction_point(self) -> tuple[int, bytes] | None:
        with self._machine_lock:
            point = self._machine.compaction_point()
        return None if point is None else (point.raft_index, point.data)

    def install_snapshot(self, raft_index: int, state: bytes) -> None:
        machine = ShardStateMachine.restore(state, self._limits)
        with self._machine_lock:
            self._machine = machine
        log.info("state machine restored from the snapshot at raft index %d", raft_index)

    # ------------------------------------------------------------------ internals

    def _on_fatal(self, exc: BaseException) -> None:
        """The tick thread stopped: damaged data (a bad record read by Raft, a snapshot that
        does not load, an undecodable command) goes to the event log as corruption."""
        cause = exc.cause if isinstance(exc, StoreFailed) else exc
        if isinstance(cause, Corruption | RaftFatal):
            self._events.emit("corruption", term=self._store.term, detail=str(exc))

    def _remember_proposed(self, encoded: bytes, command: Command) -> None:
        with self._proposed_lock:
            if encoded in self._proposed:  # the same bytes again (a Barrier, a retry)
                return
            self._proposed[encoded] = command
            self._proposed_bytes += len(encoded)
            while (
                len(self._proposed) > PROPOSED_CACHED_MAX
                or self._proposed_bytes > PROPOSED_CACHED_BYTES_MAX
            ):
                dropped, _ = self._proposed.popitem(last=False)
                self._proposed_bytes -= len(dropped)

    def _check_alive(self) -> None:
        """Reads and writes refuse once the replica stopped on a fatal error."""
        fatal = self._node.fatal
        if fatal is not None:
            raise ReplicaFailed(fatal)


def _result_or_raise(waiter: _Waiter, leader: str | None) -> Result:
    reason = waiter.reason
    if reason == FailReason.SUCCESS:
        if isinstance(waiter.result, ShardError):
            raise waiter.result
        return waiter.result  # type: ignore[return-value]
    if reason == FailReason.QUEUE_FULL:
        raise Overloaded("the Raft command queue is full")
    if reason in (FailReason.NOT_LEADER, FailReason.MISSING_LEADER):
        raise NotLeader(leader)
    if reason == FailReason.REQUEST_DENIED:
        raise MembershipChangeInProgress("the leader refused the change (one at a time)")
    names = {
        FailReason.DISCARDED: "discarded by a new leader",
        FailReason.LEADER_CHANGED: "the leader changed",
        FailReason.UNKNOWN_OUTCOME: "unknown outcome",
    }
    raise OutcomeUnknown(names.get(reason, f"fail reason {reason}"))


def _emit_opened(events: ReplicaEvents, store: ShardStore) -> None:
    """The `start` event (the term recovered) and, if recovery repaired anything, a
    `recovery` event saying what."""
    stats = store.stats()
    events.emit(
        "start",
        term=store.term,
        voted_for=store.voted_for,
        detail=f"journal [{stats.first_index}, {stats.last_index}]",
    )
    report = stats.recovery
    if report.torn_reason is not None or report.deleted_files:
        events.emit(
            "recovery",
            term=store.term,
            detail=(
                f"torn tail: {report.torn_reason}; cut {report.torn_tail_bytes_cut} bytes; "
                f"deleted {report.deleted_files}"
            ),
        )


def _with_snapshot_path(config: RaftConfig, data_dir: str) -> RaftConfig:
    from dataclasses import replace

    return replace(config, snapshot_path=os.path.join(data_dir, "snapshot"))
