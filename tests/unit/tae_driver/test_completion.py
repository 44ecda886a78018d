"""`Driver.submit_direct`: completion without a future (tae_driver/completion.py, issue 21).

What it proves, over the memory backend holding appends so that the test decides when each
record returns (no timing): entries submitted in one turn complete in DSN order, and each
callback already sees every completion of that record done (the engine's group hold-back
relies on it); callbacks run in the turn the record returns, before any task that awaited
something else wakes (no extra loop turn), when no other record is in flight; with another
record in flight they run one turn later (so the records a backend returns in one turn are
all marked first), still in DSN order; a callback that raises reaches the loop's
exception handler and the driver carries on; a failed record and an aborted driver fail the
callbacks of every entry not yet durable, once each.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tae_driver import open_driver
from tae_driver.backends.memory import MemoryBackend
from tae_driver.completion import Completion
from tae_driver.driver import Driver
from tae_driver.errors import DriverClosed, DriverFailed
from tests.unit.tae_driver.harness import apply_all


async def writer(backend: MemoryBackend) -> Driver:
    driver = open_driver(backend)
    await driver.replay(apply_all)
    return driver


def test_completions_run_in_dsn_order_with_their_record_marked_done() -> None:
    async def main() -> None:
        backend = MemoryBackend(hold_appends=True)
        driver = await writer(backend)
        seen: list[tuple[int, list[bool]]] = []
        completions: list[Completion] = []

        def on_done(done: Completion) -> None:
            seen.append((done.result(), [c.done() for c in completions]))

        completions.extend(driver.submit_direct(b"e%d" % i, on_done) for i in range(3))
        await driver.wait_idle()
        (held,) = backend.held()
        assert seen == [] and not any(c.done() for c in completions)
        await backend.release(held)
        assert seen == [(1, [True] * 3), (2, [True] * 3), (3, [True] * 3)]
        assert [c.exception() for c in completions] == [None] * 3
        await driver.close()

    asyncio.run(main())


def test_with_another_record_in_flight_the_callbacks_run_a_turn_later() -> None:
    async def main() -> None:
        backend = MemoryBackend(hold_appends=True)
        driver = await writer(backend)
        seen: list[int] = []
        for name in (b"a", b"b"):
            driver.submit_direct(name, lambda done: seen.append(done.result()))
        await driver.wait_idle()
        driver.submit_direct(b"c", lambda done: seen.append(done.result()))
        await driver.wait_idle()
        first, second = backend.held()
        await backend.release(first)  # the second record is still in flight
        assert seen == []
        await asyncio.sleep(0)  # the turn after: a and b
        assert seen == [1, 2]
        await backend.release(second)  # nothing in flight: in that turn
        assert seen == [1, 2, 3]
        await driver.close()

    asyncio.run(main())


def test_a_raising_callback_goes_to_the_loop_and_the_driver_carries_on() -> None:
    async def main() -> None:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        backend = MemoryBackend(hold_appends=True)
        driver = await writer(backend)

        def boom(done: Completion) -> None:
            raise RuntimeError("a bug in the callback")

        later: list[int] = []
        driver.submit_direct(b"a", boom)
        driver.submit_direct(b"b", lambda done: later.append(done.result()))
        await driver.wait_idle()
        await backend.release(backend.held()[0])
        assert later == [2]
        (context,) = reported
        assert isinstance(context["exception"], RuntimeError)
        driver.submit_direct(b"c", lambda done: later.append(done.result()))
        await driver.wait_idle()
        await backend.release(backend.held()[0])
        assert later == [2, 3]
        await driver.close()

    asyncio.run(main())


def test_a_failed_record_and_an_abort_fail_every_pending_callback_once() -> None:
    async def main() -> None:
        backend = MemoryBackend(hold_appends=True)
        driver = await writer(backend)
        errors: list[BaseException | None] = []
        for i in range(2):
            driver.submit_direct(b"x%d" % i, lambda done: errors.append(done.exception()))
        await driver.wait_idle()
        await backend.fail(backend.held()[0])
        assert len(errors) == 2 and all(isinstance(e, DriverFailed) for e in errors)

        backend = MemoryBackend(hold_appends=True)
        driver = await writer(backend)
        closed: list[BaseException | None] = []
        driver.submit_direct(b"y", lambda done: closed.append(done.exception()))
        await driver.wait_idle()
        await driver.abort()
        assert len(closed) == 1 and isinstance(closed[0], DriverClosed)

    asyncio.run(main())


def test_a_fired_completion_drops_its_callback() -> None:
    """As a future drops its callbacks: the engine's callback closes over the commit whose
    waiter holds the completion, and a kept callback made every commit a reference cycle
    (tests/unit/engine/test_commit_garbage.py), whether it succeeded, failed or raised."""

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: None)
        backend = MemoryBackend(hold_appends=True)
        driver = await writer(backend)

        def boom(done: Completion) -> None:
            raise RuntimeError("a bug in the callback")

        fine = driver.submit_direct(b"a", lambda done: None)
        raising = driver.submit_direct(b"b", boom)
        await driver.wait_idle()
        assert fine.on_done is not None and raising.on_done is not None  # not fired yet
        await backend.release(backend.held()[0])
        assert fine.done() and fine.on_done is None
        assert raising.done() and raising.on_done is None
        failing = driver.submit_direct(b"c", lambda done: None)
        await driver.wait_idle()
        await backend.fail(backend.held()[0])
        assert isinstance(failing.exception(), DriverFailed) and failing.on_done is None

    asyncio.run(main())
