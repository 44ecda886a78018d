"""The pure parts of the node journal: what replay does to one store, and which journal
files may be deleted. No I/O, no threads (docs/decisions/0011-shared-journal.md).

Replay. The journal holds, per store, the operations it made since some point: appends of
entries, suffix truncations and vote saves, in the order they happened. The store's own
files (segments, `meta`) are a checkpoint of the same history that may lag the journal (their
writes are lazy) or have passed its start (the journal is truncated only after the files
caught up). `plan_replay` computes what to do to the store so that it ends in the state the
whole history leads to, whatever point between the two the files reached:

* An append of `[i..m]` means "the log was `[.. i-1]` and became `[.. m]`", so it is
  replayed as a cut at `i` followed by the entries; a truncation at `x` is a cut at `x`.
* Let `c` be the lowest cut point of all the operations. Nothing in the history touched an
  index below `c` since the journal starts, so the store's entries below `c` are right; every
  entry from `c` on is given by the operations. The plan keeps the store's entries from `c`
  on for as long as their terms agree with the result (Raft's log matching: same index and
  term, same entry) and cuts once at the first disagreement: replaying twice, or after the
  files caught up, does nothing (idempotent).
* Entries below the store's log start (a prefix truncation, durable in `meta` before it
  returned) are skipped.
* The last vote in the journal is applied if it is newer than the one in `meta`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from logsvc.store.records import Entry


@dataclass(frozen=True, slots=True)
class AppendOp:
    entries: tuple[Entry, ...]  # dense indexes


@dataclass(frozen=True, slots=True)
class TruncateOp:
    index: int  # the log was cut to end at index - 1


@dataclass(frozen=True, slots=True)
class VoteOp:
    term: int
    voted_for: str | None


StoreOp = AppendOp | TruncateOp | VoteOp


class ReplayGap(Exception):
    """The journal's operations for a store do not continue its log: records are missing
    (reported by the shell as `Corruption`)."""


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    cut_from: int | None  # truncate the store's suffix from this index first
    appends: tuple[Entry, ...]  # then append these
    vote: tuple[int, str | None] | None  # then save this vote

    @property
    def empty(self) -> bool:
        return self.cut_from is None and not self.appends and self.vote is None


def plan_replay(
    ops: Iterable[StoreOp],
    *,
    first_index: int,
    last_index: int,
    term_at: Callable[[int], int],
    term: int,
    voted_for: str | None,
) -> ReplayPlan:
    """What replay does to a store whose log is `[first_index, last_index]` (module doc)."""
    cut: int | None = None
    tail: list[Entry] = []
    vote: tuple[int, str | None] | None = None
    for op in ops:
        if isinstance(op, VoteOp):
            vote = (op.term, op.voted_for)
            continue
        if isinstance(op, TruncateOp):
            at, batch = op.index, []
        else:
            batch = [e for e in op.entries if e.index >= first_index]
            if not batch:
                continue
            at = batch[0].index
        if cut is None or at < cut:
            cut, tail = at, list(batch)  # everything from `at` on is what this op says
            continue
        if at > cut + len(tail):
            raise ReplayGap(
                f"journal continues at index {at} but its log ends at {cut + len(tail) - 1}"
            )
        del tail[at - cut :]
        tail.extend(batch)
    plan_vote = _newer_vote(vote, term, voted_for)
    if cut is None:
        return ReplayPlan(None, (), plan_vote)
    if cut < first_index:
        tail = tail[first_index - cut :]
        cut = first_index
    if cut > last_index + 1:
        raise ReplayGap(f"journal starts at index {cut} but the store's log ends at {last_index}")
    matched = 0
    while matched < len(tail) and cut + matched <= last_index:
        if term_at(cut + matched) != tail[matched].term:
            break
        matched += 1
    end = cut + matched  # the first index the plan writes or cuts
    cut_from = end if end <= last_index else None
    return ReplayPlan(cut_from, tuple(tail[matched:]), plan_vote)


def _newer_vote(
    vote: tuple[int, str | None] | None, term: int, voted_for: str | None
) -> tuple[int, str | None] | None:
    if vote is None:
        return None
    if vote[0] > term or (vote[0] == term and voted_for is None and vote[1] is not None):
        return vote
    return None


@dataclass(slots=True)
class _FileUse:
    file_seq: int
    op_seq_max: dict[int, int] = field(default_factory=dict)  # store_id -> its last op here


class JournalLedger:
    """Which journal files still hold operations not yet durable in their store's files.

    Each store numbers its operations 1, 2, ... (`op_seq`); the journal notes, per file, the
    highest op_seq of every store that wrote into it. A store reports `checkpointed(op_seq)`
    once every operation up to it is durable in its own files (segments fdatasynced, `meta`
    saved). A file other than the newest may be deleted once every store's operations in it
    are checkpointed: then no crash can need them (decision 0011, "Truncation").
    """

    __slots__ = ("_checkpointed", "_files")

    def __init__(self) -> None:
        self._files: list[_FileUse] = []
        self._checkpointed: dict[int, int] = {}

    def on_file_created(self, file_seq: int) -> None:
        assert not self._files or file_seq > self._files[-1].file_seq
        self._files.append(_FileUse(file_seq))

    def on_written(self, file_seq: int, store_id: int, op_seq: int) -> None:
        use = self._files[-1]
        assert use.file_seq == file_seq, "operations go to the newest file"
        assert op_seq >= use.op_seq_max.get(store_id, 0)
        use.op_seq_max[store_id] = op_seq
        self._checkpointed.setdefault(store_id, 0)

    def checkpointed(self, store_id: int, op_seq: int) -> None:
        before = self._checkpointed.get(store_id, 0)
        self._checkpointed[store_id] = max(before, op_seq)

    def forget_store(self, store_id: int) -> None:
        """A store detached and none of the files holds its operations any more."""
        if all(store_id not in use.op_seq_max for use in self._files):
            self._checkpointed.pop(store_id, None)

    def stores_behind(self, file_seq: int) -> dict[int, int]:
        """store_id -> op_seq a store must checkpoint before `file_seq` can go."""
        for use in self._files:
            if use.file_seq == file_seq:
                return {
                    store_id: op_seq
                    for store_id, op_seq in use.op_seq_max.items()
                    if self._checkpointed.get(store_id, 0) < op_seq
                }
        return {}

    def deletable(self) -> list[int]:
        """Sealed files, oldest first, that no crash can need; deleted oldest first (a
        prefix), so the files left are always a contiguous run."""
        found: list[int] = []
        for use in self._files[:-1]:
            if self.stores_behind(use.file_seq):
                break
            found.append(use.file_seq)
        return found

    def on_deleted(self, file_seq: int) -> None:
        assert self._files and self._files[0].file_seq == file_seq, "delete oldest first"
        use = self._files.pop(0)
        for store_id in use.op_seq_max:
            if all(store_id not in other.op_seq_max for other in self._files):
                self._checkpointed.pop(store_id, None)

    def oldest_sealed(self) -> int | None:
        return self._files[0].file_seq if len(self._files) > 1 else None

    @property
    def file_count(self) -> int:
        return len(self._files)
