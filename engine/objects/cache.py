"""The buffer cache: decoded blocks, indexes and delete masks, bounded by bytes.

Why (issue 14 "Buffer manager", seed `004_*` "Buffer Management"): data outlives memory, so
what the engine reads from objects is loaded on demand and dropped when memory is needed, and
RSS stays flat as the data grows. One cache for everything, bounded by bytes (the seed's LRU
of fixed nodes, with sizes instead of node counts).

Rules:

* `pin(key, load)` returns a `Pin` holding the value; the entry cannot be evicted while any
  pin on it is held. Release it (`pin.release()`, or `with cache.pin(...) as value:`).
* Least recently *released* unpinned entries are evicted first, and only as many as the new
  entry needs. If the new entry cannot fit even after evicting every unpinned entry (the
  pinned bytes leave no room, or the entry alone is larger than the cache), `pin` raises
  `CacheFull` (an `Overloaded`): the cache never grows past its capacity.
* `load()` returns `(value, size_bytes)` and runs outside the cache's lock, so a slow read
  from S3 blocks nobody else. Loads of one key are single-flight: a second `pin` of a key
  being loaded waits for that load (at most `CACHE_LOAD_WAIT_S_MAX`, then
  `ObjectStoreUnavailable`) instead of reading the object twice. A load that raises leaves
  nothing behind; its waiters then try the load themselves.
* Thread-safe: one lock over the bookkeeping, never held during a load.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.objects import limits
from engine.objects.errors import CacheFull, ObjectStoreUnavailable

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class CacheStats:
    capacity_bytes: int
    used_bytes: int
    pinned_bytes: int
    entry_count: int
    hit_count: int
    miss_count: int
    eviction_count: int
    load_failure_count: int
    full_count: int

    @property
    def hit_ratio(self) -> float:
        lookups = self.hit_count + self.miss_count
        return self.hit_count / lookups if lookups else 0.0


class _Entry(Generic[V]):
    __slots__ = ("doomed", "pin_count", "size_bytes", "value")

    def __init__(self, value: V, size_bytes: int) -> None:
        self.value = value
        self.size_bytes = size_bytes
        self.pin_count = 0
        self.doomed = False  # invalidated while pinned: dropped at its last release


class Pin(Generic[K, V]):
    """A held reference to a cached value. Release exactly once."""

    __slots__ = ("_cache", "_entry", "_released", "key")

    def __init__(self, cache: BufferCache[K, V], key: K, entry: _Entry[V]) -> None:
        self._cache = cache
        self.key = key
        self._entry = entry
        self._released = False

    @property
    def value(self) -> V:
        assert not self._released, "use of a released pin"
        return self._entry.value

    @property
    def size_bytes(self) -> int:
        return self._entry.size_bytes

    def release(self) -> None:
        assert not self._released, "pin released twice"
        self._released = True
        self._cache.unpin(self.key, self._entry)

    def __enter__(self) -> V:
        return self.value

    def __exit__(self, *exc: object) -> None:
        self.release()


class BufferCache(Generic[K, V]):
    """Values by key, bounded by `capacity_bytes` (module docstring: the rules)."""

    def __init__(
        self,
        capacity_bytes: int = limits.CACHE_BYTES_DEFAULT,
        *,
        load_wait_s_max: float = limits.CACHE_LOAD_WAIT_S_MAX,
    ) -> None:
        assert capacity_bytes >= 1
        assert load_wait_s_max > 0
        self.capacity_bytes = capacity_bytes
        self._load_wait_s_max = load_wait_s_max
        self._lock = threading.Lock()
        self._entries: dict[K, _Entry[V]] = {}
        self._unpinned: OrderedDict[K, None] = OrderedDict()  # LRU order: oldest first
        self._loading: dict[K, threading.Event] = {}
        self._used_bytes = 0
        self._pinned_bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._load_failures = 0
        self._fulls = 0

    def pin(self, key: K, load: Callable[[], tuple[V, int]]) -> Pin[K, V]:
        """The value of `key`, pinned; `load()` -> (value, size_bytes) on a miss."""
        deadline = time.monotonic() + self._load_wait_s_max
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    self._hits += 1
                    return self._pin_locked(key, entry)
                loading = self._loading.get(key)
                if loading is None:
                    self._misses += 1
                    done = threading.Event()
                    self._loading[key] = done
                    break
            if not loading.wait(max(0.0, deadline - time.monotonic())):
                raise ObjectStoreUnavailable(
                    "buffer cache", str(key), "another thread's load of this entry is too slow"
                )
        try:
            value, size_bytes = load()
        except BaseException:
            with self._lock:
                self._load_failures += 1
                del self._loading[key]
            done.set()
            raise
        assert size_bytes >= 0
        try:
            with self._lock:
                self._make_room_locked(size_bytes)
                entry = _Entry(value, size_bytes)
                self._entries[key] = entry
                self._used_bytes += size_bytes
                return self._pin_locked(key, entry)
        finally:
            with self._lock:
                del self._loading[key]
            done.set()

    def peek(self, key: K) -> Pin[K, V] | None:
        """The value of `key` pinned if it is cached, else None (nothing is loaded: a caller
        on an event loop tries this before sending a load to a worker thread)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._hits += 1
            return self._pin_locked(key, entry)

    def invalidate(self, key: K) -> None:
        """Forget `key` (its object was deleted or replaced): dropped now if unpinned, else at
        its last release. A load in flight is not affected."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            if entry.pin_count:
                entry.doomed = True
                del self._entries[key]  # new pins load afresh; the holders keep theirs
                return
            self._drop_locked(key, entry)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                capacity_bytes=self.capacity_bytes,
                used_bytes=self._used_bytes,
                pinned_bytes=self._pinned_bytes,
                entry_count=len(self._entries),
                hit_count=self._hits,
                miss_count=self._misses,
                eviction_count=self._evictions,
                load_failure_count=self._load_failures,
                full_count=self._fulls,
            )

    def check_invariants(self) -> None:
        """Assert the bookkeeping (tests call it after every step)."""
        with self._lock:
            assert self._used_bytes <= self.capacity_bytes
            assert 0 <= self._pinned_bytes <= self._used_bytes
            live = sum(entry.size_bytes for entry in self._entries.values())
            pinned_live = sum(e.size_bytes for e in self._entries.values() if e.pin_count)
            assert set(self._unpinned) == {k for k, e in self._entries.items() if not e.pin_count}
            # Doomed entries (invalidated while pinned) still count until released.
            assert live <= self._used_bytes
            assert pinned_live <= self._pinned_bytes

    # --- Private (callers hold _lock) -------------------------------------------------------------

    def _pin_locked(self, key: K, entry: _Entry[V]) -> Pin[K, V]:
        if entry.pin_count == 0:
            self._unpinned.pop(key, None)
            self._pinned_bytes += entry.size_bytes
        entry.pin_count += 1
        return Pin(self, key, entry)

    def unpin(self, key: K, entry: _Entry[V]) -> None:
        """One pin of `entry` ended (`Pin.release` calls this; callers release the pin)."""
        with self._lock:
            assert entry.pin_count > 0
            entry.pin_count -= 1
            if entry.pin_count:
                return
            self._pinned_bytes -= entry.size_bytes
            if entry.doomed:
                self._used_bytes -= entry.size_bytes
                return
            self._unpinned[key] = None  # most recently used: evicted last

    def _make_room_locked(self, size_bytes: int) -> None:
        if self._pinned_bytes + size_bytes > self.capacity_bytes:
            self._fulls += 1
            raise CacheFull(size_bytes, self.capacity_bytes, self._pinned_bytes)
        while self._used_bytes + size_bytes > self.capacity_bytes:
            victim, _ = self._unpinned.popitem(last=False)
            self._drop_locked(victim, self._entries[victim], evicted=True)

    def _drop_locked(self, key: K, entry: _Entry[V], *, evicted: bool = False) -> None:
        assert entry.pin_count == 0
        self._unpinned.pop(key, None)
        del self._entries[key]
        self._used_bytes -= entry.size_bytes
        if evicted:
            self._evictions += 1
