"""`python -m engine sql` and the compute node's `sql` command (engine/sql_command.py) print
the query's answer in each format, write `--out` whole, and exit as engine/cli.py says: 2 with
one line and no traceback for a bad argument, a SQL error or an `--at` out of reach.

How: an engine directory made with `SyncEngine`, closed, then `engine.cli.main` in-process
(it opens the engine read-only, as the installed command does); the compute node's command
through `engine.tn.reader._command` over an in-process TN (`LocalTN`).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.cli import main
from engine.cn.node import ComputeNode
from engine.cn.port import LocalTN
from engine.engine import Engine
from engine.objects.store import MemoryObjectStore
from engine.schema import Column, Schema
from engine.sync import SyncEngine
from engine.tn import reader
from tae_driver.backends.memory import MemoryBackend

SCHEMA = Schema(
    [Column("id", "int64"), Column("note", "string", nullable=True)], primary_key=["id"]
)


def rows(ids: list[int]) -> pa.Table:
    notes = [None if i % 2 else f"n{i}" for i in ids]
    return pa.table({"id": ids, "note": notes}, schema=SCHEMA.to_arrow())


@pytest.fixture
def engine_dir(tmp_path: Path) -> tuple[str, int]:
    """An engine with shop.t: rows 0..9, then 0..4 deleted; and the timestamp before."""
    path = str(tmp_path / "engine")
    with SyncEngine.open(path) as eng:
        with eng.transaction() as txn:
            txn.create_database("shop")
            txn.create_table("shop", "t", SCHEMA)
        with eng.transaction() as txn:
            txn.table("shop", "t").insert(rows(list(range(10))))
        before = eng.visible_ts
        with eng.transaction() as txn:
            txn.table("shop", "t").delete(range(5))
    return path, before


QUERY = "select id, note from shop.t where id < 8 order by id"


def test_formats(engine_dir: tuple[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = engine_dir
    assert main(["sql", path, QUERY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "note"]
    assert [line.split() for line in lines[1:4]] == [["5", "NULL"], ["6", "n6"], ["7", "NULL"]]
    assert lines[4].startswith("(3 rows at commit_ts ")

    assert main(["sql", path, QUERY, "--format", "csv"]) == 0
    got = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert got == [["id", "note"], ["5", ""], ["6", "n6"], ["7", ""]]

    assert main(["sql", path, QUERY, "--format", "json"]) == 0
    got_json = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert got_json == [{"id": 5, "note": None}, {"id": 6, "note": "n6"}, {"id": 7, "note": None}]


def test_at_reads_the_older_snapshot(
    engine_dir: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, before = engine_dir
    query = "select count(*) as n from t"
    assert main(["sql", path, query, "--format", "json", "--at", str(before)]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 10}
    assert main(["sql", path, query, "--format", "json", "--at", "2099-01-01T00:00:00Z"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "future" in err and err.count("\n") == 1


def test_out_writes_the_file_whole_in_each_format(
    engine_dir: tuple[str, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = engine_dir
    out = tmp_path / "answer.parquet"
    assert main(["sql", path, QUERY, "--format", "parquet", "--out", str(out)]) == 0
    assert pq.read_table(out).to_pylist() == [
        {"id": 5, "note": None},
        {"id": 6, "note": "n6"},
        {"id": 7, "note": None},
    ]
    text = tmp_path / "answer.csv"
    assert main(["sql", path, QUERY, "--format", "csv", "--out", str(text)]) == 0
    assert text.read_text().splitlines()[0] == '"id","note"'
    assert capsys.readouterr().out == ""
    # A failed query leaves the earlier file as it was and no partial one.
    assert main(["sql", path, "selec", "--format", "csv", "--out", str(text)]) == 2
    assert text.read_text().splitlines()[0] == '"id","note"'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answer.csv", "answer.parquet", "engine"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["selec 1"], "syntax error"),
        (["select * from nosuch"], "nosuch does not exist"),
        (["delete from shop.t"], "read-only"),
        ([QUERY, "--at", "yesterday"], "--at 'yesterday' is not a time"),
        ([QUERY, "--format", "parquet"], "--format parquet needs --out"),
    ],
)
def test_bad_arguments_and_sql_errors_exit_2_with_one_line(
    engine_dir: tuple[str, int], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path, _ = engine_dir
    assert main(["sql", path, *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ") and message in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_a_missing_engine_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", str(tmp_path / "none"), "select 1"]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_the_compute_node_sql_command(capsys: pytest.CaptureFixture[str]) -> None:
    async def main_() -> None:
        objects = MemoryObjectStore()
        tn = await Engine.open("unused", MemoryBackend(), objects=objects, maintenance=False)
        cn = ComputeNode(LocalTN(tn), objects)
        port = LocalTN(tn)
        try:
            async with tn.transaction() as txn:
                await txn.create_database("shop")
                await txn.create_table("shop", "t", SCHEMA)
                await txn.table("shop", "t").insert(rows(list(range(10))))
            before = tn.visible_ts
            async with tn.transaction() as txn:
                await txn.table("shop", "t").delete(range(5))

            async def command(words: list[str]) -> int:
                return await reader._command(cn, port, words, stdin_free=True)  # type: ignore[arg-type]

            words = ["sql", "select count(*) as n from shop.t", "--format", "json"]
            assert await command(words) == 0
            assert json.loads(capsys.readouterr().out) == {"n": 5}
            assert await command([*words, "--at", str(before)]) == 0
            assert json.loads(capsys.readouterr().out) == {"n": 10}
            assert await command(["sql", QUERY]) == 0
            last = capsys.readouterr().out.splitlines()[-1]
            assert last == f"(3 rows at commit_ts {tn.visible_ts})"
            assert await command(["sql", "drop table shop.t"]) != 0
            out = capsys.readouterr().out
            assert out.startswith("error: SqlError: ") and "read-only" in out
            assert await command(["sql", QUERY, "--at", "soon"]) != 0
            assert capsys.readouterr().out.startswith("error: --at 'soon' is not a time")
        finally:
            await cn.close()
            await tn.close()

    asyncio.run(main_())
