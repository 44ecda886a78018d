"""`python -m spark_jobs JOB [options]`: run one job (spark_jobs/jobs.py) and print a short,
true summary; outputs in OUT/<job>/<run-id>/ with `_manifest.json` written last.

    python -m spark_jobs lsn_audit --node n1=/var/lib/logsvc/n1 --node n2=... --out /tmp/out
    python -m spark_jobs replay_as_of --file-wal /var/lib/engine --as-of TS --out /tmp/out
    spark-submit --master local[2] --py-files spark_jobs.zip spark_jobs/__main__.py inventory ...

Exit codes: 0 done; 1 the job failed on its input (a typed error, printed); 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys

from spark_jobs import inputs
from spark_jobs.errors import BadInput, SparkJobError
from spark_jobs.jobs import BUCKET_MS_DEFAULT, JOBS, JobParams
from spark_jobs.journal import VERIFY_MODES
from spark_jobs.run import ENGINE_SPARK, ENGINES, run_job

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_jobs",
        description="Spark jobs over the engine's WAL and logsvc's segment files.",
    )
    p.add_argument("job", choices=JOBS)
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
    p.add_argument("--out", required=True, metavar="DIR", help="runs go to DIR/<job>/<run-id>/")
    p.add_argument("--run-id", help="default: UTC time plus a random suffix")
    p.add_argument("--engine", choices=ENGINES, default=ENGINE_SPARK)
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--shard", type=int, action="append", help="only this shard (repeat)")
    p.add_argument("--replica", action="append", help="only this replica (repeat)")
    p.add_argument("--verify", choices=VERIFY_MODES, help="checksums: true, false or report")
    p.add_argument("--as-of", type=int, metavar="TS", help="replay_as_of: a commit timestamp")
    p.add_argument(
        "--objects",
        action="append",
        metavar="[SHARD=]DIR",
        help="the engine's objects directory (checkpoints, block objects) for a shard's log; "
        "without SHARD= the i-th goes with the i-th --file-wal (default: DIR/objects beside "
        "a file WAL in DIR/wal); required for logsvc shards whose engine has objects",
    )
    p.add_argument(
        "--bucket-ms", type=int, default=BUCKET_MS_DEFAULT, help="write_stats: bucket width"
    )
    return p


def params_from(args: argparse.Namespace) -> JobParams:
    if args.file_wal is not None:
        log_inputs = inputs.file_input(*args.file_wal)
    else:
        log_inputs = inputs.logsvc_input(args.node)
    if args.job == "replay_as_of" and (args.as_of is None or args.as_of < 0):
        raise BadInput("replay_as_of needs --as-of TS (a commit timestamp, >= 0)")
    if args.bucket_ms < 1:
        raise BadInput("--bucket-ms must be >= 1")
    objects = objects_of(args.objects or [], args.file_wal is not None)
    return JobParams(
        job=args.job,
        inputs=log_inputs,
        shards=None if args.shard is None else frozenset(args.shard),
        replicas=None if args.replica is None else frozenset(args.replica),
        verify=args.verify,
        as_of=args.as_of,
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
        params = params_from(args)
    except BadInput as exc:
        print(f"spark_jobs: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        outcome = run_job(
            params, engine=args.engine, out=args.out, run_id=args.run_id, master=args.master
        )
    except SparkJobError as exc:
        print(f"spark_jobs {args.job}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for line in outcome.lines:
        print(line)
    print(f"outputs: {outcome.run_dir} (manifest: _manifest.json)")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
