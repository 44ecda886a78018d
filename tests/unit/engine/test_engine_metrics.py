"""The engine's storage figures, their Prometheus rendering, the objects audit and `python -m
engine stats` (issue 14 "Metrics for the engine ... exposed in Prometheus format, and `engine
stats DIR`").

Proves, in-process: the rendering is valid Prometheus text (parsed back with
prometheus_client's own parser) and every figure moves when the engine does what it
measures: blocks per level and rewrites on a flush and a merge; the compaction backlog when a
block is sealed and once it is flushed; the checkpoint's age, the WAL entries and bytes
retained when a checkpoint truncates the WAL; garbage pending after a merge and gone after
the checkpoint that covers it; cache hits and misses on reads. The audit finds an object
nobody refers to and one that is referred to but missing. The CLI prints the storage figures
(text and JSON) of an engine on its file WAL and directory of objects, and refuses S3 options
that are incomplete. L0 bytes after a restart from a checkpoint count the dump once, not once
per commit it holds (a bug this file found).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine import Column, Engine, Schema, cli, metrics
from engine.checkpoint import layout
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


def samples(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text body: name{labels} -> value (parsed by
    prometheus_client, so a malformed body fails here)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


async def create(eng: Engine) -> None:
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)


async def insert(eng: Engine, ids: range) -> None:
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert([{"id": i, "v": f"v{i}"} for i in ids])


def test_every_figure_moves_when_the_engine_does_what_it_measures() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        # No history window (decision 0010): a checkpoint truncates and collects at once.
        eng = await Engine.open(
            "unused",
            wal,
            objects=objects,
            policy=Policy(merge_l1_blocks=2, history_retention_ms=0),
            maintenance=False,
        )
        assert eng.checkpointer is not None and eng.maintenance is not None
        eng.checkpointer.wal_reserve_entries = 0
        await create(eng)
        await insert(eng, range(0, 100))
        first = samples(metrics.render(eng))
        assert first['engine_blocks{level="l0"}'] == 1
        assert first['engine_blocks{level="l1"}'] == first['engine_blocks{level="l2"}'] == 0
        assert first["engine_l0_bytes"] > 0
        assert first["engine_wal_entries_retained"] == 2
        assert first["engine_wal_entries_since_checkpoint"] == 2
        assert first["engine_wal_retained_bytes"] > 0
        assert "engine_checkpoint_age_seconds" not in first  # no checkpoint yet: not a zero
        assert first["engine_compaction_backlog"] == 0  # the open block is young
        assert first["engine_live_rows"] == 100

        table = next(iter(eng._state.catalog.tables.values()))
        assert table.data.freeze()  # sealed: a flush is due now
        assert samples(metrics.render(eng))["engine_compaction_backlog"] == 1
        await eng.maintenance.settle()
        await insert(eng, range(100, 200))
        await eng.maintenance.settle(freeze_all=True)  # a second L1 block: merged into L2
        flushed = samples(metrics.render(eng))
        assert flushed['engine_blocks{level="l0"}'] == 0
        assert flushed['engine_blocks{level="l1"}'] == 0
        assert flushed['engine_blocks{level="l2"}'] == 1
        assert flushed['engine_rewrites_total{kind="flush"}'] == 2
        assert flushed['engine_rewrites_total{kind="merge"}'] == 1
        assert flushed["engine_compaction_backlog"] == 0
        assert flushed["engine_objects_written_total"] == 3
        assert flushed["engine_garbage_objects_pending"] == 2  # the merge's inputs
        assert flushed["engine_l0_bytes"] == 0

        async with eng.transaction() as txn:
            await txn.table("d", "t").scan()
        async with eng.transaction() as txn:
            await txn.table("d", "t").scan()  # the same columns again: cache hits
        read = samples(metrics.render(eng))
        assert read["engine_cache_hits_total"] > flushed["engine_cache_hits_total"]
        assert read["engine_cache_misses_total"] > flushed["engine_cache_misses_total"]
        assert 0 < read["engine_cache_hit_ratio"] < 1
        assert read["engine_cache_used_bytes"] > 0

        manifest = await eng.checkpoint()
        assert manifest is not None
        await eng._driver.truncation_settled()
        after = samples(metrics.render(eng, now_ms=manifest.created_wall_ms + 1500))
        assert after["engine_checkpoint_age_seconds"] == 1.5
        assert after["engine_checkpoints_total"] == 1
        assert after["engine_checkpoints_retained"] == 1
        assert after["engine_wal_entries_since_checkpoint"] == 1  # the CKP entry itself
        assert after["engine_wal_entries_retained"] < flushed["engine_wal_entries_retained"]
        assert after["engine_wal_retained_bytes"] < flushed["engine_wal_retained_bytes"]
        assert after["engine_garbage_objects_pending"] == 0  # covered: deleted
        assert after["engine_objects_deleted_total"] == 2
        assert after["engine_checkpoint_last_duration_seconds"] > 0

        await insert(eng, range(200, 210))
        later = samples(metrics.render(eng))
        assert later["engine_wal_entries_since_checkpoint"] == 2
        assert later["engine_commits_total"] > after["engine_commits_total"]
        await eng.close()

    run(main)


def test_the_audit_finds_orphans_and_missing_objects() -> None:
    async def main() -> None:
        objects = MemoryObjectStore()
        eng = await Engine.open("unused", MemoryBackend(), objects=objects, maintenance=False)
        assert eng.maintenance is not None
        await create(eng)
        await insert(eng, range(0, 50))
        await eng.maintenance.settle(freeze_all=True)
        await eng.checkpoint()
        clean = metrics.audit_objects(eng)
        assert clean.missing == () and clean.unreferenced == ()
        assert clean.stored == clean.referenced == len(objects.names())
        objects.put("data/2/left-by-a-crash.parquet", b"x")
        (flushed,) = [n for n in objects.names() if n.startswith("data/") and "crash" not in n]
        objects.delete(flushed)
        found = metrics.audit_objects(eng)
        assert found.unreferenced == ("data/2/left-by-a-crash.parquet",)
        assert found.missing == (flushed,)
        await eng.close()

    run(main)


def test_engine_stats_prints_the_storage_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fill(checkpoint: bool) -> None:
        eng = await Engine.open(
            str(tmp_path), maintenance=False, policy=Policy(history_retention_ms=0)
        )
        assert eng.maintenance is not None and eng.checkpointer is not None
        eng.checkpointer.wal_reserve_entries = 0
        if not checkpoint:
            await create(eng)
            await insert(eng, range(0, 300))
            await eng.maintenance.settle(freeze_all=True)
            await insert(eng, range(300, 350))
        else:
            await eng.checkpoint()
            await eng._driver.truncation_settled()
            await insert(eng, range(350, 360))
        await eng.close()

    asyncio.run(fill(checkpoint=False))
    assert cli.main(["stats", str(tmp_path), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    storage = before["storage"]
    assert storage["blocks"] == {"l0": 1, "l1": 1, "l2": 0}
    assert storage["checkpoint"] is None
    assert storage["objects"] == f"dir:{tmp_path / 'objects'}"
    assert before["objects_audit"]["missing"] == []
    assert before["objects_audit"]["stored"] == 1  # the L1 object
    assert before["live_rows"] == 350  # the keys the part-1 CLI had are still there

    asyncio.run(fill(checkpoint=True))
    assert cli.main(["stats", str(tmp_path), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    storage = after["storage"]
    assert storage["checkpoint"]["kind"] == layout.KIND_GLOBAL
    assert storage["wal_entries_since_checkpoint"] == 2  # the CKP entry and the insert
    assert storage["wal_entries_retained"] < before["storage"]["wal_entries_retained"]
    assert after["objects_audit"]["stored"] > 1 and after["objects_audit"]["unreferenced"] == []

    assert cli.main(["stats", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "blocks             l0 1, l1 1, l2 0" in text
    assert f"checkpoint         global at commit_ts {storage['checkpoint']['ckp_ts']}" in text
    assert "WAL retained       " in text and ", 2 after the newest checkpoint" in text
    assert ", 0 missing, 0 unreferenced" in text


def test_engine_stats_refuses_incomplete_s3_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cli.S3_ACCESS_KEY_ENV, raising=False)
    assert cli.main(["stats", str(tmp_path), "--objects", "s3", "--s3-bucket", "b"]) == 2
    assert "needs --s3-endpoint and --s3-bucket" in capsys.readouterr().err
    args = ["stats", str(tmp_path), "--objects", "s3", "--s3-endpoint", "h:1", "--s3-bucket", "b"]
    assert cli.main(args) == 2
    assert cli.S3_ACCESS_KEY_ENV in capsys.readouterr().err
    assert cli.main(["stats", str(tmp_path), "--s3-bucket", "b"]) == 2
    assert "go with --objects s3" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "wal")  # refused before opening anything


def test_l0_bytes_after_a_restart_count_a_checkpoint_dump_once() -> None:
    """An L0 block restored from a checkpoint's dump is one Arrow table sliced into one node
    per commit (engine/checkpoint/plan.py `_nodes`); every slice shares the dump's buffers.
    Counting each slice's whole buffers grew with the square of the commits in the block
    (3000 one-row commits of 348 kB were counted as 1.0 GB), so a restart hit the L0 hard
    limit at once and commits that append waited for flushes."""

    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        eng = await Engine.open("unused", wal, objects=objects, maintenance=False)
        await create(eng)
        for i in range(200):
            await insert(eng, range(i, i + 1))
        before = metrics.storage_stats(eng).l0_bytes
        await eng.checkpoint()
        await eng.close()
        again = await Engine.open("unused", wal, objects=objects, maintenance=False)
        try:
            after = metrics.storage_stats(again).l0_bytes
            assert after <= 2 * before, (before, after)
            assert again.maintenance is not None
            again.maintenance.step()
            assert not again.maintenance.over_memory
        finally:
            await again.close()

    run(main)
