"""Read-only tools write nothing (issue 20 item 2; ARCHITECTURE.md §11 "A read-only tool
writes nothing").

Proves: `python -m engine tables|scan|stats` on an engine whose WAL ends in a torn tail leaves
every byte of the directory as it was (a hash of every path, kind and content before and
after: nothing cut, no lock file, no temporary directory), and the engine then opens with
every row; `FileBackend.open(read_only=True)` reads a log whose writer holds the lock, does
not read a torn tail, and keeps reading segments a truncation deleted after its open; `python
-m engine tables` beside an engine process that holds the lock and commits shows at least
every commit that process acknowledged before the look; the spark_jobs local jobs that read an
engine directory (its file WAL and objects) change nothing in it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Column, Engine, Schema
from engine import cli as engine_cli
from spark_jobs import local
from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend

ROWS = Schema([Column("id", "int64"), Column("note", "string", nullable=True)], ["id"])
BATCHES = (1, 1000, 1001)  # three transactions, 2,002 rows: the WAL


def tree_hash(root: Path) -> str:
    """Every path under `root` with its kind and (for a file) its bytes."""
    digest = hashlib.sha256()
    for directory, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        digest.update(f"d {os.path.relpath(directory, root)}\n".encode())
        for name in sorted(files):
            path = os.path.join(directory, name)
            digest.update(f"f {os.path.relpath(path, root)}\n".encode())
            digest.update(Path(path).read_bytes())
    return digest.hexdigest()


async def fill(path: str) -> None:
    eng = await Engine.open(path)
    async with eng.transaction() as txn:
        await txn.create_database("shop")
        await txn.create_table("shop", "items", ROWS)
    first = 0
    for count in BATCHES:
        async with eng.transaction() as txn:
            await txn.table("shop", "items").insert(
                [{"id": first + i, "note": "x"} for i in range(count)]
            )
        first += count
    await eng.close()


def tear_the_tail(path: Path) -> None:
    """Half a frame header after the newest segment's last record: what a crash in the
    middle of a group write leaves."""
    wal = path / "wal"
    newest = max(n for n in os.listdir(wal) if segment.parse_segment_file_name(n) is not None)
    with open(wal / newest, "ab") as handle:
        handle.write(b"\x07" * 11)


async def live_rows(path: str) -> int:
    eng = await Engine.open(path)
    try:
        async with eng.transaction() as txn:
            rows: int = (await txn.table("shop", "items").scan(columns=["id"])).num_rows
            return rows
    finally:
        await eng.close()


def test_the_cli_leaves_a_torn_wal_byte_for_byte_and_the_engine_keeps_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(fill(str(tmp_path)))
    tear_the_tail(tmp_path)
    before = tree_hash(tmp_path)
    assert engine_cli.main(["tables", str(tmp_path)]) == 0
    assert f"rows={sum(BATCHES)}" in capsys.readouterr().out
    assert engine_cli.main(["scan", str(tmp_path), "shop.items", "--limit", "2"]) == 0
    assert engine_cli.main(["stats", str(tmp_path), "--json"]) == 0
    assert tree_hash(tmp_path) == before
    assert asyncio.run(live_rows(str(tmp_path))) == sum(BATCHES)


def test_a_read_only_file_backend_reads_beside_the_writer_and_changes_nothing(
    tmp_path: Path,
) -> None:
    wal = str(tmp_path / "wal")

    async def scenario() -> None:
        writer = await FileBackend.open(wal, segment_bytes_max=2048)
        for i in range(40):
            await writer.append(b"r%03d" % i + b"." * 100)  # several segments
        with open(writer.segment_paths()[-1], "ab") as handle:
            handle.write(b"\x07" * 11)  # a half-written frame at the tail
        before = tree_hash(tmp_path)
        reader = await FileBackend.open(wal, read_only=True)  # the writer holds the lock
        assert tree_hash(tmp_path) == before
        assert await reader.latest() == 40
        # The writer truncates away the oldest segments; the reader still reads them.
        await writer.truncate(30)
        assert len(writer.segment_paths()) < len(reader.segment_paths())
        records, next_lsn = await reader.read(1, 1 << 20)
        assert [r.lsn for r in records] == list(range(1, 41)) and next_lsn == 41
        assert records[0].payload.startswith(b"r000")
        await reader.close()
        await writer.close()
        with pytest.raises(Exception, match="does not exist"):
            await FileBackend.open(str(tmp_path / "nothing"), read_only=True)
        assert not (tmp_path / "nothing").exists()

    asyncio.run(scenario())


BUSY_STORAGE = ["--flush-age-ms", "100", "--merge-l1-blocks", "4", "--checkpoint-ms", "200"]
BUSY_STORAGE += ["--wal-reserve-entries", "16"]


@pytest.mark.parametrize("storage", [[], BUSY_STORAGE], ids=["commits", "flush-merge-checkpoint"])
def test_engine_tables_beside_a_running_engine_process_shows_its_durable_commits(
    tmp_path: Path, storage: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """With `storage`, the engine also flushes, merges, checkpoints and truncates its WAL
    several times a second while it is looked at. The looks are the CLI's `main` run in
    this process, beside the engine's (as the other tests here run it): a `python -m engine`
    process per look only added its start-up, six times."""
    engine_dir = str(tmp_path / "engine")
    workload_module = "engine.testing.workload"
    command = [sys.executable, "-m", workload_module, "--dir", engine_dir, "--seconds", "120"]
    workload = subprocess.Popen(
        [*command, *storage],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert workload.stdout is not None
        acked = 0
        for look in range(3):
            for line in workload.stdout:  # ends if the process dies: the assert says so
                acked += line.startswith("ack ")
                if acked >= 20 * (look + 1):
                    break
            assert acked >= 20 * (look + 1), workload.stderr.read() if workload.stderr else ""
            capsys.readouterr()
            assert engine_cli.main(["tables", engine_dir]) == 0, capsys.readouterr().err
            tables = capsys.readouterr().out
            orders = next(line for line in tables.splitlines() if "demo.orders" in line)
            # Every commit acknowledged before the look is there, maybe more.
            assert int(orders.split("rows=")[1].split()[0]) >= acked
            assert engine_cli.main(["stats", engine_dir, "--json"]) == 0, capsys.readouterr().err
            # (Its audit may find objects "missing": the writer's newer checkpoints made
            # garbage of what the look's older ones refer to. A moving target, not damage.)
            assert json.loads(capsys.readouterr().out)["live_rows"] >= acked
        assert workload.poll() is None  # the engine went on committing
    finally:
        workload.kill()
        workload.wait(60)


def test_spark_jobs_local_readers_write_nothing_in_an_engine_directory(tmp_path: Path) -> None:
    asyncio.run(fill(str(tmp_path)))
    tear_the_tail(tmp_path)
    before = tree_hash(tmp_path)
    for job in ("replay_as_of", "write_stats", "inventory", "lsn_audit"):
        local.run(JobParams(job, file_input(str(tmp_path)), as_of=2**62))
    assert tree_hash(tmp_path) == before
