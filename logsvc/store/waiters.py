"""Threads waiting for a store's durability, each woken only once its own index is durable
(used by `store.py` and its parts)."""

from __future__ import annotations

import heapq
import threading


class Waiters:
    """Threads waiting for durability, woken only once their own index is durable.

    A Condition's notify_all would wake every waiter on every sync, and most would go back
    to sleep: with 64 writers that thundering herd, not the disk, bounded throughput. Each
    waiter blocks on its own lock; a sync releases exactly the ones it covered. Called with
    the store's `_mu` held. A waiter that timed out leaves its gate behind; releasing it
    later is harmless, and release_all (failure, close, truncation) clears everything.
    """

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, threading.Lock]] = []
        self._seq = 0

    def add(self, index: int) -> threading.Lock:
        gate = threading.Lock()
        gate.acquire()
        self._seq += 1
        heapq.heappush(self._heap, (index, self._seq, gate))
        return gate

    def release_upto(self, durable_index: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= durable_index:
            heapq.heappop(heap)[2].release()

    def release_all(self) -> None:
        heap, self._heap = self._heap, []
        for _, _, gate in heap:
            gate.release()
