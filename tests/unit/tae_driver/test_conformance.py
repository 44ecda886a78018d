"""Every `LogBackend` behaves as backend.py's contract says (memory and file here; the same
functions run against the logsvc backend and a real cluster in tests/e2e/test_tae_driver_logsvc.py).

Each test runs once per backend kind through the `harness` fixture (conftest.py), which can
also restart a backend (the same object for memory, close + open for file). It checks LSN
assignment (strictly increasing, dense for a fresh log, concurrent appends distinct), reads
(exact bytes, own LSNs, `next = last + 1`, at least one record past `max_bytes`,
`next == first` only at the end: §2.7 Q1/Q2), truncation (monotonic, inclusive,
`AlreadyTruncated` with the truncated LSN, `OutOfRange` past the end: §4 scenario 3), that
the truncated and latest LSNs survive a restart, and tail wake-ups.
"""

from __future__ import annotations

import asyncio

import pytest

from tae_driver.backend import RecordKind, TailWaiter
from tae_driver.errors import AlreadyTruncated, OutOfRange
from tests.unit.tae_driver.harness import BackendHarness


def test_a_fresh_log_is_empty(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        assert (await backend.latest(), await backend.truncated()) == (0, 0)
        assert await backend.read(1, 1024) == ([], 1)
        await backend.close()

    asyncio.run(scenario())


def test_appends_get_increasing_lsns_and_read_back_exactly(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        payloads = [b"", b"one", bytes(range(256)) * 40]
        lsns = [await backend.append(p) for p in payloads]
        assert lsns == [1, 2, 3]
        assert await backend.latest() == 3
        records, next_lsn = await backend.read(1, 1 << 20)
        assert [(r.lsn, r.payload, r.kind) for r in records] == [
            (lsn, p, RecordKind.USER) for lsn, p in zip(lsns, payloads, strict=True)
        ]
        assert next_lsn == 4
        await backend.close()

    asyncio.run(scenario())


def test_concurrent_appends_get_distinct_lsns(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        payloads = [b"p%03d" % i for i in range(100)]
        lsns = await asyncio.gather(*(backend.append(p) for p in payloads))
        assert sorted(lsns) == list(range(1, 101))
        records, _ = await backend.read(1, 1 << 20)
        by_lsn = {r.lsn: r.payload for r in records}
        assert all(by_lsn[lsn] == p for lsn, p in zip(lsns, payloads, strict=True))
        await backend.close()

    asyncio.run(scenario())


def test_reads_page_by_bytes_and_return_at_least_one(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        for i in range(6):
            await backend.append(b"x" * 100 + bytes([i]))
        records, next_lsn = await backend.read(1, 1)
        assert ([r.lsn for r in records], next_lsn) == ([1], 2)  # larger than max_bytes
        records, next_lsn = await backend.read(2, 250)
        assert ([r.lsn for r in records], next_lsn) == ([2, 3], 4)
        records, next_lsn = await backend.read(4, 1 << 20)
        assert ([r.lsn for r in records], next_lsn) == ([4, 5, 6], 7)
        assert await backend.read(7, 1 << 20) == ([], 7)  # caught up: next == first
        assert await backend.read(50, 1 << 20) == ([], 50)
        await backend.close()

    asyncio.run(scenario())


def test_truncate_is_monotonic_inclusive_and_bounded(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        for i in range(5):
            await backend.append(b"%d" % i)
        await backend.truncate(2)
        assert await backend.truncated() == 2
        records, _ = await backend.read(3, 1 << 20)
        assert [r.lsn for r in records] == [3, 4, 5]
        for again in (2, 1):
            with pytest.raises(AlreadyTruncated) as info:
                await backend.truncate(again)
            assert (info.value.requested_lsn, info.value.truncated_lsn) == (again, 2)
        with pytest.raises(OutOfRange):
            await backend.truncate(6)
        assert (await backend.truncated(), await backend.latest()) == (2, 5)
        assert await backend.append(b"5") == 6
        await backend.truncate(6)
        assert await backend.read(7, 1 << 20) == ([], 7)
        await backend.close()

    asyncio.run(scenario())


def test_reads_at_or_below_the_truncation_point_are_out_of_range(
    harness: BackendHarness,
) -> None:
    """The local backends compact at once. (A log service may still serve such reads;
    callers always start at truncated() + 1.)"""

    async def scenario() -> None:
        backend = await harness.open()
        for i in range(3):
            await backend.append(b"%d" % i)
        await backend.truncate(2)
        with pytest.raises(OutOfRange):
            await backend.read(2, 1 << 20)
        await backend.close()

    asyncio.run(scenario())


def test_state_survives_a_restart(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        for i in range(40):
            await backend.append(b"r%02d" % i + b"." * 150)
        await backend.truncate(25)
        backend = await harness.reopen(backend)
        assert (await backend.truncated(), await backend.latest()) == (25, 40)
        records, next_lsn = await backend.read(26, 1 << 20)
        assert [r.lsn for r in records] == list(range(26, 41))
        assert records[0].payload == b"r25" + b"." * 150
        assert next_lsn == 41
        assert await backend.append(b"after") == 41
        await backend.close()

    asyncio.run(scenario())


def test_truncating_everything_keeps_the_lsn_sequence(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        for _ in range(30):
            await backend.append(b"." * 200)
        await backend.truncate(30)
        backend = await harness.reopen(backend)
        assert (await backend.truncated(), await backend.latest()) == (30, 30)
        assert await backend.read(31, 1 << 20) == ([], 31)
        assert await backend.append(b"next") == 31
        await backend.close()

    asyncio.run(scenario())


def test_a_tail_waiter_wakes_on_growth(harness: BackendHarness) -> None:
    async def scenario() -> None:
        backend = await harness.open()
        if not isinstance(backend, TailWaiter):
            pytest.skip("this backend does not wake tails")
        await backend.append(b"a")
        await backend.wait_past(0)  # already past: returns at once
        waiter = asyncio.ensure_future(backend.wait_past(1))
        lsn = await backend.append(b"b")
        await waiter
        assert lsn == 2
        await backend.close()

    asyncio.run(scenario())
