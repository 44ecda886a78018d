"""Commit timestamps and wall time (engine/clock.py, issue 24): a wall time maps to the last
timestamp of its millisecond, and what a user types for "as of" parses to a timestamp or an
aware datetime, or fails saying what it accepts."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.clock import (
    LOGICAL_MAX,
    TS_MAX,
    make_ts,
    parse_at,
    ts_at_datetime,
    ts_at_wall_ms,
    ts_datetime,
    ts_isoformat,
    ts_physical_ms,
)

UTC = datetime.UTC


def test_a_wall_time_maps_to_the_last_timestamp_of_its_millisecond() -> None:
    at = datetime.datetime(2026, 11, 26, 12, 0, 0, 123_999, tzinfo=UTC)
    ts = ts_at_datetime(at)
    assert ts_physical_ms(ts) == 1_795_694_400_123
    assert ts == make_ts(1_795_694_400_123, LOGICAL_MAX)
    # a commit issued in that millisecond is in the snapshot; one in the next is not
    assert make_ts(1_795_694_400_123, 7) <= ts < make_ts(1_795_694_400_124, 0)
    assert ts_isoformat(ts) == "2026-11-26T12:00:00.123Z"


def test_an_offset_is_the_same_instant() -> None:
    plus_one = datetime.timezone(datetime.timedelta(hours=1))
    assert ts_at_datetime(datetime.datetime(2026, 11, 26, 13, tzinfo=plus_one)) == ts_at_datetime(
        datetime.datetime(2026, 11, 26, 12, tzinfo=UTC)
    )


@given(st.integers(min_value=0, max_value=ts_physical_ms(TS_MAX)))
def test_wall_ms_round_trips(epoch_ms: int) -> None:
    ts = ts_at_wall_ms(epoch_ms)
    assert ts_physical_ms(ts) == epoch_ms
    if epoch_ms < 253_402_300_800_000:  # datetime's year 9999
        assert ts_at_datetime(ts_datetime(ts)) == ts


def test_parse_at_accepts_three_spellings() -> None:
    assert parse_at("117000000000000000") == 117_000_000_000_000_000
    assert parse_at("1795694400000ms") == datetime.datetime(2026, 11, 26, 12, tzinfo=UTC)
    assert parse_at("2026-11-26T12:00:00Z") == datetime.datetime(2026, 11, 26, 12, tzinfo=UTC)
    at = parse_at(" 2026-11-26T13:00:00+01:00 ")
    assert isinstance(at, datetime.datetime)
    assert ts_at_datetime(at) == ts_at_wall_ms(1_795_694_400_000)


@pytest.mark.parametrize(
    "text",
    ["", "yesterday", "2026-11-26T12:00:00", "2026-11-26", "-5", "12.5", "ms", str(TS_MAX + 1)],
)
def test_parse_at_refuses_what_is_not_a_time(text: str) -> None:
    with pytest.raises(ValueError, match="is not a time"):
        parse_at(text)


def test_a_naive_datetime_is_refused() -> None:
    with pytest.raises(ValueError, match="time zone"):
        ts_at_datetime(datetime.datetime(2026, 11, 26, 12))
