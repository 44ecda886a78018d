"""The asyncio driver keeps the engine's contract end to end over a MemoryBackend.

How: a MemoryBackend with `hold_appends=True` lets each test decide when each record commits
(and so which LSN it gets); `driver.wait_idle()` and `backend.release()` are explicit
hand-offs, so no test sleeps or times anything. Covered here, by §4 scenario:

* 10 the window (W=7, r13 outstanding: r19 dispatched, r20 waits until r13 returns);
* 11 out-of-order completion, in-order notification, the LSN map and safe DSNs;
* 12 group commit packing through `submit` (120 entries in one loop turn -> 50/50/20);
* 13 writes gated on replay, one replay only;
* 27 a tailing reader with concurrent truncation (scaled from 10,000 to 1,000 entries), and
  cancellation;
* 28 reader -> writer promotion, and a reader stopped into FOR_READ stays read-only;
* 29 a restart rebuilds the LSN map so truncation maps as before;
plus back-pressure (`Overloaded` / waiting `append`), an oversized entry, a failed append
failing the driver, abort and close, and the tail's polling back-off with an injected sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tae_driver import ReplayDecision, ReplayMode, open_driver
from tae_driver.backend import LogBackend, Record
from tae_driver.backends.memory import HeldAppend, MemoryBackend
from tae_driver.driver import Driver
from tae_driver.errors import (
    DriverClosed,
    DriverFailed,
    EntryTooLarge,
    NeedReplayForWrite,
    Overloaded,
    ReplayStateError,
    TailTruncated,
)
from tae_driver.record import EntriesRecord, decode
from tae_driver.truncation import TruncationPlanner
from tests.unit.tae_driver.harness import Recorder, apply_all


async def writer(
    backend: MemoryBackend,
    *,
    window: int = 64,
    intake_entries_max: int = 8192,
    record_entries_max: int = 50,
    record_bytes_max: int = 2 * 1024 * 1024,
) -> Driver:
    driver = open_driver(
        backend,
        window=window,
        intake_entries_max=intake_entries_max,
        record_entries_max=record_entries_max,
        record_bytes_max=record_bytes_max,
    )
    await driver.replay(apply_all)
    return driver


async def dispatch(
    driver: Driver, backend: MemoryBackend, *entries: bytes
) -> tuple[list[asyncio.Future[int]], HeldAppend]:
    """Submit `entries` in one loop turn; return their futures and the one record held."""
    before = len(backend.held())
    futures = [driver.submit(e) for e in entries]
    await driver.wait_idle()
    held = backend.held()
    assert len(held) == before + 1
    return futures, held[-1]


def record_of(held: HeldAppend) -> EntriesRecord:
    decoded = held.decoded()
    assert isinstance(decoded, EntriesRecord)
    return decoded


def test_scenario_10_window_blocks_the_20th_record_until_the_13th_returns() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=7)
        backend.hold_appends = True
        records: dict[int, HeldAppend] = {}
        for n in range(1, 20):
            if n > 7:
                await backend.release(records[n - 7])  # r1..r12 return in order
            _, records[n] = await dispatch(driver, backend, b"r%d" % n)
            assert record_of(records[n]).start_dsn == n
        for n in range(14, 20):
            await backend.release(records[n])  # done at the backend, not delivered
        assert driver.committed_dsn() == 12
        future20 = driver.submit(b"r20")
        await driver.wait_idle()
        assert [record_of(h).start_dsn for h in backend.held()] == [13]  # r20 is not out
        await backend.release(records[13])
        await driver.wait_idle()
        assert driver.committed_dsn() == 19
        (held20,) = backend.held()
        assert record_of(held20).start_dsn == 20
        await backend.release(held20)
        assert await future20 == 20
        await driver.close()

    asyncio.run(scenario())


def test_scenario_11_out_of_order_completion_in_order_notification() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        backend.set_truncated(9)  # the next LSN is 10
        driver = await writer(backend, window=8)
        backend.hold_appends = True
        completed: list[int] = []
        fa, a = await dispatch(driver, backend, *[b"a%d" % i for i in range(5)])
        fb, b = await dispatch(driver, backend, *[b"b%d" % i for i in range(3)])
        fc, c = await dispatch(driver, backend, b"c0")
        for future in [*fa, *fb, *fc]:
            future.add_done_callback(lambda f: completed.append(f.result()))
        assert [(record_of(h).start_dsn, record_of(h).count) for h in (a, b, c)] == [
            (1, 5),
            (6, 3),
            (9, 1),
        ]
        assert [record_of(h).safe_dsn for h in (a, b, c)] == [0, 0, 0]
        watermarks = [driver.committed_dsn()]
        assert await backend.release(c) == 10
        assert not any(f.done() for f in [*fa, *fb, *fc])  # nothing before A
        watermarks.append(driver.committed_dsn())
        assert await backend.release(a) == 11
        assert [f.result() for f in fa] == [1, 2, 3, 4, 5]
        watermarks.append(driver.committed_dsn())
        assert await backend.release(b) == 12
        watermarks.append(driver.committed_dsn())
        await asyncio.gather(*fa, *fb, *fc)
        assert completed == list(range(1, 10))
        assert watermarks == [0, 0, 5, 9]
        assert {(k.lsn, k.start_dsn, k.end_dsn) for k in driver.lsn_map()} == {
            (10, 9, 9),
            (11, 1, 5),
            (12, 6, 8),
        }
        # A record dispatched now carries the watermark it left with.
        _, d = await dispatch(driver, backend, b"d0")
        assert record_of(d).safe_dsn == 9
        await backend.release(d)
        await driver.close()

    asyncio.run(scenario())


def test_scenario_12_entries_submitted_in_one_turn_share_records() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=8)
        backend.hold_appends = True
        entries = [b"entry-%03d" % i for i in range(120)]
        futures = [driver.submit(e) for e in entries]
        await driver.wait_idle()
        held = backend.held()
        assert [(record_of(h).start_dsn, record_of(h).count) for h in held] == [
            (1, 50),
            (51, 50),
            (101, 20),
        ]
        assert [e for h in held for e in record_of(h).entries] == entries
        for h in reversed(held):
            await backend.release(h)
        assert [await f for f in futures] == list(range(1, 121))
        await driver.close()

    asyncio.run(scenario())


def test_back_pressure_submit_overloads_and_append_waits() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=1, intake_entries_max=3, record_entries_max=2)
        backend.hold_appends = True
        _, first = await dispatch(driver, backend, b"0")
        queued = [driver.submit(b"%d" % i) for i in range(1, 4)]  # the window is full
        with pytest.raises(Overloaded):
            driver.submit(b"4")
        waiting = asyncio.ensure_future(driver.append(b"4"))
        await driver.wait_idle()
        assert not waiting.done()
        await backend.release(first)
        await driver.wait_idle()
        (second,) = backend.held()
        assert record_of(second).entries == (b"1", b"2")
        await backend.release(second)
        await driver.wait_idle()
        (third,) = backend.held()
        assert record_of(third).entries == (b"3", b"4")
        await backend.release(third)
        assert [await f for f in queued] == [2, 3, 4]
        assert await waiting == 5
        await driver.close()

    asyncio.run(scenario())


def test_an_entry_too_large_for_one_record_is_refused() -> None:
    async def scenario() -> None:
        driver = await writer(MemoryBackend(), record_bytes_max=1024)
        with pytest.raises(EntryTooLarge):
            await driver.append(b"x" * 1000)
        assert await driver.append(b"x" * 980) == 1
        await driver.close()

    asyncio.run(scenario())


def test_scenario_13_writes_are_gated_on_replay_for_write() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        first = await writer(backend)
        for i in range(7):
            await first.append(b"%d" % i)
        await first.close()

        driver = open_driver(backend)
        with pytest.raises(NeedReplayForWrite):
            await driver.append(b"early")
        await driver.replay(apply_all)
        assert await driver.append(b"after") == 8
        with pytest.raises(ReplayStateError):
            await driver.replay(apply_all)
        await driver.close()

        tailing = open_driver(backend)
        started = asyncio.Event()
        tail = Recorder(on_dsn=lambda dsn: started.set())
        task = asyncio.ensure_future(tailing.replay(tail, mode=ReplayMode.FOREVER))
        await started.wait()
        with pytest.raises(ReplayStateError):
            await tailing.replay(apply_all)
        tailing.stop_tailing(ReplayMode.FOR_READ)
        await task
        with pytest.raises(NeedReplayForWrite):
            await tailing.append(b"read-only")
        await tailing.close()

    asyncio.run(scenario())


def test_a_failed_append_fails_the_driver_and_a_restart_discards_what_followed() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=4)
        backend.hold_appends = True
        (fa,), a = await dispatch(driver, backend, b"a")
        (fb,), b = await dispatch(driver, backend, b"b")
        await backend.release(b)  # B is durable at LSN 1
        await backend.fail(a)  # A never will be
        for future in (fa, fb):
            with pytest.raises(DriverFailed):
                await future
        with pytest.raises(DriverFailed):
            driver.submit(b"c")
        await driver.close()

        backend.hold_appends = False
        recorder = Recorder()
        restarted = open_driver(backend)
        summary = await restarted.replay(recorder)
        assert recorder.handled == []
        assert summary.trailing_records == 1
        assert await restarted.append(b"c") == 1  # DSN 1 reused; B is skipped for good
        await restarted.close()
        again = Recorder()
        await open_driver(backend).replay(again, mode=ReplayMode.FOR_READ)
        assert again.entries == {1: b"c"}

    asyncio.run(scenario())


def test_abort_abandons_in_flight_appends_which_may_still_land() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=4)
        backend.hold_appends = True
        (fa,), a = await dispatch(driver, backend, b"a")
        (fb,), _ = await dispatch(driver, backend, b"b")
        await driver.abort()
        for future in (fa, fb):
            with pytest.raises(DriverClosed):
                await future
        assert a.abandoned
        await backend.release(a)  # lands after the crash
        backend.hold_appends = False
        recorder = Recorder()
        restarted = open_driver(backend)
        await restarted.replay(recorder)
        assert recorder.entries == {1: b"a"}
        assert await restarted.append(b"c") == 2
        await restarted.close()

    asyncio.run(scenario())


def test_close_waits_for_accepted_appends() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend)
        backend.hold_appends = True
        (future,), held = await dispatch(driver, backend, b"a")
        closing = driver.close()  # refuses new appends at once
        with pytest.raises(DriverClosed):
            driver.submit(b"late")
        waiting = asyncio.ensure_future(closing)
        await backend.release(held)
        await waiting
        assert await future == 1  # completed, not failed: close waited for it

    asyncio.run(scenario())


def reach(recorder: Recorder, goal: list[int]) -> tuple[asyncio.Event, Callable[[int], None]]:
    event = asyncio.Event()

    def on_dsn(dsn: int) -> None:
        if dsn == goal[0]:
            event.set()

    return event, on_dsn


def test_scenario_27_tailing_reader_with_concurrent_truncation() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        producer = await writer(backend, window=16)
        goal = [1000]
        tail = Recorder()
        reached, tail.on_dsn = reach(tail, goal)
        consumer = open_driver(backend, read_batch_bytes=2048)
        tailing = asyncio.ensure_future(consumer.replay(tail, mode=ReplayMode.FOREVER))
        await asyncio.gather(*(producer.append(b"e%d" % i) for i in range(1, 1001)))
        await reached.wait()
        assert tail.handled == list(range(1, 1001))
        producer.truncate(125)
        producer.truncate(250)
        truncated_lsn = await producer.truncation_settled()
        assert truncated_lsn > 0
        reached.clear()
        goal[0] = 2000
        await asyncio.gather(*(producer.append(b"e%d" % i) for i in range(1001, 2001)))
        await reached.wait()
        assert tail.handled == list(range(1, 2001))
        assert all(tail.entries[d] == b"e%d" % d for d in tail.handled)
        assert consumer.dsn() == 2000
        # A fresh consumer whose engine checkpointed 500 sees 501..2000 applied, contiguous.
        fresh = Recorder(apply_from=501)
        await open_driver(backend).replay(fresh, mode=ReplayMode.FOR_READ)
        assert fresh.applied == list(range(501, 2001))
        assert fresh.handled[0] > 1  # the truncated prefix is gone
        tailing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await tailing
        await producer.close()

    asyncio.run(scenario())


def test_a_tail_whose_next_record_was_truncated_away_stops_with_tail_truncated() -> None:
    """Issue 25: a tailing reader that fell behind the writer's truncation must not resume
    above it (the entries in between would be a hole behind applied ones): it stops with
    `TailTruncated`, naming where it was, and its reader catches up from a checkpoint."""

    async def scenario() -> None:
        backend = MemoryBackend()
        producer = await writer(backend, window=16)
        goal = [10]
        tail = Recorder()
        reached, tail.on_dsn = reach(tail, goal)
        consumer = open_driver(backend, read_batch_bytes=64)
        tailing = asyncio.ensure_future(consumer.replay(tail, mode=ReplayMode.FOREVER))
        await asyncio.gather(*(producer.append(b"e%d" % i) for i in range(1, 11)))
        await reached.wait()
        hold = asyncio.Event()
        read = backend.read

        async def held_read(first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
            await hold.wait()  # the reader is paused
            return await read(first_lsn, max_bytes)

        backend.read = held_read  # type: ignore[method-assign]
        await asyncio.gather(*(producer.append(b"e%d" % i) for i in range(11, 101)))
        producer.truncate(90)
        truncated_lsn = await producer.truncation_settled()
        hold.set()
        with pytest.raises(TailTruncated) as caught:
            await tailing
        assert caught.value.truncated_lsn == truncated_lsn
        assert caught.value.next_lsn <= truncated_lsn
        assert caught.value.last_dsn == 10
        assert tail.handled == list(range(1, 11))  # nothing applied past the hole
        await producer.close()

    asyncio.run(scenario())


def test_scenario_28_a_tailing_reader_is_promoted_to_writer() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        producer = await writer(backend, window=8)
        goal = [500]
        tail = Recorder()
        reached, tail.on_dsn = reach(tail, goal)
        standby = open_driver(backend)
        tailing = asyncio.ensure_future(standby.replay(tail, mode=ReplayMode.FOREVER))
        await asyncio.gather(*(producer.append(b"p%d" % i) for i in range(500)))
        await reached.wait()
        await producer.close()
        standby.stop_tailing(ReplayMode.FOR_WRITE)
        summary = await tailing
        assert (summary.mode, summary.last_dsn, standby.writable) == (
            ReplayMode.FOR_WRITE,
            500,
            True,
        )
        dsns = await asyncio.gather(*(standby.append(b"s%d" % i) for i in range(500)))
        assert dsns == list(range(501, 1001))

        goal[0] = 1000
        second = Recorder()
        reached2, second.on_dsn = reach(second, goal)
        reader = open_driver(backend)
        tailing2 = asyncio.ensure_future(reader.replay(second, mode=ReplayMode.FOREVER))
        await reached2.wait()
        assert reader.dsn() == standby.dsn() == 1000
        reader.stop_tailing(ReplayMode.FOR_READ)
        summary2 = await tailing2
        assert (summary2.mode, summary2.last_dsn) == (ReplayMode.FOR_READ, 1000)
        assert second.handled == list(range(1, 1001))
        assert not reader.writable
        with pytest.raises(NeedReplayForWrite):
            await reader.append(b"x")
        await standby.close()
        await reader.close()

    asyncio.run(scenario())


def test_scenario_29_a_restart_rebuilds_the_lsn_map() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=8)
        await asyncio.gather(*(driver.append(b"%d" % i) for i in range(1000)))
        before = driver.lsn_map()
        dsn_before = driver.dsn()
        await driver.close()

        recorder = Recorder()
        restarted = open_driver(backend)
        await restarted.replay(recorder)
        assert recorder.handled == list(range(1, 1001))
        assert restarted.dsn() == dsn_before == 1000
        assert restarted.truncate_intent() == 0  # MO: first replayed DSN - 1
        after = restarted.lsn_map()
        assert [(k.lsn, k.start_dsn, k.end_dsn, k.safe_dsn) for k in after] == [
            (k.lsn, k.start_dsn, k.end_dsn, k.safe_dsn) for k in before
        ]
        old, new = TruncationPlanner(0, before), TruncationPlanner(0, after)
        for intent in (1, 50, 333, 999, 1000):
            assert old.walk(intent) == new.walk(intent)
        await restarted.close()

    asyncio.run(scenario())


class PlainBackend:
    """A LogBackend that cannot wake a tailing reader (no `wait_past`)."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner

    async def append(self, payload: bytes) -> int:
        return await self.inner.append(payload)

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        return await self.inner.read(first_lsn, max_bytes)

    async def truncate(self, lsn: int) -> None:
        await self.inner.truncate(lsn)

    async def truncated(self) -> int:
        return await self.inner.truncated()

    async def latest(self) -> int:
        return await self.inner.latest()

    async def close(self) -> None:
        await self.inner.close()


class FakeSleep:
    """Injected `sleep`: records each requested delay and waits for the test to end it."""

    def __init__(self) -> None:
        self.delays_ms: list[int] = []
        self.sleeping: asyncio.Future[None] | None = None
        self.asleep = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.delays_ms.append(round(seconds * 1000))
        self.sleeping = asyncio.get_running_loop().create_future()
        self.asleep.set()
        await self.sleeping

    async def wait_asleep(self) -> None:
        await self.asleep.wait()

    async def wake_and_wait_asleep(self) -> None:
        """End the current sleep, then wait until the sleeper sleeps again."""
        assert self.sleeping is not None
        self.asleep.clear()
        self.sleeping.set_result(None)
        await self.asleep.wait()


def test_a_tail_over_a_backend_without_wakeups_polls_with_back_off() -> None:
    async def scenario() -> None:
        inner = MemoryBackend()
        backend: LogBackend = PlainBackend(inner)
        producer = await writer(inner)
        sleep = FakeSleep()
        tail = Recorder()
        reader = open_driver(backend, sleep=sleep)
        tailing = asyncio.ensure_future(reader.replay(tail, mode=ReplayMode.FOREVER))
        await sleep.wait_asleep()
        for _ in range(8):
            await sleep.wake_and_wait_asleep()
        assert sleep.delays_ms == [1, 2, 4, 8, 16, 32, 64, 128, 128]
        await producer.append(b"x")  # the reader is asleep: it cannot see this yet
        assert tail.handled == []
        await sleep.wake_and_wait_asleep()  # that poll finds it and resets the back-off
        assert tail.handled == [1]
        assert sleep.delays_ms[-1] == 1
        reader.stop_tailing(ReplayMode.FOR_READ)
        await tailing
        await producer.close()

    asyncio.run(scenario())


def test_a_handle_must_answer_with_a_replay_decision() -> None:
    async def scenario() -> None:
        backend = MemoryBackend()
        producer = await writer(backend)
        await producer.append(b"x")
        await producer.close()

        def bad(dsn: int, entry: bytes) -> ReplayDecision:
            return "apply"  # type: ignore[return-value]

        with pytest.raises(TypeError):
            await open_driver(backend).replay(bad)

    asyncio.run(scenario())


def test_configuration_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        open_driver(MemoryBackend(), window=0)
    with pytest.raises(ValueError):
        open_driver(MemoryBackend(), window=10_000)


def test_skip_records_and_markers_decode_in_the_log_after_replay() -> None:
    """The skip record written by a for-write replay is a user record the next replay reads."""

    async def scenario() -> None:
        backend = MemoryBackend()
        driver = await writer(backend, window=4)
        backend.hold_appends = True
        _, a = await dispatch(driver, backend, b"a")
        _, b = await dispatch(driver, backend, b"b")
        await backend.release(b)
        await driver.abort()
        backend.hold_appends = False
        restarted = open_driver(backend)
        summary = await restarted.replay(Recorder())
        assert summary.skip_lsn is not None
        records = {r.lsn: decode(r.payload) for r in backend.records()}
        assert summary.skip_lsn in records
        assert a.lsn is None
        await restarted.close()

    asyncio.run(scenario())
