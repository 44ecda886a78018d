"""`replay.plan_replay_arrays` (a log's records planned as arrays, issue 23) against
`replay.plan_replay` (record by record): on random logs - clean ones most often, then with
duplicate copies (equal or not), overlaps, gaps below and above the safe DSNs, a safe DSN
vouching for a copy at a higher LSN, skip records, truncation, markers, records in any order,
with or without a checkpoint base - both give the same plan, or raise the same error with the
same message. A clean log is planned without a step per record (a spy on `plan_replay`);
`PlanInput` gives the same plan from segment arrays and from single records.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_jobs import replay
from spark_jobs.checkpoints import Checkpoint
from spark_jobs.errors import SparkJobError


def _base(ckp_dsn: int | None) -> replay.BaseState:
    if ckp_dsn is None:
        return replay.EMPTY_BASE
    fake = SimpleNamespace(
        ckp_dsn=ckp_dsn, ckp_ts=10 * ckp_dsn, manifest=SimpleNamespace(name="c1")
    )
    return replay.BaseState(cast(Checkpoint, fake))


def _log(rng: random.Random) -> tuple[list[replay.DriverRecord], list[tuple[int, int]], int]:
    """Records (each LSN once, in a shuffled order), skips and a truncated LSN."""
    records: list[replay.DriverRecord] = []
    lsn = rng.randrange(1, 5)
    dsn = rng.choice([1, 1, 1, rng.randrange(1, 20)])
    safe = dsn - 1
    damage = rng.random() < 0.5
    for _ in range(rng.randrange(0, 25)):
        count = rng.randrange(0, 4) if rng.random() < 0.2 else rng.randrange(1, 6)
        start = dsn
        if damage and rng.random() < 0.15:
            start += rng.choice([-3, -1, 1, 2])  # an overlap or a gap
        start = max(1, start)
        record_safe = safe if not damage or rng.random() < 0.9 else safe + rng.randrange(1, 9)
        checksum = rng.randrange(-(2**63), 2**63)
        records.append(replay.DriverRecord(lsn, start, count, record_safe, checksum))
        if damage and count and rng.random() < 0.1:  # a copy, equal or not
            copy_checksum = checksum if rng.random() < 0.6 else checksum ^ 1
            lsn += rng.randrange(1, 3)
            records.append(replay.DriverRecord(lsn, start, count, record_safe, copy_checksum))
        if count:
            dsn = start + count
            safe = max(safe, start + count - 1 - rng.randrange(0, 3))
        lsn += rng.randrange(1, 3)
    skips: list[tuple[int, int]] = []
    if damage and records and rng.random() < 0.2:
        named = rng.choice(records)
        skips.append((named.start_dsn, named.lsn if rng.random() < 0.7 else named.lsn + 1000))
    truncated = 0
    if damage and records and rng.random() < 0.2:
        truncated = rng.choice(records).lsn
    rng.shuffle(records)
    return records, skips, truncated


def _arrays(records: list[replay.DriverRecord]) -> replay.RecordArrays:
    def column(name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in records], dtype=np.int64)

    return replay.RecordArrays(
        column("lsn"), column("start_dsn"), column("count"), column("safe_dsn"), column("checksum")
    )


def _outcome(plan: object) -> object:
    try:
        return ("plan", plan if isinstance(plan, replay.ReplayPlan) else plan())  # type: ignore[operator]
    except SparkJobError as exc:
        return (type(exc).__name__, str(exc))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, None, 0, 3, 12]))
@example(0, None)
def test_the_array_plan_is_the_record_plan(seed: int, ckp_dsn: int | None) -> None:
    # A seed, not st.randoms: its draws are uniform, so about half the logs are clean and
    # half damaged in some way (hypothesis' own draws lean to the first choice).
    records, skips, truncated = _log(random.Random(seed))
    base = _base(ckp_dsn)
    expected = _outcome(lambda: replay.plan_replay(records, skips, truncated, "log", base))
    found = _outcome(
        lambda: replay.plan_replay_arrays(_arrays(records), skips, truncated, "log", base)
    )
    assert found == expected


def test_a_clean_log_is_planned_without_a_step_per_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = [replay.DriverRecord(lsn, 3 * lsn - 2, 3, 3 * lsn - 4, lsn) for lsn in range(1, 60)]
    records.append(replay.DriverRecord(60, 0, 0, 177, 0))  # a marker
    expected = replay.plan_replay(records, [], 0, "log")
    calls = []
    monkeypatch.setattr(replay, "plan_replay", lambda *args: calls.append(args))
    found = replay.plan_replay_arrays(_arrays(records), [], 0, "log")
    assert not calls
    assert found == expected
    assert (found.first_dsn, found.last_dsn, found.safe_dsn) == (1, 177, 177)
    assert set(found.kept_lsns) == set(range(1, 60))
