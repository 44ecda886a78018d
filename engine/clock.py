"""The engine's hybrid logical clock: commit timestamps that follow wall time and strictly
increase.

Why a hybrid clock (shared/reference/tae-engine.md "Timestamps"): a timestamp a person can read
as a time (physical milliseconds), that never goes backwards when the wall clock does, and that
never falls below the highest commit timestamp replayed after a restart (`observe`).

A timestamp is one unsigned 64-bit integer: `physical_ms << LOGICAL_BITS | logical`. Ordering
the integers orders the timestamps. Time is an input (`now_ms`), so tests drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

LOGICAL_BITS = 16
LOGICAL_MAX = (1 << LOGICAL_BITS) - 1
TS_MAX = (1 << 64) - 1


def ts_physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def ts_logical(ts: int) -> int:
    return ts & LOGICAL_MAX


def make_ts(physical_ms: int, logical: int = 0) -> int:
    assert 0 <= logical <= LOGICAL_MAX
    return (physical_ms << LOGICAL_BITS) | logical


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class HybridClock:
    """`next()` returns a timestamp strictly greater than every one returned or observed."""

    __slots__ = ("_last", "_now_ms")

    def __init__(self, now_ms: Callable[[], int] = wall_ms, *, floor_ts: int = 0) -> None:
        self._now_ms = now_ms
        self._last = floor_ts

    @property
    def last_ts(self) -> int:
        return self._last

    def observe(self, ts: int) -> None:
        """Never return a timestamp at or below `ts` (a replayed commit, a peer's)."""
        if ts > self._last:
            self._last = ts

    def next(self) -> int:
        physical = make_ts(self._now_ms())
        # When the wall clock is behind (it went back, or many commits share a millisecond),
        # the logical part counts on; it carries into the physical part when it overflows,
        # which only makes timestamps run ahead of the wall clock, never backwards.
        ts = physical if physical > self._last else self._last + 1
        assert ts <= TS_MAX
        self._last = ts
        return ts
