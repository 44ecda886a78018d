"""Which snapshot timestamp a user's "as of" names on a compute node (`engine cn scan --at`,
`cn sql --at`, `ComputeNode.sql(at=)`), issue 24. An engine resolves its own with
`Engine.snapshot(at=...)` (engine/time_travel.py `resolve`, which also waits for commits in
flight below the time); a compute node has no clock of the TN's, so it pulls first and uses
this rule on what it pulled.

    ts = snapshot_ts(parse_at(text), visible_ts)

A commit timestamp is taken as given (the engine says `SnapshotUnavailable` when it cannot
serve it). A wall time (engine/clock.py `parse_at`: ISO-8601 with a zone, or epoch `Nms`) is
the snapshot at the last timestamp of its millisecond, `ts_at_datetime`; one that has already
passed but is newer than the newest commit is the newest commit (nothing committed in
between: the same rows), and one still in the future is refused, since rows committed before
it may not exist yet.

"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from engine.clock import make_ts, ts_at_datetime, ts_at_wall_ms, ts_isoformat, wall_ms
from engine.errors import TimestampInFuture


def snapshot_ts(
    at: int | datetime.datetime, visible_ts: int, now_ms: Callable[[], int] = wall_ms
) -> int:
    """The snapshot timestamp of `at` (a commit timestamp, or an aware wall time) when the
    newest visible commit is `visible_ts`; `TimestampInFuture` for a wall time in the
    future."""
    if isinstance(at, int):
        return at
    ts = ts_at_datetime(at)
    now = now_ms()
    if ts > ts_at_wall_ms(now):
        raise TimestampInFuture(
            f"{at.isoformat()} is in the future (now is {ts_isoformat(make_ts(now))}): rows "
            "committed before it may not exist yet",
            visible_ts,
        )
    return min(ts, visible_ts)
