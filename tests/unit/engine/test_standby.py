"""A standby's tail of the WAL, supervised (issue 25, engine/standby.py, decision 0008).

Proves, in-process over one memory WAL and object store shared by a writer and a standby:
a standby whose reads are held back while the writer checkpoints and truncates past its
position catches up from the newest checkpoint (never applying an entry over a hole), ends
with the writer's exact state, and takes over with every commit there; a tail that fails
for another reason says so at once (`standby_failure`, the TN's role `failed`), retries, and
says `standby` again once it reads; one that keeps failing without progress gives up with
`StandbyFailed`, and cannot be promoted. The retry policy is driven by itself, no I/O.

The standby's reads go through `GatedReads`, a test double of the `LogBackend` port around
the shared `MemoryBackend`: closing its gate is the SIGSTOP of the real-process test
(tests/e2e/test_tn_processes.py), and it can fail reads on demand.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pytest

from engine import Column, Engine, Schema, StandbyFailed, metrics
from engine import standby as standby_module
from engine.blockstore import ObjectBlockStore
from engine.objects.store import MemoryObjectStore
from engine.standby import TailRetries
from engine.tn.service import TNService
from tae_driver.backend import Record
from tae_driver.backends.memory import MemoryBackend
from tae_driver.errors import BackendUnavailable

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
WAIT_S_MAX = 20.0


class GatedReads:
    """The standby's view of the shared WAL: reads wait while the gate is closed, and the
    next `failures` reads raise `BackendUnavailable`; everything else is the backend's."""

    def __init__(self, backend: MemoryBackend) -> None:
        self._backend = backend
        self.gate = asyncio.Event()
        self.gate.set()
        self.failures = 0
        self.reads_waiting = 0

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        if not self.gate.is_set():
            self.reads_waiting += 1
            await self.gate.wait()
            self.reads_waiting -= 1
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("the log service did not answer (injected)")
        return await self._backend.read(first_lsn, max_bytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"v{i}" for i in ids]}, schema=ROWS.to_arrow())


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S_MAX
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def pair() -> tuple[MemoryBackend, MemoryObjectStore, Engine, GatedReads, Engine]:
    wal, objects = MemoryBackend(), MemoryObjectStore()
    # No history window (decision 0010): each checkpoint truncates the WAL right at itself.
    active = await Engine.open(
        "unused",
        wal,
        objects=objects,
        maintenance=False,
        history_retention=datetime.timedelta(0),
    )
    assert active.checkpointer is not None
    active.checkpointer.wal_reserve_entries = 0  # truncate right at each checkpoint
    async with active.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
    reads = GatedReads(wal)
    standby = await Engine.open(
        "unused",
        reads,  # a LogBackend by duck typing
        objects=objects,
        maintenance=False,
        standby=True,
    )
    await until(lambda: standby.visible_ts == active.visible_ts, "the standby to follow")
    return wal, objects, active, reads, standby


async def commit_rows(eng: Engine, ids: range) -> None:
    for i in ids:
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert(rows(i))


async def ids_of(eng: Engine) -> list[int]:
    async with eng.transaction() as txn:
        got = await txn.table("d", "t").scan(columns=["id"])
    return sorted(got.column("id").to_pylist())


def test_a_standby_behind_the_truncation_catches_up_from_the_checkpoint_and_takes_over() -> None:
    async def main() -> None:
        _wal, _objects, active, reads, standby = await pair()
        try:
            reads.gate.clear()  # the standby is paused: it reads nothing
            await commit_rows(active, range(1000, 1001))
            await until(lambda: reads.reads_waiting == 1, "the standby's read to be held")
            for round_ in range(3):  # several checkpoints, each truncating past the standby
                await commit_rows(active, range(round_ * 10, round_ * 10 + 10))
                assert await active.checkpoint() is not None
            await commit_rows(active, range(100, 105))  # and entries after the last one
            truncated_dsn = active.driver_stats().truncate_intent_dsn
            assert truncated_dsn > standby._visible_dsn + 1
            await until(lambda: active.driver_stats().truncated_lsn > 0, "the truncation")
            assert standby.standby_failure is None
            reads.gate.set()
            await until(lambda: standby.visible_ts == active.visible_ts, "the catch-up")
            tail = standby._standby_tail
            assert tail is not None
            assert tail.catchups >= 1 and tail.failures == 0
            assert standby.standby_failure is None
            assert standby.digest() == active.digest()
            assert TNService(standby).role == "standby"
            assert "engine_standby_catchups_total 1.0" in metrics.render(standby)
            expected = await ids_of(active)
            await active.abort()  # the writer dies; the standby takes over
            await standby.promote()
            await commit_rows(standby, range(200, 202))
            assert await ids_of(standby) == sorted([*expected, 200, 201])
        finally:
            await standby.close()
            await active.close()

    run(main)


def test_a_failing_tail_says_failed_at_once_retries_and_recovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(standby_module, "TailRetries", lambda: TailRetries(3, 50, 50))

    async def main() -> None:
        _wal, _objects, active, reads, standby = await pair()
        try:
            service = TNService(standby)
            reads.failures = 2  # the next two reads fail: two failed attempts, then it works
            await commit_rows(active, range(5))
            await until(lambda: service.role == "failed", "the failure to show")
            assert "BackendUnavailable" in (standby.standby_failure or "")
            assert "engine_standby_tail_failed 1.0" in metrics.render(standby)
            await until(lambda: standby.visible_ts == active.visible_ts, "the retry")
            await until(lambda: service.role == "standby", "the recovery to show")
            tail = standby._standby_tail
            assert tail is not None and tail.failures == 2 and tail.gave_up is None
            assert standby.digest() == active.digest()
            assert "engine_standby_tail_failed 0.0" in metrics.render(standby)
        finally:
            await standby.close()
            await active.close()

    run(main)


def test_a_tail_that_keeps_failing_gives_up_and_cannot_be_promoted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(standby_module, "TailRetries", lambda: TailRetries(2, 1, 2))

    async def main() -> None:
        _wal, _objects, active, reads, standby = await pair()
        try:
            reads.failures = 10**6
            await commit_rows(active, range(3))
            await until(lambda: standby.standby_gave_up is not None, "the tail to give up")
            assert isinstance(standby.standby_gave_up, StandbyFailed)
            assert "failed 2 times" in str(standby.standby_gave_up)
            assert TNService(standby).role == "failed"
            with pytest.raises(StandbyFailed):
                await standby.promote()
        finally:
            await standby.close()
            await active.close()

    run(main)


def test_the_retry_policy_backs_off_gives_up_and_starts_again_after_progress() -> None:
    retries = TailRetries(attempts_max=3, delay_ms_min=100, delay_ms_max=250)
    assert retries.failed(10) == 100
    assert retries.failed(10) == 200
    assert retries.failed(10) == 250  # capped
    assert retries.failed(10) is None  # three without progress: give up
    again = TailRetries(attempts_max=2, delay_ms_min=100, delay_ms_max=1000)
    assert again.failed(10) == 100
    assert again.failed(10) == 200
    assert again.failed(11) == 100  # it moved on since: the count starts again
    assert again.failed(11) == 200
    assert again.failed(11) is None


def test_the_orphan_collection_keeps_objects_a_restart_still_needs() -> None:
    """Objects whose blocks were created and dropped after the newest checkpoint wait for a
    checkpoint to cover the drop (a restart replays their creation). The orphan collection
    (at open and at a standby's promotion) must not take them for orphans: else a crash
    before the next checkpoint leaves an engine that cannot reopen. Driven on a writer that
    holds such an object, so the rule is tested whatever collects when."""

    async def main() -> None:
        wal, objects, active, _reads, standby = await pair()
        await standby.close()
        assert active.maintenance is not None and active.checkpointer is not None
        await commit_rows(active, range(3))
        assert await active.checkpoint() is not None
        async with active.transaction() as txn:
            await txn.table("d", "t").insert(rows(*range(100, 190)))
        await active.maintenance.settle(freeze_all=True)  # an object after the checkpoint
        flushed = {info.name for info in objects.list("data/")}
        async with active.transaction() as txn:  # two thirds dead: compacted, dropped
            await txn.table("d", "t").delete(list(range(100, 160)))
        await active.maintenance.settle()
        await commit_rows(active, range(5, 10))
        store = active._block_store
        assert isinstance(store, ObjectBlockStore) and flushed <= store.pending_names()
        assert await active.checkpointer.collect_orphans() == 0
        digest = active.digest()
        await active.abort()  # a crash before the next checkpoint
        again = await Engine.open("unused", wal, objects=objects, maintenance=False)
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    run(main)
