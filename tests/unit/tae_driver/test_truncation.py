"""Truncation maps DSN intents to backend LSNs as §2.4 says, and the driver acts on it safely.

The pure planner is checked against the §2.4 / scenario 14 table exactly, then for the two
rules we add: the horizon (never pass an LSN an in-flight record may still take, §2.7 Q3)
and coverage (a truncation needs a durable record above it whose safe DSN covers the
intent). Through the driver and a MemoryBackend: intents only move up, a read-only driver
never truncates, "already truncated" by someone else counts as success (scenario 15), the
intent is not the confirmed truncation (§2.7 Q6), and a safe marker is written only when no
later record covers.
"""

from __future__ import annotations

import asyncio

import pytest

from tae_driver import ReplayMode, open_driver
from tae_driver.backends.memory import MemoryBackend
from tae_driver.record import EntriesRecord, encode_record
from tae_driver.truncation import KnownRecord, NeedCoverage, TruncateAt, TruncationPlanner
from tests.unit.tae_driver.harness import Recorder, apply_all

# §2.4: psn2DSN = {11:[1,5], 12:[8,10], 13:[6,7], 14:[11,12], 17:[13,13]}, truncated 10;
# PSNs 15-16 are non-user (unknown to the driver).
TABLE_RECORDS = [
    KnownRecord(11, 1, 5, 0),
    KnownRecord(12, 8, 10, 5),
    KnownRecord(13, 6, 7, 5),
    KnownRecord(14, 11, 12, 10),
    KnownRecord(17, 13, 13, 12),
]


@pytest.mark.parametrize(
    ("intent", "lsn"), [(4, None), (5, 11), (7, 11), (10, 13), (12, 14), (13, 17)]
)
def test_section_2_4_table(intent: int, lsn: int | None) -> None:
    planner = TruncationPlanner(10, TABLE_RECORDS)
    assert planner.walk(intent) == lsn


def test_records_above_the_intent_survive_and_the_walk_restarts_above_truncation() -> None:
    planner = TruncationPlanner(10, TABLE_RECORDS)
    planner.on_truncated(11)
    assert [k.lsn for k in planner.records()] == [12, 13, 14, 17]
    assert planner.walk(7) is None  # 12 holds 8..10: DSNs 6-7 at 13 stay (handled on replay)
    assert planner.walk(12) == 14


def test_records_holding_no_live_dsn_never_stop_the_walk() -> None:
    planner = TruncationPlanner(
        0,
        [
            KnownRecord(1, 1, 2, 0),
            KnownRecord(2, 1, 0, 2),  # a safe marker
            KnownRecord(3, 1, 0, 0),  # a skip record / discarded stale copy
            KnownRecord(4, 3, 9, 2),
        ],
    )
    assert planner.walk(2) == 3


def test_the_walk_never_passes_the_horizon() -> None:
    planner = TruncationPlanner(10, TABLE_RECORDS)
    assert planner.walk(13, horizon_lsn=13) == 13
    assert planner.walk(13, horizon_lsn=12) == 12
    assert planner.walk(13, horizon_lsn=11) == 11
    assert planner.walk(13, horizon_lsn=10) is None


def test_plan_needs_a_covering_safe_dsn_above_the_truncation_point() -> None:
    planner = TruncationPlanner(10, TABLE_RECORDS)
    assert planner.plan(10) == TruncateAt(13)  # 14 carries safe 10
    assert planner.plan(12) == TruncateAt(14)  # 17 carries safe 12
    # Nothing above 17 covers DSN 13: truncate as far as is covered (14), then ask.
    assert planner.plan(13) == TruncateAt(14)
    planner.on_truncated(14)
    assert planner.truncated_dsn_max == 12
    assert planner.plan(13) == NeedCoverage(17, 13)
    planner.note(KnownRecord(18, 14, 13, 13))  # a safe marker: no DSNs, safe 13
    assert planner.plan(13) == TruncateAt(17)  # the marker itself is not passed
    planner.on_truncated(17)
    # Only the marker is left: a range with no live DSN never asks for another marker.
    assert planner.walk(13) == 18
    assert planner.plan(13) is None


def test_truncating_a_marker_needs_cover_for_what_was_truncated_before() -> None:
    # DSNs <= 9 are gone; the marker at 5 is what proves it. Record 6 carries safe 0.
    planner = TruncationPlanner(
        0, [KnownRecord(5, 1, 0, 9), KnownRecord(6, 10, 12, 0)], truncated_dsn_max=9
    )
    assert planner.plan(12) == NeedCoverage(6, 12)
    planner.note(KnownRecord(7, 13, 13, 12))
    assert planner.plan(12) == TruncateAt(6)


# --- through the driver ---------------------------------------------------------------------


def test_intents_only_move_up_and_are_not_the_confirmed_truncation() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = open_driver(backend)
        await driver.replay(apply_all)
        for i in range(20):
            await driver.append(b"e%d" % i)
        driver.truncate(10)
        assert driver.truncate_intent() == 10
        assert driver.truncated_lsn() == 0  # Q6: an intent is not a truncation
        driver.truncate(5)
        assert driver.truncate_intent() == 10
        truncated = await driver.truncation_settled()
        assert truncated == driver.truncated_lsn() == 10  # one entry per record here
        assert backend.truncate_calls == [10]
        await driver.close()

    asyncio.run(scenario())


def test_a_read_only_driver_never_truncates() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        writer = open_driver(backend)
        await writer.replay(apply_all)
        for i in range(5):
            await writer.append(b"%d" % i)
        await writer.close()
        reader = open_driver(backend)
        await reader.replay(Recorder(), mode=ReplayMode.FOR_READ)
        reader.truncate(5)
        await reader.wait_idle()
        assert await reader.truncation_settled() == 0
        assert backend.truncate_calls == []
        await reader.close()

    asyncio.run(scenario())


def test_already_truncated_by_someone_else_counts_as_success() -> None:
    """Scenario 15: the backend says InvalidTruncate with truncated >= the request."""

    async def scenario() -> None:
        backend = MemoryBackend()
        driver = open_driver(backend, window=1)
        await driver.replay(apply_all)
        for i in range(6):
            await driver.append(b"%d" % i)
        backend.set_truncated(4)
        driver.truncate(2)  # maps to LSN 2 <= 4
        assert await driver.truncation_settled() == 4
        assert backend.truncate_calls == [2]
        assert [k.lsn for k in driver.lsn_map()] == [5, 6]
        assert driver.stats().truncate_errors == 0
        await driver.close()

    asyncio.run(scenario())


def test_intent_4_makes_no_backend_call() -> None:
    """Scenario 14 through the driver: a replayed log shaped like the §2.4 table."""

    async def scenario() -> None:
        backend = MemoryBackend()
        for lsn, start, end, safe in [
            (11, 1, 5, 0),
            (12, 8, 10, 5),
            (13, 6, 7, 5),
            (14, 11, 12, 10),
            (17, 13, 13, 12),
        ]:
            backend.put(lsn, encode_record(start, safe, [b"%d" % d for d in range(start, end + 1)]))
        for lsn in (15, 16):
            backend.put_internal(lsn)
        backend.set_truncated(10)
        driver = open_driver(backend)
        await driver.replay(Recorder())
        assert driver.dsn() == 13
        driver.truncate(4)
        await driver.truncation_settled()
        assert backend.truncate_calls == []
        driver.truncate(7)
        await driver.truncation_settled()
        assert backend.truncate_calls == [11]
        driver.truncate(10)
        await driver.truncation_settled()
        assert backend.truncate_calls == [11, 13]
        driver.truncate(12)
        assert await driver.truncation_settled() == 14
        # Intent 13 needs a record above LSN 17 with safe >= 13: the driver writes a marker.
        driver.truncate(13)
        assert await driver.truncation_settled() == 17
        assert driver.stats().coverage_records == 1
        (_, marker), *_ = [(lsn, r) for lsn, r in backend.user_records() if lsn > 17]
        assert isinstance(marker, EntriesRecord)
        assert (marker.count, marker.safe_dsn) == (0, 13)
        await driver.close()

    asyncio.run(scenario())


def test_no_marker_when_a_later_record_already_covers() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = open_driver(backend, window=1)
        await driver.replay(apply_all)
        for i in range(10):
            await driver.append(b"%d" % i)
        driver.truncate(5)  # LSN 6 carries safe 5
        assert await driver.truncation_settled() == 5
        assert driver.stats().coverage_records == 0
        await driver.close()

    asyncio.run(scenario())


def test_q3_the_walk_never_passes_an_lsn_whose_reply_is_still_on_its_way() -> None:
    """§2.7 Q3: B commits at a lower LSN than A but the driver hears of A first; A is
    delivered and checkpointed. Truncating at A's LSN would silently drop B."""

    async def scenario() -> None:
        backend = MemoryBackend()
        driver = open_driver(backend, window=4)
        await driver.replay(apply_all)
        backend.hold_appends = True
        fa = driver.submit(b"a")
        await driver.wait_idle()
        fb = driver.submit(b"b")
        await driver.wait_idle()
        a, b = backend.held()
        lsn_b = backend.commit(b)  # B is durable first...
        lsn_a = backend.commit(a)
        assert lsn_b < lsn_a
        await backend.tell(a)  # ...but A's reply arrives first
        assert await fa == 1
        driver.truncate(1)  # the engine checkpointed A
        await driver.wait_idle()
        for pending in backend.held():  # any coverage marker lands
            await backend.release(pending)
            await driver.wait_idle()
        assert backend.truncate_calls == []  # B's LSN is below A's and not known yet
        await backend.tell(b)
        assert await fb == 2
        await driver.wait_idle()
        # Now B is known, and it holds DSN 2 > 1 at the lower LSN: still nothing to truncate.
        assert backend.truncate_calls == []
        recorder = Recorder(apply_from=2)
        await open_driver(backend).replay(recorder, mode=ReplayMode.FOR_READ)
        assert recorder.applied == [2]
        backend.hold_appends = False
        driver.truncate(2)
        assert await driver.truncation_settled() >= lsn_a
        await driver.close()

    asyncio.run(scenario())
