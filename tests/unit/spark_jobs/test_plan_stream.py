"""`plan_stream.PlanStream` (a log's plan from one pass over its records in LSN order, in
constant memory) against `replay.plan_replay` (record by record, the rules' statement): on
random logs in LSN order - clean ones, with markers, truncation and a checkpoint base, and
damaged ones (`test_plan_arrays._log`: copies, overlaps, gaps, vouched-for late copies, skip
records) - fed in random pieces, as arrays and one record at a time. Where the stream gives
a plan it is `plan_replay`'s (its LSN spans listed against the log's records); where
`plan_replay` raises, the stream gives none (its caller then plans record by record, so the
errors stay that function's) or, for a refusal of where the log starts, the same error with
the same message; and every clean log gets a plan from the stream.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_jobs import replay
from spark_jobs.errors import ReplayRefused, SparkJobError
from spark_jobs.plan_stream import PlanStream
from tests.unit.spark_jobs.test_plan_arrays import _base, _log


def _clean_log(rng: random.Random) -> tuple[list[replay.DriverRecord], int, int | None]:
    """A log as a driver writes it: records in LSN order (LSN gaps where other frames were),
    DSNs running on from 1, safe DSNs trailing them, markers between; truncated (with a
    checkpoint covering the cut) or not."""
    records: list[replay.DriverRecord] = []
    lsn = rng.randrange(1, 4)
    dsn, safe = 1, 0
    for _ in range(rng.randrange(0, 30)):
        if rng.random() < 0.2:
            safe = max(safe, dsn - 1 - rng.randrange(0, 2))
            records.append(replay.DriverRecord(lsn, 0, 0, safe, 0))
        else:
            count = rng.randrange(1, 4)
            records.append(replay.DriverRecord(lsn, dsn, count, safe, rng.randrange(2**62)))
            dsn += count
            safe = max(safe, dsn - 1 - rng.randrange(0, 3))
        lsn += rng.randrange(1, 3)
    truncated, ckp_dsn = 0, None
    if records and rng.random() < 0.5:
        cut = rng.randrange(len(records))
        truncated = records[cut].lsn
        held = [r.start_dsn + r.count - 1 for r in records[: cut + 1] if r.count]
        ckp_dsn = max(held, default=0) + rng.randrange(0, 2)
    return records, truncated, ckp_dsn


def _feed(stream: PlanStream, records: list[replay.DriverRecord], rng: random.Random) -> PlanStream:
    at = 0
    while at < len(records):
        size = rng.randrange(1, 8)
        piece = records[at : at + size]
        at += size
        if rng.random() < 0.5:
            for r in piece:
                stream.add_one(r.lsn, r.start_dsn, r.count, r.safe_dsn)
        else:
            stream.add_arrays(
                *(
                    np.array([getattr(r, name) for r in piece], dtype=np.int64)
                    for name in ("lsn", "start_dsn", "count", "safe_dsn")
                )
            )
    return stream


def _streamed(
    records: list[replay.DriverRecord],
    skips: list[tuple[int, int]],
    truncated: int,
    base: replay.BaseState,
    rng: random.Random,
) -> replay.ReplayPlan | None:
    stream = _feed(PlanStream(base.ckp_dsn), records, rng)
    stream.add_skips(skips)
    if truncated:
        stream.add_truncate(truncated)
    prefix = None
    if stream.needs_prefix():
        cut = [r for r in records if r.lsn <= truncated]
        prefix = _feed(PlanStream(base.ckp_dsn), cut, rng)
    return stream.plan("log", base, prefix)


def _listed(found: replay.LsnSet, lsns: list[int]) -> replay.LsnSet:
    """`found` with a span's LSNs listed: those of `lsns` (the records of its kind) it holds."""
    return replay.LsnSet.of(lsn for lsn in lsns if lsn in found)


def _as_listed(plan: replay.ReplayPlan, records: list[replay.DriverRecord]) -> replay.ReplayPlan:
    entry_lsns = [r.lsn for r in records if r.count]
    every_lsn = [r.lsn for r in records]
    return replay.ReplayPlan(
        _listed(plan.kept_lsns, entry_lsns),
        plan.first_dsn,
        plan.last_dsn,
        _listed(plan.truncated_lsns, every_lsn),
        plan.duplicate_lsns,
        plan.skipped_lsns,
        plan.trailing_lsns,
        plan.safe_dsn,
    )


def _expected(
    records: list[replay.DriverRecord],
    skips: list[tuple[int, int]],
    truncated: int,
    base: replay.BaseState,
) -> replay.ReplayPlan | tuple[str, str]:
    try:
        return replay.plan_replay(records, skips, truncated, "log", base)
    except SparkJobError as exc:
        return (type(exc).__name__, str(exc))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, None, 0, 3, 12]))
@example(0, None)
def test_a_streamed_plan_is_the_record_plan(seed: int, ckp_dsn: int | None) -> None:
    rng = random.Random(seed)
    records, skips, truncated = _log(rng)
    records.sort(key=lambda r: r.lsn)  # a reader meets them in LSN order
    base = _base(ckp_dsn)
    expected = _expected(records, skips, truncated, base)
    try:
        found = _streamed(records, skips, truncated, base, rng)
    except SparkJobError as exc:  # a refusal of where the log starts: plan_replay's own
        assert (type(exc).__name__, str(exc)) == expected
        return
    if found is not None:
        assert _as_listed(found, records) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
@example(1)
def test_every_clean_log_is_streamed(seed: int) -> None:
    rng = random.Random(seed)
    records, truncated, ckp_dsn = _clean_log(rng)
    base = _base(ckp_dsn)
    expected = _expected(records, [], truncated, base)
    assert isinstance(expected, replay.ReplayPlan), "the generator made a log the rules refuse"
    found = _streamed(records, [], truncated, base, rng)
    assert found is not None
    assert _as_listed(found, records) == expected
    assert len(found.kept_lsns) == len(expected.kept_lsns)
    assert len(found.truncated_lsns) == len(expected.truncated_lsns)


def test_a_large_log_that_cannot_answer_is_refused_as_it_streams() -> None:
    """A log truncated with no checkpoint to cover the cut: refused by the stream itself,
    with plan_replay's message (no record-by-record plan of a large log to say so)."""
    records = [replay.DriverRecord(lsn, lsn, 1, lsn - 1, lsn) for lsn in range(1, 9)]
    expected = _expected(records, [], 3, replay.EMPTY_BASE)
    assert isinstance(expected, tuple) and expected[0] == "ReplayRefused"
    with pytest.raises(ReplayRefused) as refused:
        _streamed(records, [], 3, replay.EMPTY_BASE, random.Random(0))
    assert str(refused.value) == expected[1]


def test_records_out_of_lsn_order_are_not_streamed() -> None:
    stream = PlanStream(0)
    stream.add_one(2, 1, 1, 0)
    stream.add_one(1, 2, 1, 1)
    assert stream.plan("log", replay.EMPTY_BASE) is None


def test_kept_lsns_are_tested_per_chunk_in_either_form() -> None:
    span = replay.LsnSet(span_after=10, span_upto=20, span_count=7)
    listed = replay.LsnSet.of([3, 11, 20])
    lsns = np.array([3, 10, 11, 20, 21], dtype=np.int64)
    assert span.contains(lsns).tolist() == [False, False, True, True, False]
    assert listed.contains(lsns).tolist() == [True, False, True, True, False]
    assert replay.LsnSet().contains(lsns).tolist() == [False] * 5
    assert (len(span), len(listed), 11 in span, 12 in listed) == (7, 3, True, False)
