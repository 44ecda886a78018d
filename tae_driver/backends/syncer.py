"""One long-lived thread that writes and syncs groups, completing each group on the loop.

Why (issue 21, target 2): the file backend used to send every group write + fdatasync through
`asyncio.to_thread`: an executor submit, a future chained back to the loop, a wake-up of the
flusher task and a task step per group, about 6 loop turns and ~100 us of Python around a
~60 us fdatasync. Here one thread owns the disk writes: it takes the next group as soon as the
previous sync returns (the queue is the group: whatever waited while the disk was busy), runs
`write_group` on it, and hands the result back with **one** `loop.call_soon_threadsafe` per
group, whose callback completes every item of the group in that same loop turn.

Rules:

* **Bounded**: at most `items_max` items wait (`put` raises `Overloaded` beyond it); a group
  takes at most what `take` returns.
* **Nothing completes before its write_group returned** (the backend's fdatasync is in it):
  `on_done` is only called after it.
* **fsyncgate**: after a `write_group` raised, the thread never calls it again; every later
  group is handed back with that same error, unwritten (the owner reopens to learn what the
  disk holds).
* **Bounded lifetime**: an idle thread exits after `idle_exit_s` and `put` starts a new one,
  so a backend dropped without `close` (a crash test) leaves no thread behind for long;
  `stop()` makes it exit once the queue is empty.

The thread touches only what `write_group` touches (the owner gives it state no other thread
mutates) and the queue, under `_lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from tae_driver.errors import Overloaded

T = TypeVar("T")
R = TypeVar("R")

GroupDone = Callable[[list[T], R | None, BaseException | None], None]


class GroupSyncer(Generic[T, R]):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        name: str,
        write_group: Callable[[list[T]], R],
        on_done: GroupDone[T, R],
        take: Callable[[deque[T]], list[T]],
        items_max: int,
        idle_exit_s: float,
    ) -> None:
        assert items_max >= 1
        assert idle_exit_s > 0
        self._loop = loop
        self._name = name
        self._write_group = write_group
        self._on_done = on_done
        self._take = take
        self._items_max = items_max
        self._idle_exit_s = idle_exit_s
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: deque[T] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        self.threads_started = 0

    def put(self, item: T, *, bounded: bool = True) -> None:
        """Queue `item` for the next group (called on the loop). Raises `Overloaded` when
        `items_max` items already wait. `bounded=False` is for an item the owner bounds
        itself (at most one at a time: the file backend's TRUNCATE frame, under its lock),
        so that control work is never refused by data back-pressure."""
        with self._lock:
            assert not self._stopping
            if bounded and len(self._queue) >= self._items_max:
                raise Overloaded(self._name, self._items_max)
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self.threads_started += 1
                self._thread.start()
            else:
                self._ready.notify()

    def drain(self) -> list[T]:
        """Take every item still queued (the owner fails them after an error)."""
        with self._lock:
            items = list(self._queue)
            self._queue.clear()
            return items

    def running(self) -> bool:
        """Whether a thread is alive for this syncer (an idle one exits on its own)."""
        with self._lock:
            return self._thread is not None

    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    def stop(self) -> threading.Thread | None:
        """Make the thread exit once the queue is empty; returns it (to join off the loop)."""
        with self._lock:
            self._stopping = True
            self._ready.notify()
            return self._thread

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    if self._stopping or not self._ready.wait(self._idle_exit_s):
                        if self._queue:
                            break  # put() raced with the timeout
                        self._thread = None
                        return
                group = self._take(self._queue)
                failure = self._failure
            assert group
            result: R | None = None
            error = failure
            if error is None:
                try:
                    result = self._write_group(group)
                except BaseException as exc:  # handed to the loop: never lost
                    error = exc
                    with self._lock:
                        self._failure = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self._loop.call_soon_threadsafe(self._on_done, group, result, error)
