"""`python -m engine`: look into an engine's committed state without SQL; run a TN daemon and a
compute node reader (issue 15).

    python -m engine tables DIR                     databases, tables, schemas, row counts
    python -m engine scan DIR db.table [--where FILTER] [--columns a,b] [--at TS|ISO|Nms]
                     [--format table|csv|json] [--limit N]
                                                    rows by primary key, filtered, at a
                                                    past time (engine/scan_command.py)
    python -m engine sql DIR "select ..." [--at TS|ISO-8601|Nms] [--format table|csv|json|
        parquet] [--out FILE]                       one SELECT over a snapshot (sql_command.py)
    python -m engine stats DIR [--json]             commit timestamp, counts, WAL position,
                                                    storage: blocks per level, the newest
                                                    checkpoint, WAL retained, the objects
    python -m engine history DIR [--table db.t] [--since AT] [--until AT] [--limit N]
                                 [--maintenance] [--json]
                                                    the commits in the retained WAL
                                                    (engine/history_cli.py)

    python -m engine serve --config tn.toml [--standby]    the TN daemon (engine/tn/daemon.py)
    python -m engine promote --config tn.toml              make that standby TN active now
    python -m engine cn --config cn.toml [COMMAND...]      a compute node: read, insert,
                                                           delete (engine/tn/reader.py)
    python -m engine repair DIR [--yes]     a corrupt file WAL: say what is lost; with --yes
                                            move the damaged suffix aside (engine/repair.py)

`tables`, `scan`, `sql` and `stats` open the engine read-only and write nothing (issue 20):
replay FOR_READ in memory (`history` reads the WAL the same way, streaming it instead); a file
WAL is read without its lock (beside a running engine, showing what it had written when the
command looked) and a torn tail is not read, never cut; the objects directory gets no lock
and no temporary files; over logsvc no lease is taken, so a running engine is not fenced.
They print, and close. `--wal logsvc --client-config client.toml
--shard N` reads an engine whose WAL is on logsvc.

Objects: in `DIR/objects` by default; `--objects s3 --s3-endpoint HOST:PORT --s3-bucket B
[--s3-prefix P] [--s3-region R] [--s3-scheme http|https]` for an engine whose objects are in
S3, with the credentials in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; `--objects none` for
an engine of part 1 (every row in the WAL).

Exit codes: 0 done, 1 the engine could not be opened or read (or the output's reader went
away: `... | head` ends quietly; or `sql` without DuckDB), 2 bad arguments (also a `--where`
filter or `--columns` that does not fit the table, naming the column or character; for `sql` a
SQL error or an `--at` the engine cannot serve, on one line). `serve`,
`promote` and `cn` say theirs in their modules (a config error is 2, naming the key; a
fenced TN exits 3; `repair`: 0 nothing to repair or repaired, 1 damage found and nothing
changed (pass --yes), 2 bad arguments or no WAL, 3 not repairable or the WAL is locked).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine import history_cli, limits, scan_command, sql_command
from engine.clock import ts_physical_ms
from engine.engine import Engine
from engine.errors import BadArgument, EngineError
from engine.objects.errors import ObjectNotFound
from engine.objects.store import ObjectStore
from logsvc.pipes import quiet_on_broken_pipe
from tae_driver.errors import DriverError

if TYPE_CHECKING:
    from engine import metrics

S3_ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
S3_SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text)
        command.add_argument("dir", help="the engine's directory")
        add_wal_options(command)
        add_object_options(command)
        return command

    add("tables", "databases and tables, with schemas and live row counts")
    scan = add("scan", "rows of a table by primary key: filtered, at a past time, as csv/json")
    scan_command.add_options(scan)
    sql = add("sql", "one SELECT over a snapshot (DuckDB, the optional extra logsvc[sql])")
    sql_command.add_arguments(sql)
    stats = add("stats", "commit timestamp, counts, WAL position, storage")
    stats.add_argument("--json", action="store_true")
    history_cli.add_arguments(add("history", "the commits in the retained WAL (history_cli.py)"))
    serve = sub.add_parser("serve", help="run a TN daemon (issue 15)")
    serve.add_argument("--config", required=True, help="the TN's tn.toml")
    serve.add_argument("--standby", action="store_true", help="tail the WAL; take over later")
    promote = sub.add_parser("promote", help="make the standby TN of this config active now")
    promote.add_argument("--config", required=True, help="the standby's tn.toml")
    from engine.tn import reader

    reader.add_parser(sub)
    from engine import repair

    repair.add_parser(sub)
    return parser


def add_wal_options(parser: argparse.ArgumentParser) -> None:
    """--wal, --client-config, --shard: where an engine's WAL is (also
    engine/testing/workload.py)."""
    parser.add_argument("--wal", choices=["file", "logsvc"], default="file")
    parser.add_argument("--client-config", help="client.toml of the logsvc cluster")
    parser.add_argument("--shard", type=int, help="the logsvc shard of the WAL")


def wal_options_error(args: argparse.Namespace) -> str | None:
    if args.wal == "logsvc" and (args.client_config is None or args.shard is None):
        return "--wal logsvc needs --client-config and --shard"
    return None


def add_object_options(parser: argparse.ArgumentParser) -> None:
    """--objects and the --s3-* options: where an engine's objects are (module docstring;
    also engine/testing/workload.py)."""
    parser.add_argument(
        "--objects",
        choices=["dir", "none", "s3"],
        help="dir: DIR/objects (the default); s3: the --s3-* bucket; none: no objects",
    )
    parser.add_argument("--s3-endpoint", help="HOST:PORT of the S3 service")
    parser.add_argument("--s3-bucket")
    parser.add_argument("--s3-prefix", default="", help="key prefix of the engine's objects")
    parser.add_argument("--s3-region", default="us-east-1")
    parser.add_argument("--s3-scheme", choices=["http", "https"], default="https")


def objects_options_error(args: argparse.Namespace) -> str | None:
    s3_given = args.s3_endpoint is not None or args.s3_bucket is not None
    if args.objects != "s3":
        return "--s3-endpoint and --s3-bucket go with --objects s3" if s3_given else None
    if args.s3_endpoint is None or args.s3_bucket is None:
        return "--objects s3 needs --s3-endpoint and --s3-bucket"
    if not os.environ.get(S3_ACCESS_KEY_ENV) or not os.environ.get(S3_SECRET_KEY_ENV):
        return f"--objects s3 needs the credentials in {S3_ACCESS_KEY_ENV} and {S3_SECRET_KEY_ENV}"
    return None


def objects_from_args(args: argparse.Namespace) -> str | ObjectStore | None:
    """What `Engine.open(objects=...)` takes for these options (checked by
    `objects_options_error` first)."""
    if args.objects != "s3":
        return str(args.objects) if args.objects is not None else None
    from engine.objects.s3 import S3ObjectStore  # pyarrow's S3 client: only when asked for

    return S3ObjectStore(
        args.s3_endpoint,
        args.s3_bucket,
        args.s3_prefix,
        os.environ[S3_ACCESS_KEY_ENV],
        os.environ[S3_SECRET_KEY_ENV],
        region=args.s3_region,
        scheme=args.s3_scheme,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return quiet_on_broken_pipe(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    if not __debug__:
        print("error: the engine refuses to run under python -O", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    if args.command == "serve":
        from engine.tn import daemon

        return daemon.serve(args.config, standby=args.standby)
    if args.command == "promote":
        from engine.tn import daemon

        return daemon.promote(args.config)
    if args.command == "cn":
        from engine.tn import reader

        return reader.main(args.config, list(args.words))
    if args.command == "repair":
        from engine import repair

        return repair.run(args.dir, args.yes)
    problem = wal_options_error(args) or objects_options_error(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.command == "history":
        return history_cli.run(args, objects_from_args(args))
    if args.command == "sql":
        problem = sql_command.arguments_error(args)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        if args.command == "sql":
            return sql_command.run(args, lambda: _open_read_only(args))
        if args.command == "scan":
            args.request = scan_command.request(args)
        return asyncio.run(_run(args))
    except BadArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # the output's reader went away: quiet_on_broken_pipe ends quietly
    except (EngineError, DriverError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace) -> int:
    """Look, printing only a whole answer: beside a running engine, an object the look needs
    may be deleted by the writer meanwhile (`limits.READ_ONLY_LOOK_ATTEMPTS_MAX`); then the
    look starts again from the writer's newer state."""
    for attempt in range(1, limits.READ_ONLY_LOOK_ATTEMPTS_MAX + 1):
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                info = await _look(args)
        except ObjectNotFound:
            if attempt == limits.READ_ONLY_LOOK_ATTEMPTS_MAX:
                raise
            continue
        sys.stdout.write(output.getvalue())
        if info is not None:
            sys.stdout.flush()
            print(info, file=sys.stderr)
        break
    return 0


async def _open_read_only(args: argparse.Namespace) -> Engine:
    return await Engine.open(
        args.dir,
        wal=args.wal,
        client_config=args.client_config,
        shard=args.shard,
        read_only=True,
        objects=objects_from_args(args),
    )


async def _look(args: argparse.Namespace) -> str | None:
    """Print what `args` asks for; a line for stderr, if any."""
    engine = await _open_read_only(args)
    try:
        if args.command == "tables":
            await _tables(engine)
        elif args.command == "scan":
            return await _scan(engine, args.request)
        else:
            # Imported here: metrics loads prometheus_client, which no other command needs.
            from engine import metrics

            audit = await asyncio.to_thread(metrics.audit_objects, engine)
            _stats(engine, audit, args.json)
        return None
    finally:
        await engine.close()


async def _tables(engine: Engine) -> None:
    async with engine.transaction() as txn:
        databases = txn.databases()
        if not databases:
            print("(no databases)")
        for db in databases:
            print(f"{db}")
            for name in txn.tables(db):
                handle = txn.table(db, name)
                schema = handle.schema
                rows = (await handle.scan(columns=list(schema.primary_key))).num_rows
                columns = ", ".join(
                    f"{c.name} {c.type}{'' if c.nullable else ' not null'}" for c in schema.columns
                )
                print(f"  {db}.{name}  rows={rows}  key=({', '.join(schema.primary_key)})")
                print(f"    {columns}")


async def _scan(engine: Engine, req: scan_command.ScanRequest) -> str | None:
    visible_ts = engine.visible_ts
    async with engine.snapshot(at=visible_ts if req.at is None else req.at) as view:
        return await scan_command.scan(view, req, sys.stdout)


def _stats(engine: Engine, audit: metrics.ObjectAudit, as_json: bool) -> None:
    from engine import metrics  # (see _look)

    stats = engine.stats()
    storage = metrics.storage_stats(engine)
    document = dataclasses.asdict(stats)
    document["replay"] = (
        {k: (v.value if hasattr(v, "value") else v) for k, v in document["replay"].items()}
        if document["replay"]
        else None
    )
    document["storage"] = dataclasses.asdict(storage)
    document["objects_audit"] = dataclasses.asdict(audit)
    if as_json:
        print(json.dumps(document, sort_keys=True))
        return
    replay = stats.replay
    print(f"visible commit_ts  {stats.visible_ts}  (wall ms {ts_physical_ms(stats.visible_ts)})")
    print(f"databases          {stats.databases}")
    print(f"tables             {stats.tables}")
    print(f"live rows          {stats.live_rows}")
    if replay is not None:
        print(
            f"WAL                {replay.entries_applied} transactions replayed, last DSN "
            f"{replay.last_dsn}, {replay.records_read} records read, truncated below LSN "
            f"{replay.truncated_lsn + 1}"
        )
    _storage_lines(storage, audit)


def _storage_lines(storage: metrics.StorageStats, audit: metrics.ObjectAudit) -> None:
    from engine import metrics  # (see _look)

    wal_bytes = (
        f", {storage.wal_bytes_retained} bytes" if storage.wal_bytes_retained is not None else ""
    )
    print(
        f"WAL retained       {storage.wal_entries_retained} entries{wal_bytes}, "
        f"{storage.wal_entries_since_checkpoint} after the newest checkpoint"
    )
    if storage.objects is None:
        print("objects            none (every row in memory and in the WAL)")
        return
    blocks = ", ".join(f"{level} {storage.blocks[level]}" for level in metrics.LEVELS)
    print(f"blocks             {blocks}  ({storage.l0_bytes} bytes in L0)")
    checkpoint = storage.checkpoint
    if checkpoint is None:
        print("checkpoint         none")
    else:
        print(
            f"checkpoint         {checkpoint.kind} at commit_ts {checkpoint.ckp_ts}, DSN "
            f"{checkpoint.ckp_dsn}, written {checkpoint.age_s:.1f} s ago; "
            f"{storage.checkpoints_retained} retained"
        )
    print(
        f"objects            {storage.objects}: {audit.stored} stored ({audit.stored_bytes} "
        f"bytes), {audit.referenced} referenced, {len(audit.missing)} missing, "
        f"{len(audit.unreferenced)} unreferenced (deleted by the next writable open)"
    )
    for name in audit.missing[:10]:
        print(f"  missing          {name}")
