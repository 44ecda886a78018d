"""One hosted shard replica, seen from the node's event loop.

The replica's Raft work runs on its tick thread; this class is the hand-off (ARCHITECTURE.md
§7): proposals go in through `ShardReplica.submit`, results come back with one
`call_soon_threadsafe` each; reads run on the node's small reader pool (they may touch
disk); tail reads wait for an "applied" signal, coalesced so the tick thread wakes the loop at
most once per burst.

Server-side group commit: appends arriving together are packed into one Raft entry (an
`AppendGroup`), bounded by bytes and by a short linger, so one Raft round trip and one fsync
per replica carry many clients' batches.

Every queue is bounded: past `appends_queued_per_shard_max` /
`reads_inflight_per_shard_max` / `tail_waiters_per_shard_max` (logsvc/node/limits.py) the
call raises `Overloaded` at once instead of buffering.

Appends are the hot path: `submit_append` takes a callback instead of returning an
awaitable, so the data plane answers each append without a task or a future of its own
(several microseconds each, at tens of thousands of appends a second).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from logsvc.node.limits import ServerLimits
from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    AppendGroup,
    Barrier,
    Command,
    GroupAppended,
    Result,
    Truncate,
)
from logsvc.shard.errors import ShardError
from logsvc.shard.replica import NotLeader, OutcomeUnknown, Overloaded, ReadResult, ShardReplica

log = logging.getLogger("logsvc.shard_host")

# What an append's callback gets: the shard's result, or the typed error that refused it.
AppendOutcome = Result | ShardError
AppendCallback = Callable[[AppendOutcome], None]


class ShardHost:
    def __init__(
        self,
        shard_id: int,
        replica: ShardReplica,
        reader: Executor,
        limits: ServerLimits,
        leader_address: Callable[[str | None], str | None],
    ) -> None:
        self.shard_id = shard_id
        self.replica = replica
        self._reader = reader
        self._limits = limits  # validated with the config (a group also fits the shard's: below)
        self._leader_address = leader_address
        self._loop = asyncio.get_running_loop()
        # Appends waiting for the batcher, oldest first; at most appends_queued_per_shard_max.
        # A deque and one wake-up future, not an asyncio.Queue: the batcher takes a whole burst per
        # wake-up instead of paying a queue operation per append.
        self._queued: collections.deque[tuple[AppendBatch, AppendCallback]] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None  # set while the batcher waits
        self._proposals = asyncio.Semaphore(limits.proposals_inflight_per_shard_max)
        self._reads_inflight = 0
        self._tail_waiters = 0
        # Tail reads in progress (reading or waiting): while none is, an apply wakes nothing
        # (a loop wake-up per apply on every replica, for nobody, cost CPU the Raft path
        # needs). Counted before a tail first looks, so an apply it could miss still wakes it.
        self._tailing = 0
        self._applied = asyncio.Event()
        self._wake_pending = False
        # A group must also fit the shard's own limits (its Raft entry is one command).
        shard_limits = replica.shard_limits
        self._batches_max = min(limits.batch_appends_max, shard_limits.group_batches_max)
        self._bytes_max = min(limits.batch_bytes_max, shard_limits.group_bytes_max)
        self._records_max = shard_limits.records_per_batch_max
        # Groups proposed and not yet answered (at most proposals_inflight_per_shard_max).
        self._inflight: set[_InFlight] = set()
        self._batcher = asyncio.create_task(self._run_batcher(), name=f"batcher:{shard_id}")
        replica.add_apply_listener(self._from_tick_thread)

    async def close(self) -> None:
        self._batcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._batcher
        # Appends still queued were never proposed: NOT_LEADER (with no hint) sends their
        # clients to another node, safely (nothing of theirs is in the log).
        while self._queued:
            _, on_outcome = self._queued.popleft()
            _settle(on_outcome, NotLeader(None))
        # Proposed, not answered: they may commit yet, so their clients cannot be told no.
        for group in list(self._inflight):
            self._finish(group, OutcomeUnknown("the node is shutting down"))

    # ------------------------------------------------------------------ writes

    def submit_append(self, batch: AppendBatch, on_outcome: AppendCallback) -> None:
        """Queue `batch` for the next group; `on_outcome(result or typed error)` runs on the
        event loop once, when it is known. `Overloaded` at once (nothing queued) when
        `appends_queued_per_shard_max` appends are already waiting. `on_outcome` must not
        raise."""
        if len(self._queued) >= self._limits.appends_queued_per_shard_max:
            raise Overloaded(f"shard {self.shard_id}: append queue full")
        self._queued.append((batch, on_outcome))
        waiter = self._wakeup
        if waiter is not None:
            self._wakeup = None
            _wake(waiter)

    async def truncate(self, lsn: int, epoch: int) -> Result:
        """Fenced like an append: `StaleEpoch` / `NotLeaseHolder` unless `epoch` is the
        current lease's (0 while no lease was ever granted)."""
        return await self._propose(Truncate(lsn, epoch))

    async def acquire_lease(self, holder: str, epoch: int) -> Result:
        return await self._propose(AcquireLease(holder, epoch))

    async def barrier(self) -> Result:
        """A no-op through the log: once applied here, this replica is (or just was) the
        leader of a majority and has applied everything committed before it."""
        return await self._propose(Barrier(0))

    async def _propose(self, command: Command) -> Result:
        async with self._proposals:
            outcome = await self._submit_and_wait(command)
        if isinstance(outcome, ShardError):
            raise outcome
        return outcome

    async def _submit_and_wait(self, command: Command) -> Result | ShardError:
        """Propose on the tick thread and wait (bounded) for the outcome on the loop; a
        typed error is returned, not raised, so a group can hand it to every caller."""
        future: asyncio.Future[Result | ShardError] = self._loop.create_future()
        try:
            self.replica.submit(command, lambda outcome: self._resolve(future, outcome))
            return await asyncio.wait_for(future, self._limits.proposal_timeout_ms / 1000.0)
        except TimeoutError:
            return OutcomeUnknown(f"no answer within {self._limits.proposal_timeout_ms} ms")
        except ShardError as exc:  # refused before queueing (NotLeader, ReplicaFailed...)
            return exc

    def _resolve(self, future: asyncio.Future[Result | ShardError], outcome: object) -> None:
        def settle() -> None:
            if not future.done():
                future.set_result(outcome)  # type: ignore[arg-type]

        self._loop.call_soon_threadsafe(settle)

    async def _run_batcher(self) -> None:
        pending: list[tuple[AppendBatch, AppendCallback]] = []
        try:
            await self._collect_and_send(pending)
        except asyncio.CancelledError:
            # Taken from the queue, never proposed: like the queue's rest in `close`.
            for _, on_outcome in pending:
                _settle(on_outcome, NotLeader(None))
            raise

    async def _collect_and_send(self, pending: list[tuple[AppendBatch, AppendCallback]]) -> None:
        """The batcher's loop; `pending` holds the group being collected (for the caller,
        which answers it if the batcher is cancelled)."""
        limits = self._limits
        queued = self._queued
        while True:
            pending.clear()
            if not queued:
                await self._queued_more(None)
            size = 0
            records = 0
            deadline = self._loop.time() + limits.batch_delay_ms_max / 1000.0
            while len(pending) < self._batches_max and size < self._bytes_max:
                if not queued:
                    remaining = deadline - self._loop.time()
                    if remaining <= 0 or not await self._queued_more(remaining):
                        break
                item = queued[0]
                grown = size + _batch_bytes(item[0])
                if pending and (
                    grown > self._bytes_max or records + len(item[0].records) > self._records_max
                ):
                    break  # the next group starts with it
                queued.popleft()
                pending.append(item)
                size = grown
                records += len(item[0].records)
            if not pending:  # woken with nothing queued: nothing to propose
                continue
            # Proposals run concurrently (bounded); the batcher goes on collecting.
            await self._proposals.acquire()
            self._propose_group(list(pending))

    async def _queued_more(self, timeout_s: float | None) -> bool:
        """Wait until an append is queued (at most `timeout_s`); False if none was.

        A timer, not `asyncio.wait_for`: on Python 3.11, wait_for returns normally when the
        task is cancelled just as the awaited future completes, and a batcher that lost its
        cancellation would keep `close()` waiting for it."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._wakeup = waiter
        timer = None if timeout_s is None else self._loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if self._wakeup is waiter:
                self._wakeup = None
        return bool(self._queued)

    def _propose_group(self, items: list[tuple[AppendBatch, AppendCallback]]) -> None:
        """Propose one group (its proposal slot already taken) and answer its appends from
        the callback the tick thread hands the outcome to: no task, future or timeout
        wrapper per group, and one loop wake-up between the apply and the answers."""
        command: Command = (
            items[0][0] if len(items) == 1 else AppendGroup(tuple(b for b, _ in items))
        )
        group = _InFlight(items)
        self._inflight.add(group)
        timeout_ms = self._limits.proposal_timeout_ms
        group.timer = self._loop.call_later(
            timeout_ms / 1000.0,
            self._finish,
            group,
            OutcomeUnknown(f"no answer within {timeout_ms} ms"),
        )
        try:
            self.replica.submit(command, functools.partial(self._from_tick, group))
        except ShardError as exc:  # refused before queueing (NotLeader, ReplicaFailed...)
            self._finish(group, exc)

    def _from_tick(self, group: _InFlight, outcome: Result | ShardError) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._finish, group, outcome)

    def _finish(self, group: _InFlight, outcome: Result | ShardError) -> None:
        """On the loop: the group's one answer (the first of outcome, timeout, shutdown)."""
        if group.answered:
            return
        group.answered = True
        if group.timer is not None:
            group.timer.cancel()
        self._inflight.discard(group)
        self._proposals.release()
        results: list[AppendOutcome]
        if isinstance(outcome, GroupAppended):
            results = list(outcome.results)
        else:
            results = [outcome] * len(group.items)
        for (_, on_outcome), result in zip(group.items, results, strict=True):
            _settle(on_outcome, result)

    # ------------------------------------------------------------------ reads

    async def read(self, from_lsn: int, max_bytes: int, records_max: int) -> ReadResult:
        if self._reads_inflight >= self._limits.reads_inflight_per_shard_max:
            raise Overloaded(f"shard {self.shard_id}: too many reads in flight")
        self._reads_inflight += 1
        try:
            return await self._loop.run_in_executor(
                self._reader, self.replica.read, from_lsn, max_bytes, records_max
            )
        finally:
            self._reads_inflight -= 1

    async def tail(
        self, from_lsn: int, max_bytes: int, wait_ms: int, records_max: int
    ) -> ReadResult:
        """Records at or after `from_lsn`, waiting up to `wait_ms` for the first one."""
        wait_ms = min(max(wait_ms, 0), self._limits.tail_wait_ms_max)
        deadline = self._loop.time() + wait_ms / 1000.0
        self._tailing += 1
        try:
            return await self._tail(from_lsn, max_bytes, records_max, deadline)
        finally:
            self._tailing -= 1

    async def _tail(
        self, from_lsn: int, max_bytes: int, records_max: int, deadline: float
    ) -> ReadResult:
        while True:
            applied = self._applied
            result = await self.read(from_lsn, max_bytes, records_max)
            remaining = deadline - self._loop.time()
            if result.records or remaining <= 0:
                return result
            if self._tail_waiters >= self._limits.tail_waiters_per_shard_max:
                raise Overloaded(f"shard {self.shard_id}: too many tail waiters")
            self._tail_waiters += 1
            try:
                await asyncio.wait_for(applied.wait(), remaining)
            except TimeoutError:
                pass
            finally:
                self._tail_waiters -= 1

    def _from_tick_thread(self, _next_lsn: int) -> None:
        # Coalesced: at most one pending wake-up of the loop, however many applies; none
        # while no tail read is in progress (one that starts after this apply reads it).
        if self._wake_pending or not self._tailing:
            return
        self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self._loop.call_soon_threadsafe(self._wake_tails)

    def _wake_tails(self) -> None:
        self._wake_pending = False
        applied, self._applied = self._applied, asyncio.Event()
        applied.set()

    # ------------------------------------------------------------------ status

    def leader_address(self) -> str | None:
        return self._leader_address(self.replica.node.leader)


def _settle(on_outcome: AppendCallback, outcome: AppendOutcome) -> None:
    """Hand one append its outcome; a callback that raises (a bug) costs only its own
    answer, never the rest of the group's."""
    try:
        on_outcome(outcome)
    except Exception:
        log.exception("an append's outcome callback failed")


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _batch_bytes(batch: AppendBatch) -> int:
    return sum(map(len, batch.records)) + 64


class _InFlight:
    """One proposed group of appends, until it is answered."""

    __slots__ = ("answered", "items", "timer")

    def __init__(self, items: list[tuple[AppendBatch, AppendCallback]]) -> None:
        self.items = items
        self.timer: asyncio.TimerHandle | None = None
        self.answered = False
