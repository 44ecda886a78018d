"""Time travel by timestamp and wall time, and the history retention window (issue 24 items
2-3, decision 0010).

What it proves: inside the window a snapshot at any past timestamp returns exactly the rows
the engine had then, after flushes, merges, compactions, checkpoints, the collection of
dropped blocks and restarts (clean or a crash); outside it `SnapshotUnavailable` names the
oldest readable timestamp; a timestamp or wall time past what has happened is
`TimestampInFuture`; a wall time resolves repeatably; a window of 0 behaves as before; the
WAL and the objects are collected once they fall out of the window. How: an in-memory WAL and
object store, maintenance driven by hand, and the engine's injectable clock (`now_ms`) moved
by the test, so the window passes without waiting.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path

import pytest

from engine import (
    Column,
    Engine,
    Overloaded,
    Schema,
    SnapshotUnavailable,
    SyncEngine,
    TimestampInFuture,
    limits,
    metrics,
)
from engine.checkpoint import files, layout, retention
from engine.clock import TS_MAX, ts_at_wall_ms, ts_datetime
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
BLOCK = limits.BLOCK_ROWS_MAX
START_MS = 1_795_694_400_000  # 2026-11-26T12:00:00Z
HOUR = datetime.timedelta(hours=1)
# Merge every 2 L1 blocks, compact a block a tenth dead: every kind of rewrite happens.
POLICY = Policy(merge_l1_blocks=2, compact_deleted_fraction=0.1)


class Clock:
    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


def rows(ids: range | list[int], tag: str = "v") -> list[dict[str, object]]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


async def open_engine(
    wal: MemoryBackend,
    objects: MemoryObjectStore,
    clock: Clock,
    window: datetime.timedelta = HOUR,
) -> Engine:
    eng = await Engine.open(
        "unused",
        wal,
        objects=objects,
        maintenance=False,
        policy=POLICY,
        now_ms=clock,
        history_retention=window,
    )
    assert eng.checkpointer is not None
    eng.checkpointer.wal_reserve_entries = 0  # the WAL is kept by the window alone
    return eng


async def commit(eng: Engine, clock: Clock, insert: list[int], delete: list[int]) -> int:
    clock.now += 1000
    async with eng.transaction() as txn:
        table = txn.table("d", "t")
        if insert:
            await table.insert(rows(insert, tag=f"{clock.now}-"))
        if delete:
            await table.delete(delete)
    return eng.visible_ts


async def scan_at(eng: Engine, ts: int | datetime.datetime) -> list[dict[str, object]]:
    async with eng.snapshot(at=ts) as view:
        table = await view.table("d", "t").scan()
    return sorted(table.to_pylist(), key=lambda row: int(row["id"]))


async def create_table(eng: Engine) -> None:
    """Table d.t of ROWS, empty."""
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)


async def history(eng: Engine, clock: Clock) -> dict[int, list[dict[str, object]]]:
    """Commits with every kind of rewrite and a checkpoint between them; the rows seen at
    each commit's timestamp, as the engine had them then."""
    await create_table(eng)
    maintenance = eng.maintenance
    assert maintenance is not None
    seen: dict[int, list[dict[str, object]]] = {}
    next_id = 0
    for round_ in range(6):
        ts = await commit(eng, clock, list(range(next_id, next_id + BLOCK // 2)), [])
        next_id += BLOCK // 2
        seen[ts] = await scan_at(eng, ts)
        # A quarter of the rows the previous round flushed: a compaction's worth.
        low = max(0, round_ - 1) * (BLOCK // 2) + 3
        dead = list(range(low, low + BLOCK // 8)) if round_ else []
        ts = await commit(eng, clock, [10**9 + round_], dead)
        seen[ts] = await scan_at(eng, ts)
        await maintenance.settle(freeze_all=True)  # flush, merge, compact; collect drops
        if round_ % 2 == 1:
            assert await eng.checkpoint() is not None
    assert sum(maintenance.rewrites_done.values()) >= 6
    assert maintenance.rewrites_done["merge"] >= 1 and maintenance.rewrites_done["compact"] >= 1
    return seen


def test_snapshots_in_the_window_return_the_state_of_then_across_rewrites_and_restarts() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        seen = await history(eng, clock)
        first = min(seen)
        # Rewrites collected the blocks the first commits were read from: the memory no
        # longer holds that history; the window rebuilds it.
        assert eng._history_floor_ts > first
        for ts, expected in seen.items():
            assert await scan_at(eng, ts) == expected, ts
        await eng.close()

        again = await open_engine(wal, objects, clock)
        assert again._history_floor_ts > first  # restored from the newest checkpoint
        assert again.oldest_ts <= first
        for ts, expected in seen.items():
            assert await scan_at(again, ts) == expected, ts
        await again.abort()  # a crash: the next open replays what was durable

        crashed = await open_engine(wal, objects, clock)
        try:
            for ts, expected in sorted(seen.items(), reverse=True):
                assert await scan_at(crashed, ts) == expected, ts
        finally:
            await crashed.close()

    asyncio.run(main())


def test_a_snapshot_at_a_wall_time_reads_every_commit_issued_by_then() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        try:
            await create_table(eng)
            one = await commit(eng, clock, [1], [])
            wall_one = ts_datetime(one)
            two = await commit(eng, clock, [2], [])
            assert await scan_at(eng, wall_one) == await scan_at(eng, one)
            # A millisecond later than the first commit and before the second: the first.
            between = wall_one + datetime.timedelta(milliseconds=1)
            assert [r["id"] for r in await scan_at(eng, between)] == [1]
            # Past the last commit (no commit since): the newest state, the same each time.
            clock.now += 5000
            later = ts_datetime(two) + datetime.timedelta(seconds=2)
            assert [r["id"] for r in await scan_at(eng, later)] == [1, 2]
            assert [r["id"] for r in await scan_at(eng, later)] == [1, 2]
            # In another zone, the same instant.
            plus_one = later.astimezone(datetime.timezone(datetime.timedelta(hours=1)))
            assert [r["id"] for r in await scan_at(eng, plus_one)] == [1, 2]
            async with eng.snapshot(at=between) as view:  # the snapshot's own timestamp
                assert view.start_ts == ts_at_wall_ms(START_MS + 1001)
            # The wall clock went back: a wall time the clock already issued timestamps past
            # is not in the future (no new commit can land at or below it)...
            await commit(eng, clock, [3], [])
            clock.now -= 60_000
            assert [r["id"] for r in await scan_at(eng, ts_datetime(two))] == [1, 2]
            # ...but the newest commit's millisecond is: the next commit continues in it.
            with pytest.raises(TimestampInFuture):
                await scan_at(eng, ts_datetime(eng.visible_ts))
        finally:
            await eng.close()

    asyncio.run(main())


def test_a_wall_time_waits_for_commits_in_flight_below_it() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        try:
            await create_table(eng)
            clock.now += 1000
            in_flight = asyncio.get_running_loop().create_task(commit(eng, clock, [7], []))
            for _ in range(1000):  # until it is prepared (in the pipeline), not visible
                if len(eng._pipeline):
                    break
                await asyncio.sleep(0)
            assert len(eng._pipeline) == 1
            (ticket,) = eng._pipeline.queued()
            assert ticket.commit_ts > eng.visible_ts
            clock.now += 1000
            # The commit's millisecond is past: the snapshot must hold it, not the state
            # visible a moment before it landed (which a later read would contradict).
            assert [r["id"] for r in await scan_at(eng, ts_datetime(ticket.commit_ts))] == [7]
            await in_flight
        finally:
            await eng.close()

    asyncio.run(main())


def test_a_timestamp_or_wall_time_in_the_future_is_its_own_error() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
            with pytest.raises(TimestampInFuture, match="in the future") as raised:
                async with eng.snapshot(eng.visible_ts + 1):
                    pass
            assert raised.value.newest_ts == eng.visible_ts
            tomorrow = ts_datetime(ts_at_wall_ms(START_MS)) + datetime.timedelta(days=1)
            with pytest.raises(TimestampInFuture, match="engine's clock"):
                async with eng.snapshot(at=tomorrow):
                    pass
            with pytest.raises(TimestampInFuture):
                await eng.begin_at(tomorrow)
            with pytest.raises(SnapshotUnavailable):  # the parent: old callers still catch it
                async with eng.snapshot(TS_MAX):
                    pass
        finally:
            await eng.close()

    asyncio.run(main())


def test_outside_the_window_the_error_names_the_oldest_readable_timestamp() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        try:
            seen = await history(eng, clock)
            first = min(seen)
            clock.now += 2 * 3_600_000  # the whole history falls out of the window
            for id_ in range(3):  # checkpoints move the window's anchor
                await commit(eng, clock, [2 * 10**9 + id_], [])
                assert await eng.checkpoint() is not None
            oldest = eng.oldest_ts
            assert oldest > max(seen)
            with pytest.raises(SnapshotUnavailable) as raised:
                async with eng.snapshot(first):
                    pass
            assert raised.value.oldest_ts == oldest
            assert str(oldest) in str(raised.value)
            assert "compacted" not in str(raised.value)
            await scan_at(eng, oldest)  # the oldest readable one is readable
        finally:
            await eng.close()

    asyncio.run(main())


def test_the_wal_and_objects_are_kept_through_the_window_then_collected() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        try:
            await history(eng, clock)
            checkpointer = eng.checkpointer
            assert checkpointer is not None
            data = {i.name for i in objects.list("data/")}
            held = {
                b.object_name
                for t in eng._state.catalog.tables.values()
                for b in t.data.blocks.values()
                if hasattr(b, "object_name")
            }
            # Inside the window: objects of dropped blocks, the whole WAL and every
            # checkpoint stay.
            assert data - held, "no rewrite dropped an object?"
            assert await wal.truncated() == 0
            assert len(checkpointer.retained) == 3
            old_newest = checkpointer.retained[-1].ckp_ts
            at_anchor = await scan_at(eng, old_newest)
            clock.now += 2 * 3_600_000
            new = []
            for id_ in range(2):
                await commit(eng, clock, [2 * 10**9 + id_], [])
                await eng.maintenance.settle()  # type: ignore[union-attr]
                manifest = await eng.checkpoint()
                assert manifest is not None
                new.append(manifest.ckp_ts)
            await eng._driver.truncation_settled()
            # Out of the window: what only the old history needed is gone.
            left = {i.name for i in objects.list("data/")}
            assert not (data - held) & left
            # The window starts an hour ago: the newest checkpoint of the old history is its
            # anchor (the state then), kept with the two new ones; the older ones went.
            assert [m.ckp_ts for m in checkpointer.retained] == [old_newest, *new]
            assert checkpointer.anchor is not None
            assert checkpointer.anchor.ckp_ts == old_newest
            assert await wal.truncated() > 0
            # ...and the window's start is still readable, from the anchor and the WAL kept
            # after it (memory no longer holds it).
            assert eng._history_floor_ts > old_newest + 1
            assert eng.oldest_ts == old_newest
            shown = dict(
                line.split(" ") for line in metrics.render(eng).splitlines() if line[0] != "#"
            )
            assert float(shown["engine_history_retention_seconds"]) == 3600
            oldest_s = float(shown["engine_history_oldest_timestamp_seconds"])
            assert oldest_s == (old_newest >> 16) / 1000
            assert await scan_at(eng, old_newest + 1) == at_anchor
        finally:
            await eng.close()

    asyncio.run(main())


def test_a_window_of_zero_keeps_only_what_the_newest_checkpoint_covers() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        no_window = datetime.timedelta(0)
        eng = await open_engine(wal, objects, clock, no_window)
        seen = await history(eng, clock)
        with pytest.raises(SnapshotUnavailable) as raised:
            async with eng.snapshot(min(seen)):
                pass
        assert raised.value.oldest_ts == eng._history_floor_ts
        assert "history_retention is 0" in str(raised.value)
        await eng.close()
        again = await open_engine(wal, objects, clock, no_window)
        try:
            newest = again.checkpointer.newest  # type: ignore[union-attr]
            assert newest is not None and again.oldest_ts == newest.ckp_ts
            with pytest.raises(SnapshotUnavailable, match=str(newest.ckp_ts)):
                async with again.snapshot(newest.ckp_ts - 1):
                    pass
        finally:
            await again.close()

    asyncio.run(main())


def test_history_retention_is_checked() -> None:
    async def main() -> None:
        with pytest.raises(Exception, match="history_retention"):
            await Engine.open("unused", "memory", history_retention=-HOUR)
        with pytest.raises(Exception, match="history_retention"):
            await Engine.open("unused", "memory", history_retention=3600)  # type: ignore[arg-type]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("ckp_ts", "cutoff", "count_max", "kept", "anchor"),
    [
        ([10, 20, 30, 40], TS_MAX, 256, (2, 3), 3),  # no window: the newest two
        ([10, 20, 30, 40], 25, 256, (1, 2, 3), 1),  # the newest at or below the cutoff on
        ([10, 20, 30, 40], 5, 256, (0, 1, 2, 3), None),  # all newer than the cutoff: all
        ([10, 20, 30, 40], 40, 256, (2, 3), 3),
        # Thinned: the anchor and the newest two stay; 20 (neighbours 10 and 25) goes first.
        ([10, 20, 25, 40, 50], 10, 4, (0, 2, 3, 4), 0),
        ([10, 20, 25, 40, 50], 5, 3, (0, 3, 4), None),
    ],
)
def test_which_checkpoints_the_window_keeps(
    ckp_ts: list[int], cutoff: int, count_max: int, kept: tuple[int, ...], anchor: int | None
) -> None:
    found = retention.keep(ckp_ts, cutoff, count_max=count_max)
    assert found is not None
    assert found.indices == kept
    assert found.anchor == anchor


def test_a_read_only_open_beside_the_files_reads_history_below_the_newest_checkpoint(
    tmp_path: Path,
) -> None:
    """What `python -m engine scan --at` will do: a read-only engine over a file WAL and a
    directory of objects rebuilds a past state from a kept checkpoint and the WAL."""

    async def main() -> None:
        clock = Clock()
        eng = await Engine.open(
            str(tmp_path), maintenance=False, policy=POLICY, now_ms=clock, history_retention=HOUR
        )
        seen = await history(eng, clock)
        await eng.close()
        ro = await Engine.open(str(tmp_path), read_only=True, now_ms=clock)
        try:
            newest = ro.checkpointer.newest  # type: ignore[union-attr]
            assert newest is not None and ro._history_floor_ts == newest.ckp_ts
            for ts in sorted(seen)[:4]:
                assert ts < newest.ckp_ts
                assert await scan_at(ro, ts) == seen[ts], ts
        finally:
            await ro.close()

    asyncio.run(main())


def test_the_sync_engine_takes_a_wall_time(tmp_path: Path) -> None:
    clock = Clock()
    eng = SyncEngine.open(str(tmp_path), wal="memory", now_ms=clock)
    try:
        with eng.transaction() as txn:
            txn.create_database("d")
            txn.create_table("d", "t", ROWS)
        clock.now += 1000
        with eng.transaction() as txn:
            txn.table("d", "t").insert(rows([1]))
        then = ts_datetime(eng.visible_ts)
        clock.now += 1000
        with eng.transaction() as txn:
            txn.table("d", "t").insert(rows([2]))
        with eng.snapshot(at=then) as view:
            assert view.table("d", "t").scan().column("id").to_pylist() == [1]
        with pytest.raises(TimestampInFuture), eng.snapshot(at=then + datetime.timedelta(days=1)):
            pass
    finally:
        eng.close()


def test_an_open_historical_snapshot_keeps_what_it_reads_while_the_window_moves_on() -> None:
    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        try:
            seen = await history(eng, clock)
            ts = sorted(seen)[3]
            assert ts < eng._history_floor_ts  # rebuilt from a checkpoint and the WAL
            async with eng.snapshot(ts) as view:
                clock.now += 2 * 3_600_000  # the snapshot's time leaves the window...
                for id_ in range(3):  # ...and checkpoints would collect what it reads
                    await commit(eng, clock, [2 * 10**9 + id_], [])
                    await eng.maintenance.settle()  # type: ignore[union-attr]
                    assert await eng.checkpoint() is not None
                got = await view.table("d", "t").scan()
                assert sorted(got.to_pylist(), key=lambda r: int(r["id"])) == seen[ts]
            with pytest.raises(Overloaded):
                async with eng.snapshot(ts), eng.snapshot(ts), eng.snapshot(ts):
                    pass
            # Closed: the window moves on at the next checkpoint, and the time is gone.
            await commit(eng, clock, [3 * 10**9], [])
            assert await eng.checkpoint() is not None
            with pytest.raises(SnapshotUnavailable):
                async with eng.snapshot(ts):
                    pass
        finally:
            await eng.close()

    asyncio.run(main())


def test_two_checkpoints_of_one_timestamp_open() -> None:
    """Two checkpoints can share a ckp_ts (a crash after one was written and before the WAL
    named it, then the same state checkpointed again): an engine under a window opens from
    them, keeping one per timestamp (the retention core wants them strictly rising; the
    model test's crash steps met this)."""

    async def main() -> None:
        wal, objects, clock = MemoryBackend(), MemoryObjectStore(), Clock()
        eng = await open_engine(wal, objects, clock)
        await create_table(eng)
        await commit(eng, clock, [1, 2], [])
        first = await eng.checkpoint()
        await commit(eng, clock, [3], [])
        second = await eng.checkpoint()
        assert first is not None and second is not None
        await eng.close()
        # The older checkpoint again, whole, under a second tag of the same ckp_ts.
        old_dir = first.directory
        new_dir = f"{old_dir.rstrip('/').rsplit('-', 1)[0]}-ffffffff/"
        for info in objects.list(old_dir):
            data = objects.get(info.name)
            if info.name.endswith("manifest.json"):
                body = json.loads(data)
                body.pop("checksum")
                body = json.loads(json.dumps(body).replace(old_dir, new_dir))
                body["checksum"] = layout._checksum(body)
                data = json.dumps(body).encode()
            objects.put(new_dir + info.name[len(old_dir) :], data)
        assert len(files.manifests(objects)) == 3
        eng = await open_engine(wal, objects, clock)
        assert [row["id"] for row in await scan_at(eng, eng.visible_ts)] == [1, 2, 3]
        assert eng.checkpointer is not None
        retained = [m.ckp_ts for m in eng.checkpointer.retained]
        assert retained == sorted(set(retained))
        await eng.close()

    asyncio.run(main())
