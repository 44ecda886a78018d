"""Running seeds where the simulation is deterministic: in a fresh interpreter started with
`PYTHONHASHSEED=0` (pysyncobj iterates sets of nodes hashed by their string ids, so the
hash seed must be fixed before the interpreter starts; chaos-plan §4.10), one subprocess
per batch of seeds, and the command that reproduces one seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.chaos.dst.simulation import SimOptions

REPO_ROOT = Path(__file__).resolve().parents[3]
HASH_SEED = "0"
# Seeds per subprocess: pysyncobj leaks a pipe (two descriptors) per replica start, so a
# process must not run so many seeds that it nears a default limit of 1024 descriptors.
SEEDS_PER_PROCESS_MAX = 12


def deterministic_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = HASH_SEED
    env.pop("LOGSVC_EVENT_LOG", None)  # the product's event log stays off: we observe
    env.pop("LOGSVC_FAILPOINTS", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def hash_seed_is_fixed() -> bool:
    return os.environ.get("PYTHONHASHSEED") == HASH_SEED


def git_commit() -> str:
    """HEAD, with "+dirty" when the working tree differs from it (the repro then needs the
    same uncommitted changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD"], cwd=REPO_ROOT, capture_output=True, check=False
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def repro_command(options: SimOptions) -> str:
    flags = options.command_flags()
    return (
        f"PYTHONHASHSEED=0 .venv/bin/python -m tests.chaos.dst --seed {options.seed}"
        + (f" {flags}" if flags else "")
        + f"   # at commit {git_commit()}"
    )


def run_batch(
    seed: int, count: int, flags: Sequence[str] = (), timeout_s: float = 600.0
) -> list[dict[str, object]]:
    """Seeds [seed, seed + count) in one PYTHONHASHSEED=0 subprocess; their JSON summaries.
    Raises RuntimeError if the subprocess dies without a summary for every seed."""
    command = [
        sys.executable,
        "-m",
        "tests.chaos.dst",
        "--seed",
        str(seed),
        "--seeds",
        str(count),
        *flags,
    ]
    done = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=deterministic_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(summaries) != count:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode} with {len(summaries)} of {count} "
            f"summaries\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
    return summaries


def run_seeds(
    seeds: Sequence[int], flags: Sequence[str] = (), parallel: int = 2, timeout_s: float = 600.0
) -> list[dict[str, object]]:
    """`seeds` cut into `parallel` slices run side by side, each slice as few subprocesses
    as its runs of consecutive seeds allow; the summaries in seed order."""
    ordered = sorted(seeds)
    size = -(-len(ordered) // parallel) if ordered else 0
    slices = [ordered[i : i + size] for i in range(0, len(ordered), size)] if size else []

    def run_slice(batch: list[int]) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for start, count in _runs(batch):
            out.extend(run_batch(start, count, flags, timeout_s))
        return out

    results: list[dict[str, object]] = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for chunk in pool.map(run_slice, slices):
            results.extend(chunk)
    return sorted(results, key=lambda summary: int(str(summary["seed"])))


def _runs(seeds: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs in a sorted list, at most SEEDS_PER_PROCESS_MAX long:
    [3, 4, 5, 9] -> [(3, 3), (9, 1)]."""
    runs: list[tuple[int, int]] = []
    for seed in sorted(seeds):
        if runs and runs[-1][0] + runs[-1][1] == seed and runs[-1][1] < SEEDS_PER_PROCESS_MAX:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((seed, 1))
    return runs
