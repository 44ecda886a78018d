"""`python -m engine history` (issue 24 item 2) over a real engine directory.

Proves: after a checkpoint truncated the WAL, the command lists exactly the commits the WAL
still holds (with the names of tables created in the cut part, from the checkpoint's
catalog), says from which DSN and commit_ts history starts and that a checkpoint cut the rest;
maintenance rows appear only with `--maintenance`; `--table`, `--since`/`--until` (commit
timestamps and ISO-8601 times) and `--limit` select rows; `--json` is one JSON document; a WAL
with a torn tail is listed up to the tear and left byte for byte as it was; rows are emitted
while the WAL is read, not after (bounded memory); bad arguments exit 2 with one line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engine import Column, Engine, Schema
from engine import cli as engine_cli
from engine.clock import ts_isoformat
from engine.compaction import Policy
from engine.history import Filter, History, HistoryRow
from engine.history_cli import read_wal
from tae_driver.backends.file import FileBackend

from .test_read_only_tools import tear_the_tail, tree_hash

ROWS = Schema([Column("id", "int64"), Column("note", "string", nullable=True)], ["id"])
SEGMENT_BYTES = 2048  # small segments, so a checkpoint's truncation deletes some
BEFORE_CUT = 12  # commits of 5 rows, then a flush and a checkpoint that truncates below them
AFTER_CUT = 3


def build(path: Path) -> list[int]:
    """An engine whose WAL was truncated by a checkpoint; returns the commit_ts of every
    commit made after it (two tables: `shop.items`, created before the cut, and
    `shop.orders`)."""

    async def main() -> list[int]:
        wal = await FileBackend.open(str(path / "wal"), segment_bytes_max=SEGMENT_BYTES)
        eng = await Engine.open(
            str(path),
            wal=wal,
            objects="dir",
            # no history window: the checkpoint truncates the WAL below it (decision 0010)
            policy=Policy(checkpoint_wal_reserve_entries=0, history_retention_ms=0),
            maintenance=False,
        )
        async with eng.transaction() as txn:
            await txn.create_database("shop")
            await txn.create_table("shop", "items", ROWS)
        for k in range(BEFORE_CUT):
            async with eng.transaction() as txn:
                await txn.table("shop", "items").insert(
                    [{"id": 5 * k + i, "note": "n" * 40} for i in range(5)]
                )
        assert eng.maintenance is not None
        await eng.maintenance.settle(freeze_all=True)
        await eng.checkpoint()
        assert eng._driver is not None
        await eng._driver.truncation_settled()
        after = []
        async with eng.transaction() as txn:
            await txn.create_table("shop", "orders", ROWS)
        after.append(eng.visible_ts)
        async with eng.transaction() as txn:
            await txn.table("shop", "items").delete([0, 1, 2])
            await txn.table("shop", "orders").insert([{"id": 1, "note": None}])
        after.append(eng.visible_ts)
        async with eng.transaction() as txn:
            await txn.table("shop", "orders").insert([{"id": 2, "note": None}])
        after.append(eng.visible_ts)
        await eng.close()
        await wal.close()
        return after

    return asyncio.run(main())


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    path = tmp_path_factory.mktemp("history")
    return path, build(path)


def history(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = engine_cli.main(["history", *argv])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def commit_lines(lines: list[str]) -> list[str]:
    return lines[1:-1]  # the header and the closing line around them


def test_lists_the_retained_commits_names_and_where_history_starts(
    engine_dir: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, after = engine_dir
    code, lines, err = history(capsys, str(path))
    assert code == 0, err
    rows = commit_lines(lines)
    # Only the commits after the cut: the 13 before it are gone from the WAL.
    assert [int(line.split()[0]) for line in rows] == after
    assert rows[0].split()[1] == ts_isoformat(after[0])
    assert rows[0].endswith("create table shop.orders")
    # shop.items was created in the truncated part: its name comes from the checkpoint.
    assert rows[1].endswith("shop.items +0 -3; shop.orders +1 -0")
    assert rows[2].endswith("shop.orders +1 -0")
    closing = lines[-1]
    assert "3 listed" in closing
    assert f"history from commit_ts {after[0]}" in closing
    assert "truncated after checkpoints" in closing


def test_maintenance_rows_only_when_asked(
    engine_dir: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = engine_dir
    _, lines, _ = history(capsys, str(path), "--maintenance")
    kinds = [line.split()[3] for line in commit_lines(lines)]
    assert kinds.count("commit") == 3
    assert "checkpoint" in kinds


def test_table_since_until_and_limit_select_rows(
    engine_dir: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, after = engine_dir
    _, lines, _ = history(capsys, str(path), "--table", "shop.items")
    rows = commit_lines(lines)
    assert len(rows) == 1 and rows[0].endswith("shop.items +0 -3")  # orders' part left out
    _, lines, _ = history(capsys, str(path), "--since", str(after[1]), "--until", str(after[1]))
    assert [int(line.split()[0]) for line in commit_lines(lines)] == [after[1]]
    _, lines, _ = history(capsys, str(path), "--since", "2999-01-01T00:00:00Z")
    assert commit_lines(lines) == []
    _, lines, _ = history(capsys, str(path), "--until", "1970-01-02T00:00:00+01:00")
    assert commit_lines(lines) == []
    _, lines, _ = history(capsys, str(path), "--limit", "2")
    assert [int(line.split()[0]) for line in commit_lines(lines)] == after[1:]
    assert "2 shown of 3" in lines[-1]


def test_json_is_one_document(
    engine_dir: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, after = engine_dir
    code, lines, _ = history(capsys, str(path), "--json", "--maintenance")
    assert code == 0
    document = json.loads("\n".join(lines))
    commits = [r for r in document["rows"] if not r["maintenance"]]
    assert [r["commit_ts"] for r in commits] == after
    assert commits[1]["tables"] == [
        {"table": "shop.items", "table_id": commits[1]["tables"][0]["table_id"], "rows_deleted": 3},
        {
            "table": "shop.orders",
            "table_id": commits[1]["tables"][1]["table_id"],
            "rows_appended": 1,
        },
    ]
    assert any(r["kind"] == "checkpoint" and "ckp_ts" in r for r in document["rows"])
    retained = document["retained"]
    assert retained["first_commit_ts"] == after[0] and retained["commits"] == 3
    assert retained["first_dsn"] > 1 and "truncated" in retained["cut"]


def test_a_torn_tail_is_listed_up_to_the_tear_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def fill() -> None:
        eng = await Engine.open(str(tmp_path))
        async with eng.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        async with eng.transaction() as txn:
            await txn.table("d", "t").insert([{"id": 1, "note": "x"}])
        await eng.close()

    asyncio.run(fill())
    tear_the_tail(tmp_path)
    before = tree_hash(tmp_path)
    code, lines, err = history(capsys, str(tmp_path))
    assert code == 0, err
    assert [line.split()[-2:] for line in commit_lines(lines)] == [
        ["table", "d.t"],
        ["+1", "-0"],
    ]
    assert "(2 listed; the retained WAL holds DSN 1..2" in lines[-1]
    assert tree_hash(tmp_path) == before


def test_rows_are_emitted_while_the_wal_is_read(engine_dir: tuple[Path, list[int]]) -> None:
    path, _ = engine_dir
    core = History(row_filter=Filter(maintenance=True))
    seen: list[tuple[int, int]] = []

    def emit(row: HistoryRow) -> None:
        seen.append((row.dsn, core.retained.last_dsn))

    async def main() -> None:
        backend = await FileBackend.open(str(path / "wal"), read_only=True)
        try:
            await read_wal(backend, core, emit)
        finally:
            await backend.close()

    asyncio.run(main())
    assert len(seen) >= 4
    assert all(dsn == read_so_far for dsn, read_so_far in seen)  # nothing held back


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--table", "items"], "--table"),
        (["--since", "yesterday"], "--since"),
        (["--until", "2026-11-26T12:00:00"], "--until"),  # no time zone
        (["--limit", "0"], "--limit"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    engine_dir: tuple[Path, list[int]],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    names: str,
) -> None:
    path, _ = engine_dir
    code, lines, err = history(capsys, str(path), *argv)
    assert code == 2 and lines == []
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {names}")


def test_not_an_engine_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, err = history(capsys, str(tmp_path / "missing"))
    assert code == 1 and lines == []
    assert "no engine here" in err
