"""The engine's hybrid logical clock: commit timestamps that follow wall time and strictly
increase.

Why a hybrid clock (shared/reference/tae-engine.md "Timestamps"): a timestamp a person can read
as a time (physical milliseconds), that never goes backwards when the wall clock does, and that
never falls below the highest commit timestamp replayed after a restart (`observe`).

A timestamp is one unsigned 64-bit integer: `physical_ms << LOGICAL_BITS | logical`. Ordering
the integers orders the timestamps. Time is an input (`now_ms`), so tests drive it.
"""

from __future__ import annotations

import datetime
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

    def now_ms(self) -> int:
        """The wall clock this clock follows (epoch milliseconds): every timestamp issued
        from now on has a physical part at or above it."""
        return self._now_ms()

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


# --- wall time (issue 24) ---------------------------------------------------------------------
#
# A commit timestamp's physical part is the wall clock's milliseconds since the Unix epoch (UTC)
# when it was issued, or later when the clock went back (above). So "the state as of a wall time
# T" is the snapshot at the last timestamp of T's millisecond: every commit issued at or before T
# is in it. A wall time is always a time-zone-aware datetime: a naive one would be read in
# whatever zone the reader assumed.


def ts_at_wall_ms(epoch_ms: int) -> int:
    """The last commit timestamp of millisecond `epoch_ms` (its snapshot holds every commit
    issued in or before that millisecond)."""
    if epoch_ms < 0 or epoch_ms > ts_physical_ms(TS_MAX):
        raise ValueError(f"wall time {epoch_ms} ms is out of range")
    return make_ts(epoch_ms, LOGICAL_MAX)


def ts_at_datetime(at: datetime.datetime) -> int:
    """The snapshot timestamp of wall time `at` (time-zone aware), as `ts_at_wall_ms`."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"{at.isoformat()}: a wall time needs a time zone (Z or +HH:MM)")
    return ts_at_wall_ms(_epoch_ms(at))


def ts_datetime(ts: int) -> datetime.datetime:
    """The wall time (UTC, millisecond precision) a commit timestamp was issued at."""
    return _EPOCH + datetime.timedelta(milliseconds=ts_physical_ms(ts))


def ts_isoformat(ts: int) -> str:
    """`ts_datetime(ts)` as ISO-8601 with milliseconds and Z: 2026-11-26T12:00:00.000Z."""
    return ts_datetime(ts).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_at(text: str) -> int | datetime.datetime:
    """What a user typed for "as of": a commit timestamp (digits: 117...), epoch milliseconds
    (digits then `ms`: 1795694400000ms), or an ISO-8601 date-time with a time zone
    (2026-11-26T12:00:00Z, 2026-11-26T13:00:00+01:00). Returns the commit timestamp as an int,
    or the wall time as an aware datetime (resolved against an engine by `snapshot(at=...)`).
    ValueError says what it accepts."""
    text = text.strip()
    try:
        if text.isdigit():
            ts = int(text)
            if ts > TS_MAX:
                raise ValueError(f"{text}: above the largest commit timestamp")
            return ts
        if text.endswith("ms") and text[:-2].isdigit():
            epoch_ms = int(text[:-2])
            ts_at_wall_ms(epoch_ms)  # range check
            return _EPOCH + datetime.timedelta(milliseconds=epoch_ms)
        at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        ts_at_datetime(at)  # time zone and range checks
        return at
    except (ValueError, OverflowError) as exc:
        raise ValueError(
            f"{text!r} is not a time: give a commit timestamp (digits), epoch milliseconds "
            f"(digits then 'ms') or an ISO-8601 date-time with a time zone "
            f"(2026-11-26T12:00:00Z) ({exc})"
        ) from None


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _epoch_ms(at: datetime.datetime) -> int:
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
