"""Where a chaos run keeps its evidence, and what stays after it (chaos-plan.md §4.13).

One directory per run:

    <base>/<scenario>-seed<N>-<time>/
        run.json          scenario, seed, time scale, schedule notes, reproduction command
        cluster/          node configs, data directories, durability ledgers
        logs/             one log per node (every incarnation appended), workload.log
        events/           each node's Raft event log (JSON lines)
        history.jsonl     the workload's operations
        nemesis.jsonl     the faults, with start/end/confirmation
        dumps.jsonl       every replica's final dump
        report.txt        the checker's report (violations with surrounding operations)
        data.tar.gz       the data directories (on failure)

`<base>` is CHAOS_ARTIFACTS, else the directory the caller gives (pytest's tmp dir). On
success the run directory is deleted unless CHAOS_KEEP=1; on failure it stays and its path
goes into the assertion message with the one-line reproduction command.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any

ENV_SEED = "CHAOS_SEED"
ENV_TIME_SCALE = "CHAOS_TIME_SCALE"
ENV_SCENARIOS = "CHAOS_SCENARIOS"
ENV_KEEP = "CHAOS_KEEP"
ENV_ARTIFACTS = "CHAOS_ARTIFACTS"
# The nodes' [node] journal: "shard" (default) or "node" (the shared node journal,
# docs/decisions/0011-shared-journal.md).
ENV_JOURNAL = "CHAOS_JOURNAL"
DEFAULT_SEED = 1


def env_seed(default: int = DEFAULT_SEED) -> int:
    return int(os.environ.get(ENV_SEED, default))


def env_journal() -> str:
    journal = os.environ.get(ENV_JOURNAL, "shard")
    assert journal in ("shard", "node"), f"{ENV_JOURNAL} must be shard or node"
    return journal


def env_time_scale() -> float:
    scale = float(os.environ.get(ENV_TIME_SCALE, "1"))
    assert scale > 0, f"{ENV_TIME_SCALE} must be positive"
    return scale


def env_keep() -> bool:
    return os.environ.get(ENV_KEEP, "") not in ("", "0", "false", "no")


def env_scenarios() -> set[str] | None:
    raw = os.environ.get(ENV_SCENARIOS, "").strip()
    if not raw:
        return None
    return {name.strip().upper() for name in raw.split(",") if name.strip()}


@dataclass(slots=True)
class RunDir:
    path: str
    scenario: str
    seed: int
    repro: str
    notes: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def create(base: str | None, scenario: str, seed: int, repro: str) -> RunDir:
        root = os.environ.get(ENV_ARTIFACTS) or base or "/tmp/logsvc-chaos"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = os.path.join(root, f"{scenario}-seed{seed}-{stamp}-{os.getpid()}")
        os.makedirs(path, exist_ok=False)
        run = RunDir(path, scenario, seed, repro)
        run.save()
        return run

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def save(self) -> None:
        data = {
            "scenario": self.scenario,
            "seed": self.seed,
            "repro": self.repro,
            "notes": self.notes,
        }
        with open(self.file("run.json"), "w") as f:
            json.dump(data, f, indent=2, default=str)

    def write_text(self, name: str, text: str) -> str:
        path = self.file(name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def archive_data(self) -> str | None:
        """Tarball of the data directories (the node configs, data and ledgers)."""
        source = self.file("cluster")
        if not os.path.isdir(source):
            return None
        target = self.file("data.tar.gz")
        with tarfile.open(target, "w:gz") as tar:
            tar.add(source, arcname="cluster")
        return target

    def finish(self, failed: bool) -> bool:
        """Keep everything on failure (with a data tarball) or with CHAOS_KEEP; else
        delete the run directory. Returns whether it was kept."""
        self.save()
        if failed:
            with contextlib.suppress(OSError):
                self.archive_data()
            return True
        if env_keep():
            return True
        shutil.rmtree(self.path, ignore_errors=True)
        return False
