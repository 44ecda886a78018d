"""`--at` resolution (engine/as_of.py): a commit timestamp is taken as given; a wall time is
the last timestamp of its millisecond, clamped to the newest commit once it has passed, and
refused while it is in the future.

How: the pure helper with the wall clock as an input (`now_ms`), no engine.
"""

from __future__ import annotations

import datetime

import pytest

from engine.as_of import snapshot_ts
from engine.clock import LOGICAL_MAX, make_ts, parse_at
from engine.errors import SnapshotUnavailable

NOW_MS = 1_795_694_400_000  # 2026-11-26T12:00:00Z


def now() -> int:
    return NOW_MS


def test_a_commit_timestamp_is_taken_as_given() -> None:
    assert snapshot_ts(12345, visible_ts=make_ts(NOW_MS), now_ms=now) == 12345


def test_a_past_wall_time_is_the_last_timestamp_of_its_millisecond() -> None:
    at = parse_at(f"{NOW_MS - 10}ms")
    assert isinstance(at, datetime.datetime)
    newest = make_ts(NOW_MS - 1)
    assert snapshot_ts(at, visible_ts=newest, now_ms=now) == make_ts(NOW_MS - 10, LOGICAL_MAX)
    # Past, but after the newest commit: the newest commit (nothing committed in between).
    older = make_ts(NOW_MS - 100, 7)
    assert snapshot_ts(at, visible_ts=older, now_ms=now) == older
    # This very millisecond has passed far enough: its commits so far are all visible.
    this_ms = parse_at(f"{NOW_MS}ms")
    assert isinstance(this_ms, datetime.datetime)
    assert snapshot_ts(this_ms, visible_ts=older, now_ms=now) == older


def test_a_wall_time_in_the_future_is_refused() -> None:
    at = parse_at("2026-11-26T12:00:00.001Z")
    assert isinstance(at, datetime.datetime)
    with pytest.raises(SnapshotUnavailable, match="is in the future"):
        snapshot_ts(at, visible_ts=make_ts(NOW_MS), now_ms=now)
