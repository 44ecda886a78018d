"""The scan command of both command lines (issue 24): `python -m engine scan DIR db.table ...`
(engine/cli.py) and `scan db.table ...` of `python -m engine cn` (engine/tn/reader.py).

    scan DB.TABLE [--where FILTER] [--columns a,b] [--at TS|ISO-8601|Nms]
                  [--format table|csv|json] [--limit N]

`--where` is the filter grammar of engine/where.py (`customer = 42 AND note IS NOT NULL`),
pushed into the engine's scan (zonemaps prune blocks); `--columns` picks and orders the
columns; `--at` reads the snapshot at a commit timestamp, an ISO-8601 time with a zone or epoch
milliseconds (engine/as_of.py); rows come in primary-key order, the first `--limit`.

Formats, to stdout: `table` (aligned columns, NULL for a null, long values cut at 40
characters, then a line `(N of M rows at commit_ts T)`); `csv` (a header, RFC 4180 quoting, a
null is an empty unquoted field and an empty string is `""`); `json` (JSON lines: one object
per row, keys in column order, null for a null: engine/json_rows.py, which `engine cn insert
--json` reads back). In csv and json a date or timestamp is ISO-8601 and binary is base64; a
float NaN or infinity is `nan`, `inf`, `-inf` in csv and the strings `NaN`, `Infinity`,
`-Infinity` in json (JSON has no such numbers); the `(N of M rows ...)` line goes to stderr,
so stdout is data only.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import io
from dataclasses import dataclass
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.csv as pa_csv

from engine import limits, where
from engine.clock import parse_at
from engine.errors import BadArgument
from engine.json_rows import json_lines
from engine.schema import Schema
from engine.txn import Transaction

FORMATS = ("table", "csv", "json")

CELL_CHARS_MAX = 40
"""A value in `table` output is cut past this many characters (a line stays readable)."""


@dataclass(frozen=True, slots=True)
class ScanRequest:
    db: str
    table: str
    where: str | None
    columns: str | None
    at: int | datetime.datetime | None
    format: str
    limit: int


def add_options(parser: argparse.ArgumentParser) -> None:
    """The table argument and the scan options (the module docstring)."""
    parser.add_argument("table", help="db.table")
    parser.add_argument("--where", help="a filter: customer = 42 AND note IS NOT NULL")
    parser.add_argument("--columns", help="the columns to print, comma-separated (default all)")
    parser.add_argument("--at", help="a commit timestamp, ISO-8601 with a zone, or epoch Nms")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--limit", type=int, default=limits.SCAN_ROWS_DEFAULT_LIMIT)


def request(args: argparse.Namespace) -> ScanRequest:
    """The parsed options, checked as far as they can be without the table; `BadArgument`
    naming the first bad one."""
    db, dot, name = args.table.partition(".")
    if not dot or not db or not name:
        raise BadArgument(f"scan needs DB.TABLE, not {args.table!r}")
    if args.limit < 0:
        raise BadArgument(f"--limit must be >= 0, not {args.limit}")
    try:
        at = parse_at(args.at) if args.at is not None else None
    except ValueError as exc:
        raise BadArgument(f"--at {exc}") from None
    return ScanRequest(db, name, args.where, args.columns, at, args.format, args.limit)


def chosen_columns(text: str | None, schema: Schema) -> list[str]:
    """`--columns a,b` checked against the table: `BadArgument` names an unknown one."""
    names = [c.name for c in schema.columns]
    if text is None:
        return names
    chosen: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if name not in names:
            shown = repr(name) if name else "an empty name"
            raise BadArgument(f"--columns: unknown column {shown} (columns: {', '.join(names)})")
        if name not in chosen:
            chosen.append(name)
    return chosen


async def scan(view: Transaction, req: ScanRequest, out: TextIO) -> str | None:
    """Print the rows `req` asks for from the snapshot `view` to `out`; for csv and json,
    return the count line (for stderr: stdout is data only)."""
    handle = view.table(req.db, req.table)
    schema = handle.schema
    filter_ = where.parse(req.where, schema) if req.where is not None else None
    columns = chosen_columns(req.columns, schema)
    keys = list(schema.primary_key)
    read = columns + [k for k in keys if k not in columns]
    table = await handle.scan(columns=read, filter=filter_)
    total = table.num_rows
    table = table.sort_by([(k, "ascending") for k in keys]).slice(0, req.limit).select(columns)
    count = f"({table.num_rows} of {total} rows at commit_ts {view.start_ts})"
    if req.format == "table":
        for line in rows_text(table):
            print(line, file=out)
        print(count, file=out)
        return None
    if req.format == "csv":
        write_csv(table, out)
    else:
        for line in json_lines(table):
            print(line, file=out)
    return count


def rows_text(table: pa.Table) -> list[str]:
    """A header line and one line per row of a `pa.Table`, in aligned columns."""
    names = table.column_names
    cells = [[_cell(row[n]) for n in names] for row in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True))]
    for row_cells in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row_cells, widths, strict=True)))
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = str(value)
    return text if len(text) <= CELL_CHARS_MAX else text[: CELL_CHARS_MAX - 3] + "..."


def write_csv(table: pa.Table, out: TextIO) -> None:
    """`table` as CSV (module docstring), binary columns as base64 first."""
    for i, field in enumerate(table.schema):
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            encoded = pa.array(
                [None if v is None else _base64(v) for v in table.column(i).to_pylist()],
                type=pa.string(),
            )
            table = table.set_column(i, field.name, encoded)
    sink = io.BytesIO()
    pa_csv.write_csv(table, sink)
    out.write(sink.getvalue().decode())


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")
