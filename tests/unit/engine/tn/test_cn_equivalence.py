"""Hypothesis (issue 15 "Tests that must exist"): for random transaction histories and random
timestamps, a compute node's scan at ts over the network equals the TN's own snapshot scan
at ts, including across flushes, merges, checkpoints and the TN's logtail buffer losing its
oldest entries (as WAL truncation does) between the CN's pulls. (A CN that is behind the
buffer is sent a checkpoint: it reads from that checkpoint on, as the TN's answer says.)

How: a real Engine (memory WAL, memory objects shared with the CN as an object store would
be) served by a real TNServer on loopback; a ComputeNode over NetworkTN reads at timestamps
drawn from the history, some while it follows by subscription; a second, fresh compute node
reads every readable timestamp at the end. Rewrites run through `maintenance.step()` with a
policy that merges every two L1 blocks. Bounded: 60 examples of at most 25 steps (about a second).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Column, DuplicateKey, Engine, Schema
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from engine.tn.limits import ClientOptions
from engine.tn.server import TNServer
from engine.tn.service import TNService
from tae_driver.backends.memory import MemoryBackend

pytestmark = pytest.mark.timeout(120)

TOKEN = "tn-test-token-0123"
ROWS = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], primary_key=["id"])
OPTIONS = ClientOptions(connect_timeout_s=1.0, request_timeout_s=5.0, failover_wait_s_max=2.0)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 40), min_size=1, max_size=6)),
        st.tuples(st.just("delete"), st.lists(st.integers(0, 40), min_size=1, max_size=4)),
        st.tuples(st.just("update"), st.lists(st.integers(0, 40), min_size=1, max_size=3)),
        st.tuples(st.just("cn_commit"), st.lists(st.integers(41, 60), min_size=1, max_size=3)),
        st.tuples(st.just("rewrite"), st.just([])),
        st.tuples(st.just("checkpoint"), st.just([])),
        st.tuples(st.just("truncate"), st.just([])),
        st.tuples(st.just("read"), st.just([])),
        st.tuples(st.just("follow"), st.just([])),
    ),
    min_size=1,
    max_size=25,
)


def rows(ids: list[int], tag: str) -> pa.Table:
    unique = sorted(set(ids))
    return pa.table({"id": unique, "v": [f"{tag}{i}" for i in unique]}, schema=ROWS.to_arrow())


async def scan(view: Any) -> list[dict[str, Any]]:
    if "t" not in view.tables("d"):
        return []
    table = await view.table("d", "t").scan()
    return sorted(table.to_pylist(), key=lambda row: row["id"])


async def same_at(cn: ComputeNode, engine: Engine, ts: int) -> None:
    async with cn.snapshot(ts) as mine, engine.snapshot(ts) as theirs:
        assert await scan(mine) == await scan(theirs), ts


async def history(actions: list[tuple[str, list[int]]], seed: int) -> None:
    rng = random.Random(seed)
    objects = MemoryObjectStore()
    engine = await Engine.open(
        "unused",
        MemoryBackend(),
        objects=objects,
        maintenance=False,
        policy=Policy(merge_l1_blocks=2),
    )
    server = TNServer(TNService(engine), TOKEN)
    await server.start("127.0.0.1", 0)
    client = NetworkTN([f"127.0.0.1:{server.port}"], TOKEN, OPTIONS)
    cn = ComputeNode(client, objects)
    try:
        async with engine.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        stamps = [engine.visible_ts]
        for number, (kind, ids) in enumerate(actions):
            if kind in ("insert", "delete", "update"):
                try:
                    async with engine.transaction() as txn:
                        table = txn.table("d", "t")
                        if kind == "insert":
                            await table.insert(rows(ids, f"s{number}-"))
                        elif kind == "delete":
                            await table.delete(ids)
                        else:
                            await table.update(ids, {"v": f"u{number}"})
                except DuplicateKey:
                    continue
            elif kind == "cn_commit":
                try:
                    async with cn.transaction() as txn:
                        await txn.table("d", "t").insert(rows(ids, f"cn{number}-"))
                except DuplicateKey:
                    continue
            elif kind == "rewrite":
                maintenance = engine.maintenance
                assert maintenance is not None
                await asyncio.gather(*maintenance.step(freeze_all=True))
                await asyncio.gather(*maintenance.step())  # merges of what was flushed
            elif kind == "checkpoint":
                await engine.checkpoint()
            elif kind == "truncate":
                manifest = await engine.checkpoint()
                newest = engine.checkpointer.newest if engine.checkpointer else None
                if manifest is None and newest is None:
                    continue
                # The buffer forgets what precedes the newest checkpoint, as it does once
                # it passes its bound: a CN behind it must start from the checkpoint.
                engine._logtail.reset((manifest or newest).ckp_ts)  # type: ignore[union-attr]
            elif kind == "follow":
                await cn.follow()
            else:
                # What the CN can serve: its own history, and when it is behind the TN's
                # buffer, what follows the checkpoint it will be sent (none older exists).
                newest = engine.checkpointer.newest if engine.checkpointer else None
                behind = cn.applied_ts < engine._logtail.base_ts
                floor = max(
                    cn._history_floor_ts,
                    engine._history_floor_ts,
                    newest.ckp_ts if behind and newest is not None else 0,
                )
                readable = [ts for ts in stamps if ts >= floor]
                if readable:
                    await same_at(cn, engine, rng.choice(readable))
            stamps.append(engine.visible_ts)
        fresh = ComputeNode(client, objects)
        try:
            await fresh.catch_up()
            floor = max(fresh._history_floor_ts, engine._history_floor_ts)
            for ts in stamps:
                if ts >= floor:
                    await same_at(fresh, engine, ts)
        finally:
            await fresh.close()
    finally:
        await cn.close()
        await client.close()
        await server.close()
        await engine.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps, st.integers(0, 2**32))
def test_a_cn_scan_at_ts_equals_the_tn_snapshot_scan_at_ts(
    actions: list[tuple[str, list[int]]], seed: int
) -> None:
    asyncio.run(asyncio.wait_for(history(actions, seed), 60))
