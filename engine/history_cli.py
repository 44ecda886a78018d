"""`python -m engine history DIR`: the commits in an engine's retained WAL (issue 24 item 2).

    python -m engine history DIR [--table db.t] [--since AT] [--until AT] [--limit N]
                                 [--maintenance] [--json]

One line per commit, oldest first: commit_ts, its wall time (UTC), DSN, kind and, per table,
rows appended (+) and deleted (-), tables created and dropped. The engine's own flushes,
merges, compactions and checkpoints are hidden unless `--maintenance`. `--since`/`--until`
take what `--at` takes everywhere (engine/clock.py `parse_at`: a commit timestamp, `Nms`
epoch milliseconds, ISO-8601 with a zone), both ends included. `--limit N` lists the newest
N of the rows kept. A closing line says which DSNs and commit timestamps the retained WAL
holds and whether checkpoints cut older history away (their state is in the checkpoint;
their commits are not listed anywhere).

Read-only like `tables`, `scan` and `stats` (engine/cli.py): the WAL is read through the
same backends with the same options (`--wal logsvc --client-config --shard`, the `--objects`
options), without the file WAL's lock and without cutting a torn tail, and over logsvc
without a lease. Nothing is replayed into memory: each entry is decoded, turned into a row by
`engine.history.History` and printed, so memory stays flat however long the WAL is. Table
names come from the WAL's catalog entries and the newest checkpoint's catalog.

Exit codes as `engine/cli.py`'s: 0 done, 1 the engine could not be read, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
from collections.abc import Callable
from typing import TextIO

from engine import limits, opening
from engine.checkpoint import files, layout
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import Manifest
from engine.clock import TS_MAX, make_ts, parse_at, ts_at_datetime, ts_isoformat, ts_physical_ms
from engine.errors import EngineError, NotFound, WalCorruption
from engine.history import (
    HEADER_TEXT,
    CatalogName,
    Filter,
    History,
    HistoryRow,
    Retained,
    retained_json,
    retained_text,
    row_json,
    row_text,
)
from engine.layout import WAL_DIR_NAME
from engine.objects.errors import ObjectNotFound
from engine.objects.store import ObjectStore
from engine.wal.codec import decode_entry
from tae_driver import LogBackend, ReplayDecision, ReplayMode, open_driver
from tae_driver import errors as driver_errors
from tae_driver.errors import DriverError


def add_arguments(command: argparse.ArgumentParser) -> None:
    """`history`'s own options (DIR and the WAL and object options are engine/cli.py's)."""
    command.add_argument("--table", help="only commits touching db.table")
    command.add_argument("--since", help="from this commit_ts, Nms or ISO-8601 time (included)")
    command.add_argument("--until", help="up to this commit_ts, Nms or ISO-8601 time (included)")
    command.add_argument(
        "--limit",
        type=int,
        help=f"only the newest N rows (1..{limits.HISTORY_LIMIT_ROWS_MAX})",
    )
    command.add_argument(
        "--maintenance",
        action="store_true",
        help="also list flushes, merges, compactions and checkpoints",
    )
    command.add_argument("--json", action="store_true", help="one JSON document")


def arguments_error(args: argparse.Namespace) -> str | None:
    """The one line that names a bad argument, or None."""
    if args.table is not None and "." not in args.table:
        return f"--table {args.table!r}: give db.table"
    if args.limit is not None and not 1 <= args.limit <= limits.HISTORY_LIMIT_ROWS_MAX:
        return f"--limit {args.limit}: give 1..{limits.HISTORY_LIMIT_ROWS_MAX}"
    for option in ("since", "until"):
        text = getattr(args, option)
        if text is not None:
            try:
                parse_at(text)
            except ValueError as exc:
                return f"--{option}: {exc}"
    return None


def row_filter(args: argparse.Namespace) -> Filter:
    """The `Filter` of checked arguments: a wall time is its whole millisecond (`--since`
    from its first timestamp, `--until` to its last, as `snapshot(at=...)` reads it)."""
    since_ts, until_ts = 0, TS_MAX
    if args.since is not None:
        at = parse_at(args.since)
        since_ts = at if isinstance(at, int) else make_ts(ts_physical_ms(ts_at_datetime(at)))
    if args.until is not None:
        at = parse_at(args.until)
        until_ts = at if isinstance(at, int) else ts_at_datetime(at)
    return Filter(since_ts, until_ts, args.table, args.maintenance)


def run(args: argparse.Namespace, objects: object) -> int:
    """engine/cli.py calls this with the WAL and object options checked and `objects` what
    `Engine.open(objects=...)` would take."""
    problem = arguments_error(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        asyncio.run(history(args, objects, sys.stdout))
    except (EngineError, DriverError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


async def history(args: argparse.Namespace, objects: object, out: TextIO) -> None:
    path = os.fspath(args.dir)
    wal = args.wal
    if wal == "file" and not os.path.isdir(os.path.join(path, WAL_DIR_NAME)):
        raise NotFound(f"no engine here: {os.path.join(path, WAL_DIR_NAME)} does not exist")
    with opening.typed_open_errors(path):
        if opening.uses_directory(wal, objects):
            opening.check_engine_dir(path, wal, create=True)  # read-only: checks, creates nothing
        blocks = await asyncio.to_thread(
            opening.open_block_store,
            path,
            objects,  # type: ignore[arg-type]  # checked by engine/cli.py
            wal,
            True,
            limits.HISTORY_CACHE_BYTES,
        )
    try:
        newest: Manifest | None = None
        names: list[CatalogName] = []
        levels: list[tuple[int, int, int]] = []
        if blocks is not None:
            newest, names, levels = await asyncio.to_thread(checkpoint_catalog, blocks.store)
        core = History(names, levels, row_filter(args))
        printer = Printer(out, as_json=args.json, limit=args.limit)
        with opening.typed_open_errors(path):
            backend, owns = await opening.open_backend(
                path, wal, args.client_config, args.shard, True, None
            )
        try:
            truncated_lsn = await read_wal(backend, core, printer.row)
        finally:
            if owns:
                await backend.close()
        printer.close(core.retained, cut_text(core.retained, truncated_lsn, newest))
    finally:
        if blocks is not None:
            blocks.close()


async def read_wal(backend: LogBackend, core: History, emit: Callable[[HistoryRow], None]) -> int:
    """Every entry of the retained WAL through `core`, in DSN order, each kept row to `emit`
    as it is read (the driver's FOR_READ replay: a torn tail is not read, nothing is written).
    Returns the backend's truncated LSN."""
    driver = open_driver(backend)
    decided = ReplayDecision.INTERNAL

    def handle(dsn: int, payload: bytes) -> ReplayDecision:
        row = core.feed(dsn, decode_entry(payload, dsn))
        if row is not None:
            emit(row)
        return decided

    try:
        summary = await driver.replay(handle, ReplayMode.FOR_READ)
    except driver_errors.ReplayCorruptionError as exc:
        raise WalCorruption(driver.dsn() + 1, f"undecodable log record: {exc}") from exc
    finally:
        await driver.close()
    return summary.truncated_lsn


def checkpoint_catalog(
    store: ObjectStore,
) -> tuple[Manifest | None, list[CatalogName], list[tuple[int, int, int]]]:
    """The newest checkpoint, its catalog's names and its blocks' levels (blocking). Beside
    a running writer the checkpoint may be retired while it is read: then the newer one is
    read (`limits.READ_ONLY_LOOK_ATTEMPTS_MAX`). A damaged checkpoint gives no names (tables
    created before the WAL's start are then shown by id) and says so on stderr."""
    for attempt in range(1, limits.READ_ONLY_LOOK_ATTEMPTS_MAX + 1):
        try:
            newest = files.newest(store)
            if newest is None:
                return None, [], []
            catalog = layout.decode_catalog(store.get(newest.catalog), newest.catalog)
            block_rows = layout.decode_blocks(store.get(newest.blocks), newest.blocks)
        except ObjectNotFound:
            if attempt == limits.READ_ONLY_LOOK_ATTEMPTS_MAX:
                raise
            continue
        except CheckpointCorrupt as exc:
            print(f"warning: {exc}: tables are shown by id", file=sys.stderr)
            return None, [], []
        names = [
            CatalogName(r.db_id, r.table_id if r.kind == "table" else 0, r.name) for r in catalog
        ]
        levels = [(r.table_id, r.block_id, r.level) for r in block_rows]
        return newest, names, levels
    raise AssertionError("unreachable")


def cut_text(retained: Retained, truncated_lsn: int, newest: Manifest | None) -> str | None:
    """What truncation cut away, or None when the WAL holds every commit since the first."""
    if retained.first_dsn == 1 or (retained.first_dsn == 0 and truncated_lsn == 0):
        return None
    where = f"before DSN {retained.first_dsn}" if retained.first_dsn else "of every DSN"
    if newest is None:
        return f"the WAL's entries {where} were truncated (no checkpoint found in the objects)"
    return (
        f"the WAL's entries {where} were truncated after checkpoints: the newest (ckp_ts "
        f"{newest.ckp_ts}, {ts_isoformat(newest.ckp_ts)}) holds their data, not their history"
    )


class Printer:
    """Rows to `out` as they come (text lines, or one JSON document written piece by
    piece), or with `limit` the newest `limit` rows kept until the end."""

    def __init__(self, out: TextIO, *, as_json: bool, limit: int | None) -> None:
        self._out = out
        self._json = as_json
        self._kept: collections.deque[HistoryRow] | None = (
            collections.deque(maxlen=limit) if limit is not None else None
        )
        self._written = 0
        out.write('{"rows": [' if as_json else HEADER_TEXT + "\n")

    def row(self, row: HistoryRow) -> None:
        if self._kept is not None:
            self._kept.append(row)
        else:
            self._write(row)

    def _write(self, row: HistoryRow) -> None:
        if self._json:
            self._out.write(("\n" if self._written == 0 else ",\n") + json.dumps(row_json(row)))
        else:
            self._out.write(row_text(row) + "\n")
        self._written += 1

    def close(self, retained: Retained, cut: str | None) -> None:
        for row in self._kept or ():
            self._write(row)
        if self._json:
            document = json.dumps(retained_json(retained, cut), sort_keys=True)
            self._out.write(f'\n], "retained": {document}}}\n')
        else:
            shown = self._written if self._kept is not None else None
            self._out.write(retained_text(retained, cut, shown) + "\n")
        self._out.flush()
