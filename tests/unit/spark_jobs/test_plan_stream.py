"""`plan_stream.PlanStream` (a log's plan from one pass over its records in LSN order, in
constant memory) against `replay.plan_replay` (record by record, the rules' statement): on
random logs in LSN order - clean ones, with markers, truncation and a checkpoint base, and
damaged ones (`test_plan_arrays._log`: copies, overlaps, gaps, vouched-for late copies, skip
records) - fed in random pieces, as arrays and one record at a time. Where the stream gives
a plan it is `plan_replay`'s (its LSN spans listed against the log's records); where
`plan_replay` raises, the stream gives none (its caller then plans record by record, so the
errors stay that function's) or, for a refusal of where the log starts, the same error with
the same message; and every clean log gets a plan from the stream. Then logs as crashed
drivers leave them (`_crashed_log`: copies re-appended a few records later, identical or
not, skip records naming them, windows made small): the same comparison, and every log of
the shapes a driver makes (identical copies within the window, skips of copies or of a
range's first copy) is streamed whenever `plan_replay` plans it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_jobs import limits, plan_stream, replay
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


COPY_KINDS = ("same", "same", "same", "same", "differ", "partial", "spanning")


def _crashed_log(
    rng: random.Random, kinds: tuple[str, ...], delay_max: int, lone_skips: bool = True
) -> tuple[list[replay.DriverRecord], list[tuple[int, int]], int, int | None]:
    """A log as a driver writes it (`_clean_log`), with what crashes add: copies of entry
    records re-appended a few originals later (`delay_max` at most) at higher LSNs, of the
    `kinds` chosen from: "same" (the record's bytes and safe DSN: a retried append),
    "differ" (other bytes), "partial" (part of its DSNs), "spanning" (its DSNs and the next
    record's); skip records naming copies, originals that have copies, or an original's only
    copy (unless not `lone_skips`); truncated (a checkpoint covering the cut) or not."""
    records: list[replay.DriverRecord] = []
    lsn = rng.randrange(1, 4)
    dsn, safe = 1, 0
    pending: list[tuple[int, replay.DriverRecord]] = []  # (due after original, copy)
    originals = 0

    def append(start: int, count: int, record_safe: int, checksum: int) -> None:
        nonlocal lsn
        records.append(replay.DriverRecord(lsn, start, count, record_safe, checksum))
        lsn += rng.randrange(1, 3)

    for _ in range(rng.randrange(0, 40)):
        if rng.random() < 0.2:
            safe = max(safe, dsn - 1 - rng.randrange(0, 2))
            append(0, 0, safe, 0)
        else:
            count = rng.randrange(1, 4)
            checksum = rng.randrange(2**62)
            append(dsn, count, safe, checksum)
            for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
                kind = rng.choice(kinds)
                start, copy_count, copy_safe, copy_sum = dsn, count, safe, checksum
                if kind == "differ":
                    copy_sum, copy_safe = checksum ^ 1, safe + rng.randrange(0, 2)
                elif kind == "partial":
                    start, copy_count = (dsn + 1, count - 1) if count > 1 else (dsn, 2)
                elif kind == "spanning":
                    copy_count = count + 1
                pending.append(
                    (
                        originals + rng.randrange(0, delay_max + 1),
                        replay.DriverRecord(0, start, copy_count, copy_safe, copy_sum),
                    )
                )
            dsn += count
            safe = max(safe, dsn - 1 - rng.randrange(0, 3))
            for due, copy in [p for p in pending if p[0] <= originals]:
                pending.remove((due, copy))
                append(copy.start_dsn, copy.count, copy.safe_dsn, copy.checksum)
            originals += 1
    for _, copy in pending:
        append(copy.start_dsn, copy.count, copy.safe_dsn, copy.checksum)
    skips = _crash_skips(rng, records, lone_skips)
    truncated, ckp_dsn = 0, None
    if records and rng.random() < 0.5:
        cut = rng.randrange(len(records))
        truncated = records[cut].lsn
        held = [r.start_dsn + r.count - 1 for r in records[: cut + 1] if r.count]
        ckp_dsn = max(held, default=0) + rng.randrange(0, 2)
    return records, skips, truncated, ckp_dsn


def _crash_skips(
    rng: random.Random, records: list[replay.DriverRecord], lone: bool
) -> list[tuple[int, int]]:
    """Skip records' pairs naming copies, first copies of a range, or any entry record."""
    by_range: dict[tuple[int, int], list[replay.DriverRecord]] = {}
    for r in records:
        if r.count:
            by_range.setdefault((r.start_dsn, r.count), []).append(r)
    copied = [copies for copies in by_range.values() if len(copies) > 1]
    skips = []
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        choice = rng.random()
        if copied and choice < 0.5:
            named = rng.choice(rng.choice(copied)[1:])  # a copy
        elif copied and choice < 0.8:
            named = rng.choice(copied)[0]  # the first copy: the next one is replayed
        elif by_range and lone:
            named = rng.choice(rng.choice(list(by_range.values())))  # most often a lone copy
        else:
            continue
        skips.append((named.start_dsn, named.lsn))
    return skips


def _feed(stream: PlanStream, records: list[replay.DriverRecord], rng: random.Random) -> PlanStream:
    at = 0
    while at < len(records):
        size = rng.randrange(1, 8)
        piece = records[at : at + size]
        at += size
        if rng.random() < 0.5:
            for r in piece:
                stream.add_one(r.lsn, r.start_dsn, r.count, r.safe_dsn, r.checksum)
        else:
            stream.add_arrays(
                *(
                    np.array([getattr(r, name) for r in piece], dtype=np.int64)
                    for name in ("lsn", "start_dsn", "count", "safe_dsn", "checksum")
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


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 2, 4, 64]))
@example(0, 4)
def test_a_crashed_log_streamed_is_the_record_plan(seed: int, window: int) -> None:
    """Copies (identical, differing, part of a range, spanning two), skips of copies, of
    first copies and of lone records, copies older than a (small) window, records given one
    at a time added in batches of any size: where the stream gives a plan it is
    `plan_replay`'s, duplicates and skipped records listed alike."""
    rng = random.Random(seed)
    records, skips, truncated, ckp_dsn = _crashed_log(rng, COPY_KINDS, delay_max=6)
    base = _base(ckp_dsn)
    expected = _expected(records, skips, truncated, base)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "REPLAY_PLAN_WINDOW_RECORDS", window)
        # records given one at a time are added in batches of this many
        patch.setattr(plan_stream, "ONE_AT_A_TIME_BATCH", rng.choice([1, 3, 4096]))
        try:
            found = _streamed(records, skips, truncated, base, rng)
        except SparkJobError as exc:
            assert (type(exc).__name__, str(exc)) == expected
            return
    if found is not None:
        assert _as_listed(found, records) == expected
        assert len(found.kept_lsns) == len(expected.kept_lsns)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32))
@example(3)
def test_a_crash_s_copies_and_skips_are_streamed(seed: int) -> None:
    """The shapes a driver leaves after crashes - identical copies within the window (4
    records here), skip records naming copies or a range's first copy - are planned by the
    stream whenever `plan_replay` plans them, unless a truncation cuts a range's first copy
    from a later one (the later would be replayed: planned record by record)."""
    rng = random.Random(seed)
    records, skips, truncated, ckp_dsn = _crashed_log(rng, ("same",), delay_max=3, lone_skips=False)
    base = _base(ckp_dsn)
    expected = _expected(records, skips, truncated, base)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "REPLAY_PLAN_WINDOW_RECORDS", 4)
        try:
            found = _streamed(records, skips, truncated, base, rng)
        except SparkJobError as exc:
            assert (type(exc).__name__, str(exc)) == expected
            return
    if not isinstance(expected, replay.ReplayPlan):
        assert found is None
        return
    by_range: dict[tuple[int, int], list[int]] = {}
    for r in records:
        if r.count:
            by_range.setdefault((r.start_dsn, r.count), []).append(r.lsn)
    cut = any(lsns[0] <= truncated < lsns[-1] for lsns in by_range.values())
    gone = any(set(lsns) <= {lsn for _, lsn in skips} for lsns in by_range.values())
    assert found is not None or cut or gone
    if found is not None:
        assert _as_listed(found, records) == expected
        assert len(found.kept_lsns) == len(expected.kept_lsns)


def test_a_copy_older_than_the_window_is_not_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the 3rd-last original is matched by a window of 3, not by one of 2."""
    records = [
        replay.DriverRecord(1, 1, 1, 0, 11),
        replay.DriverRecord(2, 2, 2, 1, 12),
        replay.DriverRecord(3, 4, 1, 3, 13),
        replay.DriverRecord(4, 1, 1, 0, 11),  # a copy of LSN 1
    ]
    expected = _expected(records, [], 0, replay.EMPTY_BASE)
    assert isinstance(expected, replay.ReplayPlan)
    assert set(expected.duplicate_lsns) == {4}
    monkeypatch.setattr(limits, "REPLAY_PLAN_WINDOW_RECORDS", 3)
    found = _streamed(records, [], 0, replay.EMPTY_BASE, random.Random(0))
    assert found is not None and _as_listed(found, records) == expected
    monkeypatch.setattr(limits, "REPLAY_PLAN_WINDOW_RECORDS", 2)
    assert _streamed(records, [], 0, replay.EMPTY_BASE, random.Random(0)) is None


def test_a_skipped_first_copy_hands_over_to_the_next() -> None:
    """A skip record naming a range's first copy: the next copy is replayed (kept), the
    first is skipped, and the kept span lists both exclusions."""
    records = [
        replay.DriverRecord(1, 1, 1, 0, 11),
        replay.DriverRecord(2, 2, 1, 0, 12),
        replay.DriverRecord(3, 2, 1, 0, 12),  # a copy of LSN 2
        replay.DriverRecord(4, 3, 1, 2, 13),
        replay.DriverRecord(5, 2, 1, 0, 12),  # another
        replay.DriverRecord(6, 4, 1, 3, 14),
    ]
    skips = [(2, 2)]
    expected = _expected(records, skips, 0, replay.EMPTY_BASE)
    assert isinstance(expected, replay.ReplayPlan)
    found = _streamed(records, skips, 0, replay.EMPTY_BASE, random.Random(0))
    assert found is not None
    assert (found.kept_lsns.span_count, found.kept_lsns.excluded.tolist()) == (4, [2, 5])
    assert (set(found.duplicate_lsns), set(found.skipped_lsns)) == ({5}, {2})
    assert _as_listed(found, records) == expected
    only = [(3, 4)]  # DSN 3's only copy: plan_replay finds a hole, the stream gives up
    assert isinstance(_expected(records, only, 0, replay.EMPTY_BASE), tuple)
    assert _streamed(records, only, 0, replay.EMPTY_BASE, random.Random(0)) is None


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
    stream.add_one(2, 1, 1, 0, 7)
    stream.add_one(1, 2, 1, 1, 8)
    assert stream.plan("log", replay.EMPTY_BASE) is None


def test_kept_lsns_are_tested_per_chunk_in_either_form() -> None:
    span = replay.LsnSet(span_after=10, span_upto=20, span_count=7)
    listed = replay.LsnSet.of([3, 11, 20])
    lsns = np.array([3, 10, 11, 20, 21], dtype=np.int64)
    assert span.contains(lsns).tolist() == [False, False, True, True, False]
    assert listed.contains(lsns).tolist() == [True, False, True, True, False]
    assert replay.LsnSet().contains(lsns).tolist() == [False] * 5
    assert (len(span), len(listed), 11 in span, 12 in listed) == (7, 3, True, False)
