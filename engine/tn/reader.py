"""`python -m engine cn --config cn.toml [COMMAND]`: a compute node as a scripted or
interactive reader (issue 15): it starts empty, pulls the TN's logtail for each read, reads
blocks from the object store itself, and answers exactly as the TN would at that timestamp.

Commands (one on the command line, else one a line on stdin; `cn> ` is prompted on a
terminal):

    status                                 the TN in use, its role and timestamps
    tables                                 databases and tables, with keys and row counts
    scan DB.TABLE [--at TS] [--limit N]    rows by primary key, at TS (default: newest)
    sql "SELECT ..." [--at TS|ISO-8601|Nms] [--format table|csv|json|parquet] [--out FILE]
                                           one SELECT over the snapshot (engine/sql.py)
    help | quit

Exit codes: 0 every command succeeded, 1 some failed (each failure is printed as
`error: ...` and the next command runs), 2 a bad config (naming the key) or bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import shlex
import sys

from engine import limits as engine_limits
from engine import sql, sql_command
from engine.cli import rows_text
from engine.clock import wall_ms
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.errors import EngineError
from engine.logtail import LogtailUnavailable
from engine.objects.store import LocalDirStore, ObjectStore
from engine.tn.config import CNConfig, ConfigError, load_cn
from logsvc.config import main_config_error

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

LINE_BYTES_MAX = 4096
"""A command line: longer is refused, not parsed."""

HELP = __doc__.split("\n\n")[2] if __doc__ else ""


class _Usage(Exception):
    pass


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Usage(message)


def _scan_parser() -> _ArgParser:
    parser = _ArgParser(prog="scan", add_help=False)
    parser.add_argument("table")
    parser.add_argument("--at", type=int, default=None)
    parser.add_argument("--limit", type=int, default=engine_limits.SCAN_ROWS_DEFAULT_LIMIT)
    return parser


def _sql_parser() -> _ArgParser:
    parser = _ArgParser(prog="sql", add_help=False)
    sql_command.add_arguments(parser)
    return parser


def main(config_path: str, words: list[str]) -> int:
    try:
        config = load_cn(config_path)
    except ConfigError as exc:
        return main_config_error(exc)
    try:
        return asyncio.run(_run(config, words))
    except ConfigError as exc:
        return main_config_error(exc)


async def _run(config: CNConfig, words: list[str]) -> int:
    store = _object_store(config)
    tn = NetworkTN(config.tns, config.token, config.client)
    node = ComputeNode(tn, store, cache_bytes=config.cache_bytes, client_id=config.client_id)
    try:
        if words:
            return EXIT_OK if await _command(node, tn, words) else EXIT_FAILED
        return await _session(node, tn)
    finally:
        await node.close()
        await tn.close()
        close = getattr(store, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


async def _session(node: ComputeNode, tn: NetworkTN) -> int:
    interactive = sys.stdin.isatty()
    failed = False
    while True:
        if interactive:
            print("cn> ", end="", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline, LINE_BYTES_MAX + 1)
        if not line:
            break
        if len(line) > LINE_BYTES_MAX:
            print(f"error: a command is at most {LINE_BYTES_MAX} characters", flush=True)
            failed = True
            # Skip the rest of that line (bounded reads).
            while line and not line.endswith("\n"):
                line = await asyncio.to_thread(sys.stdin.readline, LINE_BYTES_MAX + 1)
            continue
        try:
            words = shlex.split(line)
        except ValueError as exc:
            print(f"error: {exc}", flush=True)
            failed = True
            continue
        if not words:
            continue
        if words[0] in ("quit", "exit"):
            break
        if not await _command(node, tn, words):
            failed = True
    return EXIT_FAILED if failed else EXIT_OK


async def _command(node: ComputeNode, tn: NetworkTN, words: list[str]) -> bool:
    """Run one command and print its answer; False (and `error: ...`) when it failed."""
    name, args = words[0], words[1:]
    try:
        if name == "status" and not args:
            await _status(node, tn)
        elif name == "tables" and not args:
            await _tables(node)
        elif name == "scan":
            parsed = _scan_parser().parse_args(args)
            if parsed.limit < 0 or "." not in parsed.table:
                raise _Usage("scan needs DB.TABLE and a --limit >= 0")
            await _scan(node, parsed.table, parsed.at, parsed.limit)
        elif name == "sql":
            parsed = _sql_parser().parse_args(args)
            problem = sql_command.arguments_error(parsed)
            if problem is not None:
                raise _Usage(problem)
            await _sql(node, parsed)
        elif name == "help":
            print(HELP)
        else:
            raise _Usage(f"unknown command {' '.join(words)!r} (try help)")
    except _Usage as exc:
        print(f"error: {exc}", flush=True)
        return False
    except (EngineError, LogtailUnavailable, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return False
    sys.stdout.flush()
    return True


async def _status(node: ComputeNode, tn: NetworkTN) -> None:
    status = await tn.status()
    print(
        f"TN {tn.address} ({status.role}): visible_ts {status.visible_ts}, checkpoint_ts "
        f"{status.checkpoint_ts}; this CN has applied up to {node.applied_ts}"
    )


async def _tables(node: ComputeNode) -> None:
    async with node.snapshot() as view:
        databases = view.databases()
        if not databases:
            print(f"(no databases at commit_ts {view.start_ts})")
        for db in databases:
            print(db)
            for name in view.tables(db):
                handle = view.table(db, name)
                schema = handle.schema
                rows = (await handle.scan(columns=list(schema.primary_key))).num_rows
                columns = ", ".join(
                    f"{c.name} {c.type}{'' if c.nullable else ' not null'}" for c in schema.columns
                )
                print(f"  {db}.{name}  rows={rows}  key=({', '.join(schema.primary_key)})")
                print(f"    {columns}")
        print(f"(at commit_ts {view.start_ts})")


async def _scan(node: ComputeNode, qualified: str, at: int | None, limit: int) -> None:
    db, _, name = qualified.partition(".")
    async with node.snapshot(at) as view:
        handle = view.table(db, name)
        table = await handle.scan()
        total = table.num_rows
        keys = [(k, "ascending") for k in handle.schema.primary_key]
        table = table.sort_by(keys).slice(0, limit)
        for line in rows_text(table):
            print(line)
        print(f"({table.num_rows} of {total} rows at commit_ts {view.start_ts})")


async def _sql(node: ComputeNode, args: argparse.Namespace) -> None:
    at = args.at
    if isinstance(at, datetime.datetime):
        at = sql.snapshot_ts(at, await node.catch_up(), wall_ms())
    async with node.snapshot(at) as view:
        table = await sql.run(view, args.query)
    sql_command.write(table, view.start_ts, args.format, args.out)


def _object_store(config: CNConfig) -> ObjectStore:
    objects = config.objects
    if objects.dir is not None:
        return LocalDirStore(objects.dir, read_only=True)
    s3 = objects.s3
    assert s3 is not None
    from engine.objects.errors import ObjectsError
    from engine.objects.s3 import S3ObjectStore

    try:
        return S3ObjectStore(
            s3.endpoint, s3.bucket, s3.prefix, s3.access_key, s3.secret_key, s3.region, s3.scheme
        )
    except ObjectsError as exc:
        raise ConfigError("objects.s3", str(exc)) from None
