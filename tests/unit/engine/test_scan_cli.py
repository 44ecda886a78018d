"""`python -m engine scan` with `--where`, `--columns`, `--at` and `--format table|csv|json`
(engine/scan_command.py, issue 24 item 4).

Proves: the filter and the column list select exactly the rows and columns asked for, in key
order, in each format (csv tells a null from an empty string, binary is base64, dates are
ISO-8601; json lines read back as the rows); `--at` reads the state at a commit timestamp,
at epoch milliseconds and at an ISO-8601 time, and a time still in the future is refused;
every bad argument (filter, unknown column, --at, db.table, --limit) exits 2 with one line
naming it and no traceback; output into a pipe whose reader went away ends quietly.

How: a file-WAL engine in a temporary directory, two commits in different milliseconds
(awaited, not slept), the CLI's `main` run in-process with stdout and stderr captured, and
as a process writing into a pipe whose read end is closed.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import Column, Engine, Schema
from engine.cli import main
from engine.clock import ts_at_wall_ms, ts_isoformat, ts_physical_ms, wall_ms

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("customer", "int32", nullable=True),
        Column("note", "string", nullable=True),
        Column("day", "date32", nullable=True),
        Column("blob", "binary", nullable=True),
    ],
    primary_key=["id"],
)
FIRST = [
    {"id": 3, "customer": 42, "note": "", "day": datetime.date(2026, 11, 26), "blob": b"\x00a"},
    {"id": 1, "customer": 42, "note": None, "day": None, "blob": None},
    {"id": 2, "customer": 7, "note": 'x, "y"', "day": None, "blob": None},
]
SECOND = [{"id": 4, "customer": 42, "note": "later", "day": None, "blob": None}]


async def fill(path: str) -> tuple[int, int]:
    """The table, FIRST in one commit and SECOND in a later millisecond; both commit_ts."""
    engine = await Engine.open(path)
    try:
        async with engine.transaction() as txn:
            await txn.create_database("shop")
            await txn.create_table("shop", "orders", SCHEMA)
            await txn.table("shop", "orders").insert(FIRST)
        first_ts = engine.visible_ts
        while wall_ms() <= ts_physical_ms(first_ts):
            await asyncio.sleep(0.001)  # a condition awaited: the next millisecond
        async with engine.transaction() as txn:
            await txn.table("shop", "orders").insert(SECOND)
        return first_ts, engine.visible_ts
    finally:
        await engine.close()


@pytest.fixture
def engine_dir(tmp_path: Path) -> tuple[str, int, int]:
    first_ts, second_ts = asyncio.run(fill(str(tmp_path)))
    return str(tmp_path), first_ts, second_ts


def scan(capsys: pytest.CaptureFixture[str], directory: str, *options: str) -> tuple[int, str, str]:
    code = main(["scan", directory, "shop.orders", *options])
    out, err = capsys.readouterr()
    return code, out, err


def test_where_and_columns_in_json_lines(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, second_ts = engine_dir
    options = ["--where", "customer = 42 AND id < 4", "--columns", "note,id", "--format", "json"]
    code, out, err = scan(capsys, directory, *options)
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"note": None, "id": 1},
        {"note": "", "id": 3},
    ]
    assert list(json.loads(out.splitlines()[0])) == ["note", "id"]  # the order asked for
    assert err == f"(2 of 2 rows at commit_ts {second_ts})\n"


def test_csv_tells_null_from_empty_and_writes_dates_and_binary_as_text(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, _ = engine_dir
    code, out, err = scan(capsys, directory, "--format", "csv", "--where", "id IN (1, 2, 3)")
    assert code == 0, err
    blob = base64.b64encode(b"\x00a").decode()
    assert out.splitlines() == [
        '"id","customer","note","day","blob"',
        "1,42,,,",
        '2,7,"x, ""y""",,',
        f'3,42,"",2026-11-26,"{blob}"',
    ]
    assert err.startswith("(3 of 3 rows at commit_ts ")


def test_table_is_todays_format_with_the_count_line(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, second_ts = engine_dir
    code, out, err = scan(capsys, directory, "--where", "note IS NULL", "--limit", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["id", "customer", "note", "day", "blob"]
    assert lines[1].split() == ["1", "42", "NULL", "NULL", "NULL"]
    assert lines[2] == f"(1 of 1 rows at commit_ts {second_ts})"


@pytest.mark.parametrize("form", ["ts", "ms", "iso"])
def test_at_reads_the_state_of_the_first_commit(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str], form: str
) -> None:
    directory, first_ts, _ = engine_dir
    at = {
        "ts": str(first_ts),
        "ms": f"{ts_physical_ms(first_ts)}ms",
        "iso": ts_isoformat(first_ts).replace("Z", "+00:00"),
    }[form]
    code, out, err = scan(capsys, directory, "--at", at, "--format", "json", "--columns", "id")
    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == [1, 2, 3]
    # A wall time is the last timestamp of its millisecond (the second commit is later).
    ts = first_ts if form == "ts" else ts_at_wall_ms(ts_physical_ms(first_ts))
    assert err == f"(3 of 3 rows at commit_ts {ts})\n"
    code, out, err = scan(capsys, directory, "--at", "1970-01-02T00:00:00Z")
    assert (code, out, err) == (1, "", "error: no database 'shop'\n")  # before it was made


def test_a_time_in_the_future_is_refused(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, second_ts = engine_dir
    code, out, err = scan(capsys, directory, "--at", "2999-01-01T00:00:00Z")
    assert code == 1 and out == ""
    assert err.startswith("error: snapshot at 2999-01-01T00:00:00+00:00: in the future")
    # A past time newer than the newest commit is the newest commit.
    code, out, err = scan(capsys, directory, "--at", ts_isoformat((wall_ms() - 1) << 16))
    assert code == 0, err
    assert out.splitlines()[-1] == f"(4 of 4 rows at commit_ts {second_ts})"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--where", "custmer = 42"], "error: unknown column 'custmer' at character 1"),
        (["--where", "customer = 'x'"], "is not a value of column 'customer' (int32)"),
        (["--where", "customer = 1 note"], "unexpected 'note' at character 14"),
        (["--columns", "id,nope"], "error: --columns: unknown column 'nope'"),
        (["--columns", "id,"], "error: --columns: unknown column an empty name"),
        (["--at", "yesterday"], "error: --at 'yesterday' is not a time"),
        (["--at", "2026-11-26T12:00:00"], "needs a time zone"),
        (["--limit", "-1"], "error: --limit must be >= 0, not -1"),
    ],
)
def test_a_bad_argument_exits_2_with_one_line_naming_it(
    engine_dir: tuple[str, int, int],
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    says: str,
) -> None:
    directory, _, _ = engine_dir
    code, out, err = scan(capsys, directory, *options)
    assert code == 2
    assert out == ""
    assert says in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_db_table_without_a_dot_exits_2(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, _ = engine_dir
    assert main(["scan", directory, "orders"]) == 2
    assert capsys.readouterr().err == "error: scan needs DB.TABLE, not 'orders'\n"


async def fill_many(path: str, rows: int) -> None:
    engine = await Engine.open(path)
    try:
        async with engine.transaction() as txn:
            await txn.create_database("shop")
            await txn.create_table("shop", "orders", SCHEMA)
            batch: list[dict[str, Any]] = [
                {"id": i, "customer": i % 10, "note": "n" * 20} for i in range(rows)
            ]
            await txn.table("shop", "orders").insert(batch)
    finally:
        await engine.close()


SCAN = [sys.executable, "-m", "engine", "scan"]


@pytest.mark.parametrize("form", ["table", "csv", "json"])
def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path, form: str) -> None:
    """`... | head` once head has exited: exit 1, and not a word on stderr (it said
    `error: [Errno 32] Broken pipe` before)."""
    asyncio.run(fill_many(str(tmp_path), 20_000))  # ~600 KB of csv: more than a pipe holds
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [*SCAN, str(tmp_path), "shop.orders", "--format", form, "--limit", "20000"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (1, "")


def test_rows_come_in_key_order_without_the_key_column(
    engine_dir: tuple[str, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, second_ts = engine_dir
    code, out, err = scan(capsys, directory, "--columns", "customer", "--format", "csv")
    assert code == 0, err
    assert out.splitlines() == ['"customer"', "42", "7", "42", "42"]  # ids 1, 2, 3, 4
    code, out, err = scan(capsys, directory, "--columns", "customer", "--limit", "2")
    assert (code, err) == (0, "")
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[1:] == ["42", "7", f"(2 of 4 rows at commit_ts {second_ts})"]
