"""Phase 5 of `python -m engine.bench distributed` (engine/bench/distributed.py): a table
loaded through a TN as large write sets (the TN spills each to objects), a wait for a
checkpoint that covers it, then a compute node's cold start to its first query, measured
twice: as the TN answers a fresh node's first pull, and from the checkpoint (what a TN whose
in-memory logtail moved on answers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.bench import scan as bench_scan
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.cn.port import TNStatus
from engine.logtail import Logtail, TailEntry
from engine.objects.store import LocalDirStore
from engine.tn.local import LocalPair
from engine.writeset import Op, WriteSet

DB_NAME = "bench"
BIG_TABLE = "orders"
LOADS_IN_FLIGHT = 2
"""Load transactions sent at once: one is encoded while the TN runs the other."""
CHECKPOINT_INTERVAL_MS = 1000
"""The cold start TN's `[maintenance] checkpoint_interval_ms`."""
CHECKPOINT_WAIT_S_MAX = 120.0
"""How long the benchmark waits for a checkpoint that covers the load."""
RANGE_KEYS = 10_000


async def load_and_cold_start(
    pair: LocalPair, rows: int, load_batch_rows: int, emit: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The load (`rows` rows, `load_batch_rows` a write set) through the TN of `pair`, a wait
    for a checkpoint covering it, then the cold start twice (TN's answer, checkpoint); the
    summary's figures."""
    addresses = [pair.a]
    tn = NetworkTN(addresses, pair.token)
    try:
        loader = ComputeNode(tn, None, client_id="bench-ddl")  # not _load's origin
        try:
            async with loader.transaction() as txn:
                await txn.create_database(DB_NAME)
                await txn.create_table(DB_NAME, BIG_TABLE, bench_scan.SCHEMA)
        finally:
            await loader.close()
        load_s, last_ts = await _load(tn, rows, load_batch_rows)
        emit(
            {
                "bench": "distributed",
                "figure": "load",
                "rows": rows,
                "rows_per_txn": load_batch_rows,
                "seconds": round(load_s, 2),
                "rows_per_s": round(rows / load_s) if load_s else None,
            }
        )
        started = time.monotonic()
        checkpoint_ts = await _checkpoint_covering(tn, last_ts)
        checkpoint_wait_s = time.monotonic() - started
    finally:
        await tn.close()
    found: dict[str, Any] = {"load_s": round(load_s, 2)}
    for forced in (False, True):
        cold = await _cold_start(addresses, pair, rows, from_checkpoint=forced)
        emit(
            {
                "bench": "distributed",
                "figure": "cold_start",
                "rows": rows,
                "from_checkpoint_forced": forced,
                "checkpoint_wait_s": round(checkpoint_wait_s, 2),
                "checkpoint_covers_load": checkpoint_ts is not None,
                **cold,
            }
        )
        name = "checkpoint" if forced else "tn_answer"
        found[f"cold_start_{name}_s"] = cold["first_get_s"]
        found[f"cold_start_{name}_scan_s"] = cold["first_scan_s"]
    found["cold_start_s"] = max(found["cold_start_checkpoint_s"], found["cold_start_tn_answer_s"])
    return found


class _CheckpointFirst:
    """A `TNPort` over a `NetworkTN` that answers a compute node's first pull (from 0) with
    the TN's newest checkpoint and the entries after it: what the TN answers by itself once
    its in-memory logtail no longer reaches back to 0 (a TN that has run for a while, or
    restarted). A fresh TN still holds every entry and sends those instead."""

    def __init__(self, tn: NetworkTN) -> None:
        self._tn = tn

    async def status(self) -> TNStatus:
        return await self._tn.status()

    async def logtail(self, t0: int, t1: int) -> Logtail:
        if t0 == 0:
            checkpoints = await self._tn.checkpoints()
            if checkpoints:
                ckp_ts, name = checkpoints[-1]
                after = await self._tn.logtail(ckp_ts, t1)
                if after.checkpoint is None:
                    return Logtail(name, ckp_ts, after.entries, after.upto_ts)
                return after
        return await self._tn.logtail(t0, t1)

    async def commit(self, write_set: WriteSet) -> int:
        return await self._tn.commit(write_set)

    async def subscribe(
        self,
        on_entry: Callable[[TailEntry], None],
        *,
        on_gap: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        return await self._tn.subscribe(on_entry, on_gap=on_gap)


async def _load(tn: NetworkTN, rows: int, load_batch_rows: int) -> tuple[float, int]:
    """`rows` rows in write sets of `load_batch_rows`, LOADS_IN_FLIGHT at
    once; the seconds it took and the newest commit_ts."""
    status = await tn.status()
    newest = [0]
    slots = asyncio.Semaphore(LOADS_IN_FLIGHT)

    async def one(seq: int, first: int) -> None:
        try:
            count = min(load_batch_rows, rows - first)
            data = pa.Table.from_batches([bench_scan.batch(first, count)])
            ops = (Op("insert", DB_NAME, BIG_TABLE, rows=data),)
            # Disjoint keys: any snapshot will do; the TN checks the keys at commit.
            commit_ts = await tn.commit(WriteSet(status.visible_ts, ops, "bench-loader", seq))
            newest[0] = max(newest[0], commit_ts)
        finally:
            slots.release()

    started = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    try:
        for seq, first in enumerate(range(0, rows, load_batch_rows), start=1):
            await slots.acquire()
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            if failed:
                failed[0].result()
            tasks.append(asyncio.ensure_future(one(seq, first)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return time.monotonic() - started, newest[0]


async def _checkpoint_covering(tn: NetworkTN, ts: int) -> int | None:
    """Wait until the TN's newest checkpoint is at or past `ts`; its ckp_ts, or None after
    CHECKPOINT_WAIT_S_MAX."""
    deadline = time.monotonic() + CHECKPOINT_WAIT_S_MAX
    while time.monotonic() < deadline:
        status = await tn.status()
        if status.checkpoint_ts >= ts:
            return status.checkpoint_ts
        await asyncio.sleep(0.1)
    return None


async def _cold_start(
    addresses: list[str], pair: LocalPair, rows: int, *, from_checkpoint: bool
) -> dict[str, Any]:
    """A compute node that starts with nothing (its own client, an empty cache): seconds to
    its first point lookup's answer, then to a range scan's."""
    started = time.monotonic()
    tn = NetworkTN(addresses, pair.token)
    store = LocalDirStore(str(pair.objects), read_only=True)
    cn = ComputeNode(_CheckpointFirst(tn) if from_checkpoint else tn, store)
    try:
        key = rows // 2
        async with cn.snapshot() as view:
            row = await view.table(DB_NAME, BIG_TABLE).get(key)
        first_get_s = time.monotonic() - started
        assert row is not None and row["id"] == key, row
        lo = rows // 3
        hi = min(rows, lo + RANGE_KEYS)
        scan_started = time.monotonic()
        async with cn.snapshot() as view:
            got = await view.table(DB_NAME, BIG_TABLE).scan(
                columns=["id", "amount"],
                filter=(pc.field("id") >= lo) & (pc.field("id") < hi),
            )
        scan_s = time.monotonic() - scan_started
        assert got.num_rows == hi - lo, (got.num_rows, lo, hi)
        async with cn.snapshot() as view:  # the first and last loaded keys: the whole load
            table = view.table(DB_NAME, BIG_TABLE)
            assert await table.get(0) is not None and await table.get(rows - 1) is not None
        return {
            "first_get_s": round(first_get_s, 3),
            "first_scan_s": round(first_get_s + scan_s, 3),
            "range_scan_ms": round(scan_s * 1000, 1),
            "range_rows": got.num_rows,
            "checkpoints_loaded": cn.checkpoints_loaded,
            "entries_applied": cn.entries_applied,
        }
    finally:
        await cn.close()
        await tn.close()
        store.close()
