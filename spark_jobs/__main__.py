"""`python -m spark_jobs JOB [options]`: run one job (spark_jobs/jobs.py) and print a short,
true summary; outputs in OUT/<job>/<run-id>/ with `_manifest.json` written last.

    python -m spark_jobs lsn_audit --node n1=/var/lib/logsvc/n1 --node n2=... --out /tmp/out
    python -m spark_jobs replay_as_of --file-wal /var/lib/engine --as-of TS --out /tmp/out
    spark-submit --master local[2] --py-files spark_jobs.zip spark_jobs/__main__.py inventory ...

Exit codes (spark_jobs/exits.py): 0 done; 1 the job refused its input (a typed error,
printed); 2 bad usage; 3 the job found problems (`--allow-problems`: 0); 4 the input is not
a log. Which engine ran and why, and what a wall-time `--as-of` resolved to, go to stderr.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import textwrap

from engine.clock import parse_at, ts_at_datetime, ts_isoformat
from spark_jobs import inputs
from spark_jobs.engines import ENGINE_AUTO, ENGINE_CHOICES, choose_engine, human_bytes
from spark_jobs.errors import BadInput, NotALog, SparkJobError
from spark_jobs.exits import (
    EXIT_FAILED,
    EXIT_NOT_A_LOG,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    empty_log_of,
    problems_of,
)
from spark_jobs.jobs import BUCKET_MS_DEFAULT, JOBS, JobParams
from spark_jobs.limits import AUTO_SPARK_INPUT_BYTES_MIN
from spark_jobs.objectstores import ENDPOINT_ENVS, S3Settings, is_s3, split_s3
from spark_jobs.progress import is_terminal
from spark_jobs.run import run_job
from spark_jobs.session import launched_by_spark_submit
from spark_jobs.verify import VERIFY_MODES

__all__ = ["EXIT_FAILED", "EXIT_NOT_A_LOG", "EXIT_OK", "EXIT_PROBLEMS", "EXIT_USAGE", "main"]

JOB_DESCRIPTIONS = {
    "replay_as_of": "every table live at --as-of, one Parquet dataset each, equal to what "
    "Engine.snapshot(TS) scans (newest checkpoint at or before TS, then the WAL after it)",
    "lsn_audit": "per replica and shard: DSN gaps, duplicate and conflicting copies, copies "
    "skip records discard, LSN gaps, damage (file, offset), the truncation point",
    "replica_diff": "per shard, each pair of replicas compared LSN by LSN: the first divergent "
    "LSN, holes, which replica lags",
    "write_stats": "per table and --bucket-ms time bucket: transactions, commands, rows "
    "appended and deleted, bytes",
    "txn_latency": "commit_ts - start_ts (physical ms): power-of-two histogram, exact "
    "percentiles, latency.png",
    "inventory": "every segment (size, range, how it ends; no payload decoded) and every "
    "checkpoint (state, ckp_ts, kind, blocks, objects and their bytes)",
}
assert set(JOB_DESCRIPTIONS) == set(JOBS)


def _job_line(job: str, text: str) -> str:
    return textwrap.fill(text, width=90, initial_indent=f"  {job:<14}", subsequent_indent=" " * 16)


_THRESHOLD = human_bytes(AUTO_SPARK_INPUT_BYTES_MIN)

EPILOG = f"""\
jobs:
{chr(10).join(_job_line(job, text) for job, text in JOB_DESCRIPTIONS.items())}

engines (--engine):
  auto (default)  local below {_THRESHOLD} of input (the log units read), Spark at or
                  above it, or when --master is given or spark-submit launched the job;
                  the choice and its reason are printed on stderr and kept in the manifest
  local           pyarrow in this process, no JVM: faster on logs that fit one machine
  spark           Spark (local[*] unless --master or spark-submit says otherwise)

--as-of forms (engine.clock.parse_at):
  117683910608814080              a commit timestamp, used as it is
  1795694400000ms                 epoch milliseconds
  2026-11-26T12:00:00Z            ISO-8601 with a time zone (Z or +HH:MM)
  A wall time means the last commit_ts of its millisecond, (epoch_ms << 16) | 0xFFFF: the
  state holding every commit issued in or before that millisecond.

exit codes:
  0  done, nothing wrong found
  1  the job refused its input (corruption, diverging copies, a timestamp the log cannot
     answer, a missing object: a typed error, printed)
  2  bad usage
  3  PROBLEMS: the job finished and found problems (lsn_audit gaps, conflicts or damage;
     replica_diff divergence; a damaged checkpoint); --allow-problems exits 0
  4  the input is not a log (no WAL segment or logsvc shard at the path given, or a log
     whose frames gave no record)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line naming what is wrong (the usage block is `--help`'s to show).
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m spark_jobs",
        description="Jobs over the engine's WAL and logsvc's segment files, on Spark or on "
        "the local engine (pyarrow).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job", choices=JOBS, help="the job to run (see 'jobs' below)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--file-wal",
        action="append",
        metavar="DIR",
        help="an engine directory, or its wal/ (repeat: shard 0, 1, ...)",
    )
    source.add_argument(
        "--node", action="append", metavar="NAME=DIR", help="a logsvc node data directory (repeat)"
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="runs go to DIR/<job>/<run-id>/; DIR may be s3://BUCKET/PREFIX",
    )
    p.add_argument("--run-id", help="default: UTC time plus a random suffix")
    p.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=ENGINE_AUTO,
        help="auto (default), spark or local; see 'engines' below",
    )
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--shard", type=int, action="append", help="only this shard (repeat)")
    p.add_argument("--replica", action="append", help="only this replica (repeat)")
    p.add_argument("--verify", choices=VERIFY_MODES, help="checksums: true, false or report")
    p.add_argument(
        "--as-of",
        metavar="TS",
        help="replay_as_of: a commit timestamp, epoch ms (Nms) or ISO-8601 with a zone",
    )
    p.add_argument(
        "--objects",
        action="append",
        metavar="[SHARD=]DIR",
        help="the engine's objects directory or s3://BUCKET/PREFIX (checkpoints, block "
        "objects) for a shard's log; "
        "without SHARD= the i-th goes with the i-th --file-wal (default: DIR/objects beside "
        "a file WAL in DIR/wal); required for logsvc shards whose engine has objects",
    )
    p.add_argument(
        "--s3-endpoint",
        metavar="URL",
        help="http(s)://HOST:PORT of the S3 service holding s3:// objects or outputs (sets "
        "AWS_ENDPOINT_URL_S3; credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
    )
    p.add_argument(
        "--bucket-ms", type=int, default=BUCKET_MS_DEFAULT, help="write_stats: bucket width"
    )
    p.add_argument(
        "--allow-problems",
        action="store_true",
        help="exit 0, not 3, when the job finds problems (they are still printed and written)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress display (by default one is drawn on stderr when it is a terminal)",
    )
    p.add_argument(
        "--spark-log",
        action="store_true",
        help="leave Spark's own logging on (by default only its errors are printed)",
    )
    return p


def as_of_of(text: str | None) -> tuple[int | None, str | None]:
    """(commit timestamp, a note saying what a wall time resolved to)."""
    if text is None:
        return None, None
    try:
        at = parse_at(text)
        if isinstance(at, datetime.datetime):
            ts = ts_at_datetime(at)
            return ts, f"--as-of {text}: commit_ts {ts} (the last of {ts_isoformat(ts)})"
    except ValueError as exc:
        raise BadInput(f"--as-of {exc}") from None
    return at, None


def params_from(args: argparse.Namespace) -> JobParams:
    if args.file_wal is not None:
        log_inputs = inputs.file_input(*args.file_wal)
    else:
        log_inputs = inputs.logsvc_input(args.node)
    as_of, _ = as_of_of(args.as_of)
    if args.job == "replay_as_of" and as_of is None:
        raise BadInput("replay_as_of needs --as-of TS (a commit timestamp, Nms or ISO-8601)")
    if args.bucket_ms < 1:
        raise BadInput("--bucket-ms must be >= 1")
    objects = objects_of(args.objects or [], args.file_wal is not None)
    return JobParams(
        job=args.job,
        inputs=log_inputs,
        shards=None if args.shard is None else frozenset(args.shard),
        replicas=None if args.replica is None else frozenset(args.replica),
        verify=args.verify,
        as_of=as_of,
        bucket_ms=args.bucket_ms,
        objects=objects,
    )


def objects_of(specs: list[str], file_wals: bool) -> tuple[tuple[int, str], ...]:
    found: dict[int, str] = {}
    for position, spec in enumerate(specs):
        shard_text, sep, path = spec.partition("=")
        if sep:
            if not shard_text.isdigit():
                raise BadInput(f"--objects {spec!r}: SHARD=DIR with SHARD a shard number")
            shard = int(shard_text)
        elif file_wals:
            shard, path = position, spec
        else:
            raise BadInput(f"--objects {spec!r}: logsvc shards need SHARD=DIR")
        if shard in found:
            raise BadInput(f"--objects: shard {shard} given twice")
        if is_s3(path):
            split_s3(path)  # a bucket is named
            found[shard] = path
            continue
        if not os.path.isdir(path):
            raise BadInput(f"--objects {spec!r}: {path} is not a directory")
        found[shard] = os.path.abspath(path)
    return tuple(sorted(found.items()))


def main(argv: list[str] | None = None) -> int:
    if not __debug__:
        print("spark_jobs: refusing to run with assertions off (python -O)", file=sys.stderr)
        return EXIT_USAGE
    args = parser().parse_args(argv)
    try:
        if args.s3_endpoint is not None:
            S3Settings.from_env({**os.environ, ENDPOINT_ENVS[0]: args.s3_endpoint})  # checked
            os.environ[ENDPOINT_ENVS[0]] = args.s3_endpoint  # Spark's workers inherit it
        params = params_from(args)
        _, as_of_note = as_of_of(args.as_of)
    except BadInput as exc:
        print(f"spark_jobs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        units = params.units()
        if not units:
            raise NotALog(no_log_reason(params))
        choice = choose_engine(
            args.engine,
            sum(unit.size_bytes for unit in units),
            master=args.master,
            under_spark_submit=launched_by_spark_submit(),
        )
        print(f"spark_jobs {args.job}: engine {choice.engine} ({choice.reason})", file=sys.stderr)
        if as_of_note:
            print(f"spark_jobs {args.job}: {as_of_note}", file=sys.stderr)
        outcome = run_job(
            params,
            engine=choice.engine,
            out=args.out,
            run_id=args.run_id,
            master=args.master,
            engine_reason=choice.reason,
            progress=not args.no_progress and is_terminal(sys.stderr),
            quiet=not args.spark_log,
        )
    except NotALog as exc:
        print(f"spark_jobs {args.job}: not a log: {exc}", file=sys.stderr)
        return EXIT_NOT_A_LOG
    except SparkJobError as exc:
        print(f"spark_jobs {args.job}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for line in outcome.lines:
        print(line)
    print(f"outputs: {outcome.run_dir} (manifest: _manifest.json)")
    empty = empty_log_of(args.job, outcome.manifest["summary"], units)
    if empty is not None:
        print(f"spark_jobs {args.job}: not a log: {empty}", file=sys.stderr)
        return EXIT_NOT_A_LOG
    problems = problems_of(args.job, outcome.manifest["summary"])
    if problems:
        for problem in problems:
            print(f"spark_jobs {args.job}: PROBLEM: {problem}", file=sys.stderr)
        if args.allow_problems:
            return EXIT_OK
        print(
            f"spark_jobs {args.job}: {len(problems)} problem(s) found: exit {EXIT_PROBLEMS} "
            "(--allow-problems to exit 0)",
            file=sys.stderr,
        )
        return EXIT_PROBLEMS
    return EXIT_OK


def no_log_reason(params: JobParams) -> str:
    filtered = params.shards is not None or params.replicas is not None
    if params.inputs.file_wals:
        where = ", ".join(params.inputs.file_wals)
        what = f"no WAL segment (wal-<lsn>.seg) in {where}"
    else:
        where = ", ".join(f"{n.replica}={n.data_dir}" for n in params.inputs.nodes)
        what = f"no logsvc shard journal (shards/<id>/journal/) in {where}"
    return what + (" that --shard/--replica select" if filtered else "")


if __name__ == "__main__":
    sys.exit(main())
