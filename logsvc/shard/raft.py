"""pysyncobj made durable: the only module of logsvc that imports pysyncobj.

pysyncobj 0.3.17 runs elections, replication, membership and leader transfer for a shard.
As shipped it is not crash-safe (shared/reference/pysyncobj.md §8.4). This module closes each
hole that applies to our design through pysyncobj's extension points, and where that is not
enough, by overriding a private method here, against the pinned version only (asserted at
import). Each fix is named where it is made and has a test that fails on stock behaviour
(tests/unit/shard/test_raft_fixes.py).

Hole (pysyncobj.md §8.4)                 Fix
1/2 no fsync; acks before durability      `StoreJournal` writes into the shard store; the
                                           transport holds every next_node_idx, request_vote
                                           and response_vote until one store.sync() after the
                                           tick (group commit), and the tick loop syncs
                                           before the leader's next commit check, so the
                                           leader only counts itself on durable entries
(term/vote)                               `setCurrentTerm` -> `store.save_vote`: durable
                                           before pysyncobj sends the vote request or reply
3 nextIndex rewind, blind truncation      `_on_message`: a late success ack never moves
                                           nextIndex back, a refusal never moves it forward
                                           (stock could livelock a lagging follower with a
                                           conflicting suffix); an AppendEntries is trimmed to its
                                           first conflicting entry so a follower deletes only
                                           on a term conflict, and its commit index never
                                           passes what the leader vouched for (a snapshot
                                           chunk vouches for nothing until installed)
4 dump load errors swallowed              `_SyncObj__loadDumpFile` replaced: a bad snapshot
                                           is fatal; a compacted journal without its snapshot
                                           refuses to start; the snapshot file is shipped,
                                           received and found through the file-system port
                                           (`_SnapshotTransfer`), a received one durably
5 state-init race, creator-thread ticks    autoTick off; ticks driven by the node's
                                           scheduler (scheduler.py: a few worker threads
                                           for every shard, pysyncobj's poller replaced
                                           by the worker's epoll; docs/decisions/0005-...)
6 in-place compaction, all in RAM          pysyncobj compaction off; compaction only at
                                           snapshot points (docs/decisions/0001-...)
10 pickle RCE without password            the cluster secret is mandatory; messages are
                                           sealed with it by `MessageSealer` (AES-GCM, a
                                           key per sender) instead of pysyncobj's Fernet
                                           (docs/decisions/0003-raft-seal.md)
13 commit index hint                      never persisted: it restarts at the log start and
                                           is relearned from the leader (clamped by design)
Quiescence (quiescence.py, liveness.py; 0005): an idle shard's leader and followers agree
to stop heartbeats and election timers; our own messages (`logsvc_quiesce`, its ack,
`logsvc_alive` for node liveness) ride on the shard's Raft connection and never reach
pysyncobj; any Raft message, proposal or connection change wakes the shard, and a quiet
follower whose leader's node lapses times out exactly as an active one would.
Membership "one change at a time" is serialized by the replica (replica.py).
Membership across restarts: the log's configuration is kept in a members file and
pysyncobj's follows it (membership.py; docs/decisions/0002-membership.md).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import pickle
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import pysyncobj
import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.poller as pysyncobj_poller
import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.tcp_connection as pysyncobj_tcp_connection
import pysyncobj.transport as pysyncobj_transport
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.journal import Journal
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport, Transport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from logsvc import logs
from logsvc.events import ReplicaEvents
from logsvc.events import enabled as events_enabled
from logsvc.failpoints import enabled as failpoints_enabled
from logsvc.failpoints import failpoint
from logsvc.shard import membership as shard_membership
from logsvc.shard import quiescence, scheduler, small_file, snapshot_file
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.progress import ProgressView, RaftProgress
from logsvc.shard.raft_seal import MessageSealer
from logsvc.store import Entry, ShardStore, StoreError
from logsvc.store.fs import FileSystem, OsFileSystem, ReadableFile

log = logging.getLogger("logsvc.raft")

PINNED_PYSYNCOBJ_VERSION = "0.3.17"
# The private methods overridden below exist with these semantics in 0.3.17 only.
assert PYSYNCOBJ_VERSION == PINNED_PYSYNCOBJ_VERSION, (
    f"logsvc needs pysyncobj {PINNED_PYSYNCOBJ_VERSION}, found {PYSYNCOBJ_VERSION}"
)
assert pysyncobj.__name__ == "pysyncobj"

# Messages whose meaning depends on our journal being durable (Raft Figure 2: reply to
# AppendEntries only after persisting; term/vote/log durable before a vote leaves).
_AFTER_SYNC = frozenset({"next_node_idx", "request_vote", "response_vote"})
# At most this many held messages; past it the transport syncs and sends at once.
OUTBOX_MESSAGES_MAX = 4096
# Raft entries read from the store per chunk when pysyncobj iterates a journal slice.
READ_CHUNK_BYTES = 1 << 20
# A chunked entry larger than this cannot be one of ours (the store caps a record at
# record_payload_bytes_max, 256 MiB at most): the chunks are refused as corrupt.
TRANSMISSION_BYTES_MAX = 2 * (256 * 1024 * 1024)
# pysyncobj's own compaction must never trigger (we compact at snapshot points only).
_NEVER = 2**62

# logsvc's own messages on a shard's Raft connection, handled before pysyncobj sees any.
_ALIVE = "logsvc_alive"  # node liveness: the sender's node is up (liveness.py)
_QUIESCE = "logsvc_quiesce"  # leader -> follower: agree to go quiet (quiescence.py)
_QUIESCE_ACK = "logsvc_quiesce_ack"  # follower -> leader: agreed, or not (`ok`)
_LEARNER = "logsvc_learner"  # learner -> member: "this read-only connection is <address>"
_OWN_MESSAGES = frozenset({_ALIVE, _QUIESCE, _QUIESCE_ACK, _LEARNER})
# How often a quiescing leader asks again the followers that did not answer.
QUIESCE_RESEND_S = 0.5
# How soon a refused or dropped peer connection is dialled again (RaftConfig says why).
CONNECTION_RETRY_MS_DEFAULT = 1000
# Calls run on the tick (transfers requested from other threads) waiting at once.
TICK_CALLS_MAX = 64

_COMMAND_TYPE_REGULAR = 0
_COMMAND_TYPE_MEMBERSHIP = 2
_MEMBERSHIP_TYPE_BYTE = bytes([_COMMAND_TYPE_MEMBERSHIP])


class FailReason:
    """pysyncobj's command failure codes, re-exported so no other module imports it."""

    SUCCESS = FAIL_REASON.SUCCESS
    QUEUE_FULL = FAIL_REASON.QUEUE_FULL
    MISSING_LEADER = FAIL_REASON.MISSING_LEADER
    DISCARDED = FAIL_REASON.DISCARDED
    NOT_LEADER = FAIL_REASON.NOT_LEADER
    LEADER_CHANGED = FAIL_REASON.LEADER_CHANGED
    REQUEST_DENIED = FAIL_REASON.REQUEST_DENIED
    UNKNOWN_OUTCOME = FAIL_REASON.UNKNOWN_OUTCOME


class MissingClusterSecret(ValueError):
    """The Raft port carries pickles: it never runs without the cluster secret."""


class RaftFatal(RuntimeError):
    """The replica cannot go on safely (bad snapshot, journal/snapshot mismatch, store
    failure). It stops ticking and reports this; it never continues with an empty state."""


class RaftHandler(Protocol):
    """What the replica gives the Raft layer. Every call runs on the tick thread."""

    def apply(self, raft_index: int, encoded: bytes) -> object: ...

    def compaction_point(self) -> tuple[int, bytes] | None:
        """(raft index T, state after T) of the newest compactable snapshot point."""

    def install_snapshot(self, raft_index: int, state: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class RaftConfig:
    self_address: str  # "host:port" of this replica's Raft port
    peers: tuple[str, ...]  # the other replicas' Raft addresses
    secret: str  # the cluster secret (pysyncobj `password`)
    snapshot_path: str
    election_timeout_ms_min: int = 1000
    election_timeout_ms_max: int = 2500
    heartbeat_ms: int = 100
    leader_fallback_ms: int = 5000  # a leader without a majority steps down after this
    connection_timeout_ms: int = 3500
    # How soon a peer that refused or dropped a connection is dialled again (pysyncobj's
    # 5 s default): a replica joining a shard is refused by its peers until the leader adds
    # it, and with 5 s it would wait that long to start catching up; a restarted peer is
    # likewise found sooner. One connection attempt a second to a dead peer costs nothing.
    connection_retry_ms: int = CONNECTION_RETRY_MS_DEFAULT
    # A leader with nothing new for this long asks its followers to go quiet (quiescence.py:
    # no heartbeats, no election timers; node liveness stands in). 0 = never quiesce.
    quiesce_after_ms: int = 1000
    commands_queue_max: int = 10_000
    # Test only (the chaos suite's proxy mesh, tests/chaos/harness/proxy.py): canonical
    # peer address -> "host:port" to dial instead. Peers keep their canonical ids, so the
    # identity handshake and every vote, log and snapshot still name canonical addresses.
    # Empty in production (set only from LOGSVC_TEST_RAFT_DIAL, see logsvc/config.py).
    dial_overrides: tuple[tuple[str, str], ...] = ()
    # Started to join a running shard (an admin API membership change): `peers` are the
    # members as the leader knew them; elections wait until this replica's own `add` is in
    # its log (membership.py). Only read when the replica has no members file yet.
    joining: bool = False
    # A non-voting learner (Raft thesis §4.2.1; docs/decisions/0005, "Learners"): it opens
    # no Raft port and dials the members as pysyncobj's read-only node; the leader
    # replicates to it but it counts in no majority, never votes and never stands. It is
    # promoted by being restarted as a joining voter on the same journal. Implies joining.
    learner: bool = False

    def validate(self) -> RaftConfig:
        if not self.secret:
            raise MissingClusterSecret(
                "raft.secret: the cluster secret is required (the Raft port would otherwise "
                "execute pickles from anyone who can connect)"
            )
        if not 0 < 3 * self.heartbeat_ms < self.election_timeout_ms_min:
            raise ValueError("raft: election_timeout_ms_min must exceed 3 x heartbeat_ms")
        if self.election_timeout_ms_max <= self.election_timeout_ms_min:
            raise ValueError("raft: election_timeout_ms_max must exceed the minimum")
        if self.leader_fallback_ms <= self.election_timeout_ms_max:
            raise ValueError("raft: leader_fallback_ms must exceed election_timeout_ms_max")
        if self.learner and not self.joining:
            raise ValueError("raft: learner must be joining too (it is no member yet)")
        if self.quiesce_after_ms and self.quiesce_after_ms < 2 * self.heartbeat_ms:
            raise ValueError(
                "raft: quiesce_after_ms must be 0 (never) or at least 2 x heartbeat_ms"
            )
        for canonical, dial in self.dial_overrides:
            host, _, port = dial.rpartition(":")
            if not (host and port.isdigit() and 1 <= int(port) <= 65535):
                raise ValueError(
                    f"raft: dial_overrides[{canonical!r}] must be 'host:port' (got {dial!r})"
                )
        return self


def command_of_entry(journal_payload: bytes) -> bytes | None:
    """Our command bytes inside a journal entry, or None for pysyncobj's own entries
    (no-ops, membership changes). An entry is pysyncobj's encoding of one `_logsvc_apply`
    call: a type byte, then a pickle of `(method id, (command,))` written by pysyncobj. It
    comes from our own checksummed journal, never from the network, when this is called."""
    if not journal_payload or journal_payload[0] != _COMMAND_TYPE_REGULAR:
        return None
    call = pysyncobj_pickle.loads(journal_payload[1:])
    if not (isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], tuple)):
        return None
    arguments = call[1]
    if len(arguments) != 1 or not isinstance(arguments[0], bytes):
        return None
    return arguments[0]


def membership_change_of(journal_payload: bytes) -> shard_membership.Change | None:
    """The change a pysyncobj membership entry makes (`addNodeToCluster` /
    `removeNodeFromCluster` write a type byte, then a pickle of `[kind, node id, node]`);
    None for any other entry. pysyncobj itself unpickles the same bytes to apply them."""
    if not journal_payload or journal_payload[0] != _COMMAND_TYPE_MEMBERSHIP:
        return None
    request = pysyncobj_pickle.loads(journal_payload[1:])
    if not (isinstance(request, list | tuple) and len(request) >= 2):
        return None
    kind, address = request[0], request[1]
    if kind not in ("add", "rem") or not isinstance(address, str):
        return None
    return shard_membership.Change(kind, address)


class JournalEntryUndecodable(ValueError):
    """An offline reader met a journal entry whose regular-command wrapping is not the
    `(method id, (command bytes,))` pickle this module writes."""


JOURNAL_ENTRY_REGULAR = "regular"
JOURNAL_ENTRY_NOOP = "noop"
JOURNAL_ENTRY_MEMBERSHIP = "membership"
JOURNAL_ENTRY_VERSION = "version"
JOURNAL_ENTRY_UNKNOWN = "unknown"
_JOURNAL_ENTRY_KINDS = {
    _COMMAND_TYPE_REGULAR: JOURNAL_ENTRY_REGULAR,
    1: JOURNAL_ENTRY_NOOP,  # pysyncobj _COMMAND_TYPE.NO_OP: a new leader's first entry
    _COMMAND_TYPE_MEMBERSHIP: JOURNAL_ENTRY_MEMBERSHIP,
    3: JOURNAL_ENTRY_VERSION,  # pysyncobj _COMMAND_TYPE.VERSION: never proposed by logsvc
}


def journal_entry_kind(journal_payload: bytes) -> str:
    """What a journal entry is, from pysyncobj's type byte: a regular command (ours), a
    leader's no-op, a membership change, a code version, or unknown."""
    if not journal_payload:
        return JOURNAL_ENTRY_UNKNOWN
    return _JOURNAL_ENTRY_KINDS.get(journal_payload[0], JOURNAL_ENTRY_UNKNOWN)


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles only plain values: any class or function reference is refused. A regular
    entry holds `(int, (bytes,))`, which needs none."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a journal entry may not reference {module}.{name}")


def command_of_entry_offline(journal_payload: bytes) -> bytes | None:
    """`command_of_entry` for readers of journal files at rest (`logsvc doctor`-style tools,
    the Spark jobs): the same bytes out, but the pickle is read by an unpickler that refuses
    every global, so a tampered file on shared storage cannot run code in the reader. None
    for pysyncobj's own entries; `JournalEntryUndecodable` for a regular entry that is not
    the wrapping `_logsvc_apply` writes."""
    if journal_entry_kind(journal_payload) != JOURNAL_ENTRY_REGULAR:
        return None
    try:
        call = _NoGlobalsUnpickler(io.BytesIO(journal_payload[1:])).load()
    except Exception as exc:  # any unpickling failure: damage, or not our wrapping
        raise JournalEntryUndecodable(f"regular entry does not unpickle: {exc}") from None
    if not (
        isinstance(call, tuple)
        and len(call) == 2
        and isinstance(call[0], int)
        and isinstance(call[1], tuple)
        and len(call[1]) == 1
        and isinstance(call[1][0], bytes)
    ):
        raise JournalEntryUndecodable("regular entry is not (method id, (command bytes,))")
    return call[1][0]


# ------------------------------------------------------------------------ the journal


class StoreJournal(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over the shard store.

    pysyncobj addresses entries by *position* (0 = the first retained entry) and reads
    `journal[-1]` for the last index and term many times per tick, so the first and last
    entries are memoized. Slices are lazy: pysyncobj slices "from here to the end" and then
    keeps what fits in a message, which must not read a whole lagging tail from disk.
    """

    def __init__(self, store: ShardStore, events: ReplicaEvents | None = None) -> None:
        self._store = store
        self._events = events
        self._reset_pending = False
        self._commit_hint = store.first_index
        self._memo: dict[int, tuple[bytes, int, int]] = {}
        # The configurations of this log, kept durable (membership.py); set by RaftNode.
        self.membership: shard_membership.ReplicaMembership | None = None

    # pysyncobj API (names are theirs) ----------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._reset_pending:
            self._reset_to(idx)
        if self.membership is not None and command[:1] == _MEMBERSHIP_TYPE_BYTE:
            change = membership_change_of(command)
            if change is not None:  # durable before the entry is (membership.py)
                self.membership.on_entry(idx, term, change)
        self._store.append([Entry(idx, term, bytes(command))])
        self._memo.pop(self._store.last_index - 1, None)

    def clear(self) -> None:
        # Only used by pysyncobj when installing a snapshot (our override calls
        # `reset_to` directly); keep the semantics anyway: empty until the next add.
        self._reset_pending = True
        self._memo.clear()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._store.truncate_suffix(self._store.first_index + entryFrom)
        self._memo.clear()
        if self.membership is not None:
            self.membership.on_truncate_suffix(self._store.first_index + entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._store.truncate_prefix(self._store.first_index + entryTo)
        self._memo.clear()
        if self.membership is not None:
            self.membership.on_truncate_prefix(self._store.first_index)

    def __getitem__(self, item: int | slice) -> Any:
        first, count = self._bounds()
        if isinstance(item, slice):
            lo, hi, step = item.indices(count)
            assert step == 1
            return _LazyEntries(self, first + lo, first + max(lo, hi))
        position = item + count if item < 0 else item
        if not 0 <= position < count:
            raise IndexError(item)
        return self.entry(first + position)

    def __len__(self) -> int:
        return self._bounds()[1]

    def _destroy(self) -> None:
        return None  # the replica owns and closes the store

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit_hint = raftCommitIndex  # memory only: see module docstring, hole 13

    def getRaftCommitIndex(self) -> int:
        # Only ever a hint; clamped to the durable journal end (hole 13).
        return min(self._commit_hint, max(self._store.durable_index, self._store.first_index))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        voted = None if votedForNodeId is None else str(votedForNodeId)
        if term == self._store.term and voted == self._store.voted_for:
            return
        term_before, voted_before = self._store.term, self._store.voted_for
        self._store.save_vote(term, voted)  # durable before pysyncobj sends anything
        if self._events is not None:
            if term != term_before:
                self._events.emit("term", term=term)
            if voted is not None and (term != term_before or voted != voted_before):
                self._events.emit("vote", term=term, voted_for=voted)

    def getCurrentTerm(self) -> int:
        return self._store.term

    def getVotedForNodeId(self) -> str | None:
        return self._store.voted_for

    def onOneSecondTimer(self) -> None:
        return None

    # ours ----------------------------------------------------------------------------------

    @property
    def store(self) -> ShardStore:
        return self._store

    def entry(self, index: int) -> tuple[bytes, int, int]:
        found = self._memo.get(index)
        if found is None:
            [stored] = self._store.read(index, index + 1, 0)
            found = (stored.payload, stored.index, stored.term)
            if len(self._memo) > 8:
                self._memo.clear()
            self._memo[index] = found
        return found

    def read(self, lo: int, hi: int) -> Iterator[tuple[bytes, int, int]]:
        while lo < hi:
            chunk = self._store.read(lo, hi, READ_CHUNK_BYTES)
            if not chunk:
                return
            for stored in chunk:
                yield (stored.payload, stored.index, stored.term)
            lo = chunk[-1].index + 1

    def reset_to(self, index: int) -> None:
        """Empty the log so that the next entry appended is `index` (snapshot install)."""
        self._reset_to(index)

    def _reset_to(self, index: int) -> None:
        self._reset_pending = False
        store = self._store
        assert index >= store.first_index, "a snapshot never precedes our log start"
        if index <= store.last_index:
            store.truncate_suffix(index)
            if self.membership is not None:
                self.membership.on_truncate_suffix(index)
        store.truncate_prefix(index)
        self._memo.clear()

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index`; None outside the log."""
        if not self._store.first_index <= index <= self._store.last_index:
            return None
        return self.entry(index)[2]

    def _bounds(self) -> tuple[int, int]:
        if self._reset_pending:
            return self._store.last_index + 1, 0
        first = self._store.first_index
        return first, self._store.last_index - first + 1


class _LazyEntries(Sequence[tuple[bytes, int, int]]):
    """A journal slice [lo, hi) read from the store only as far as it is iterated."""

    def __init__(self, journal: StoreJournal, lo: int, hi: int) -> None:
        self._journal = journal
        self._lo = lo
        self._hi = hi

    def __len__(self) -> int:
        return self._hi - self._lo

    def __iter__(self) -> Iterator[tuple[bytes, int, int]]:
        return self._journal.read(self._lo, self._hi)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, slice):
            lo, hi, step = item.indices(len(self))
            assert step == 1
            return list(self._journal.read(self._lo + lo, self._lo + max(lo, hi)))
        position = item + len(self) if item < 0 else item
        if not 0 <= position < len(self):
            raise IndexError(item)
        return self._journal.entry(self._lo + position)

    def __reversed__(self) -> Iterator[tuple[bytes, int, int]]:
        return reversed(list(iter(self)))


class _JournalRegistry:
    """pysyncobj creates its journal with `createJournal(journalFile)`; we hand it ours."""

    PREFIX = "logsvc-journal:"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._journals: dict[str, StoreJournal] = {}
        self._counter = 0
        self._original = pysyncobj_syncobj.createJournal

    def register(self, journal: StoreJournal) -> str:
        with self._lock:
            self._counter += 1
            key = f"{self.PREFIX}{self._counter}"
            self._journals[key] = journal
            return key

    def unregister(self, key: str) -> None:
        with self._lock:
            self._journals.pop(key, None)

    def create(self, journal_file: str | None) -> Journal:
        with self._lock:
            found = self._journals.get(journal_file or "")
        if found is not None:
            return found
        assert not (journal_file or "").startswith(self.PREFIX)
        return self._original(journal_file)


_JOURNALS = _JournalRegistry()
pysyncobj_syncobj.createJournal = _JOURNALS.create


class _PollerRegistry:
    """pysyncobj creates its poller with `createPoller(conf.pollerType)`; a replica driven by
    a scheduler gets its `ShardPoller` (scheduler.py) instead of a poller of its own."""

    PREFIX = "logsvc-poller:"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pollers: dict[str, scheduler.ShardPoller] = {}
        self._counter = 0
        self._original = pysyncobj_syncobj.createPoller

    def register(self, poller: scheduler.ShardPoller) -> str:
        with self._lock:
            self._counter += 1
            key = f"{self.PREFIX}{self._counter}"
            self._pollers[key] = poller
            return key

    def unregister(self, key: str) -> None:
        with self._lock:
            self._pollers.pop(key, None)

    def create(self, poller_type: str) -> Any:
        with self._lock:
            found = self._pollers.get(poller_type)
        if found is not None:
            return found
        assert not poller_type.startswith(self.PREFIX)
        return self._original(poller_type)


_POLLERS = _PollerRegistry()
pysyncobj_syncobj.createPoller = _POLLERS.create
# Our ShardPoller speaks pysyncobj's event bits.
assert pysyncobj_poller.POLL_EVENT_TYPE.READ == scheduler.POLL_READ
assert pysyncobj_poller.POLL_EVENT_TYPE.WRITE == scheduler.POLL_WRITE
assert pysyncobj_poller.POLL_EVENT_TYPE.ERROR == scheduler.POLL_ERROR
# pysyncobj wakes its own tick thread through a pipe per SyncObj when a command is queued
# (two descriptors per replica, a write per proposal). Ticks are the scheduler's here:
# `RaftNode.propose` wakes the replica's worker instead.
pysyncobj_syncobj.PIPE_NOTIFIER_ENABLED = False

# pysyncobj pickles every message and journal entry with protocol 2, which stores `bytes`
# as latin-1 text: non-ASCII payloads grow up to 2x on the wire and on disk. Protocol 4
# stores them raw (pysyncobj.md §3.4: 2.3-4.3x throughput). Unpickling detects the
# protocol, so replicas on either setting still read each other.
PICKLE_PROTOCOL = 4
setattr(pysyncobj_pickle, "__protocol", PICKLE_PROTOCOL)


# ------------------------------------------------------------------------ simulator seams
# For the deterministic simulator only (tests/chaos/dst/), which runs real replicas in one
# thread on a virtual clock over an in-memory network. This module stays the only importer
# of pysyncobj, so what the simulator needs of pysyncobj is exposed here; production never
# uses either name below.

# pysyncobj's transport interface: the simulator's in-memory transport subclasses it and is
# passed as `transport_base` (RaftNode, ShardRaft); the durable behaviour is added on top.
TransportBase = Transport

_HOST_MONOTONIC = (pysyncobj_syncobj.monotonicTime, pysyncobj_transport.monotonicTime)


def monotonic_s() -> float:
    """pysyncobj's clock (CLOCK_MONOTONIC_RAW, not `time.monotonic`'s CLOCK_MONOTONIC: they
    drift apart by NTP's slewing), or the simulator's: every deadline a replica's tick
    returns, and every liveness time, is on it; the scheduler sleeps by it."""
    return float(pysyncobj_syncobj.monotonicTime())


def set_monotonic_clock(clock: Callable[[], float] | None) -> None:
    """Simulator only: pysyncobj's timers (elections, heartbeats, leader fallback) read
    `clock()` (seconds) instead of the host's monotonic clock; None restores the host's.
    Process-wide, as pysyncobj reads one module-level function: a simulator that gives
    nodes different clocks switches what `clock` returns before it runs each node."""
    if clock is None:
        pysyncobj_syncobj.monotonicTime, pysyncobj_transport.monotonicTime = _HOST_MONOTONIC
    else:
        pysyncobj_syncobj.monotonicTime = clock
        pysyncobj_transport.monotonicTime = clock


# ------------------------------------------------------------------------ the transport


class _StoredZlib:
    """What pysyncobj's TCP connections see as `zlib`: messages are framed as zlib streams
    of stored (uncompressed) blocks instead of level 3.

    pysyncobj compresses every message it sends, once per follower. Ours are mostly
    record payloads, which the engine's own codecs have usually compressed or which are
    random: level 3 cost 270 us per 26 KB AppendEntries on the leader, twice per entry
    (one per follower), for no saving; stored blocks cost 9 us. The stream is still zlib,
    so a node of an earlier build decodes it, and this one decodes theirs."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        return zlib.compress(data, 0)

    decompress = staticmethod(zlib.decompress)


pysyncobj_tcp_connection.zlib = _StoredZlib


class _DurableMixin(Transport):  # type: ignore[misc]
    """Holds messages that promise durability until the tick's single sync (group commit),
    and routes incoming messages through the replica's fixes before pysyncobj sees them.
    Mixed into a pysyncobj transport: TCP in production (`_DurableTransport`), the
    simulator's in-memory one in tests (`durable_transport_class`)."""

    def __init__(self, syncObj: ShardRaft, selfNode: Any, otherNodes: Any) -> None:
        self._outbox: list[tuple[Any, dict[str, Any]]] = []
        self._syncObj = syncObj  # TCPTransport sets it too; the base Transport does not
        super().__init__(syncObj, selfNode, otherNodes)

    def addNode(self, node: Any) -> None:
        # Every peer the transport will dial passes here: the configured ones, and those
        # pysyncobj creates later as plain TCPNodes (membership changes, a snapshot's
        # cluster list), so a test's dial override covers them too.
        owner: ShardRaft = self._syncObj
        super().addNode(owner._logsvc_dial_node(node))

    def setOnMessageReceivedCallback(self, callback: Any) -> None:
        if callback is None:
            super().setOnMessageReceivedCallback(None)
            return
        owner: ShardRaft = self._syncObj

        def route(node: Any, message: dict[str, Any]) -> None:
            owner._logsvc_on_message(node, message, callback)

        super().setOnMessageReceivedCallback(route)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        owner: ShardRaft = self._syncObj
        owner._logsvc_note_sent(node)
        if message.get("type") in _AFTER_SYNC:
            self._outbox.append((node, message))
            if len(self._outbox) >= OUTBOX_MESSAGES_MAX:
                self.flush()
            return True
        return bool(super().send(node, message))

    def _onNodeConnected(self, node: Any) -> None:
        owner: ShardRaft = self._syncObj
        owner._logsvc_on_connection(node, up=True)
        super()._onNodeConnected(node)

    def _onReadonlyNodeConnected(self, node: Any) -> None:
        owner: ShardRaft = self._syncObj
        owner._logsvc_on_connection(node, up=True)  # a learner: a quiet leader wakes
        super()._onReadonlyNodeConnected(node)

    def _onReadonlyNodeDisconnected(self, node: Any) -> None:
        owner: ShardRaft = self._syncObj
        owner._logsvc_learners.pop(node, None)
        super()._onReadonlyNodeDisconnected(node)

    def _onNodeDisconnected(self, node: Any) -> None:
        owner: ShardRaft = self._syncObj
        # pysyncobj also reports a dial that failed (a peer that is down, every retry):
        # only a connection that was up is news.
        if node in owner._SyncObj__connectedNodes:
            owner._logsvc_on_connection(node, up=False)
        super()._onNodeDisconnected(node)

    def held(self) -> list[tuple[Any, dict[str, Any]]]:
        return self._outbox

    def flush(self) -> None:
        """Sync the journal, then send what was held. Called after every tick."""
        owner: ShardRaft = self._syncObj
        failpoint("raft_before_flush_sync")
        owner._logsvc_journal.store.sync()
        outbox, self._outbox = self._outbox, []
        # pysyncobj sends a response_vote only to grant a vote (already durable, above).
        if failpoints_enabled() and any(m.get("type") == "response_vote" for _, m in outbox):
            failpoint("raft_after_vote_persisted_before_reply")
        for node, message in outbox:
            super().send(node, message)


class _DurableTransport(_DurableMixin, TCPTransport):  # type: ignore[misc]
    """The durable transport over pysyncobj's TCP transport (production)."""


_DURABLE_CLASSES: dict[type, type] = {TCPTransport: _DurableTransport}


def durable_transport_class(base: type) -> type:
    """The durable transport over `base`, a `TransportBase` subclass (simulator only; the
    same class for the same base, so pysyncobj and tests see one class per base)."""
    assert issubclass(base, Transport), base
    found = _DURABLE_CLASSES.get(base)
    if found is None:
        found = type(f"Durable{base.__name__}", (_DurableMixin, base), {})
        _DURABLE_CLASSES[base] = found
    return found


class _DialNode(TCPNode):  # type: ignore[misc]
    """A peer known by its canonical address but dialled at another one (test only).

    pysyncobj 0.3.17 dials `node.ip`/`node.port` (TCPTransport._connectIfNecessarySingle)
    while the id, `address`, the higher-address-dials rule and the handshake (the dialler
    announces its own selfNode.address) all use the canonical address; so overriding the
    two dial properties reroutes the connection and nothing else (chaos-plan appendix B).
    """

    def __init__(self, address: str, dial_address: str) -> None:
        super().__init__(address)
        host, _, port = dial_address.rpartition(":")
        self._logsvc_dial_host = host
        self._logsvc_dial_port = int(port)

    @property
    def ip(self) -> Any:
        return globalDnsResolver().resolve(self._logsvc_dial_host)

    @property
    def port(self) -> int:
        return self._logsvc_dial_port

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # pysyncobj pickles a node object into a membership command: the replicated log
        # must carry the plain canonical node, never this replica's test routing.
        return (TCPNode, (self.address,))


# ------------------------------------------------------------------------ the SyncObj


class ShardRaft(SyncObj):  # type: ignore[misc]
    """A pysyncobj SyncObj with logsvc's fixes. Created and ticked by `RaftNode`."""

    # pysyncobj's private state that the fixes below read and write (0.3.17 names).
    _SyncObj__raftCommitIndex: int
    _SyncObj__newAppendEntriesTime: float
    _SyncObj__raftElectionDeadline: float
    _SyncObj__raftLastApplied: int

    def __init__(
        self,
        config: RaftConfig,
        journal: StoreJournal,
        handler: RaftHandler,
        file_system: FileSystem | None = None,
        transport_base: type | None = None,
        *,
        poller: scheduler.ShardPoller | None = None,
        liveness: NodeLiveness | None = None,
        node_of: Callable[[str], str] | None = None,
    ) -> None:
        """`transport_base`: simulator only (see `TransportBase`); None = TCP. `poller`: the
        replica's poller from its scheduler (None: pysyncobj's own, the simulator's case).
        `liveness`, `node_of`: the node liveness table and the address -> node map, for
        quiescence (None: this replica keeps its own, every address a node)."""
        # Everything we use is set before SyncObj.__init__ (pysyncobj.md §1.5 D).
        self._logsvc_messages = 0  # Raft messages and connection changes seen (all ticks)
        self._logsvc_quiesce_after_s = config.quiesce_after_ms / 1000.0
        self._logsvc_election_max_s = config.election_timeout_ms_max / 1000.0
        self._logsvc_node_of: Callable[[str], str] = node_of if node_of is not None else str
        self._logsvc_liveness = (
            liveness
            if liveness is not None
            else NodeLiveness(
                self._logsvc_node_of(config.self_address),
                interval_s=config.heartbeat_ms / 1000.0,
                lapse_s=config.election_timeout_ms_min / 1000.0,
                now_s=pysyncobj_syncobj.monotonicTime(),
            )
        )
        self._logsvc_leader_q: quiescence.LeaderQuiescence | None = None
        self._logsvc_follower_q = quiescence.FollowerQuiescence()
        self._logsvc_self_address = config.self_address
        self._logsvc_learner = config.learner
        # On a member: the learners connected to it (pysyncobj's read-only node -> the
        # address the learner announced).
        self._logsvc_learners: dict[Any, str] = {}
        self._logsvc_fs = file_system if file_system is not None else OsFileSystem()
        self._logsvc_journal = journal
        self._logsvc_handler = handler
        self._logsvc_snapshot_path = config.snapshot_path
        self._logsvc_compacted_at = 0
        self._logsvc_rx = b""
        self._logsvc_dial = dict(config.dial_overrides)
        self._logsvc_proposing = False  # inside the leader's own membership change
        # Our sealing instead of pysyncobj's Fernet (see `encryptor` below): every
        # connection pysyncobj creates, from SyncObj.__init__ on, reads it.
        self._logsvc_sealer = MessageSealer(config.secret)
        conf = SyncObjConf(
            password=None,  # pysyncobj would derive a Fernet key: `encryptor` replaces it
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_ms / 1000.0,
            raftMinTimeout=config.election_timeout_ms_min / 1000.0,
            raftMaxTimeout=config.election_timeout_ms_max / 1000.0,
            leaderFallbackTimeout=config.leader_fallback_ms / 1000.0,
            connectionTimeout=config.connection_timeout_ms / 1000.0,
            connectionRetryTime=config.connection_retry_ms / 1000.0,
            commandsQueueSize=config.commands_queue_max,
            dynamicMembershipChange=True,
            logCompactionMinEntries=_NEVER,
            logCompactionMinTime=_NEVER,
            fullDumpFile=config.snapshot_path,
            serializer=_never_called,
            deserializer=_never_called,
            useFork=False,
        )
        key = _JOURNALS.register(journal)
        conf.journalFile = key
        poller_key = None if poller is None else _POLLERS.register(poller)
        if poller_key is not None:
            conf.pollerType = poller_key
        try:
            super().__init__(
                None if config.learner else config.self_address,  # None: read-only
                [self._logsvc_dial_node(peer) for peer in config.peers],
                conf,
                transportClass=(
                    _DurableTransport
                    if transport_base is None
                    else durable_transport_class(transport_base)
                ),
            )
        finally:
            _JOURNALS.unregister(key)
            if poller_key is not None:
                _POLLERS.unregister(poller_key)
        # pysyncobj ships, receives and looks for the snapshot file with plain open() and
        # os.path.isfile: route all three through our file-system port instead (the same
        # files in production; the simulator's in-memory file system in tests/chaos/dst/).
        self._SyncObj__serializer = _SnapshotTransfer(
            self._logsvc_fs, config.snapshot_path, conf.logCompactionBatchSize
        )
        self._logsvc_snapshot_at_start = self._logsvc_fs.exists(config.snapshot_path)
        self._SyncObj__needLoadDumpFile = False

    @property
    def encryptor(self) -> MessageSealer:
        """What every pysyncobj connection seals and opens messages with (pysyncobj reads
        this property; with `password` None its own would be None): AES-GCM with a key per
        sender (raft_seal.py) instead of Fernet, 40x cheaper per AppendEntries."""
        return self._logsvc_sealer

    def _getEncryptor(self) -> MessageSealer:
        return self._logsvc_sealer

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if self._logsvc_snapshot_at_start:
            # What pysyncobj's first tick does when the snapshot file exists (hole 4 fix).
            self._logsvc_snapshot_at_start = False
            self._SyncObj__loadDumpFile(clearJournal=False)
        super()._onTick(timeToWait)

    def _logsvc_dial_node(self, node: Any) -> Any:
        """The peer `node` (an address or a pysyncobj node) as the transport should dial it:
        a `_DialNode` where a test override names its address, else as pysyncobj made it."""
        address = node if isinstance(node, str) else getattr(node, "address", None)
        dial = self._logsvc_dial.get(address) if isinstance(address, str) else None
        if dial is None or isinstance(node, _DialNode):
            return node
        assert isinstance(address, str)
        return _DialNode(address, dial)

    # -- membership: pysyncobj's configuration follows the log's (membership.py) -----------

    def _SyncObj__changeCluster(self, request: Any) -> bool:
        # The leader proposing a change: pysyncobj's own check and in-memory change (the
        # journal then records the entry when pysyncobj appends it).
        self._logsvc_proposing = True
        try:
            return bool(SyncObj._SyncObj__changeCluster(self, request))
        finally:
            self._logsvc_proposing = False

    def _SyncObj__doChangeCluster(self, request: Any, reverse: bool = False) -> bool:
        # Everywhere else (an entry received, a truncation undone, an entry applied, also
        # after a restart) pysyncobj would toggle its configuration by the entry alone;
        # instead it takes the latest configuration of the log, which the journal keeps.
        if self._logsvc_proposing or self._logsvc_journal.membership is None:
            return bool(SyncObj._SyncObj__doChangeCluster(self, request, reverse))
        return self._logsvc_follow_membership()

    def _logsvc_follow_membership(self) -> bool:
        """Make pysyncobj's peers the log's latest configuration; True if they changed."""
        membership = self._logsvc_journal.membership
        assert membership is not None
        target = set(membership.peers)
        if target == {node.id for node in self._SyncObj__otherNodes}:
            return False
        self._SyncObj__updateClusterConfiguration(
            [self._logsvc_dial_node(address) for address in sorted(target)]
        )
        if self._isLeader():  # as pysyncobj's own change does for a node it adds
            now = pysyncobj_syncobj.monotonicTime()
            for node in self._SyncObj__otherNodes:
                self._SyncObj__lastResponseTime.setdefault(node, now)
        log.info("raft peers are now %s (the log's configuration)", sorted(target))
        return True

    @replicated  # type: ignore[untyped-decorator]
    def _logsvc_apply(self, encoded: bytes) -> object:
        raft_index = self._SyncObj__raftLastApplied + 1  # the entry being applied
        return self._logsvc_handler.apply(raft_index, encoded)

    # -- hole 3: message fixes ------------------------------------------------------------

    def _logsvc_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        kind = message.get("type")
        if kind == _LEARNER:
            address = message.get("address")
            if isinstance(address, str) and not isinstance(node, TCPNode):
                self._logsvc_learners[node] = address
            return
        if self._logsvc_quiesce_after_s:
            now_s = pysyncobj_syncobj.monotonicTime()
            sender = str(node.id)
            if isinstance(node, TCPNode):  # not a learner's read-only connection (no node)
                self._logsvc_liveness.heard(self._logsvc_node_of(sender), now_s)
            if kind in _OWN_MESSAGES:
                self._logsvc_on_own_message(node, sender, kind, message, now_s)
                return
            if not (kind == "next_node_idx" and message.get("success")):
                # Any Raft message ends quiet, on either side, except a follower's answer
                # to the leader's own AppendEntries (catching up shows in its match index).
                self._logsvc_wake(now_s)
        self._logsvc_messages += 1
        if kind == "append_entries" and "prevLogIdx" in message:
            self._logsvc_on_append_entries(node, message, deliver)
            return
        if kind == "append_entries":
            # A snapshot chunk. Stock then sets commitIndex = min(leaderCommit, our last
            # index) though nothing in our log was checked against the leader's: a lagging
            # follower with an uncommitted, diverging suffix would apply it and serve reads
            # of it (found by tests/chaos/dst/, seed 4039 with 12000 steps). Only a snapshot
            # installed here, or our own compaction, vouches for entries.
            commit_before = self._SyncObj__raftCommitIndex
            deliver(node, message)
            ceiling = max(commit_before, self._logsvc_compacted_at)
            if self._SyncObj__raftCommitIndex > ceiling:
                self._SyncObj__raftCommitIndex = ceiling
            return
        if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
            # Stock: a late ack sets nextIndex = ack + 1 even after nextIndex had moved on
            # (entries in flight), so those entries are sent again (pysyncobj.md §6.1).
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            deliver(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before
            return
        if kind == "next_node_idx" and message.get("reset") and not message.get("success"):
            # A refusal names an index at or below the prevLogIdx it answers, so refusals of
            # the latest messages only ever lower nextIndex. Stock also lets a refusal of a
            # later batch of the same round ("my log ends at X", X above the walk-back the
            # first batch's refusal just made) raise it again: a follower with a conflicting
            # suffix, more than one batch behind, then never catches up, and nextIndex
            # bounces between the two answers forever (found by tests/chaos/dst/, seed 2).
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            deliver(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after > before:
                next_index[node] = before
            return
        deliver(node, message)

    def _logsvc_on_append_entries(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        message = self._logsvc_assemble(message)
        if "transmission" in message:
            deliver(node, message)  # a chunk of a large entry: pysyncobj only buffers it
            return
        journal = self._logsvc_journal
        store = journal.store
        prev_index, prev_term = message["prevLogIdx"], message["prevLogTerm"]
        if not store.first_index <= prev_index <= store.last_index or (
            journal.entry(prev_index)[2] != prev_term
        ):
            deliver(node, message)  # pysyncobj rejects it without deleting anything
            return
        entries = list(message.get("entries", []))
        confirmed = entries[-1][1] if entries else prev_index  # what the leader vouches for
        matched = 0
        for entry in entries:
            index, term = entry[1], entry[2]
            if index > store.last_index or journal.entry(index)[2] != term:
                break  # first entry we lack, or the first conflict (delete from here)
            matched += 1
        trimmed = dict(message)
        if matched < len(entries):
            if matched:
                trimmed["prevLogIdx"] = entries[matched - 1][1]
                trimmed["prevLogTerm"] = entries[matched - 1][2]
            trimmed["entries"] = entries[matched:]
        else:
            # Everything sent is already here. Stock pysyncobj would delete every entry
            # after it (even ones we acked); present our own last entry as `prev` so
            # nothing is deleted, and correct the reply below to what was vouched for.
            trimmed["prevLogIdx"] = store.last_index
            trimmed["prevLogTerm"] = journal.entry(store.last_index)[2]
            trimmed["entries"] = []
        commit_before = self._SyncObj__raftCommitIndex
        held_before = len(self._SyncObj__transport.held())
        deliver(node, trimmed)
        for _, reply in self._SyncObj__transport.held()[held_before:]:
            if reply.get("type") == "next_node_idx" and reply.get("success"):
                reply["next_node_idx"] = confirmed + 1
        # Raft: commitIndex = min(leaderCommit, index of last new entry), never beyond what
        # this message vouched for (stock uses our last index, which may hold stale entries).
        ceiling = max(commit_before, confirmed)
        if self._SyncObj__raftCommitIndex > ceiling:
            self._SyncObj__raftCommitIndex = ceiling

    def _logsvc_assemble(self, message: dict[str, Any]) -> dict[str, Any]:
        """Turn the last chunk of a large entry into an ordinary one-entry message, so the
        same conflict check applies; the chunks before it pass through untouched."""
        transmission = message.get("transmission")
        if transmission is None:
            return message
        if transmission == "start":
            self._logsvc_rx = message["data"]
            return message
        if transmission == "process":
            self._logsvc_rx += message["data"]
            return message
        assert transmission == "finish"
        data = self._logsvc_rx + message["data"]
        try:
            entry = pysyncobj_pickle.loads(data)
        except Exception:
            # pysyncobj's sender labels a chunk "finish" when it reaches the length of the
            # entry's *command*, not of its pickle, which is longer: more chunks may follow
            # (each labelled "finish"). A proper prefix of the pickle never loads, so keep
            # collecting, and let pysyncobj buffer it as an ordinary chunk.
            if len(data) > TRANSMISSION_BYTES_MAX:
                raise RaftFatal(
                    f"a chunked entry exceeded {TRANSMISSION_BYTES_MAX} bytes"
                ) from None
            self._logsvc_rx = data
            return {**message, "transmission": "process"}
        self._logsvc_rx = b""
        whole = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        whole["entries"] = [tuple(entry)]
        return whole

    # -- quiescence (quiescence.py, liveness.py) ---------------------------------------------

    def _logsvc_note_sent(self, node: Any) -> None:
        if self._logsvc_quiesce_after_s:
            self._logsvc_liveness.sent(
                self._logsvc_node_of(str(node.id)), pysyncobj_syncobj.monotonicTime()
            )

    def _logsvc_on_connection(self, node: Any, up: bool) -> None:
        """A connection to a peer came up or went down (inside a tick)."""
        self._logsvc_messages += 1  # the tick after it acts on it (reconnects, catch-up)
        if up and self._logsvc_learner:
            # pysyncobj's read-only node is anonymous: say which replica this is, so the
            # leader can tell when the learner an admin change started has caught up.
            self._SyncObj__transport.send(
                node, {"type": _LEARNER, "address": self._logsvc_self_address}
            )
        if not self._logsvc_quiesce_after_s:
            return
        now_s = pysyncobj_syncobj.monotonicTime()
        follower = self._logsvc_follower_q
        if not up and follower.quiet and follower.leader == str(node.id):
            self._logsvc_lost_leader(now_s, "the connection to the leader closed")
        self._logsvc_wake(now_s)

    def _logsvc_wake(self, now_s: float) -> None:
        """Activity: a quiet follower is an ordinary one again; a quiescing or quiet leader
        heartbeats at once."""
        if self._logsvc_follower_q.wake():
            self._logsvc_refresh_connections(now_s)  # it may send on them next (votes...)
        leader = self._logsvc_leader_q
        if leader is not None and leader.wake(now_s):
            self._logsvc_heartbeat_now(now_s)

    def _logsvc_refresh_connections(self, now_s: float, only: Any = None) -> None:
        """Count the connections to peers on live nodes as just read from.

        pysyncobj drops a connection on which nothing was read for connection_timeout, and
        checks that when it next sends on it; a quiet shard reads nothing for minutes, so
        its first message after waking (or a liveness message on a connection that only
        carries ours) would drop the connection instead of leaving. While the peer's node
        is live in the liveness table, its connection is as good as heard from; once the
        node lapses, pysyncobj's own timeout applies again from the last refresh."""
        connections = getattr(self._SyncObj__transport, "_connections", None)
        if not connections:
            return  # the simulator's transport keeps no such clock
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        for node, connection in connections.items():
            if only is not None and node != only:
                continue
            if connection.state != pysyncobj_tcp_connection.CONNECTION_STATE.CONNECTED:
                continue
            if not liveness.lapsed(node_of(str(node.id)), now_s):
                connection._TcpConnection__lastReadTime = now_s

    def _logsvc_heartbeat_now(self, now_s: float) -> None:
        """A leader leaving quiet: AppendEntries on the next tick (which wakes the quiet
        followers), and its followers' silence counted from now, not from before (the
        leader-fallback timer did not run while it was quiet)."""
        self._SyncObj__newAppendEntriesTime = 0
        self._logsvc_refresh_connections(now_s)
        last_response = self._SyncObj__lastResponseTime
        for node in self._SyncObj__otherNodes:
            if node in last_response:
                last_response[node] = now_s
        self._logsvc_messages += 1

    def _logsvc_lost_leader(self, now_s: float, why: str) -> None:
        """A quiet follower whose leader is gone: an ordinary follower again, whose election
        timer started when the leader's node was last heard from (as if its heartbeats had
        stopped then), so a quiet shard fails over like an active one. At least a random
        part of the timeout is still ahead, so the followers do not all stand at once."""
        follower = self._logsvc_follower_q
        leader = follower.leader
        follower.wake()
        # Its next messages (a vote request...) go on connections quiet for long.
        self._logsvc_refresh_connections(now_s)
        if leader is None:
            return
        last_heard_s = self._logsvc_liveness.last_heard(self._logsvc_node_of(leader))
        timeout_s = float(self._SyncObj__generateRaftTimeout())
        spread_s = timeout_s - float(self._SyncObj__conf.raftMinTimeout)
        self._SyncObj__raftElectionDeadline = max(last_heard_s + timeout_s, now_s + spread_s)
        log.info(
            "quiet follower woke: %s; election timer from %.2f s ago",
            why,
            now_s - last_heard_s,
            extra={"term": self.raftCurrentTerm},
        )

    def _logsvc_on_own_message(
        self, node: Any, sender: str, kind: str, message: dict[str, Any], now_s: float
    ) -> None:
        if kind == _ALIVE:
            return  # liveness noted by the caller
        try:
            term, seq = int(message["term"]), int(message["seq"])
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        if kind == _QUIESCE_ACK:
            leader = self._logsvc_leader_q
            if leader is None or not self._isLeader() or term != self.raftCurrentTerm:
                return
            if node in self._SyncObj__lastResponseTime:
                self._SyncObj__lastResponseTime[node] = now_s
            leader.on_ack(sender, term, seq, bool(message.get("ok")), now_s)
            if leader.mode is quiescence.Mode.ACTIVE:  # refused: heartbeat and replicate
                self._logsvc_heartbeat_now(now_s)
            return
        assert kind == _QUIESCE
        try:
            request = quiescence.QuiesceRequest(
                term=term,
                seq=seq,
                last_index=int(message["last_index"]),
                last_term=int(message["last_term"]),
                commit_index=int(message["commit_index"]),
                targets=(),
            )
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring a malformed %s from %s", kind, sender)
            return
        store = self._logsvc_journal.store
        leader_node = self._getLeader()
        view = quiescence.FollowerView(
            term=int(self.raftCurrentTerm),
            is_follower=self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.FOLLOWER,
            leader=None if leader_node is None else str(leader_node.id),
            last_index=store.last_index,
            last_term=int(self._logsvc_journal.entry(store.last_index)[2]),
        )
        agreed = self._logsvc_follower_q.on_request(sender, request, view)
        if view.is_follower and request.term == view.term and view.leader == sender:
            # From our leader in our term: it stands for its heartbeat.
            self._SyncObj__raftElectionDeadline = now_s + self._SyncObj__generateRaftTimeout()
        if agreed and request.commit_index > self._SyncObj__raftCommitIndex:
            # The leader vouches for our whole log: it ends where its does (log matching).
            self._SyncObj__raftCommitIndex = min(request.commit_index, request.last_index)
            self._logsvc_messages += 1  # apply it on the next tick
        self._SyncObj__transport.send(
            node, {"type": _QUIESCE_ACK, "term": request.term, "seq": request.seq, "ok": agreed}
        )

    def _logsvc_quiesce_before(self, now_s: float) -> None:
        """Before a tick: keep a quiet follower's election timer and a quiet leader's
        heartbeat and fallback timers from firing; wake a quiet follower whose leader's
        node lapsed."""
        if not self._logsvc_quiesce_after_s:
            return
        if self.logsvc_quiet or (
            self._logsvc_leader_q is not None
            and self._logsvc_leader_q.mode is quiescence.Mode.QUIESCING
        ):
            self._logsvc_refresh_connections(now_s)
        follower = self._logsvc_follower_q
        if follower.quiet:
            leader = self._getLeader()
            state = self._SyncObj__raftState
            if (
                state != pysyncobj_syncobj._RAFT_STATE.FOLLOWER
                or leader is None
                or str(leader.id) != follower.leader
            ):
                follower.wake()
            elif self._logsvc_liveness.lapsed(self._logsvc_node_of(follower.leader), now_s):
                self._logsvc_lost_leader(now_s, "the leader's node lapsed")
            else:
                self._SyncObj__raftElectionDeadline = now_s + self._logsvc_election_max_s
        leader_q = self._logsvc_leader_q
        if leader_q is not None and leader_q.mode is not quiescence.Mode.ACTIVE:
            self._SyncObj__newAppendEntriesTime = math.inf
            if leader_q.quiet:
                liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
                last_response = self._SyncObj__lastResponseTime
                for node in self._SyncObj__otherNodes:
                    if node in last_response and not liveness.lapsed(node_of(node.id), now_s):
                        last_response[node] = now_s

    def _logsvc_quiesce_after(self, now_s: float) -> None:
        """After a tick: the leader's quiescence step (ask, resend, or wake)."""
        if not self._logsvc_quiesce_after_s:
            return
        if not self._isLeader():
            self._logsvc_leader_q = None
            if self._SyncObj__raftState == pysyncobj_syncobj._RAFT_STATE.CANDIDATE:
                self._logsvc_follower_q.wake()
            return
        leader_q = self._logsvc_leader_q
        if leader_q is None:
            leader_q = quiescence.LeaderQuiescence(self._logsvc_quiesce_after_s, QUIESCE_RESEND_S)
            self._logsvc_leader_q = leader_q
        fingerprint = (
            int(self.raftCurrentTerm),
            self._logsvc_journal.store.last_index,
            int(self._SyncObj__raftCommitIndex),
            int(self._SyncObj__raftLastApplied),
        )
        moved = leader_q.changed(fingerprint, now_s)  # under load: every tick, and cheap
        if moved is None:
            woke, request = leader_q.observe(self._logsvc_leader_view(now_s), now_s)
        else:
            woke, request = moved, None
        if woke:
            self._logsvc_heartbeat_now(now_s)
        if request is not None:
            targets = set(request.targets)
            message = {
                "type": _QUIESCE,
                "term": request.term,
                "seq": request.seq,
                "last_index": request.last_index,
                "last_term": request.last_term,
                "commit_index": request.commit_index,
            }
            for node in self._SyncObj__otherNodes:
                if str(node.id) in targets:
                    self._SyncObj__transport.send(node, dict(message))
        if leader_q.mode is not quiescence.Mode.ACTIVE:
            self._SyncObj__newAppendEntriesTime = math.inf

    def _logsvc_leader_view(self, now_s: float) -> quiescence.LeaderView:
        journal = self._logsvc_journal
        last_index = journal.store.last_index
        match_index = self._SyncObj__raftMatchIndex
        connected = self._SyncObj__connectedNodes
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        busy = bool(
            self._SyncObj__commandsQueue._FastQueue__queue
            or self._SyncObj__commandsWaitingCommit
            or self._SyncObj__serializer._outgoing
            or self._SyncObj__readonlyNodes  # a learner catching up: never quiet
        )
        return quiescence.LeaderView(
            term=int(self.raftCurrentTerm),
            last_index=last_index,
            last_term=int(journal.entry(last_index)[2]),
            commit_index=int(self._SyncObj__raftCommitIndex),
            last_applied=int(self._SyncObj__raftLastApplied),
            busy=busy,
            peers=tuple(
                quiescence.Peer(
                    address=str(node.id),
                    match_index=int(match_index.get(node, 0)),
                    connected=node in connected,
                    alive=not liveness.lapsed(node_of(str(node.id)), now_s),
                )
                for node in self._SyncObj__otherNodes
            ),
        )

    def _logsvc_send_alive(self, now_s: float) -> None:
        """After a tick: an `alive` message to each connected peer whose node got nothing
        from this node for a heartbeat interval (node liveness, for quiet shards)."""
        if not self._logsvc_quiesce_after_s or self._logsvc_learner:
            return  # (a learner's connections are anonymous: they carry no liveness)
        liveness, node_of = self._logsvc_liveness, self._logsvc_node_of
        connected = self._SyncObj__connectedNodes
        for node in self._SyncObj__otherNodes:
            if node in connected and liveness.send_due(node_of(str(node.id)), now_s):
                # It may be the only thing this connection carries: not a timed-out one.
                self._logsvc_refresh_connections(now_s, only=node)
                self._SyncObj__transport.send(node, {"type": _ALIVE})

    def _logsvc_next_wakeup_s(self, now_s: float) -> float | None:
        """When this replica must tick again if nothing happens (None: not until an event:
        a quiet replica)."""
        if not self._SyncObj__transport.ready:
            return now_s + float(self._SyncObj__conf.bindRetryTime)
        if self._SyncObj__raftCommitIndex > self._SyncObj__raftLastApplied:
            return now_s
        if self._SyncObj__commandsQueue._FastQueue__queue and self._SyncObj__raftLeader:
            return now_s
        if self._logsvc_snapshot_at_start:
            return now_s
        due_s = math.inf
        quiet = False
        if self._isLeader():
            leader_q = self._logsvc_leader_q
            if leader_q is None or leader_q.mode is quiescence.Mode.ACTIVE:
                due_s = min(due_s, float(self._SyncObj__newAppendEntriesTime))
            if leader_q is not None:
                check_s = leader_q.next_check_s(now_s)
                if check_s is None:
                    quiet = True
                else:
                    due_s = min(due_s, check_s)
        elif self._logsvc_follower_q.quiet:
            quiet = True
        elif not self._logsvc_learner:  # a learner never stands: no election timer
            election_s = float(self._SyncObj__raftElectionDeadline)
            if election_s > now_s or self._SyncObj__connectedNodes or not self._SyncObj__otherNodes:
                due_s = min(due_s, election_s)
            # else: due, but pysyncobj stands only once connected to someone: the redial
            # below (or the connection's event) is when it can.
        if not quiet:
            connected = self._SyncObj__connectedNodes
            if any(node not in connected for node in self._SyncObj__otherNodes):
                due_s = min(due_s, now_s + float(self._SyncObj__conf.connectionRetryTime))
        return None if due_s == math.inf else max(due_s, now_s)

    @property
    def logsvc_quiet(self) -> bool:
        """Quiet: a leader every follower agreed with, or a follower that agreed."""
        leader = self._logsvc_leader_q
        return self._logsvc_follower_q.quiet or (leader is not None and leader.quiet)

    # -- hole 6: compaction only at snapshot points ----------------------------------------

    def _SyncObj__tryLogCompaction(self) -> None:
        point = self._logsvc_handler.compaction_point()
        if point is None:
            return
        raft_index, state = point
        store = self._logsvc_journal.store
        if raft_index <= self._logsvc_compacted_at or raft_index - 1 <= store.first_index:
            return
        if raft_index > self._SyncObj__raftLastApplied:
            return
        journal = self._logsvc_journal
        last, prev = journal.entry(raft_index), journal.entry(raft_index - 1)
        nodes = set(self._SyncObj__otherNodes)
        if self._SyncObj__selfNode is not None:  # None: a learner
            nodes.add(self._SyncObj__selfNode)
        cluster = tuple(sorted(node.id for node in nodes))
        if journal.membership is not None:  # the configuration as of the snapshot's entry
            cluster = journal.membership.members_at(raft_index)
        data = snapshot_file.encode(
            snapshot_file.SnapshotFile(
                last=snapshot_file.JournalEntry(last[1], last[2], bytes(last[0])),
                prev=snapshot_file.JournalEntry(prev[1], prev[2], bytes(prev[0])),
                cluster=cluster,
                state=state,
            )
        )
        _write_durably(self._logsvc_fs, self._logsvc_snapshot_path, data)
        for node in self._SyncObj__otherNodes:
            self._SyncObj__serializer.cancelTransmisstion(node)
        journal.deleteEntriesTo(raft_index - 1 - store.first_index)
        self._logsvc_compacted_at = raft_index
        log.info(
            "compacted the journal to raft index %d (snapshot point)",
            raft_index,
            extra={"term": self.raftCurrentTerm},
        )

    # -- hole 4: a snapshot that cannot be loaded is fatal ----------------------------------

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        path = self._logsvc_snapshot_path
        try:
            data = self._logsvc_fs.read_file(path)
            snapshot = snapshot_file.decode(data)
            # A received snapshot must be durable before we rely on it.
            _make_durable(self._logsvc_fs, path)
        except (OSError, snapshot_file.SnapshotFileCorrupt) as exc:
            raise RaftFatal(f"cannot load the snapshot {path}: {exc}") from exc
        journal = self._logsvc_journal
        store = journal.store
        last, prev = snapshot.last, snapshot.prev
        have_last = store.first_index <= last.index <= store.last_index and (
            journal.entry(last.index)[2] == last.term
        )
        if have_last:
            # Raft §7: our log already holds the snapshot's last entry: keep what follows.
            if store.first_index < prev.index:
                journal.deleteEntriesTo(prev.index - store.first_index)
        else:
            # Raft §7: a snapshot holds committed state only, so a journal that lacks its
            # last entry (shorter, or conflicting there) is replaced by it. At start
            # (clearJournal False) this is a follower killed after it made a received
            # snapshot durable but before it reset its journal: refusing to start would
            # leave the replica down for good (found by the chaos suite's review).
            if not clearJournal:
                log.warning(
                    "the snapshot at raft index %d is ahead of the journal [%d, %d]: "
                    "finishing its installation (the journal is reset to it)",
                    last.index,
                    store.first_index,
                    store.last_index,
                )
            journal.reset_to(prev.index)
            journal.add(prev.command, prev.index, prev.term)
            journal.add(last.command, last.index, last.term)
            if journal.membership is not None:  # the log now starts with the snapshot
                journal.membership.on_reset(last.index, last.term, snapshot.cluster)
        self._logsvc_handler.install_snapshot(last.index, snapshot.state)
        self._SyncObj__raftLastApplied = last.index
        self._logsvc_compacted_at = max(self._logsvc_compacted_at, last.index)
        if self._SyncObj__raftCommitIndex < last.index:
            self._SyncObj__raftCommitIndex = last.index
        if journal.membership is not None:
            # Our own log's configuration (a snapshot we already had the entries of may
            # carry an older one).
            self._logsvc_follow_membership()
        else:
            self._SyncObj__updateClusterConfiguration(
                [node for node in snapshot.cluster if node != self._SyncObj__selfNode.id]
            )
        self._SyncObj__onSetCodeVersion(0)
        log.info(
            "installed the snapshot at raft index %d",
            last.index,
            extra={"term": self.raftCurrentTerm},
        )


class _SnapshotTransfer:
    """Stands in for pysyncobj's Serializer where our SyncObj still uses it: shipping the
    snapshot file to a lagging follower in chunks, and receiving one. Over the file-system
    port, and a received snapshot is written durably (temp file, fdatasync, rename,
    directory fsync) before pysyncobj loads it. Compaction is ours (hole 6), so pysyncobj's
    serialize/deserialize paths are never taken."""

    def __init__(self, fs: FileSystem, path: str, chunk_bytes: int) -> None:
        self._fs = fs
        self._path = path
        self._chunk_bytes = chunk_bytes
        self._outgoing: dict[Any, tuple[ReadableFile, int]] = {}  # node -> (file, offset)
        self._incoming: bytearray | None = None

    # pysyncobj API (names are theirs) ----------------------------------------------------

    def getTransmissionData(self, node: Any) -> tuple[bytes, bool, bool] | None:
        sending = self._outgoing.pop(node, None)
        if sending is None:
            try:
                sending = (self._fs.open_read(self._path), 0)
            except OSError as exc:
                log.error("cannot open the snapshot %s to ship it: %s", self._path, exc)
                return None
        handle, offset = sending
        try:
            data = handle.pread(offset, self._chunk_bytes)
        except OSError as exc:
            log.error("cannot read the snapshot %s to ship it: %s", self._path, exc)
            handle.close()
            return None
        is_last = not data
        if is_last:
            handle.close()
        else:
            self._outgoing[node] = (handle, offset + len(data))
        return data, offset == 0, is_last

    def setTransmissionData(self, data: tuple[bytes, bool, bool] | None) -> bool:
        """True once a whole snapshot was received and is durable at `path`."""
        if data is None:
            return False
        chunk, is_first, is_last = data
        if is_first:
            self._incoming = bytearray()
        elif self._incoming is None:
            return False  # joined mid-transmission: wait for the next one
        self._incoming += chunk
        if len(self._incoming) > TRANSMISSION_BYTES_MAX:
            raise RaftFatal(f"a received snapshot exceeded {TRANSMISSION_BYTES_MAX} bytes")
        if not is_last:
            return False
        received, self._incoming = bytes(self._incoming), None
        _write_durably(self._fs, self._path, received)
        return True

    def cancelTransmisstion(self, node: Any) -> None:
        sending = self._outgoing.pop(node, None)
        if sending is not None:
            sending[0].close()


def _never_called(*_args: object) -> Any:
    raise AssertionError("pysyncobj's serializer path is replaced by logsvc's compaction")


def _write_durably(fs: FileSystem, path: str, data: bytes) -> None:
    """A snapshot file, replaced atomically and durably."""
    small_file.write_durably(
        fs, path, data, before_rename=lambda: failpoint("raft_snapshot_before_rename")
    )


def _open_membership(
    config: RaftConfig, journal: StoreJournal, fs: FileSystem
) -> shard_membership.ReplicaMembership:
    """The replica's members file next to its snapshot, validated against its log; made
    from the configured peers on the first start. A bad file is fatal: guessing the
    peers could start a replica in the wrong group."""
    path = os.path.join(os.path.dirname(config.snapshot_path), shard_membership.FILE_NAME)
    store = journal.store
    try:
        return shard_membership.ReplicaMembership.open(
            fs,
            path,
            config.self_address,
            (config.self_address, *config.peers),
            config.joining,
            store.first_index,
            journal.term_at,
        )
    except (small_file.SmallFileCorrupt, shard_membership.MembershipLost) as exc:
        raise RaftFatal(f"cannot tell the shard's members: {exc}") from exc


def _make_durable(fs: FileSystem, path: str) -> None:
    """A snapshot pysyncobj received and renamed into place (without any fsync)."""
    handle = fs.open_write(path, create=False)
    try:
        handle.fdatasync()
    finally:
        handle.close()
    fs.fsync_dir(os.path.dirname(path) or ".")


# ------------------------------------------------------------------------ the node


class RaftNode:
    """One shard replica's Raft: builds the SyncObj; the node's `RaftScheduler` ticks it
    (a private one with a single worker when none is given)."""

    def __init__(
        self,
        config: RaftConfig,
        store: ShardStore,
        handler: RaftHandler,
        file_system: FileSystem | None = None,
        events: ReplicaEvents | None = None,
        transport_base: type | None = None,
        raft_scheduler: scheduler.RaftScheduler | None = None,
    ) -> None:
        """`file_system` holds the snapshot file (the store's own port; the real one by
        default). pysyncobj itself writes a received snapshot with plain file calls; we make
        it durable through `file_system` before relying on it. `events` receives term, vote
        and role changes (logsvc/events.py). `transport_base`: simulator only (see
        `TransportBase`); such a node is never `start()`ed: the simulator calls
        `tick_once`. `raft_scheduler`: the node's scheduler (its liveness table and address
        -> node map serve quiescence); None: a private one, started and closed with this
        node."""
        config.validate()
        fs = file_system if file_system is not None else OsFileSystem()
        if store.first_index > 1 and not fs.exists(config.snapshot_path):
            raise RaftFatal(
                f"the journal starts at raft index {store.first_index} but the snapshot "
                f"{config.snapshot_path} is missing: refusing to start with an empty state"
            )
        self._config = config
        self.label = config.self_address
        self._journal = StoreJournal(store, events)
        self._membership = _open_membership(config, self._journal, fs)
        self._journal.membership = self._membership
        # The peers are the log's latest configuration, not the ones configured at first.
        started = replace(config, peers=self._membership.peers)
        self._owns_scheduler = raft_scheduler is None and transport_base is None
        if self._owns_scheduler:
            now_s = pysyncobj_syncobj.monotonicTime()
            raft_scheduler = scheduler.RaftScheduler(
                NodeLiveness(
                    config.self_address,
                    interval_s=config.heartbeat_ms / 1000.0,
                    lapse_s=config.election_timeout_ms_min / 1000.0,
                    now_s=now_s,
                ),
                str,
                workers=1,
                reconnect_s=config.connection_retry_ms / 1000.0,
                clock=monotonic_s,
            )
        self._scheduler = raft_scheduler
        self._poller = None if raft_scheduler is None else raft_scheduler.new_poller()
        try:
            self._raft = ShardRaft(
                started,
                self._journal,
                handler,
                fs,
                transport_base,
                poller=self._poller,
                liveness=None if raft_scheduler is None else raft_scheduler.liveness,
                node_of=None if raft_scheduler is None else raft_scheduler.node_of,
            )
        except BaseException:
            if raft_scheduler is not None and self._poller is not None:
                raft_scheduler.release_poller(self._poller)
            raise
        self._members_version = self._membership.version
        self._progress = RaftProgress()
        self._events = events
        self._leading = False  # as of the last tick (role changes go to the event log)
        self._started = False
        self._stopped = False
        self._fatal: BaseException | None = None
        self._fatal_listeners: list[Callable[[BaseException], None]] = []
        # Calls from other threads that must run on the tick (leader transfers), bounded.
        self._tick_calls: deque[Callable[[], None]] = deque()
        self._tick_calls_lock = threading.Lock()
        self.ticks = 0  # counted (tests and benchmarks see how often a replica ticks)

    def start(self) -> None:
        assert not self._started
        assert self._scheduler is not None and self._poller is not None, "simulated: tick it"
        self._started = True
        if self._owns_scheduler:
            self._scheduler.start()
        self._scheduler.add(self, self._poller)

    def stop(self) -> None:
        """Stop ticking, then close the Raft connections and the listening socket (on the
        replica's worker, so no tick runs meanwhile)."""
        if self._stopped:
            return
        self._stopped = True
        if self._scheduler is not None and self._started:
            self._scheduler.remove(self, then=self._destroy)
        else:
            self._destroy()
            if self._scheduler is not None and self._poller is not None:
                self._scheduler.release_poller(self._poller)
        if self._owns_scheduler and self._scheduler is not None and self._started:
            self._scheduler.close()

    def _destroy(self) -> None:
        with contextlib.suppress(Exception):
            self._raft.destroy()

    def on_fatal(self, listener: Callable[[BaseException], None]) -> None:
        self._fatal_listeners.append(listener)

    @property
    def fatal(self) -> BaseException | None:
        return self._fatal

    def propose(self, encoded: bytes, callback: Callable[[object, int], None]) -> None:
        """Queue one command; `callback(result, fail_reason)` runs on the tick thread once
        it is applied here (FailReason.SUCCESS) or failed."""
        self._raft._logsvc_apply(encoded, callback=callback)
        self._wake()

    def _wake(self) -> None:
        if self._scheduler is not None:
            self._scheduler.wake(self)

    @property
    def is_leader(self) -> bool:
        return bool(self._raft._isLeader())

    @property
    def leader(self) -> str | None:
        leader = self._raft._getLeader()
        return None if leader is None else str(leader.id)

    @property
    def term(self) -> int:
        return int(self._raft.raftCurrentTerm)

    @property
    def commit_index(self) -> int:
        return int(self._raft.raftCommitIndex)

    @property
    def last_applied(self) -> int:
        return int(self._raft.raftLastApplied)

    @property
    def self_address(self) -> str:
        return self._config.self_address

    @property
    def quiet(self) -> bool:
        """Quiescent: no heartbeats, no election timer (quiescence.py)."""
        return bool(self._raft.logsvc_quiet)

    @property
    def learner(self) -> bool:
        """A non-voting learner (RaftConfig.learner)."""
        return self._config.learner

    def learners(self) -> dict[str, int]:
        """On the leader: each connected learner's address -> its match index (the last
        entry it holds, as it acknowledged); empty elsewhere. Any thread: a copy, retried
        if the tick changed the maps meanwhile."""
        raft = self._raft
        if not raft._isLeader():
            return {}
        for _ in range(10):
            try:
                learners = dict(raft._logsvc_learners)
                match = dict(raft._SyncObj__raftMatchIndex)
            except RuntimeError:  # changed size during the copy
                continue
            return {address: int(match.get(node, 0)) for node, address in learners.items()}
        return {}

    @property
    def last_index(self) -> int:
        return self._journal.store.last_index

    def status(self) -> dict[str, Any]:
        return dict(self._raft.getStatus())

    @property
    def members(self) -> tuple[str, ...]:
        """The Raft addresses of the shard's members: the latest configuration in this
        replica's log (this replica included while it is a member)."""
        return self._membership.members

    @property
    def joining(self) -> bool:
        """Started to join; its own `add` not in its log yet (it holds its elections)."""
        return self._membership.joining

    @property
    def config_index(self) -> int:
        """The raft index of the membership entry behind `members` (0: none yet)."""
        return self._membership.config_index

    def progress(self) -> ProgressView:
        """The last election seen and, on the leader, each follower's lag in seconds."""
        return self._progress.view(pysyncobj_syncobj.monotonicTime())

    def add_member(self, address: str, callback: Callable[[object, int], None]) -> None:
        self._raft.addNodeToCluster(address, callback=callback)
        self._wake()

    def remove_member(self, address: str, callback: Callable[[object, int], None]) -> None:
        self._raft.removeNodeFromCluster(address, callback=callback)
        self._wake()

    def transfer_leadership(
        self, address: str | None, callback: Callable[[object, int], None]
    ) -> None:
        """Run on the tick (pysyncobj sends TimeoutNow from the calling thread otherwise)."""
        self._on_tick(lambda: self._raft.transferLeadership(address, callback=callback))

    def _on_tick(self, call: Callable[[], None]) -> None:
        with self._tick_calls_lock:
            if len(self._tick_calls) >= TICK_CALLS_MAX:
                raise RaftFatal(f"more than {TICK_CALLS_MAX} calls waiting for the tick")
            self._tick_calls.append(call)
        self._wake()

    # ------------------------------------------------------------------ the scheduler's side

    def peer_nodes(self) -> frozenset[str]:
        """The nodes of this replica's peers (scheduler.Tickable); none for a learner (its
        read-only connections carry no node liveness)."""
        assert self._scheduler is not None
        if self._config.learner:
            return frozenset()
        node_of = self._scheduler.node_of
        return frozenset(node_of(str(node.id)) for node in self._raft._SyncObj__otherNodes)

    def connected_to(self, node: str) -> bool:
        """Whether this replica's connection to its peer on `node` is up."""
        assert self._scheduler is not None
        if self._config.learner:
            return False
        node_of = self._scheduler.node_of
        connected = self._raft._SyncObj__connectedNodes
        return any(
            peer in connected and node_of(str(peer.id)) == node
            for peer in self._raft._SyncObj__otherNodes
        )

    def tick(self) -> float | None:
        """One tick, on the replica's worker; the next deadline to tick again without an
        event (monotonic seconds), or None (quiet, or stopped on a fatal error)."""
        if not self.tick_once(0.0):
            return None
        raft = self._raft
        now_s = float(pysyncobj_syncobj.monotonicTime())
        if raft._logsvc_messages != self._messages_before:
            return now_s  # act on what arrived (commit, apply, answer) before anything else
        due_s: float | None = raft._logsvc_next_wakeup_s(now_s)
        return due_s

    @property
    def tick_thread(self) -> threading.Thread | None:
        """The thread that ticks this replica (its scheduler worker's), once started."""
        return None if self._scheduler is None else self._scheduler.thread_of(self)

    _messages_before = 0

    def tick_once(self, wait_s: float = 0.0) -> bool:
        """One tick: pysyncobj's (waiting up to `wait_s` for messages), then the tick's one
        sync and the held replies. False once the replica has stopped on a fatal error. The
        scheduler calls it through `tick`; the simulator (tests/chaos/dst/) calls it itself."""
        if self._fatal is not None:
            return False
        raft = self._raft
        transport: _DurableMixin = raft._SyncObj__transport
        self.ticks += 1
        shard = self._events.shard if self._events is not None else 0
        if shard:
            # Every line logged during the tick (ours, pysyncobj's, the store's) names the
            # shard: the worker thread ticks many replicas, one after the other.
            logs.bind_shard(shard)
        try:
            self._run_tick_calls()
            if self._poller is not None:
                # Receive what the worker collected, sync and send the held replies, then
                # run pysyncobj's tick (timers, commit check, applies) on it: the order of
                # pysyncobj's own loop (its poll ends one tick, our flush follows, the next
                # tick acts), in one tick of ours instead of two per event. Every reply
                # that promises durability still leaves only after the sync.
                self._poller.poll(0.0)
                transport.flush()
            now_s = pysyncobj_syncobj.monotonicTime()
            self._messages_before = raft._logsvc_messages
            raft._logsvc_quiesce_before(now_s)
            raft.doTick(wait_s)
            transport.flush()  # one sync for the tick, then the held replies
            now_s = pysyncobj_syncobj.monotonicTime()
            raft._logsvc_quiesce_after(now_s)
            raft._logsvc_send_alive(now_s)
            self._note_role()
            self._after_tick()
        except (RaftFatal, StoreError) as exc:
            self._die(exc)
        except Exception as exc:  # a bug: stop rather than tick on in an unknown state
            log.exception(
                "raft tick failed on %s", self._config.self_address, extra={"term": self.term}
            )
            self._die(exc)
        finally:
            if shard:
                logs.bind_shard(None)  # the worker's own lines name no shard
        return self._fatal is None

    def _run_tick_calls(self) -> None:
        if not self._tick_calls:
            return
        with self._tick_calls_lock:
            calls, self._tick_calls = self._tick_calls, deque()
        for call in calls:
            call()

    def _after_tick(self) -> None:
        """Membership and progress bookkeeping: a few comparisons per tick."""
        raft = self._raft
        version = self._membership.version
        if version != self._members_version:  # e.g. a truncated suffix undid a change
            self._members_version = version
            raft._logsvc_follow_membership()
            if self._scheduler is not None and self._started:
                self._scheduler.update_peers(self)
        now_s = pysyncobj_syncobj.monotonicTime()
        if self._membership.joining:
            # Not a member until our `add` arrives: an election now would only raise our
            # term and, once the leader adds us, make it step down.
            raft._SyncObj__raftElectionDeadline = now_s + (
                self._config.election_timeout_ms_max / 1000.0
            )
        leading = bool(raft._isLeader())
        match_index = (
            {node.id: int(index) for node, index in raft._SyncObj__raftMatchIndex.items()}
            if leading
            else {}
        )
        self._progress.observe(
            now_s,
            time.time(),
            self.leader,
            self.term,
            leading,
            self._journal.store.last_index,
            match_index,
        )

    def _note_role(self) -> None:
        """Emit `leader` / `follower` when leadership changed during the last tick."""
        if self._events is None or not events_enabled():
            return
        leading = bool(self._raft._isLeader())
        if leading != self._leading:
            self._leading = leading
            self._events.emit("leader" if leading else "follower", term=self.term)

    def _die(self, exc: BaseException) -> None:
        log.critical(
            "raft replica %s stopped: %s",
            self._config.self_address,
            exc,
            extra={"term": self.term},
        )
        self._fatal = exc
        # Close its connections: its peers then see it gone at once (a quiet follower of a
        # replica that stopped would otherwise wait on a node that is still alive).
        self._destroy()
        for listener in self._fatal_listeners:
            listener(exc)
