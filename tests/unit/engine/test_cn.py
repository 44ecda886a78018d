"""Compute nodes read exactly what the TN reads and commit through it (issue 15; engine/cn).

How: a real Engine (memory WAL, a `MemoryObjectStore` shared with the compute nodes) behind
`LocalTN`, the in-process `TNPort`. Proves: a CN's transactions commit on the TN with the
outcomes of local ones (conflicts between two CNs, duplicate keys, DDL); a CN that starts
after the TN dropped the early logtail starts from a checkpoint it reads from the object
store; a following CN applies pushed entries; and, under hypothesis, for random histories of
commits, flushes, merges, compactions, checkpoints and logtail trimming between a CN's pulls,
the CN's scan at random timestamps equals the TN's snapshot scan there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine import (
    BadInput,
    Column,
    DuplicateKey,
    Engine,
    Schema,
    SnapshotUnavailable,
    WriteConflict,
)
from engine.cn import node
from engine.cn.node import ComputeNode
from engine.cn.port import LocalTN
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

ROWS = Schema([Column("id", "int64"), Column("v", "int64", nullable=True)], primary_key=["id"])


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def rows(*ids: int, v: int = 0) -> pa.Table:
    return pa.table({"id": list(ids), "v": [v] * len(ids)}, schema=ROWS.to_arrow())


async def tn_and_store(**policy: Any) -> tuple[Engine, MemoryObjectStore]:
    objects = MemoryObjectStore()
    eng = await Engine.open(
        "unused", MemoryBackend(), objects=objects, maintenance=False, policy=Policy(**policy)
    )
    assert eng.checkpointer is not None
    eng.checkpointer.wal_reserve_entries = 0
    return eng, objects


async def table_of(view: Any) -> list[tuple[int, int | None]]:
    if "t" not in view.tables("d"):
        return []
    got = (await view.table("d", "t").scan()).to_pylist()
    return sorted((r["id"], r["v"]) for r in got)


def test_compute_nodes_commit_through_the_tn_with_local_outcomes() -> None:
    async def main() -> None:
        tn, objects = await tn_and_store()
        port = LocalTN(tn)
        first, second = ComputeNode(port, objects), ComputeNode(port, objects)
        try:
            async with first.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
                await txn.table("d", "t").insert(rows(1, 2, 3))
            async with tn.transaction() as local:  # the TN sees what the CN committed
                assert await local.table("d", "t").get(2) == {"id": 2, "v": 0}
            a = await first.begin()
            b = await second.begin()
            assert await b.table("d", "t").get(1) == {"id": 1, "v": 0}  # b pulled the DDL
            await a.table("d", "t").update([1], {"v": 10})
            await b.table("d", "t").update([1], {"v": 20})
            await a.commit()
            with pytest.raises(WriteConflict):  # first committer wins, across compute nodes
                await b.commit()
            async with second.transaction() as txn:
                with pytest.raises(DuplicateKey):  # checked locally first
                    await txn.table("d", "t").insert(rows(2))
                await txn.table("d", "t").delete([3])
                await txn.table("d", "t").insert(rows(4, v=4))
            async with second.snapshot() as view:
                assert await table_of(view) == [(1, 10), (2, 0), (4, 4)]
            async with tn.transaction() as local:
                assert await table_of(local) == [(1, 10), (2, 0), (4, 4)]
        finally:
            await first.close()
            await second.close()
            await tn.close()

    run(main)


def test_a_late_compute_node_starts_from_a_checkpoint_and_a_follower_keeps_up() -> None:
    async def main() -> None:
        tn, objects = await tn_and_store()
        async with tn.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
            await txn.table("d", "t").insert(rows(*range(100)))
        assert tn.maintenance is not None
        await tn.maintenance.settle(freeze_all=True)  # the rows in an object
        manifest = await tn.checkpoint()
        assert manifest is not None
        tn._logtail.reset(manifest.ckp_ts)  # the earlier entries left the TN's memory
        async with tn.transaction() as txn:
            await txn.table("d", "t").delete([5])
        late = ComputeNode(LocalTN(tn), objects)
        follower = ComputeNode(LocalTN(tn), objects)
        try:
            async with late.snapshot() as view:
                assert len(await table_of(view)) == 99
            assert late.checkpoints_loaded == 1
            await follower.follow()
            async with tn.transaction() as txn:
                await txn.table("d", "t").insert(rows(1000))
            for _ in range(100):
                if follower.applied_ts == tn.visible_ts:
                    break
                await asyncio.sleep(0.01)
            assert follower.applied_ts == tn.visible_ts
            pulls_before = follower.entries_applied
            async with follower.snapshot(tn.visible_ts) as view:  # no pull needed
                assert await view.table("d", "t").get(1000) == {"id": 1000, "v": 0}
            assert follower.entries_applied == pulls_before
        finally:
            await late.close()
            await follower.close()
            await tn.close()

    run(main)


async def collected_first_object(tn: Engine, objects: MemoryObjectStore) -> None:
    """90 rows flushed into an object, two thirds of them deleted (the block compacted away),
    then three checkpoints: the first object is deleted while the TN's memory still holds
    the entries that created it. The table then holds keys 60..89 and 1000..1002."""
    async with tn.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)
        await txn.table("d", "t").insert(rows(*range(90)))
    assert tn.maintenance is not None
    await tn.maintenance.settle(freeze_all=True)  # the rows in an object
    first_objects = {info.name for info in objects.list("data/")}
    assert first_objects
    async with tn.transaction() as txn:
        await txn.table("d", "t").delete(list(range(60)))  # two thirds dead: compacted
    await tn.maintenance.settle()
    for key in range(1000, 1003):  # checkpoints cover the drop; the old object is deleted
        async with tn.transaction() as txn:
            await txn.table("d", "t").insert(rows(key))
        assert await tn.checkpoint() is not None
    assert not first_objects & {info.name for info in objects.list("data/")}


async def assert_a_fresh_node_reads_it(port: LocalTN, objects: MemoryObjectStore) -> None:
    fresh = ComputeNode(port, objects)
    try:
        async with fresh.snapshot() as view:
            got = await table_of(view)
        assert [key for key, _v in got] == [*range(60, 90), 1000, 1001, 1002]
        assert fresh.checkpoints_loaded == 1
    finally:
        await fresh.close()


def test_a_fresh_compute_node_never_replays_a_block_whose_object_was_collected() -> None:
    """The soak run's ObjectNotFound: a CN starting empty pulled every entry from ts 0 while
    the TN still had them in memory, and applying an old CreateBlock looked for an object
    that a checkpoint had already let the TN delete (its block was compacted away). A CN
    below the objects' floor starts from a checkpoint instead."""

    async def main() -> None:
        tn, objects = await tn_and_store(history_retention_ms=0)  # collects at once
        try:
            await collected_first_object(tn, objects)
            assert tn._logtail.covers(0)  # the TN still holds every entry from the start
            await assert_a_fresh_node_reads_it(LocalTN(tn), objects)
        finally:
            await tn.close()

    run(main)


def test_a_compute_node_asks_again_when_the_checkpoint_it_was_sent_is_retired() -> None:
    """The soak run's second ObjectNotFound: a cold start read a checkpoint the TN retired
    meanwhile (it took two newer ones). The CN asks again and loads the newer one."""

    async def main() -> None:
        tn, objects = await tn_and_store(history_retention_ms=0)  # collects at once
        async with tn.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
            await txn.table("d", "t").insert(rows(*range(10)))
        assert await tn.checkpoint() is not None
        tn._logtail.reset(tn.visible_ts)  # a CN from 0 is sent the checkpoint
        port = LocalTN(tn)
        answers: list[str | None] = []
        ask = port.logtail

        async def logtail_then_retire(t0: int, t1: int) -> Any:
            tail = await ask(t0, t1)
            answers.append(tail.checkpoint)
            if len(answers) == 1:  # two newer checkpoints retire the one just named
                for key in (100, 101):
                    async with tn.transaction() as txn:
                        await txn.table("d", "t").insert(rows(key))
                    assert await tn.checkpoint() is not None
                tn._logtail.reset(tn.visible_ts)
            return tail

        port.logtail = logtail_then_retire  # type: ignore[method-assign]
        cn = ComputeNode(port, objects)
        try:
            async with cn.snapshot() as view:
                assert [key for key, _v in await table_of(view)] == [*range(10), 100, 101]
            assert len(answers) == 2 and answers[0] != answers[1]
            assert cn.checkpoints_loaded == 1
        finally:
            await cn.close()
            await tn.close()

    run(main)


def test_a_fresh_compute_node_reads_through_a_standby_after_the_writer_collected() -> None:
    """A standby tailing the writer learns its checkpoints from the CKP entries: a CN that
    starts on the standby is sent the writer's newest checkpoint, never entries naming
    objects the writer already deleted, nor a checkpoint from the standby's own open that
    the writer retired since."""

    async def main() -> None:
        tn, objects = await tn_and_store(history_retention_ms=0)  # collects at once
        standby = await Engine.open(
            "unused", tn._backend, objects=objects, maintenance=False, standby=True
        )
        try:
            await collected_first_object(tn, objects)
            for _ in range(500):
                if standby.visible_ts == tn.visible_ts:
                    break
                await asyncio.sleep(0.01)
            assert standby.visible_ts == tn.visible_ts
            await assert_a_fresh_node_reads_it(LocalTN(standby), objects)
        finally:
            await standby.close()
            await tn.close()

    run(main)


STEPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "insert", "delete", "update", "flush", "ckp", "trim", "pull"]),
        st.integers(0, 40),
        st.integers(1, 5),
    ),
    min_size=5,
    max_size=25,
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(STEPS, st.randoms(use_true_random=False))
def test_a_compute_node_reads_what_the_tn_reads_at_any_timestamp(
    steps: list[tuple[str, int, int]], rng: Any
) -> None:
    node.PULL_ATTEMPTS_MAX, node.PULL_RETRY_S = 2, 0.0  # an unreachable ts answers at once

    async def main() -> None:
        tn, objects = await tn_and_store(merge_l1_blocks=2, compact_deleted_fraction=0.3)
        cn = ComputeNode(LocalTN(tn), objects)
        async with tn.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        stamps = [tn.visible_ts]
        views = []
        try:
            for op, key, count in steps:
                if op in ("insert", "delete", "update"):
                    async with tn.transaction() as txn:
                        table = txn.table("d", "t")
                        keys = list(range(key, key + count))
                        if op == "insert":
                            live = {r["id"] for r in (await table.scan(columns=["id"])).to_pylist()}
                            fresh = [k for k in keys if k not in live]
                            if fresh:
                                await table.insert(rows(*fresh, v=key))
                        elif op == "delete":
                            await table.delete(keys)
                        else:
                            await table.update(keys, {"v": -key})
                    stamps.append(tn.visible_ts)
                    # Hold a view at this timestamp: the TN keeps its history for the check.
                    view_scope = tn.snapshot(tn.visible_ts)
                    views.append((tn.visible_ts, view_scope, await view_scope.__aenter__()))
                elif op == "flush":
                    assert tn.maintenance is not None
                    await tn.maintenance.settle(freeze_all=True)
                elif op == "ckp":
                    await tn.checkpoint()
                elif op == "trim":
                    newest = tn.checkpointer.newest if tn.checkpointer else None
                    if newest is not None:  # the TN forgets the entries before it
                        tn._logtail = _rebuilt(tn, newest.ckp_ts)
                else:
                    target = rng.choice(stamps)
                    reachable = _reachable(tn, cn, target)
                    try:
                        await cn.catch_up(target)
                    except SnapshotUnavailable:
                        assert not reachable, target
            # At every timestamp: the CN reads what the TN's view there reads, or, when it
            # cannot get there any more, says so.
            for ts, _, tn_view in views:
                reachable = _reachable(tn, cn, ts)
                try:
                    async with cn.snapshot(ts) as cn_view:
                        assert await table_of(cn_view) == await table_of(tn_view), ts
                except SnapshotUnavailable:
                    assert not reachable, ts
                    event("a timestamp the CN can no longer reach")
                else:
                    assert reachable, ts
                    event("compared at a timestamp")
            event(f"checkpoints loaded by the CN: {min(cn.checkpoints_loaded, 2)}")
        finally:
            for _, scope, _ in views:
                await scope.__aexit__(None, None, None)
            await cn.close()
            await tn.close()

    run(main)


def _reachable(tn: Engine, cn: ComputeNode, ts: int) -> bool:
    """Whether the CN can read at `ts`: it holds it, or can pull forward to it from where it
    is, through the TN's memory (when no entry after its position can name an object the TN
    already collected) or a checkpoint at or below `ts` that memory continues."""
    if ts <= cn.applied_ts:
        return ts >= cn._history_floor_ts
    buffer = tn._logtail
    floor = tn._objects_floor_ts  # entries from below it may name collected objects
    if buffer.covers(cn.applied_ts) and cn.applied_ts >= floor:
        return True
    retained = tn.checkpointer.retained if tn.checkpointer is not None else []
    return any(buffer.covers(m.ckp_ts) and floor <= m.ckp_ts <= ts for m in retained)


def _rebuilt(tn: Engine, ckp_ts: int) -> Any:
    """The TN's logtail with only the entries after `ckp_ts`, as if the rest was dropped."""
    from engine.logtail import LogtailBuffer

    old = tn._logtail
    kept = old.between(ckp_ts, tn.visible_ts) if old.covers(ckp_ts) else ()
    buffer = LogtailBuffer(ckp_ts if old.covers(ckp_ts) else old.base_ts, old.bytes_max)
    if not old.covers(ckp_ts):
        return old
    for entry in kept:
        buffer.append(entry, keep_after_ts=ckp_ts)
    return buffer


def test_scans_with_filters_on_a_compute_node() -> None:
    async def main() -> None:
        tn, objects = await tn_and_store()
        cn = ComputeNode(LocalTN(tn), objects)
        try:
            async with cn.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
                await txn.table("d", "t").insert(rows(*range(20), v=7))
            assert tn.maintenance is not None
            await tn.maintenance.settle(freeze_all=True)
            async with cn.snapshot() as view:
                got = await view.table("d", "t").scan(columns=["id"], filter=pc.field("id") >= 15)
                assert sorted(got.column("id").to_pylist()) == [15, 16, 17, 18, 19]
        finally:
            await cn.close()
            await tn.close()

    run(main)


class _CountingTN(LocalTN):
    """LocalTN counting its logtail answers (with the timestamp each reaches); while `gate`
    is clear an answer is held on its way back (a network round trip), and `asked` says a
    question arrived."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.asked_at: list[int] = []
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    async def logtail(self, t0: int, t1: int) -> Any:
        answer = await super().logtail(t0, t1)  # the TN answers now; it arrives later
        self.asked_at.append(answer.upto_ts)
        self.asked.set()
        await self.gate.wait()
        return answer


def test_concurrent_transactions_share_one_pull_as_new_as_each_asked() -> None:
    """Sixteen transactions begun at once ask the TN for its newest state in one or two
    pulls, not sixteen one after another; and each starts at or after the TN's visible
    timestamp when it was begun (a shared pull that asked earlier would be too old)."""

    async def main() -> None:
        eng, objects = await tn_and_store()
        port = _CountingTN(eng)
        cn = ComputeNode(port, objects)
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)

            txns = await asyncio.gather(*(cn.begin() for _ in range(16)))
            assert len(port.asked_at) <= 2, port.asked_at  # 16 one at a time before
            assert {txn.start_ts for txn in txns} == {eng.visible_ts}
            for txn in txns:
                await txn.rollback()
            # A begin while a pull's question is on its way does not join it: that answer
            # may be older than what the TN made visible since.
            asked = len(port.asked_at)
            port.gate.clear()
            port.asked.clear()
            first = asyncio.ensure_future(cn.begin())
            await asyncio.wait_for(port.asked.wait(), 10)
            assert len(port.asked_at) == asked + 1  # asked, not answered yet
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(rows(1))
            visible = eng.visible_ts
            second = asyncio.ensure_future(cn.begin())
            await asyncio.sleep(0)  # one loop turn: it began, while the first is unanswered
            port.gate.set()
            # The first pull's answer is older than what the second begin must see.
            assert port.asked_at[asked] < visible <= (await second).start_ts
            await (await first).rollback()
        finally:
            await cn.close()
            await eng.close()

    run(main)


def test_compute_nodes_given_one_name_never_answer_each_others_commits() -> None:
    """Two CNs with the same `client_id` (one cn.toml copied, or a CN restarted) each
    count their commits from 1: their origins must still differ, or the TN would answer the
    second commit as a retry of the first and drop its rows while acknowledging them."""

    async def main() -> None:
        eng, objects = await tn_and_store()
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
            for key in (1, 2):  # the second node: a copy, or the first one restarted
                cn = ComputeNode(LocalTN(eng), objects, client_id="cn-1")
                async with cn.transaction() as txn:
                    await txn.table("d", "t").insert(rows(key))
                await cn.close()
            async with eng.snapshot(eng.visible_ts) as view:
                assert await table_of(view) == [(1, 0), (2, 0)]
            with pytest.raises(BadInput):
                ComputeNode(LocalTN(eng), objects, client_id="x" * 250)
        finally:
            await eng.close()

    run(main)
