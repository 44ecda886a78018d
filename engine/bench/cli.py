"""`python -m engine.bench commit|scan|distributed ...`: the engine's benchmarks, each printing
lines of JSON with its peer measured in the same run. One module per benchmark:

* `commit` (engine/bench/commit.py): commit throughput and latency against SQLite;
* `scan` (engine/bench/scan.py): reads over checkpointed blocks against DuckDB;
* `distributed` (engine/bench/distributed.py, its cold start in engine/bench/cold_start.py):
  compute nodes over a TN pair on logsvc, against SQLite.

Percentiles (linear interpolation) and CPU seconds are taken as in every benchmark of the
repository (logsvc/bench/measure.py). Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.bench import commit as commit_bench
from engine.bench.commit import (
    GC_CHOICES,
    INPUTS,
    PRELOAD_ROWS_MAX,
    ROW_BYTES,
    ROWS_MAX,
    SECONDS_MAX,
    SQLITE_MODES,
    WALS,
    WARMUP_S_DEFAULT,
    WARMUP_S_MAX,
    WRITERS_MAX,
    run,
    summary,
)
from logsvc import stop_signal


def _csv(kind: Callable[[str], Any], choices: Sequence[str] | None = None) -> Callable[[str], Any]:
    def parse(text: str) -> list[Any]:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        if choices is not None:
            if items == ["none"]:
                return []
            for item in items:
                if item not in choices:
                    raise argparse.ArgumentTypeError(f"{item!r} is not one of {', '.join(choices)}")
        try:
            values = [kind(item) for item in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return list(dict.fromkeys(values))  # duplicates once, order kept

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commit = commands.add_parser(
        "commit",
        help="commit throughput and latency vs SQLite",
        description=commit_bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commit.add_argument(
        "--wal",
        type=_csv(str, WALS),
        default=["file"],
        help="engine WALs, a comma list of file, logsvc, memory, or none (default: file)",
    )
    commit.add_argument(
        "--sqlite",
        type=_csv(str, SQLITE_MODES),
        default=list(SQLITE_MODES),
        help="SQLite synchronous modes, a comma list of full, normal, or none (default both)",
    )
    commit.add_argument("--writers", type=_csv(int), default=[1, 16, 64])
    commit.add_argument("--rows", type=_csv(int), default=[1], help="rows per transaction")
    commit.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    commit.add_argument(
        "--warmup", type=float, default=WARMUP_S_DEFAULT, help="uncounted seconds before each"
    )
    commit.add_argument(
        "--input",
        choices=INPUTS,
        default="arrow",
        help="how the engine gets each transaction's rows: a pa.RecordBatch or a list of dicts",
    )
    commit.add_argument(
        "--gc",
        choices=GC_CHOICES,
        default="default",
        help="'tuned': logsvc.gc_tuning.tune_for_latency() first (as `logsvc bench cluster`)",
    )
    commit.add_argument(
        "--preload-rows",
        type=_csv(int),
        default=[0],
        help="rows with random keys in the engine's table before each measurement, a comma "
        "list (issue 21: the rate must stay flat as the table grows; default 0)",
    )
    commit.add_argument(
        "--unmerged",
        action="store_true",
        help="no merges in the engine (flushes and checkpoints run): a preload's blocks stay "
        "one object each, all key ranges overlapping (>= 1,000 blocks from 8.2M rows)",
    )
    commit.add_argument(
        "--history-retention-s",
        type=float,
        default=None,
        help="the engine's history retention window (default: the engine's, an hour); the "
        "end-of-run wal_bytes_end and object_bytes_end stay bounded by it",
    )
    commit.add_argument("--dir", default=None, help="where temporary directories go")
    scan = commands.add_parser("scan", help="reads over checkpointed blocks vs DuckDB")
    scan.add_argument("--rows", type=int, default=1_000_000)
    scan.add_argument("--batch-rows", type=int, default=20_000, help="rows per load txn")
    scan.add_argument("--lookups", type=int, default=200, help="point lookups per run")
    scan.add_argument("--repeat", type=int, default=5, help="runs of each query")
    scan.add_argument("--tail-mb", type=float, default=0.0, help="WAL tail before restart")
    scan.add_argument("--cache-mb", type=int, default=256, help="the engine's buffer cache")
    scan.add_argument("--no-duckdb", action="store_true", help="the engine's figures only")
    scan.add_argument("--no-sql", action="store_true", help="skip the queries through eng.sql")
    scan.add_argument("--dir", default=None, help="where temporary directories go")
    dist = commands.add_parser(
        "distributed", help="two CNs over a TN pair on logsvc: commits, freshness, failover"
    )
    dist.add_argument("--writers", type=int, default=16, help="writer coroutines per CN")
    dist.add_argument("--seconds", type=float, default=10.0, help="the commit measurement")
    dist.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds before it")
    dist.add_argument("--rows", type=int, default=10_000_000, help="the cold start's table")
    dist.add_argument("--load-batch-rows", type=int, default=200_000, help="rows per load txn")
    dist.add_argument("--probes", type=int, default=200, help="idle freshness commits")
    dist.add_argument("--dir", default=None, help="where temporary directories go")
    return parser


def main(argv: list[str] | None = None) -> int:
    if not __debug__:
        print("engine.bench refuses to run under python -O (asserts stay on)", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    stop_signal.stop_on_sigterm()  # SIGTERM stops the clusters and TNs started here, by PID

    def emit(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    if args.command == "scan":
        from engine.bench import scan as scan_bench

        if not 1 <= args.rows <= 100_000_000 or not 1 <= args.batch_rows <= 100_000:
            parser.error("--rows must be in [1, 1e8] and --batch-rows in [1, 1e5]")
        emit(scan_bench.run(args, emit))
        return 0
    if args.command == "distributed":
        from engine.bench import distributed as dist

        if not 1 <= args.writers <= dist.WRITERS_MAX:
            parser.error(f"--writers must be in [1, {dist.WRITERS_MAX}]")
        if not 0 < args.seconds <= SECONDS_MAX or not 0 <= args.warmup <= WARMUP_S_MAX:
            parser.error(
                f"--seconds must be in (0, {SECONDS_MAX}], --warmup in [0, {WARMUP_S_MAX}]"
            )
        if not 1 <= args.rows <= dist.ROWS_MAX:
            parser.error(f"--rows must be in [1, {dist.ROWS_MAX}]")
        if not 1 <= args.load_batch_rows <= dist.LOAD_BATCH_ROWS_MAX:
            parser.error(f"--load-batch-rows must be in [1, {dist.LOAD_BATCH_ROWS_MAX}]")
        if not 1 <= args.probes <= dist.PROBES_MAX:
            parser.error(f"--probes must be in [1, {dist.PROBES_MAX}]")
        options = dist.Options(
            writers=args.writers,
            seconds=args.seconds,
            warmup=args.warmup,
            rows=args.rows,
            load_batch_rows=args.load_batch_rows,
            probes=args.probes,
            dir_path=args.dir,
        )
        emit(dist.run(options, emit))
        return 0
    if not args.wal and not args.sqlite:
        parser.error("nothing to measure: --wal none and --sqlite none")
    if not all(1 <= w <= WRITERS_MAX for w in args.writers):
        parser.error(f"--writers must each be in [1, {WRITERS_MAX}]")
    if not all(1 <= r <= ROWS_MAX for r in args.rows):
        parser.error(f"--rows must each be in [1, {ROWS_MAX}]")
    if not 0 < args.seconds <= SECONDS_MAX:
        parser.error(f"--seconds must be in (0, {SECONDS_MAX}]")
    if not 0 <= args.warmup <= WARMUP_S_MAX:
        parser.error(f"--warmup must be in [0, {WARMUP_S_MAX}]")
    from engine import limits

    window_s_max = limits.HISTORY_RETENTION_MS_MAX / 1000
    if args.history_retention_s is not None and not 0 <= args.history_retention_s <= window_s_max:
        parser.error(f"--history-retention-s must be in [0, {window_s_max:g}]")
    if any(not 0 <= n <= PRELOAD_ROWS_MAX for n in args.preload_rows):
        parser.error(f"--preload-rows must be in [0, {PRELOAD_ROWS_MAX}]")
    if "logsvc" in args.wal:
        from logsvc.devcluster import SHARDS_MAX

        if len(args.writers) * len(args.rows) * len(args.preload_rows) > SHARDS_MAX:
            parser.error(f"--wal logsvc takes at most {SHARDS_MAX} (writers, rows) cases")
    if args.gc == "tuned":
        from logsvc import gc_tuning

        gc_tuning.tune_for_latency()

    started = time.monotonic()
    results = run(
        args.wal,
        args.sqlite,
        args.writers,
        args.rows,
        args.seconds,
        warmup=args.warmup,
        input_kind=args.input,
        dir_path=args.dir,
        emit=emit,
        preload_rows=args.preload_rows,
        history_retention_s=args.history_retention_s,
        unmerged=args.unmerged,
    )
    emit(
        summary(
            results,
            input=args.input,
            gc=args.gc,
            row_bytes=ROW_BYTES,
            total_s=round(time.monotonic() - started, 1),
        )
    )
    return 0
