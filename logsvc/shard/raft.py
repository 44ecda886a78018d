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
                                           nextIndex back; an AppendEntries is trimmed to its
                                           first conflicting entry so a follower deletes only
                                           on a term conflict, and its commit index never
                                           passes what the leader vouched for
4 dump load errors swallowed              `_SyncObj__loadDumpFile` replaced: a bad snapshot
                                           is fatal; a compacted journal without its snapshot
                                           refuses to start
5 state-init race, creator-thread ticks    autoTick off; our own long-lived tick thread
6 in-place compaction, all in RAM          pysyncobj compaction off; compaction only at
                                           snapshot points (docs/decisions/0001-...)
10 pickle RCE without password            the cluster secret is mandatory
13 commit index hint                      never persisted: it restarts at the log start and
                                           is relearned from the leader (clamped by design)
Membership "one change at a time" is serialized by the replica (replica.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pysyncobj
import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.journal import Journal
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from logsvc.shard import snapshot_file
from logsvc.store import Entry, ShardStore, StoreError
from logsvc.store.fs import FileSystem, OsFileSystem

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

_COMMAND_TYPE_REGULAR = 0
_COMMAND_TYPE_MEMBERSHIP = 2


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
    tick_wait_ms: int = 20  # the poller wakes on any message; this bounds idle waits
    commands_queue_max: int = 10_000

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


# ------------------------------------------------------------------------ the journal


class StoreJournal(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over the shard store.

    pysyncobj addresses entries by *position* (0 = the first retained entry) and reads
    `journal[-1]` for the last index and term many times per tick, so the first and last
    entries are memoized. Slices are lazy: pysyncobj slices "from here to the end" and then
    keeps what fits in a message, which must not read a whole lagging tail from disk.
    """

    def __init__(self, store: ShardStore) -> None:
        self._store = store
        self._reset_pending = False
        self._commit_hint = store.first_index
        self._memo: dict[int, tuple[bytes, int, int]] = {}

    # pysyncobj API (names are theirs) ----------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._reset_pending:
            self._reset_to(idx)
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

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._store.truncate_prefix(self._store.first_index + entryTo)
        self._memo.clear()

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
        self._store.save_vote(term, voted)  # durable before pysyncobj sends anything

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
        store.truncate_prefix(index)
        self._memo.clear()

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

# pysyncobj pickles every message and journal entry with protocol 2, which stores `bytes`
# as latin-1 text: non-ASCII payloads grow up to 2x on the wire and on disk. Protocol 4
# stores them raw (pysyncobj.md §3.4: 2.3-4.3x throughput). Unpickling detects the
# protocol, so replicas on either setting still read each other.
PICKLE_PROTOCOL = 4
setattr(pysyncobj_pickle, "__protocol", PICKLE_PROTOCOL)


# ------------------------------------------------------------------------ the transport


class _DurableTransport(TCPTransport):  # type: ignore[misc]
    """Holds messages that promise durability until the tick's single sync (group commit),
    and routes incoming messages through the replica's fixes before pysyncobj sees them."""

    def __init__(self, syncObj: ShardRaft, selfNode: Any, otherNodes: Any) -> None:
        self._outbox: list[tuple[Any, dict[str, Any]]] = []
        super().__init__(syncObj, selfNode, otherNodes)

    def setOnMessageReceivedCallback(self, callback: Any) -> None:
        if callback is None:
            super().setOnMessageReceivedCallback(None)
            return
        owner: ShardRaft = self._syncObj

        def route(node: Any, message: dict[str, Any]) -> None:
            owner._logsvc_on_message(node, message, callback)

        super().setOnMessageReceivedCallback(route)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        if message.get("type") in _AFTER_SYNC:
            self._outbox.append((node, message))
            if len(self._outbox) >= OUTBOX_MESSAGES_MAX:
                self.flush()
            return True
        return bool(super().send(node, message))

    def held(self) -> list[tuple[Any, dict[str, Any]]]:
        return self._outbox

    def flush(self) -> None:
        """Sync the journal, then send what was held. Called after every tick."""
        owner: ShardRaft = self._syncObj
        owner._logsvc_journal.store.sync()
        outbox, self._outbox = self._outbox, []
        for node, message in outbox:
            super().send(node, message)


# ------------------------------------------------------------------------ the SyncObj


class ShardRaft(SyncObj):  # type: ignore[misc]
    """A pysyncobj SyncObj with logsvc's fixes. Created and ticked by `RaftNode`."""

    # pysyncobj's private state that the fixes below read and write (0.3.17 names).
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftLastApplied: int

    def __init__(
        self,
        config: RaftConfig,
        journal: StoreJournal,
        handler: RaftHandler,
        file_system: FileSystem | None = None,
    ) -> None:
        # Everything we use is set before SyncObj.__init__ (pysyncobj.md §1.5 D).
        self._logsvc_fs = file_system if file_system is not None else OsFileSystem()
        self._logsvc_journal = journal
        self._logsvc_handler = handler
        self._logsvc_snapshot_path = config.snapshot_path
        self._logsvc_compacted_at = 0
        self._logsvc_rx = b""
        conf = SyncObjConf(
            password=config.secret,
            autoTick=False,
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.heartbeat_ms / 1000.0,
            raftMinTimeout=config.election_timeout_ms_min / 1000.0,
            raftMaxTimeout=config.election_timeout_ms_max / 1000.0,
            leaderFallbackTimeout=config.leader_fallback_ms / 1000.0,
            connectionTimeout=config.connection_timeout_ms / 1000.0,
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
        try:
            super().__init__(
                config.self_address,
                list(config.peers),
                conf,
                transportClass=_DurableTransport,
            )
        finally:
            _JOURNALS.unregister(key)

    @replicated  # type: ignore[untyped-decorator]
    def _logsvc_apply(self, encoded: bytes) -> object:
        raft_index = self._SyncObj__raftLastApplied + 1  # the entry being applied
        return self._logsvc_handler.apply(raft_index, encoded)

    # -- hole 3: message fixes ------------------------------------------------------------

    def _logsvc_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None:
        kind = message.get("type")
        if kind == "append_entries" and "prevLogIdx" in message:
            self._logsvc_on_append_entries(node, message, deliver)
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
        nodes = self._SyncObj__otherNodes | {self._SyncObj__selfNode}
        data = snapshot_file.encode(
            snapshot_file.SnapshotFile(
                last=snapshot_file.JournalEntry(last[1], last[2], bytes(last[0])),
                prev=snapshot_file.JournalEntry(prev[1], prev[2], bytes(prev[0])),
                cluster=tuple(sorted(node.id for node in nodes)),
                state=state,
            )
        )
        _write_durably(self._logsvc_fs, self._logsvc_snapshot_path, data)
        for node in self._SyncObj__otherNodes:
            self._SyncObj__serializer.cancelTransmisstion(node)
        journal.deleteEntriesTo(raft_index - 1 - store.first_index)
        self._logsvc_compacted_at = raft_index
        log.info("compacted the journal to raft index %d (snapshot point)", raft_index)

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
        elif not clearJournal:
            raise RaftFatal(
                f"snapshot at raft index {last.index} does not match the journal "
                f"[{store.first_index}, {store.last_index}]"
            )
        else:
            journal.reset_to(prev.index)
            journal.add(prev.command, prev.index, prev.term)
            journal.add(last.command, last.index, last.term)
        self._logsvc_handler.install_snapshot(last.index, snapshot.state)
        self._SyncObj__raftLastApplied = last.index
        self._logsvc_compacted_at = max(self._logsvc_compacted_at, last.index)
        if self._SyncObj__raftCommitIndex < last.index:
            self._SyncObj__raftCommitIndex = last.index
        self._SyncObj__updateClusterConfiguration(
            [node for node in snapshot.cluster if node != self._SyncObj__selfNode.id]
        )
        self._SyncObj__onSetCodeVersion(0)
        log.info("installed the snapshot at raft index %d", last.index)


def _never_called(*_args: object) -> Any:
    raise AssertionError("pysyncobj's serializer path is replaced by logsvc's compaction")


def _write_durably(fs: FileSystem, path: str, data: bytes) -> None:
    """Replace `path` atomically and durably: temp file, fdatasync, rename, directory fsync."""
    tmp = path + ".tmp"
    if fs.exists(tmp):
        fs.unlink(tmp)
    handle = fs.open_write(tmp, create=True)
    try:
        handle.write(data)
        handle.fdatasync()
    finally:
        handle.close()
    fs.rename(tmp, path)
    fs.fsync_dir(os.path.dirname(path) or ".")


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
    """One shard replica's Raft: builds the SyncObj and ticks it on its own thread."""

    def __init__(
        self,
        config: RaftConfig,
        store: ShardStore,
        handler: RaftHandler,
        file_system: FileSystem | None = None,
    ) -> None:
        """`file_system` holds the snapshot file (the store's own port; the real one by
        default). pysyncobj itself writes a received snapshot with plain file calls; we make
        it durable through `file_system` before relying on it."""
        config.validate()
        fs = file_system if file_system is not None else OsFileSystem()
        if store.first_index > 1 and not fs.exists(config.snapshot_path):
            raise RaftFatal(
                f"the journal starts at raft index {store.first_index} but the snapshot "
                f"{config.snapshot_path} is missing: refusing to start with an empty state"
            )
        self._config = config
        self._journal = StoreJournal(store)
        self._raft = ShardRaft(config, self._journal, handler, fs)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._fatal: BaseException | None = None
        self._fatal_listeners: list[Callable[[BaseException], None]] = []

    def start(self) -> None:
        assert self._thread is None
        self._thread = threading.Thread(
            target=self._run, name=f"raft:{self._config.self_address}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)
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

    def status(self) -> dict[str, Any]:
        return dict(self._raft.getStatus())

    def add_member(self, address: str, callback: Callable[[object, int], None]) -> None:
        self._raft.addNodeToCluster(address, callback=callback)

    def remove_member(self, address: str, callback: Callable[[object, int], None]) -> None:
        self._raft.removeNodeFromCluster(address, callback=callback)

    def transfer_leadership(
        self, address: str | None, callback: Callable[[object, int], None]
    ) -> None:
        self._raft.transferLeadership(address, callback=callback)

    def _run(self) -> None:
        wait_s = self._config.tick_wait_ms / 1000.0
        transport: _DurableTransport = self._raft._SyncObj__transport
        try:
            while not self._stopping.is_set():
                self._raft.doTick(wait_s)
                transport.flush()  # one sync for the tick, then the held replies
        except (RaftFatal, StoreError) as exc:
            self._die(exc)
        except Exception as exc:  # a bug: stop rather than tick on in an unknown state
            log.exception("raft tick failed on %s", self._config.self_address)
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        log.critical("raft replica %s stopped: %s", self._config.self_address, exc)
        self._fatal = exc
        for listener in self._fatal_listeners:
            listener(exc)
