"""Soak mode of the chaos suite (chaos-plan.md §4.12): the CI harness for hours, with
shifting fault mixes.

    .venv/bin/python -m tests.chaos.soak --duration 2h --shards 3 --replicas 3 --seed 7

* Every `--period` (60 s), a new mix: with probability 1/4 a fault-free period, else a
  random non-empty subset of the fault packages (Jepsen's package-gen): kill, pause,
  partition (every mesh spec), power loss of one node, coordinated power loss, corruption
  of one follower (a minority), failpoint crash, clock skew at restart (when libfaketime is
  installed). Within a period, faults of the mix are applied one after another, each held
  for a few seconds and then healed; the period ends healed.
* Every `--checkpoint` (10 min) and at the end: heal, let the load run through the recovery
  window, stop the workload, wait for convergence (bounded), SIGTERM the nodes, dump every
  replica offline and run the full check (`checker.check_all`) on the history so far (all
  segments: the dumps hold records of every segment). Then the nodes and a fresh workload
  (new process names, so payload ids stay unique) start again.
* The run stops at the first violation and keeps its artifacts. It prints one JSON summary
  line: checkpoints, operations, faults applied (and not confirmed), violations, the
  artifact directory and the reproduction command. Exit status 0 when every checkpoint
  passed, 1 on a violation, 2 on a harness error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tests.chaos import checker
from tests.chaos.harness.artifacts import RunDir, env_keep
from tests.chaos.harness.cluster import Cluster, ClusterSpec
from tests.chaos.harness.nemesis import Nemesis, NemesisLog
from tests.chaos.harness.proxy import PARTITION_SPECS
from tests.chaos.harness.scenario import (
    S,
    collect_evidence,
    converge,
    dump_all,
    start_mesh,
)
from tests.chaos.harness.workload import HistoryTail, WorkloadProcess, WorkloadSpec
from tests.chaos.history import ReplicaDump, read_jsonl, to_json_line

PACKAGES = (
    "kill",
    "pause",
    "partition",
    "power_loss",
    "power_loss_all",
    "corruption",
    "failpoint",
    "clock",
)
# Failpoints on paths every node runs many times a second under load: a crash there is
# certain within seconds (the rarely-run ones, around votes and snapshots, belong to C9).
HOT_FAILPOINTS = (
    "store_after_write_before_sync",
    "store_after_sync_before_ack",
    "raft_before_flush_sync",
)
# Slower syncs leave unsynced bytes when a node dies, so that power losses bite.
SLOW_SYNC_POINT = "store_after_write_before_sync"
SLOW_SYNC = f"{SLOW_SYNC_POINT}=sleep(10)"
RECOVER_WINDOW_S = 20.0  # L1 in soak (plan §4.8)
CONVERGE_WINDOW_S = 150.0
AVAILABILITY_WINDOW_S = 15.0  # L3: an ok append per window while only a minority is faulted
AVAILABILITY_SETTLE_S = 15.0


def parse_duration(text: str) -> float:
    """'2h', '10m', '90s', '1h30m' or plain seconds -> seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 2h, 10m, 90s)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        repro = (
            f".venv/bin/python -m tests.chaos.soak --duration {args.duration_text} "
            f"--shards {args.shards} --replicas {args.replicas} --seed {args.seed} "
            f"--period {args.period} --checkpoint {args.checkpoint} --rate {args.rate:g}"
        )
        self.run = RunDir.create(args.artifacts, "soak", args.seed, repro)
        spec = ClusterSpec(nodes=args.replicas, shards=args.shards, replicas=args.replicas)
        self.cluster = Cluster(self.run.path, spec)
        self.log = NemesisLog(self.run.file("nemesis.jsonl"))
        self.mesh: Any = None
        self.nemesis: Nemesis | None = None
        self.workload: WorkloadProcess | None = None
        self.segment = 0
        self.histories: list[str] = []
        self.tail: HistoryTail | None = None
        self.summary: dict[str, Any] = {
            "seed": args.seed,
            "duration_s": args.duration_s,
            "shards": args.shards,
            "replicas": args.replicas,
            "artifacts": self.run.path,
            "repro": repro,
            "periods": [],
            "checkpoints": [],
        }
        self.corrupted: set[str] = set()
        self.clock_available: bool | None = None

    # ------------------------------------------------------------------ lifecycle

    def start_segment(self) -> None:
        self.cluster.start_all()
        self.cluster.wait_ready(90.0)
        self.segment += 1
        history = self.run.file(f"history-{self.segment:03d}.jsonl")
        self.histories.append(history)
        self.tail = HistoryTail(history)
        spec = WorkloadSpec(
            addresses=self.cluster.data_addresses(),
            token=self.cluster.token,
            shards=self.cluster.shards,
            history_path=history,
            seed=self.args.seed * 1000 + self.segment,
            process_prefix=f"s{self.segment}w",
            clients=6,
            appends_per_s_per_shard=self.args.rate,
        )
        self.workload = WorkloadProcess(
            spec,
            self.run.file(f"workload-{self.segment:03d}.json"),
            self.run.file(f"logs/workload-{self.segment:03d}.log"),
        )
        self.workload.start()

    def run_all(self) -> int:
        status = 2
        try:
            self.mesh = start_mesh(self.cluster, self.args.seed)
            for node in self.cluster.nodes.values():
                node.env["LOGSVC_FAILPOINTS"] = SLOW_SYNC
            self.cluster.write_description()
            self.nemesis = Nemesis(self.cluster, self.log, self.rng, mesh=self.mesh)
            self.start_segment()
            status = self._loop()
        except Exception as exc:
            self.summary["harness_error"] = f"{type(exc).__name__}: {exc}"
            self.run.write_text("harness-error.txt", traceback.format_exc())
            status = 2
        finally:
            if self.workload is not None:
                self.workload.close()
            self.cluster.close()
            if self.mesh is not None:
                self.mesh.close()
        self.summary["status"] = {0: "pass", 1: "violation", 2: "harness error"}[status]
        self.run.notes["summary"] = self.summary
        kept = self.run.finish(failed=status != 0)
        self.summary["kept"] = kept or env_keep()
        print(json.dumps(self.summary, default=str), flush=True)
        return status

    def _loop(self) -> int:
        deadline = time.monotonic() + self.args.duration_s
        next_checkpoint = time.monotonic() + self.args.checkpoint_s
        while True:
            now = time.monotonic()
            if now >= deadline:
                return self.checkpoint(final=True)
            if now >= next_checkpoint:
                status = self.checkpoint(final=False)
                if status != 0:
                    return status
                next_checkpoint = time.monotonic() + self.args.checkpoint_s
                continue
            period_end = min(deadline, next_checkpoint, now + self.args.period_s)
            self.period(period_end)

    # ------------------------------------------------------------------ fault periods

    def period(self, end: float) -> None:
        assert self.nemesis is not None
        if self.rng.random() < 0.25:
            mix: list[str] = []
        else:
            mix = self.rng.sample(PACKAGES, self.rng.randint(1, 3))
        self.summary["periods"].append(mix or ["fault-free"])
        self.log.info("period", [], True, f"mix {mix or 'fault-free'}")
        if not mix:
            time.sleep(max(0.0, end - time.monotonic()))
            return
        while time.monotonic() < end - 12.0:
            package = self.rng.choice(mix)
            self.apply(package)
            self.nemesis.heal()
            self._wait_ready_quietly(30.0)
            time.sleep(min(max(0.0, end - time.monotonic()), self.rng.uniform(2.0, 6.0)))
        time.sleep(max(0.0, end - time.monotonic()))

    def _wait_ready_quietly(self, seconds: float) -> None:
        try:
            self.cluster.wait_ready(seconds)
        except TimeoutError as exc:
            self.log.info("ready", [], False, str(exc))

    def apply(self, package: str) -> None:
        nemesis = self.nemesis
        assert nemesis is not None
        cluster = self.cluster
        shard = self.rng.choice(cluster.shards)
        replicas = cluster.replicas_of[shard]
        minority = (len(replicas) - 1) // 2
        hold_s = self.rng.uniform(3.0, 8.0)
        actions: dict[str, Callable[[], None]] = {}

        def kill() -> None:
            if self.rng.random() < 0.5:
                old = nemesis.kill_leader(shard)
                time.sleep(hold_s)
                if old is not None:
                    nemesis.restart(old[0])
                    nemesis.confirm_leader_change(shard, old)
            else:  # any count, majorities included (unavailable meanwhile)
                victims = nemesis.kill_random(self.rng.randint(1, len(replicas)))
                time.sleep(hold_s)
                for node_id in victims:
                    nemesis.restart(node_id)

        def pause() -> None:
            if self.rng.random() < 0.5:
                nemesis.pause_leader(shard)
            else:
                for node_id in self.rng.sample(replicas, self.rng.randint(1, max(1, minority))):
                    nemesis.pause(node_id)
            time.sleep(hold_s)

        def partition() -> None:
            spec = self.rng.choice(PARTITION_SPECS)
            nemesis.partition(spec, self.rng.choice([shard, None]))
            time.sleep(max(hold_s, 5.0))  # at least 2 x connection timeout

        def power_loss() -> None:
            victim = self.rng.choice(replicas)
            nemesis.crash(victim, in_failpoint=SLOW_SYNC_POINT)
            nemesis.power_loss([victim])
            nemesis.restart(victim)
            time.sleep(hold_s)

        def power_loss_all() -> None:
            nodes = cluster.node_ids
            found = cluster.leader(shard)
            writer = found[0] if found is not None else self.rng.choice(nodes)
            nemesis.crash_all(nodes, in_failpoint=(writer, SLOW_SYNC_POINT))
            nemesis.power_loss(nodes)
            for node_id in nodes:
                nemesis.restart(node_id)
            time.sleep(hold_s)

        def corruption() -> None:
            # One follower at a time (a minority), and only one damaged replica per
            # checkpoint segment: after that, repairs are not this package's to judge.
            found = cluster.leader(shard)
            followers = [n for n in replicas if found is None or n != found[0]]
            candidates = [n for n in followers if n not in self.corrupted]
            if not candidates or cluster.quarantined:
                return
            victim = self.rng.choice(candidates)
            self.corrupted.add(victim)
            nemesis.crash(victim)
            nemesis.corrupt(victim, self.rng.choice([("bitflip",), ("torn_tail", "truncate_file")]))
            nemesis.restart_checked(victim)
            time.sleep(hold_s)

        def failpoint() -> None:
            victim = self.rng.choice(cluster.node_ids)
            name = self.rng.choice(HOT_FAILPOINTS)
            hit = self.rng.randint(1, 30)
            nemesis.crash(victim)
            slow = "" if SLOW_SYNC.startswith(name + "=") else f"{SLOW_SYNC};"
            nemesis.failpoint_crash(victim, f"{slow}{name}=exit@{hit}")
            time.sleep(min(hold_s, 3.0))
            nemesis.restart(victim)

        def clock() -> None:
            victim = self.rng.choice(cluster.node_ids)
            offset = self.rng.choice([-300.0, -30.0, 30.0, 3600.0, 0.0])
            rate = self.rng.choice([1.0, 1.0, 0.7, 1.5])
            if offset == 0.0 and rate == 1.0:
                rate = 1.5
            if nemesis.restart_with_clock(victim, offset, rate):
                time.sleep(hold_s * 2)
                nemesis.end_clock(victim)

        actions.update(
            kill=kill,
            pause=pause,
            partition=partition,
            power_loss=power_loss,
            power_loss_all=power_loss_all,
            corruption=corruption,
            failpoint=failpoint,
            clock=clock,
        )
        actions[package]()

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, final: bool) -> int:
        """Heal, converge, stop, dump, check everything so far. 0 = pass."""
        assert self.nemesis is not None and self.workload is not None and self.tail
        started = time.monotonic()
        self.nemesis.heal()
        heal_ns = self.log.end("heal", [], "checkpoint heal").time_ns
        self._wait_ready_quietly(RECOVER_WINDOW_S)
        deadline = time.monotonic() + RECOVER_WINDOW_S
        time.sleep(3.0)
        while time.monotonic() < deadline and not all(
            self.tail.ok_appends_since(heal_ns, shard) > 0 for shard in self.cluster.shards
        ):
            time.sleep(0.25)
        counts = self.workload.stop()
        converge(self.cluster, self.log, self.histories[-1], CONVERGE_WINDOW_S)
        self.cluster.disconnect_probes()
        self.cluster.terminate_all()
        dumps = dump_all(self.cluster)
        with open(self.run.file(f"dumps-{self.segment:03d}.jsonl"), "w") as f:
            for dump in dumps:
                f.write(to_json_line(dump) + "\n")
        violations, evidence_ops = self._check(dumps)
        entry = {
            "segment": self.segment,
            "ops": evidence_ops,
            "workload": counts.get("counts", {}),
            "violations": [f"[{v.check}] shard {v.shard}: {v.message}" for v in violations],
            "seconds": round(time.monotonic() - started, 1),
        }
        self.summary["checkpoints"].append(entry)
        self.summary["faults"] = self._fault_counts()
        if violations:
            return 1
        if not final:
            self.corrupted.clear()
            self.start_segment()
        return 0

    def _check(self, dumps: list[ReplicaDump]) -> tuple[list[checker.Violation], int]:
        evidence = collect_evidence(
            self.run, self.cluster, self.histories[0], self.log, dumps, True
        )
        for path in self.histories[1:]:
            if os.path.exists(path):
                evidence.ops.extend(read_jsonl([path]).ops)
        options = checker.CheckOptions(
            recover_window_ns=int(RECOVER_WINDOW_S * S),
            converge_window_ns=int(CONVERGE_WINDOW_S * S),
            availability_window_ns=int(AVAILABILITY_WINDOW_S * S),
            availability_settle_ns=int(AVAILABILITY_SETTLE_S * S),
            acked_appends_min=1,
            reads_min=1,
            dumps_per_shard_min=self.args.replicas,
        )
        if any(e.fault == "power_loss" and e.applied for e in evidence.nemesis):
            options = replace(options, power_loss=True)
        violations = checker.check_all(evidence, options)
        self.run.write_text(f"report-{self.segment:03d}.txt", checker.report(violations, evidence))
        return violations, len(evidence.ops)

    def _fault_counts(self) -> dict[str, dict[str, int]]:
        applied: Counter[str] = Counter()
        unconfirmed: Counter[str] = Counter()
        for event in self.log.events:
            if event.phase == "end":
                continue
            (applied if event.applied else unconfirmed)[event.fault] += 1
        return {"applied": dict(applied), "unconfirmed": dict(unconfirmed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="2h")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--replicas", type=int, choices=(3, 5), default=3)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--period", default="60s", help="fault mix period")
    parser.add_argument("--checkpoint", default="10m", help="heal + full check interval")
    parser.add_argument("--rate", type=float, default=40.0, help="appends/s per shard")
    parser.add_argument("--artifacts", default=None, help="base directory of the run")
    args = parser.parse_args(argv)
    args.duration_text = args.duration
    args.duration_s = parse_duration(args.duration)
    args.period_s = parse_duration(args.period)
    args.checkpoint_s = parse_duration(args.checkpoint)
    return Soak(args).run_all()


if __name__ == "__main__":
    sys.exit(main())
