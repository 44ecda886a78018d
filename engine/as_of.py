"""`--at` of the command lines (`engine scan`, `engine cn scan`): which snapshot timestamp a
user's "as of" names (issue 24).

    ts = snapshot_ts(parse_at(text), visible_ts)

A commit timestamp is taken as given (the engine says `SnapshotUnavailable` when it cannot
serve it). A wall time (engine/clock.py `parse_at`: ISO-8601 with a zone, or epoch `Nms`) is
the snapshot at the last timestamp of its millisecond, `ts_at_datetime`; one that has already
passed but is newer than the newest commit is the newest commit (nothing committed in
between: the same rows), and one still in the future is refused, since rows committed before
it may not exist yet.

Why a helper of its own: until `Engine.snapshot(at=datetime)` carries this rule, both command
lines resolve a wall time here, so the rule has one home and moves in one edit.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from engine.clock import make_ts, ts_at_datetime, ts_at_wall_ms, ts_isoformat, wall_ms
from engine.errors import SnapshotUnavailable


def snapshot_ts(
    at: int | datetime.datetime, visible_ts: int, now_ms: Callable[[], int] = wall_ms
) -> int:
    """The snapshot timestamp of `at` (a commit timestamp, or an aware wall time) when the
    newest visible commit is `visible_ts`; `SnapshotUnavailable` for a wall time in the
    future."""
    if isinstance(at, int):
        return at
    ts = ts_at_datetime(at)
    now = now_ms()
    if ts > ts_at_wall_ms(now):
        raise SnapshotUnavailable(
            f"{at.isoformat()} is in the future (now is {ts_isoformat(make_ts(now))}): rows "
            "committed before it may not exist yet"
        )
    return min(ts, visible_ts)
