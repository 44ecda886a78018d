"""Waiting for durability from an asyncio event loop without blocking it.

The store's syncer thread calls one listener per sync; the listener hands the new durable
index to the loop with a single `call_soon_threadsafe` (ARCHITECTURE.md §7), which then
resolves every future waiting at or below it. So the cost per sync is one thread hand-off,
however many coroutines wait: that is what lets group commit pay off in Python, where
waking one thread per waiter would cost more than the fsync.

The number of waiting futures is bounded: past `waiters_max`, `wait_durable` raises
`TooManyWaiters` instead of queueing more (the caller sheds load).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq

from logsvc.store.errors import StoreError, StoreFailed
from logsvc.store.store import ShardStore

WAITERS_MAX_DEFAULT = 65_536  # one per in-flight append; far above any sane window


class TooManyWaiters(StoreError):
    def __init__(self, waiters_max: int) -> None:
        super().__init__(f"more than {waiters_max} appends are waiting for durability")
        self.waiters_max = waiters_max


class AsyncDurability:
    """Create on the event loop's thread; use `await wait_durable(index)` from it."""

    def __init__(self, store: ShardStore, *, waiters_max: int = WAITERS_MAX_DEFAULT) -> None:
        assert waiters_max > 0
        self._loop = asyncio.get_running_loop()
        self._store = store
        self._waiters_max = waiters_max
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = 0
        self._durable_index = 0
        self._failed: StoreFailed | None = None
        store.add_durable_listener(self._from_syncer)

    async def wait_durable(self, index: int) -> None:
        if index <= self._durable_index:
            return
        if self._failed is not None:
            raise self._failed
        if len(self._heap) >= self._waiters_max:
            raise TooManyWaiters(self._waiters_max)
        future: asyncio.Future[None] = self._loop.create_future()
        self._seq += 1
        heapq.heappush(self._heap, (index, self._seq, future))
        await future

    def _from_syncer(self, durable_index: int, failed: StoreFailed | None) -> None:
        # Runs on the syncer thread (or the caller's, once, at registration).
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._loop.call_soon_threadsafe(self._advance, durable_index, failed)

    def _advance(self, durable_index: int, failed: StoreFailed | None) -> None:
        self._durable_index = max(self._durable_index, durable_index)
        heap = self._heap
        while heap and heap[0][0] <= self._durable_index:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
        if failed is not None:
            self._failed = failed
            while heap:
                future = heapq.heappop(heap)[2]
                if not future.done():
                    future.set_exception(failed)
