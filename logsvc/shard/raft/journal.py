"""`StoreJournal`: pysyncobj's journal interface over the shard store (holes 1/2 and 13 of
the adapter's table: entries and term/vote go to the durable store; the commit index is a
hint only), and the two decoders of pysyncobj's entry pickles that the live path uses."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.journal import Journal

from logsvc.events import ReplicaEvents
from logsvc.shard import membership as shard_membership
from logsvc.shard import snapshot_file
from logsvc.shard.raft import patches as _patches  # noqa: F401  (patched before use)
from logsvc.shard.raft.entries import COMMAND_TYPE_MEMBERSHIP, COMMAND_TYPE_REGULAR
from logsvc.store import Entry, ShardStore

# Raft entries read from the store per chunk when pysyncobj iterates a journal slice.
READ_CHUNK_BYTES = 1 << 20
# The newest entries, kept in memory as appended and as read: pysyncobj reads each new entry
# back per follower per AppendEntries (twice: to size the batch, then to slice it) and the
# last one many times per tick, each a store read under its lock. Bounded per replica by
# count and by payload bytes (a node hosts a thousand replicas: 64 KiB each), except that
# the two kept last stay whatever their size (the last entry is read many times a tick:
# a group of large records must not be read from the store each time; the memo before
# this one kept up to 8 entries of any size).
MEMO_ENTRIES_MAX = 64
MEMO_BYTES_MAX = 64 << 10
MEMO_NEWEST_KEPT = 2

_MEMBERSHIP_TYPE_BYTE = bytes([COMMAND_TYPE_MEMBERSHIP])


def command_of_entry(journal_payload: bytes) -> bytes | None:
    """Our command bytes inside a journal entry, or None for pysyncobj's own entries
    (no-ops, membership changes). An entry is pysyncobj's encoding of one `_logsvc_apply`
    call: a type byte, then a pickle of `(method id, (command,))` written by pysyncobj. It
    comes from our own checksummed journal, never from the network, when this is called."""
    if not journal_payload or journal_payload[0] != COMMAND_TYPE_REGULAR:
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
    if not journal_payload or journal_payload[0] != COMMAND_TYPE_MEMBERSHIP:
        return None
    request = pysyncobj_pickle.loads(journal_payload[1:])
    if not (isinstance(request, list | tuple) and len(request) >= 2):
        return None
    kind, address = request[0], request[1]
    if kind not in ("add", "rem") or not isinstance(address, str):
        return None
    return shard_membership.Change(kind, address)


class StoreJournal(Journal):  # type: ignore[misc]
    """pysyncobj's journal interface over the shard store.

    pysyncobj addresses entries by *position* (0 = the first retained entry) and reads
    `journal[-1]` for the last index and term many times per tick, and each new entry back
    per follower: the newest entries are kept in memory (`MEMO_ENTRIES_MAX`,
    `MEMO_BYTES_MAX`), forgotten whole by any truncation or reset. Slices are lazy:
    pysyncobj slices "from here to the end" and then keeps what fits in a message, which
    must not read a whole lagging tail from disk.
    """

    def __init__(self, store: ShardStore, events: ReplicaEvents | None = None) -> None:
        self._store = store
        self._events = events
        self._reset_pending = False
        self._commit_hint = store.first_index
        # (term, votedFor) set by pysyncobj and not yet durable: see `setCurrentTerm`.
        self._pending_vote: tuple[int, str | None] | None = None
        self._memo: dict[int, tuple[bytes, int, int]] = {}  # oldest first
        self._memo_bytes = 0
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
        payload = bytes(command)
        self._store.append([Entry(idx, term, payload)])
        self._remember(idx, (payload, idx, term))

    def clear(self) -> None:
        # Only used by pysyncobj when installing a snapshot (our override calls
        # `reset_to` directly); keep the semantics anyway: empty until the next add.
        self._reset_pending = True
        self._forget()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        self._store.truncate_suffix(self._store.first_index + entryFrom)
        self._forget()
        if self.membership is not None:
            self.membership.on_truncate_suffix(self._store.first_index + entryFrom)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._store.truncate_prefix(self._store.first_index + entryTo)
        self._forget()
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
        # Held until `flush_vote`, which the transport calls before any message leaves
        # (the tick's flush, or a send that is not held): a voter's "new term, no vote"
        # then "voted for X" in one tick is one durable write, not two (each is a file
        # write, two fsyncs and a rename; they were half the survivors' time in a
        # 1,000-shard failover). A term or vote that never left needs no durability: a
        # replica that crashes before the flush restarts as if it never saw it.
        voted = None if votedForNodeId is None else str(votedForNodeId)
        if (term, voted) == self._vote():
            return
        assert term >= self._vote()[0], "term must never go backwards"
        self._pending_vote = (term, voted)

    def getCurrentTerm(self) -> int:
        return self._vote()[0]

    def getVotedForNodeId(self) -> str | None:
        return self._vote()[1]

    def onOneSecondTimer(self) -> None:
        return None

    # ours ----------------------------------------------------------------------------------

    @property
    def store(self) -> ShardStore:
        return self._store

    def _vote(self) -> tuple[int, str | None]:
        """(currentTerm, votedFor) as pysyncobj set them, durable or not yet."""
        if self._pending_vote is not None:
            return self._pending_vote
        return self._store.term, self._store.voted_for

    @property
    def vote_pending(self) -> bool:
        """A term or vote set that `flush_vote` has not made durable yet."""
        return self._pending_vote is not None

    def flush_vote(self) -> None:
        """Make the term and vote pysyncobj last set durable (`store.save_vote`); the
        transport calls it before sending anything (hole 1/2: a vote request or reply, or
        any message of a new term, leaves only once its term and vote are durable)."""
        pending = self._pending_vote
        if pending is None:
            return
        term, voted = pending
        term_before, voted_before = self._store.term, self._store.voted_for
        self._store.save_vote(term, voted)
        self._pending_vote = None
        if self._events is not None:
            if term != term_before:
                self._events.emit("term", term=term)
            if voted is not None and (term != term_before or voted != voted_before):
                self._events.emit("vote", term=term, voted_for=voted)

    def entry(self, index: int) -> tuple[bytes, int, int]:
        found = self._memo.get(index)
        if found is None:
            [stored] = self._store.read(index, index + 1, 0)
            found = (stored.payload, stored.index, stored.term)
            self._remember(index, found)
        return found

    def read(self, lo: int, hi: int) -> Iterator[tuple[bytes, int, int]]:
        memo = self._memo
        while lo < hi:  # the newest, from memory while they are there
            found = memo.get(lo)
            if found is None:
                break
            yield found
            lo += 1
        while lo < hi:  # the rest from the store
            chunk = self._store.read(lo, hi, READ_CHUNK_BYTES)
            if not chunk:
                return
            for stored in chunk:
                yield (stored.payload, stored.index, stored.term)
            lo = chunk[-1].index + 1

    def _remember(self, index: int, found: tuple[bytes, int, int]) -> None:
        """Keep `found` (the entry at `index`) among the newest, evicting the oldest past
        the bounds but never the `MEMO_NEWEST_KEPT` kept last. Entries at an index change
        only by a truncation, which forgets all."""
        memo = self._memo
        if index in memo:
            return
        memo[index] = found
        self._memo_bytes += len(found[0])
        while len(memo) > MEMO_NEWEST_KEPT and (
            len(memo) > MEMO_ENTRIES_MAX or self._memo_bytes > MEMO_BYTES_MAX
        ):
            self._memo_bytes -= len(memo.pop(next(iter(memo)))[0])

    def _forget(self) -> None:
        self._memo.clear()
        self._memo_bytes = 0

    def install_snapshot_entries(
        self, prev: snapshot_file.JournalEntry, last: snapshot_file.JournalEntry
    ) -> None:
        """Replace the whole log with a snapshot's two entries without telling
        `membership`: its caller has already reset it to the snapshot's configuration,
        durably, before this (snapshot_points.py says why). The entries become durable as
        any appended (acknowledged only then); a crash before that leaves the log empty at
        `prev`'s index, and the restart installs the snapshot again (node.py
        `_snapshot_to_finish`)."""
        assert last.index == prev.index + 1, "a snapshot's two entries are consecutive"
        self._reset_to(prev.index, tell_membership=False)
        self._store.append(
            [Entry(prev.index, prev.term, prev.command), Entry(last.index, last.term, last.command)]
        )

    def _reset_to(self, index: int, *, tell_membership: bool = True) -> None:
        self._reset_pending = False
        store = self._store
        assert index >= store.first_index, "a snapshot never precedes our log start"
        if index <= store.last_index:
            store.truncate_suffix(index)
            if tell_membership and self.membership is not None:
                self.membership.on_truncate_suffix(index)
        store.truncate_prefix(index)
        self._forget()

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
