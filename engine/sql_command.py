"""`python -m engine sql DIR "select ..." [--at TS|ISO-8601|Nms] [--format table|csv|json|parquet]
[--out FILE]`: one SELECT over an engine's snapshot (engine/sql.py), opened read-only as
`engine scan` is (engine/cli.py), and the same output for the compute node's `sql` command
(engine/tn/reader.py).

Formats: `table` aligned columns and a last line `(N rows at commit_ts T)`; `csv` a header
line and one line per row (pyarrow's CSV writer); `json` JSON Lines, one object per row
(dates and times as ISO-8601, decimals as strings, bytes as hex); `parquet` one Parquet file,
only with `--out`. `--out FILE` writes FILE (through a temporary file renamed over it, so a
failed query leaves no half file) instead of standard output.

Exit codes (engine/cli.py): 0 done; 1 the engine could not be opened or read, or DuckDB is
not installed; 2 a bad argument, a SQL error (DuckDB's message on one line), or an `--at`
the engine cannot serve.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import decimal
import io
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from engine import limits
from engine.clock import parse_at
from engine.engine import Engine
from engine.errors import BadInput, SnapshotUnavailable
from engine.objects.errors import ObjectNotFound
from engine.scan_command import rows_text

FORMATS = ("table", "csv", "json", "parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The query, --at, --format and --out (also the compute node's `sql` command)."""
    parser.add_argument("query", help='one SELECT, e.g. "select count(*) from shop.orders"')
    parser.add_argument(
        "--at",
        help="the snapshot: a commit timestamp, epoch milliseconds (digits then ms) or an "
        "ISO-8601 time with a zone (2026-11-26T12:00:00Z); default the newest",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (aligned, the default), csv, json (JSON Lines: an object a row), parquet "
        "(needs --out)",
    )
    parser.add_argument("--out", help="write this file instead of standard output")


def arguments_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line, or None (parses --at into args.at)."""
    if args.format == "parquet" and args.out is None:
        return "--format parquet needs --out FILE"
    if args.at is not None:
        try:
            args.at = parse_at(args.at)
        except ValueError as exc:
            return f"--at {exc}"
    return None


def run(args: argparse.Namespace, open_engine: Callable[[], Any]) -> int:
    """`engine sql` (checked by `arguments_error`): open, query, write, close."""
    try:
        table, ts = asyncio.run(_query(args, open_engine))
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write(table, ts, args.format, args.out)
    return 0


async def _query(args: argparse.Namespace, open_engine: Callable[[], Any]) -> tuple[pa.Table, int]:
    """The answer and its snapshot's commit timestamp. Beside a running engine, an object the
    query reads may be deleted by the writer meanwhile: then it starts again from the
    writer's newer state (`limits.READ_ONLY_LOOK_ATTEMPTS_MAX`, as engine/cli.py's looks)."""
    # Imported here: engine.sql loads pyarrow.dataset (and with it pandas), about 0.3 CPU-s
    # that every other command of the CLI (a TN's start included) would pay for nothing.
    from engine import sql

    for attempt in range(1, limits.READ_ONLY_LOOK_ATTEMPTS_MAX + 1):
        engine: Engine = await open_engine()
        try:
            try:
                at = engine.visible_ts if args.at is None else args.at
                async with engine.snapshot(at=at) as view:
                    return await sql.run(view, args.query), view.start_ts
            except (BadInput, SnapshotUnavailable) as exc:  # the query's, not the open's
                raise _Refused(one_line(str(exc))) from None
        except ObjectNotFound:
            if attempt == limits.READ_ONLY_LOOK_ATTEMPTS_MAX:
                raise
        finally:
            await engine.close()
    raise AssertionError("unreachable")


class _Refused(Exception):
    """The query or its --at was refused (exit 2); an engine that would not open is 1."""


def write(table: pa.Table, ts: int, format: str, out: str | None) -> None:
    """`table` in `format` to `out` (a path) or standard output."""
    if out is None:
        if format == "table":
            sys.stdout.write(text_table(table, ts))
        else:
            sys.stdout.flush()
            _write_binary(table, format, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        return
    partial = f"{out}.partial"
    try:
        with open(partial, "wb") as file:
            if format == "table":
                file.write(text_table(table, ts).encode())
            else:
                _write_binary(table, format, file)
        os.replace(partial, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def text_table(table: pa.Table, ts: int) -> str:
    lines = rows_text(table)
    lines.append(f"({table.num_rows} rows at commit_ts {ts})")
    return "\n".join(lines) + "\n"


def _write_binary(table: pa.Table, format: str, file: IO[bytes]) -> None:
    if format == "csv":
        pa_csv.write_csv(table, file)
    elif format == "json":
        for row in table.to_pylist():
            file.write(json.dumps(row, default=_json_value, ensure_ascii=False).encode())
            file.write(b"\n")
    else:
        assert format == "parquet"
        pq.write_table(table, file)


def _json_value(value: object) -> object:
    if isinstance(value, (datetime.date, datetime.time, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON")


def one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def format_text(table: pa.Table, ts: int, format: str) -> str:
    """`table` as text in `format` (table, csv or json): the compute node's `sql` prints it."""
    if format == "table":
        return text_table(table, ts)
    buffer = io.BytesIO()
    _write_binary(table, format, buffer)
    return buffer.getvalue().decode()
