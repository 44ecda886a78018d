"""replay_as_of with the engine's storage (decision 0006): block commands, checkpoints as the
base state, a truncated WAL. On a real engine's directory (file WAL, objects directory)
written by `storage_history`: flushes to L1 objects, a merge into an L2 segment, deletes on
persisted and on L0 blocks, a table dropped and created again, a global checkpoint with the
WAL left whole, two incremental ones (an L0 dump, delta objects), the WAL truncated three
entries short of the second and exactly at the third, which retires the first.

* At every timestamp the engine scanned (taken when it was the newest commit), for the
  directory copied before any checkpoint, after each of the first two, and at the end: the
  replayed tables equal the engine's scans row for row (as multisets ordered by key), or the
  job is refused exactly where the files cannot answer: a TS older than the oldest retained
  checkpoint once the WAL no longer starts at DSN 1, and a TS whose checkpoint's tail was
  truncated away. With the WAL whole, a TS before the checkpoint is answered from the WAL
  alone and one after it from the checkpoint.
* The base-state reader's edge cases on copies of the final directory: a checkpoint
  directory without a manifest is ignored; a damaged manifest is refused, not skipped for an
  older checkpoint; a block object, a dump or a delta object that is missing is
  `ObjectsUnreadable` naming it; the inventory lists every checkpoint with its state.
* The command level reads CreateBlock and DropBlock with their object, row group and rows.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.checkpoint import layout
from spark_jobs import checkpoints, local, walread
from spark_jobs.errors import ObjectsUnreadable, ReplayRefused
from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from spark_jobs.walread import LEVEL_COMMAND, ReadOptions
from tests.unit.spark_jobs.logs import (
    Scans,
    StorageHistory,
    bound_replay_memory,
    in_memory,
    storage_history,
)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> StorageHistory:
    return storage_history(str(tmp_path_factory.mktemp("storage")))


def by_key(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    key = next(iter(rows[0])) if rows else ""
    return sorted(rows, key=lambda row: row[key])


def replayed(path: str, as_of: int, **params: Any) -> dict[str, list[dict[str, Any]]]:
    result = local.run(JobParams("replay_as_of", file_input(path), as_of=as_of, **params))
    return {
        name.split("/", 1)[1].replace("/", "."): by_key(in_memory(table).to_pylist())
        for name, table in result.tables.items()
    }


def expect_equal(got: dict[str, list[dict[str, Any]]], scans: Scans, where: object) -> None:
    assert sorted(got) == sorted(scans), where
    for name, rows in scans.items():
        assert got[name] == by_key(rows), (where, name)


def test_replay_equals_the_engine_around_flushes_merges_checkpoints_and_truncation(
    history: StorageHistory,
) -> None:
    ckp0, ckp1, ckp2 = (m.ckp_ts for m in history.checkpoints)
    answered: dict[str, list[int]] = {}
    refused: dict[str, list[tuple[int, str]]] = {}
    for copy, path in (
        ("flushed", history.copies["flushed"]),
        ("ckp0", history.copies["ckp0"]),
        ("ckp1", history.copies["ckp1"]),
        ("final", history.path),
    ):
        answered[copy], refused[copy] = [], []
        for ts, scans in sorted(history.scans.items()):
            if ts > history.visible[copy]:
                continue
            try:
                got = replayed(path, ts)
            except ReplayRefused as exc:
                refused[copy].append((ts, str(exc)))
                continue
            expect_equal(got, scans, (copy, ts))
            answered[copy].append(ts)
    # Whole WALs answer everything, before the checkpoint from the WAL alone.
    assert not refused["flushed"] and not refused["ckp0"]
    assert len(answered["flushed"]) >= 10 and min(answered["ckp0"]) < ckp0
    assert ckp0 in answered["ckp0"] and max(answered["ckp0"]) > ckp0
    # The WAL truncated three entries short of ckp1: below ckp0 nothing can answer, and
    # from ckp0 on ckp0's tail is gone; ckp1 and after answer.
    assert min(answered["ckp1"]) == ckp1 and max(answered["ckp1"]) > ckp1
    assert any(ts >= ckp0 for ts, _ in refused["ckp1"])
    for ts, text in refused["ckp1"]:
        if ts < ckp0:
            assert f"oldest retained checkpoint is at ckp_ts {ckp0}" in text, (ts, text)
        else:
            assert "needs the WAL from DSN" in text, (ts, text)
    # At the end: ckp0 retired, ckp1's tail truncated away, ckp2 and its tail answer.
    assert min(answered["final"]) == ckp2 and len(answered["final"]) >= 4
    for ts, text in refused["final"]:
        if ts < ckp1:
            assert f"oldest retained checkpoint is at ckp_ts {ckp1}" in text, (ts, text)
        else:
            assert "needs the WAL from DSN" in text, (ts, text)
    # What was read: incremental checkpoints, persisted blocks, a dump, deltas.
    final = local.run(JobParams("replay_as_of", file_input(history.path), as_of=2**62))
    [log] = final.summary["logs"]
    assert log["base"]["ckp_ts"] == ckp2 and log["base"]["kind"] == "incremental"
    # The retired checkpoint's directory, if newer ones still use objects in it, has no
    # manifest any more: ignored.
    retired = history.checkpoints[0].directory
    names = {info.name for info in checkpoints.open_store(objects(history.path)).list("")}
    left = any(name.startswith(retired) for name in names)
    assert log["base"]["ignored"] == ([retired] if left else [])
    assert log["first_dsn"] == history.checkpoints[2].ckp_dsn + 1
    assert final.summary["as_of_after_newest_commit"] is True
    assert final.summary["newest_commit_ts"] == history.visible["final"]
    assert any("/l0-" in name for name in names) and any("/delta-" in name for name in names)


def test_persisted_blocks_replay_the_same_in_bounded_memory(
    history: StorageHistory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoint blocks, created blocks and their deletes go through the same bounded runs
    as appended rows (spark_jobs/spill.py): under a 4 KiB bound, what the engine scans."""
    bound_replay_memory(monkeypatch, 4 << 10)
    checked = 0
    for copy in ("ckp0", "final"):
        path = history.path if copy == "final" else history.copies[copy]
        for ts, scans in sorted(history.scans.items()):
            if ts > history.visible[copy]:
                continue
            try:
                got = replayed(path, ts)
            except ReplayRefused:
                continue
            expect_equal(got, scans, (copy, ts))
            checked += 1
    final = local.run(JobParams("replay_as_of", file_input(history.path), as_of=2**62))
    assert checked >= 8 and final.summary["logs"][0]["rows_spilled_runs"] >= 2


def objects(path: str) -> str:
    return os.path.join(path, "objects")


def test_the_command_level_reads_block_commands(history: StorageHistory) -> None:
    commands = walread.read_level(
        JobParams("write_stats", file_input(history.copies["flushed"])),
        ReadOptions(LEVEL_COMMAND, batches=False),
    ).to_pylist()
    created = [c for c in commands if c["cmd_kind"] == "create_block"]
    dropped = [c for c in commands if c["cmd_kind"] == "drop_block"]
    assert created and dropped
    assert {c["level"] for c in created} == {1, 2}
    for command in created:
        assert os.path.isfile(os.path.join(objects(history.copies["flushed"]), command["object"]))
        assert command["n_rows"] >= 1 and command["row_group"] >= 0
    # A flush's entry creates, then drops: in one entry, create before drop.
    flush_dsns = {c["dsn"] for c in created} & {c["dsn"] for c in dropped}
    assert flush_dsns


@pytest.fixture
def damaged(history: StorageHistory, tmp_path: Path) -> str:
    """A copy of the final directory to damage."""
    target = str(tmp_path / "engine")
    shutil.copytree(history.path, target)
    return target


def newest_manifest(path: str) -> layout.Manifest:
    found = checkpoints.list_checkpoints(checkpoints.open_store(objects(path)))
    manifest = found[-1].manifest
    assert manifest is not None
    return manifest


def test_a_checkpoint_without_manifest_is_ignored(history: StorageHistory, damaged: str) -> None:
    newest = newest_manifest(damaged)
    cut = os.path.join(objects(damaged), "ckp", f"{history.visible['final']:020d}-cut")
    os.makedirs(cut)
    shutil.copy(
        os.path.join(objects(damaged), newest.catalog), os.path.join(cut, "catalog.parquet")
    )
    store = checkpoints.open_store(objects(damaged))
    states = [(c.directory, c.state) for c in checkpoints.list_checkpoints(store)]
    assert states[-1] == (f"ckp/{history.visible['final']:020d}-cut/", "incomplete")
    choice = checkpoints.choose_base(store, 2**62)
    assert choice.checkpoint is not None and choice.checkpoint.ckp_ts == newest.ckp_ts
    assert choice.ignored == (f"ckp/{history.visible['final']:020d}-cut/",)
    expect_equal(replayed(damaged, 2**62), history.scans[history.visible["final"]], "cut")


def test_a_damaged_manifest_is_refused_not_skipped(history: StorageHistory, damaged: str) -> None:
    newest = newest_manifest(damaged)
    path = os.path.join(objects(damaged), newest.name)
    data = bytearray(Path(path).read_bytes())
    data[data.index(b'"live_rows": ') + len(b'"live_rows": ')] ^= 0x01  # another digit
    Path(path).write_bytes(bytes(data))
    with pytest.raises(ObjectsUnreadable) as refused:
        replayed(damaged, 2**62)
    assert refused.value.name == newest.name and "damaged manifest" in str(refused.value)
    store = checkpoints.open_store(objects(damaged))
    [state] = [c for c in checkpoints.list_checkpoints(store) if c.ckp_ts == newest.ckp_ts]
    assert state.state == "damaged" and state.error == "manifest checksum mismatch"
    # The older checkpoint still answers its own timestamps where the WAL allows: here its
    # tail is truncated away, so the refusal is the truncation's, not the damage's.
    with pytest.raises(ReplayRefused):
        replayed(damaged, history.checkpoints[0].ckp_ts)


@pytest.mark.parametrize("which", ["data", "dump", "delta"])
def test_a_missing_object_is_named(damaged: str, which: str) -> None:
    manifest = newest_manifest(damaged)
    prefix = {"data": "data/", "dump": "ckp/", "delta": "ckp/"}[which]
    marker = {"data": ".parquet", "dump": "/l0-", "delta": "/delta-"}[which]
    victim = next(n for n in manifest.objects if n.startswith(prefix) and marker in n)
    os.unlink(os.path.join(objects(damaged), victim))
    with pytest.raises(ObjectsUnreadable) as missing:
        replayed(damaged, 2**62)
    assert missing.value.name == victim and "missing" in missing.value.reason


def test_a_damaged_delta_object_is_named(damaged: str) -> None:
    manifest = newest_manifest(damaged)
    victim = next(n for n in manifest.objects if "/delta-" in n)
    path = os.path.join(objects(damaged), victim)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])  # cut: no Parquet footer any more
    with pytest.raises(ObjectsUnreadable) as damaged_delta:
        replayed(damaged, 2**62)
    assert damaged_delta.value.name == victim


def test_the_inventory_lists_checkpoints(history: StorageHistory) -> None:
    result = local.run(JobParams("inventory", file_input(history.path)))
    rows = result.tables["checkpoints"].to_pylist()
    complete = [r for r in rows if r["state"] == "complete"]
    assert [r["ckp_ts"] for r in complete] == [m.ckp_ts for m in history.checkpoints[1:]]
    assert [r["kind"] for r in complete] == ["incremental", "incremental"]
    assert all(r["objects_bytes"] > r["dir_bytes"] > 0 for r in complete)
    assert all(r["objects_missing"] == 0 for r in complete)
    # The retired global checkpoint lost its manifest; what the others still use of its
    # directory (a dump, a delta) is listed as an incomplete directory, ignored by replay.
    for row in rows:
        if row["state"] != "complete":
            assert row["ckp_ts"] == history.checkpoints[0].ckp_ts
            assert row["state"] == "incomplete" and row["kind"] is None
    assert rows[-1]["blocks"] == history.checkpoints[-1].block_count
    assert rows[-1]["objects"] == len(history.checkpoints[-1].objects)
    assert any("checkpoint" in line and "incremental" in line for line in result.lines)


def test_write_stats_counts_a_delete_once(history: StorageHistory) -> None:
    """Flush and merge entries (CreateBlock, DropBlock) count as no rows appended or deleted.
    The log up to the copy holds 4 deleted keys, an update of 2 (deleted and appended
    again), 3 then 1 more deleted keys: 10. (A Delete a flush carries onto its own output,
    restating a delete committed while it ran, is not counted either; this history commits
    nothing during a flush, so it has none.)"""
    result = local.run(JobParams("write_stats", file_input(history.copies["flushed"])))
    assert result.summary["rows_deleted"] == 10


def test_the_cli_takes_objects_and_says_what_it_read(
    history: StorageHistory, tmp_path: Path, capsys: Any
) -> None:
    from spark_jobs import __main__ as cli

    out = str(tmp_path / "out")
    wal = os.path.join(history.path, "wal")
    moved = str(tmp_path / "objects-elsewhere")
    shutil.copytree(objects(history.path), moved)
    argv = ["replay_as_of", "--file-wal", wal, "--as-of", str(2**62), "--out", out]
    assert cli.main([*argv, "--objects", moved, "--engine", "local"]) == cli.EXIT_OK
    printed = capsys.readouterr().out
    ckp = history.checkpoints[-1]
    assert f"checkpoint ckp_ts {ckp.ckp_ts} (incremental, {ckp.block_count} blocks)" in printed
    assert "note: --as-of is after the newest commit" in printed
    # Without the objects the WAL's tail is still readable, but the checkpoint is not found:
    # the WAL no longer starts at DSN 1, so the job is refused, saying why.
    lone = str(tmp_path / "lone")
    shutil.copytree(wal, os.path.join(lone, "wal"))
    assert cli.main(["replay_as_of", "--file-wal", lone, "--as-of", "1", "--out", out]) == 1
    assert "there is no checkpoint" in capsys.readouterr().err
    bad = ["--objects", "x=" + moved]
    assert cli.main([*argv, *bad, "--engine", "local"]) == cli.EXIT_USAGE
    assert cli.main([*argv, "--objects", str(tmp_path / "none")]) == cli.EXIT_USAGE
