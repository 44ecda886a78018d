"""The commit pipeline: a pure core, events in, actions out.

Why a pure core (shared/STYLE.md; seed "Commit Pipeline": memtable update -> conflict check
-> async WAL persist -> visible in queue order): the rules that make commits correct live in
one synchronous class that tests drive without an event loop, a driver or a clock.

The order of one commit, and who does what::

    workspace prepared (the transaction, without blocking anyone)
      -> prepare(): conflict check against changes committed in (start_ts, now], in commit
         order; commit_ts from the clock; the keys enter the conflict index (so a later
         prepare conflicts with this one even before it is durable); queued
      -> the shell encodes the WAL entry and hands it to the driver without waiting
         (`cancel()` if that fails synchronously: nothing follows it yet)
      -> durable(): the driver completed the entry
      -> the head of the queue, while durable, becomes visible, in queue order: so
         visibility order = commit_ts order = WAL (DSN) order, and a snapshot at
         `visible_ts` never misses a commit below it
      -> the shell applies each visible entry to the tables and answers its waiter.

Per group, not per transaction (issue 21): the driver completes many entries at once (one
record), and their durable events arrive one after another in the same turn of the loop.
`durable` holds back the tickets it could make visible while the next ticket's event is
already on its way (`resolved`), so the last event of the group releases them all: the shell
applies them in one pass (one Arrow batch per table) and answers every waiter together. It
never waits for anything not already completed, so no commit is delayed by it.

A WAL failure fails every queued commit (`fail`): none of them is acknowledged, and the
engine stops accepting commits (the shell's job).

`T` is whatever the shell attaches to a ticket (its waiter); the core never touches it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.conflicts import (
    BulkInsert,
    ConflictIndex,
    ConflictKey,
    KeyConflict,
    RowWrite,
    SnapshotTooOld,
)
from engine.errors import Overloaded

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Ticket(Generic[T]):
    commit_ts: int
    start_ts: int
    waiter: T
    durable: bool = False
    replaced: list[tuple[ConflictKey, tuple[int, bool] | None]] = field(default_factory=list)


class CommitPipeline(Generic[T]):
    def __init__(self, *, visible_ts: int, queue_max: int, conflicts: ConflictIndex) -> None:
        assert queue_max > 0
        self.visible_ts = visible_ts
        self.queue_max = queue_max
        self.conflicts = conflicts
        self._queue: deque[Ticket[T]] = deque()
        self._last_commit_ts = visible_ts
        self._durable_prefix = 0
        """The first this many queued tickets are durable (kept between events: O(1) each)."""
        self.commits_prepared = 0
        self.commits_visible = 0
        self.conflicts_found = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def last_commit_ts(self) -> int:
        return self._last_commit_ts

    def prepare(
        self,
        start_ts: int,
        rows: Iterable[RowWrite],
        guards: Iterable[ConflictKey],
        marks: Iterable[ConflictKey],
        next_ts: Callable[[], int],
        waiter: T,
        bulk: Sequence[BulkInsert] = (),
        checked_ts: int = 0,
    ) -> Ticket[T] | KeyConflict | SnapshotTooOld:
        """Check and queue one commit. `rows` are checked and recorded, `guards` only
        checked, `marks` only recorded (`checked_ts`: `ConflictIndex.check`). Raises
        `Overloaded` when the queue is full."""
        assert start_ts <= self.visible_ts
        if len(self._queue) >= self.queue_max:
            raise Overloaded("commit queue", self.queue_max)
        rows = list(rows)
        conflict = self.conflicts.check(start_ts, rows, guards, bulk, checked_ts)
        if conflict is not None:
            self.conflicts_found += 1
            return conflict
        commit_ts = next_ts()
        assert commit_ts > self._last_commit_ts
        self._last_commit_ts = commit_ts
        ticket = Ticket(commit_ts, start_ts, waiter)
        ticket.replaced = self.conflicts.record(commit_ts, rows, marks, bulk)
        self._queue.append(ticket)
        self.commits_prepared += 1
        return ticket

    def cancel(self, ticket: Ticket[T]) -> None:
        """Take back the last prepared commit: handing it to the WAL failed before anything
        else was prepared. Its commit_ts is never used again."""
        assert self._queue and self._queue[-1] is ticket
        assert not ticket.durable
        self._queue.pop()
        self.conflicts.undo(ticket.commit_ts, ticket.replaced)
        self.commits_prepared -= 1

    def durable(
        self, ticket: Ticket[T], resolved: Callable[[T], bool] | None = None
    ) -> list[Ticket[T]]:
        """`ticket`'s entry is durable. Returns the tickets that become visible now, in
        order: none when an earlier one is still being logged, and none when the first
        queued ticket not yet durable is `resolved` (its durable event is already on its
        way and will release this group with it)."""
        assert not ticket.durable
        ticket.durable = True
        queue = self._queue
        prefix = self._durable_prefix
        while prefix < len(queue) and queue[prefix].durable:
            prefix += 1
        self._durable_prefix = prefix
        if prefix == 0:
            return []
        if prefix < len(queue) and resolved is not None and resolved(queue[prefix].waiter):
            return []
        return self._release(prefix)

    def take_durable(self) -> list[Ticket[T]]:
        """The durable tickets held back, visible now (before a failure fails the rest)."""
        queue = self._queue
        prefix = self._durable_prefix
        while prefix < len(queue) and queue[prefix].durable:
            prefix += 1
        return self._release(prefix)

    def _release(self, count: int) -> list[Ticket[T]]:
        queue = self._queue
        visible = [queue.popleft() for _ in range(count)]
        self._durable_prefix = 0
        for head in visible:
            assert head.durable
            assert head.commit_ts > self.visible_ts
            self.visible_ts = head.commit_ts
        self.commits_visible += len(visible)
        return visible

    def queued(self) -> list[Ticket[T]]:
        """The prepared commits not yet visible, in commit order."""
        return list(self._queue)

    def fail(self) -> list[Ticket[T]]:
        """The WAL failed: every queued commit is abandoned (none acknowledged)."""
        failed = list(self._queue)
        self._queue.clear()
        self._durable_prefix = 0
        return failed

    def prune(self, oldest_snapshot_ts: int) -> None:
        self.conflicts.prune(min(oldest_snapshot_ts, self.visible_ts), self.visible_ts)
