"""`python -m engine cn --config cn.toml [COMMAND]`: a compute node from the command line
(issues 15, 24): it starts empty, pulls the TN's logtail for each read, reads blocks from the
object store itself, answers exactly as the TN would at that timestamp, and commits rows
through the TN.

Commands (one on the command line, else one a line on stdin; `cn> ` is prompted on a
terminal):

    status                       the TN in use, its role and timestamps
    tables                       databases and tables, with keys and row counts
    scan DB.TABLE [--where FILTER] [--columns a,b] [--at TS|ISO-8601|Nms]
                  [--format table|csv|json] [--limit N]
                                 rows by primary key (engine/scan_command.py)
    insert DB.TABLE --json FILE  commit FILE's rows as one transaction (a JSON array of
                                 objects, or JSON lines; - for stdin; engine/json_rows.py)
                                 and print `inserted N rows into DB.TABLE at commit_ts T`
    delete DB.TABLE --json FILE  commit the deletion of FILE's keys (values, arrays or
                                 objects); print `deleted N of M keys ... at commit_ts T`
    sql "SELECT ..." [--at TS|ISO-8601|Nms] [--format table|csv|json|parquet] [--out FILE]
                                 one SELECT over the snapshot (engine/sql.py)
    help | quit

Exit codes:

    0  every command succeeded
    1  a command failed otherwise (no TN answered, an unknown database or table, as for
       `engine scan`, a snapshot no longer held, ...)
    2  a bad config (naming the key), bad arguments or bad input (bad JSON, an unknown
       column, a wrong type, an insert over a size limit): nothing was committed
    3  the transaction was refused: WriteConflict (a concurrent commit won; run it again)
       or DuplicateKey (an inserted key is already live); nothing was committed
    4  OutcomeUnknown: no TN could say whether the commit landed; read before retrying

With commands from stdin, each failure is printed as `error: ...` and the next command runs;
the exit code is that of the last command that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import shlex
import sys
from typing import Any

from engine import as_of, json_rows, scan_command, sql, sql_command
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.errors import (
    BadArgument,
    BadInput,
    DuplicateKey,
    EngineError,
    NotFound,
    OutcomeUnknown,
    TxnTooLarge,
    WriteConflict,
)
from engine.logtail import LogtailUnavailable
from engine.objects.store import LocalDirStore, ObjectStore
from engine.tn.config import CNConfig, ConfigError, load_cn
from logsvc.config import main_config_error

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_OUTCOME_UNKNOWN = 4

LINE_BYTES_MAX = 4096
"""A command line: longer is refused, not parsed."""

JSON_INPUT_BYTES_MAX = 64 * 1024 * 1024
"""An insert's or delete's JSON: larger is refused unread. One transaction's insert travels
in one request of at most 8 MiB of Arrow (engine/tn/limits.py OP_ROWS_BYTES_MAX); JSON text
of that many rows is rarely 8 times larger."""

HELP = __doc__.split("\n\n")[2] if __doc__ else ""


class _Usage(Exception):
    pass


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Usage(message)


def add_parser(sub: Any) -> None:
    """`cn` of `python -m engine` (engine/cli.py): --help lists the commands."""
    cn = sub.add_parser(
        "cn",
        help="a compute node: status, tables, scan, sql, insert, delete",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cn.add_argument("--config", required=True, help="the compute node's cn.toml")
    cn.add_argument("words", nargs=argparse.REMAINDER, help="one command (else: stdin)")


def _scan_parser() -> _ArgParser:
    parser = _ArgParser(prog="scan", add_help=False)
    scan_command.add_options(parser)
    return parser


def _sql_parser() -> _ArgParser:
    parser = _ArgParser(prog="sql", add_help=False)
    sql_command.add_arguments(parser)
    return parser


def _write_parser(name: str) -> _ArgParser:
    parser = _ArgParser(prog=name, add_help=False)
    parser.add_argument("table")
    parser.add_argument("--json", required=True, dest="json_path")
    return parser


def exit_code(exc: BaseException) -> int:
    """The exit code of a failed command (the module docstring)."""
    if isinstance(exc, (WriteConflict, DuplicateKey)):
        return EXIT_REFUSED
    if isinstance(exc, OutcomeUnknown):
        return EXIT_OUTCOME_UNKNOWN
    if isinstance(exc, NotFound):
        return EXIT_FAILED  # as `engine scan` (engine/cli.py) says an unknown table
    if isinstance(exc, (_Usage, BadInput, TxnTooLarge)):
        return EXIT_USAGE
    return EXIT_FAILED


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
            return await _command(node, tn, words, stdin_free=True)
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
    code = EXIT_OK
    while True:
        if interactive:
            print("cn> ", end="", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline, LINE_BYTES_MAX + 1)
        if not line:
            break
        if len(line) > LINE_BYTES_MAX:
            print(f"error: a command is at most {LINE_BYTES_MAX} characters", flush=True)
            code = EXIT_USAGE
            # Skip the rest of that line (bounded reads).
            while line and not line.endswith("\n"):
                line = await asyncio.to_thread(sys.stdin.readline, LINE_BYTES_MAX + 1)
            continue
        try:
            words = shlex.split(line)
        except ValueError as exc:
            print(f"error: {exc}", flush=True)
            code = EXIT_USAGE
            continue
        if not words:
            continue
        if words[0] in ("quit", "exit"):
            break
        command_code = await _command(node, tn, words, stdin_free=False)
        if command_code != EXIT_OK:
            code = command_code
    return code


async def _command(node: ComputeNode, tn: NetworkTN, words: list[str], *, stdin_free: bool) -> int:
    """Run one command and print its answer; its exit code (and `error: ...` when it
    failed). `stdin_free`: the commands do not come from stdin, so `--json -` may read it."""
    name, args = words[0], words[1:]
    try:
        if name == "status" and not args:
            await _status(node, tn)
        elif name == "tables" and not args:
            await _tables(node)
        elif name == "scan":
            parsed = _scan_parser().parse_args(args)
            await _scan(node, scan_command.request(parsed))
        elif name in ("insert", "delete"):
            parsed = _write_parser(name).parse_args(args)
            db, dot, table = parsed.table.partition(".")
            if not dot or not db or not table:
                raise _Usage(f"{name} needs DB.TABLE, not {parsed.table!r}")
            data = await _read_json_input(parsed.json_path, stdin_free=stdin_free)
            if name == "insert":
                await _insert(node, db, table, data, parsed.json_path)
            else:
                await _delete(node, db, table, data, parsed.json_path)
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
    except (_Usage, BadArgument) as exc:
        print(f"error: {exc}", flush=True)
        return EXIT_USAGE
    except (EngineError, LogtailUnavailable, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return exit_code(exc)
    sys.stdout.flush()
    return EXIT_OK


async def _read_json_input(path: str, *, stdin_free: bool) -> bytes:
    """The bytes of `--json PATH` (`-`: stdin), at most JSON_INPUT_BYTES_MAX."""
    if path == "-":
        if not stdin_free:
            raise _Usage("--json - reads stdin: give the command on the command line")
        data: bytes = await asyncio.to_thread(sys.stdin.buffer.read, JSON_INPUT_BYTES_MAX + 1)
    else:
        try:
            with open(path, "rb") as handle:
                data = await asyncio.to_thread(handle.read, JSON_INPUT_BYTES_MAX + 1)
        except OSError as exc:
            raise _Usage(f"--json {path}: {exc.strerror or exc}") from None
    if len(data) > JSON_INPUT_BYTES_MAX:
        raise _Usage(
            f"--json {path}: more than {JSON_INPUT_BYTES_MAX} bytes; split it into several "
            "transactions"
        )
    return data


async def _insert(node: ComputeNode, db: str, name: str, data: bytes, path: str) -> None:
    source = "stdin" if path == "-" else path
    values = json_rows.documents(data, source)
    async with node.transaction() as txn:
        handle = txn.table(db, name)
        count = await handle.insert(json_rows.rows(values, handle.schema, source)) if values else 0
    if count == 0:
        print(f"inserted 0 rows into {db}.{name} (nothing to commit)")
    else:
        print(f"inserted {count} rows into {db}.{name} at commit_ts {txn.commit_ts}")


async def _delete(node: ComputeNode, db: str, name: str, data: bytes, path: str) -> None:
    source = "stdin" if path == "-" else path
    values = json_rows.documents(data, source)
    async with node.transaction() as txn:
        handle = txn.table(db, name)
        keys = json_rows.keys(values, handle.schema, source)
        count = await handle.delete(keys) if keys else 0
    if count == 0:
        print(
            f"deleted 0 of {len(keys)} keys from {db}.{name} (none live at commit_ts "
            f"{txn.start_ts}: nothing to commit)"
        )
    else:
        print(f"deleted {count} of {len(keys)} keys from {db}.{name} at commit_ts {txn.commit_ts}")


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


async def _sql(node: ComputeNode, args: argparse.Namespace) -> None:
    at = args.at
    if isinstance(at, datetime.datetime):
        at = as_of.snapshot_ts(at, await node.catch_up())
    async with node.snapshot(at) as view:
        table = await sql.run(view, args.query)
    sql_command.write(table, view.start_ts, args.format, args.out)


async def _scan(node: ComputeNode, req: scan_command.ScanRequest) -> None:
    newest = await node.catch_up()
    ts = newest if req.at is None else as_of.snapshot_ts(req.at, newest)
    async with node.snapshot(ts) as view:
        info = await scan_command.scan(view, req, sys.stdout)
    if info is not None:
        sys.stdout.flush()
        print(info, file=sys.stderr, flush=True)


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
