"""Run the deterministic simulator from the command line.

    PYTHONHASHSEED=0 .venv/bin/python -m tests.chaos.dst --seed N [--seeds K] [--steps S]

Seeds N .. N+K-1 run one after another in this process. Each prints one JSON line (its
summary: counts, trace hash, CPU seconds); a seed with violations also prints them and the
command that reproduces it, with the git commit. Exit status 1 if any seed had a violation.
Without PYTHONHASHSEED=0 the command re-executes itself with it (the hash seed must be set
before the interpreter starts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

from tests.chaos.dst.runner import deterministic_env, hash_seed_is_fixed, repro_command
from tests.chaos.dst.simulation import SimOptions, run_seed

VIOLATION_CHARS_MAX = 4000  # one violation's text as printed (a fatal error's traceback)
OPEN_FILES_WANTED = 65536


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not hash_seed_is_fixed():
        os.execve(
            sys.executable,
            [sys.executable, "-m", "tests.chaos.dst", *sys.argv[1:]],
            deterministic_env(),
        )
    _raise_open_files_limit()
    failed = False
    for seed in range(args.seed, args.seed + args.seeds):
        options = SimOptions(
            seed=seed,
            steps=args.steps,
            nodes=args.nodes,
            clients=args.clients,
            faults_per_s=args.faults_per_s,
            bursts_per_s=args.bursts_per_s,
            heal_s_max=args.heal_s_max,
            truncates=not args.no_truncates,
            power_loss=not args.no_power_loss,
            fault_mix=args.fault_mix,
            lying_disk=args.lying_disk,
            quiesce_after_ms=args.quiesce_after_ms,
        )
        result = run_seed(options)
        summary = result.summary()
        summary["violations"] = [v[:VIOLATION_CHARS_MAX] for v in result.violations]
        print(json.dumps(summary, sort_keys=True), flush=True)
        if result.violations:
            failed = True
            print(f"seed {seed}: {len(result.violations)} violation(s)")
            for violation in result.violations:
                print("  " + violation[:VIOLATION_CHARS_MAX].replace("\n", "\n    "))
            print(f"reproduce: {repro_command(options)}", flush=True)
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    defaults = SimOptions(seed=0)
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.dst",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seeds", type=int, default=1, help="how many consecutive seeds")
    parser.add_argument(
        "--steps",
        type=int,
        default=defaults.steps,
        help=f"fault-phase steps of {defaults.dt_ms} ms",
    )
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--faults-per-s", type=float, default=defaults.faults_per_s)
    parser.add_argument("--bursts-per-s", type=float, default=defaults.bursts_per_s)
    parser.add_argument("--heal-s-max", type=int, default=defaults.heal_s_max)
    parser.add_argument("--no-truncates", action="store_true")
    parser.add_argument("--no-power-loss", action="store_true")
    parser.add_argument("--fault-mix", choices=("mixed", "power"), default=defaults.fault_mix)
    parser.add_argument(
        "--lying-disk",
        action="store_true",
        help="negative control: segment fdatasyncs make nothing durable",
    )
    parser.add_argument(
        "--quiesce-after-ms",
        type=int,
        default=defaults.quiesce_after_ms,
        help="idle time after which a leader asks its followers to go quiet (0: never)",
    )
    return parser


def _raise_open_files_limit() -> None:
    # pysyncobj opens a pipe for every SyncObj and never closes it: a process that restarts
    # replicas hundreds of times needs more than a default soft limit of 1024 descriptors.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


if __name__ == "__main__":
    sys.exit(main())
