"""One chaos run, start to verdict (chaos-plan.md §4.9 "every scenario has the same shape"):

    clean cluster -> warm-up load -> seeded fault schedule -> final heal -> recovery window
    (load goes on, so L1 is judged) -> workload stops -> convergence poll (bounded, L2) ->
    SIGTERM -> every replica dumped offline -> node events -> checker.check_all

`run_scenario` returns a `RunResult`; `assert_passed` raises with the artifact directory and
the one-line reproduction command. Every process started (nodes, workload, proxy mesh) is
stopped in a `finally`, whatever happened.

The schedule is a function `schedule(ctx)` of a `RunContext` (the cluster, the nemesis, the
seeded rng, the time scale); it must leave faults healed or healable by `Nemesis.heal`.
"""

from __future__ import annotations

import importlib
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tests.chaos import checker
from tests.chaos.harness.artifacts import RunDir
from tests.chaos.harness.cluster import Cluster, ClusterSpec
from tests.chaos.harness.nemesis import CONVERGED_FAULT, Nemesis, NemesisLog
from tests.chaos.harness.workload import HistoryTail, WorkloadProcess, WorkloadSpec
from tests.chaos.history import Evidence, ReplicaDump, read_jsonl, to_json_line

S = 1_000_000_000  # ns per second
# Between two faults a schedule waits for the cluster to serve again rather than for a
# fixed time: this many appends acked from the moment it asks (a dozen client round trips;
# about 0.1-0.3 s of the workload's rate on a loaded 2-core box) ...
SERVED_ACKS = 10
# ... within the L1 recovery window's length (CI 30 s): a cluster with a majority up that
# acks nothing for this long has lost liveness, which L1 would report after a final heal.
SERVED_WAIT_S = 30.0


@dataclass(slots=True)
class Scenario:
    name: str
    schedule: Callable[[RunContext], None]
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    needs_mesh: bool = False
    # Warm-up: load until this many appends were acked on every shard (it was a fixed 2 s,
    # of which the workload process's own start-up took a part that grows with the load).
    warmup_acks: int = 100
    recover_window_s: float = 30.0  # L1 (CI 30 s)
    converge_window_s: float = 90.0  # L2 (CI 90 s)
    tail_load_s: float = 3.0  # load after the final heal (at least; until L1 is met)
    workload: Mapping[str, Any] = field(default_factory=dict)  # WorkloadSpec overrides
    options: Mapping[str, Any] = field(default_factory=dict)  # CheckOptions overrides
    check_events: bool = True  # node event logs are part of the evidence (S12)
    node_env: Mapping[str, str] = field(default_factory=dict)  # every start of every node
    kernel_net: bool = False  # run each node under its own gid, iptables faults (netns)


@dataclass(slots=True)
class RunContext:
    cluster: Cluster
    nemesis: Nemesis
    rng: random.Random
    time_scale: float
    mesh: Any
    run: RunDir
    history: HistoryTail
    notes: dict[str, Any] = field(default_factory=dict)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.time_scale)

    def hold(self, since: float, seconds: float) -> None:
        """Sleep until `seconds` (scaled) have passed since the monotonic time `since`: a
        fault's minimum duration, whatever its confirmation already took."""
        time.sleep(max(0.0, since + seconds * self.time_scale - time.monotonic()))

    def wait_served(
        self,
        why: str,
        shard: int,
        count: int = SERVED_ACKS,
        wait_s: float = SERVED_WAIT_S,
        *,
        fault: str = "served",
    ) -> bool:
        """Await (bounded) `count` appends to `shard` acked from now on, and log it as an
        info event (`fault`, "served" by default), applied when they were: the proof that
        the step before (a new leader, a healed partition, a restarted cluster) left the
        shard serving. With `faults_must_apply` a run where it did not fails vacuity."""
        began = time.monotonic()
        got = self.wait_acks(count, wait_s, shard)
        took_s = time.monotonic() - began
        self.nemesis.log.info(
            fault,
            [],
            got >= count,
            f"shard {shard} {why}: {got} appends acked in {took_s:.1f} s (wanted {count})",
        )
        return got >= count

    def wait_acks(self, count: int, timeout_s: float, shard: int | None = None) -> int:
        """Wait (bounded) until `count` appends have been acked since now."""
        since = time.monotonic_ns()
        deadline = time.monotonic() + timeout_s * self.time_scale
        got = 0
        while time.monotonic() < deadline:
            got = self.history.ok_appends_since(since, shard)
            if got >= count:
                break
            time.sleep(0.2)
        return got


@dataclass(slots=True)
class RunResult:
    scenario: str
    seed: int
    run_dir: str
    repro: str
    violations: list[checker.Violation]
    report: str
    duration_s: float
    counts: dict[str, Any]
    faults: dict[str, int]
    kept: bool
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds (PhaseClock)

    @property
    def passed(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        return (
            f"{self.scenario} seed {self.seed}: "
            f"{'PASS' if self.passed else f'FAIL ({len(self.violations)} violations)'} "
            f"in {self.duration_s:.1f} s; faults {self.faults}; ops {self.counts}; "
            f"phases (s) {self.phases}"
        )


class PhaseClock:
    """Where a run's seconds go: `mark(name)` ends the phase running since the last mark
    and names it. The run notes and the test's printed summary carry the result, so that a
    schedule's cost is measured, not guessed."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self._last, 2)
        self._last = now


def repro_command(name: str, seed: int) -> str:
    return f"CHAOS_SEED={seed} .venv/bin/pytest tests/chaos/test_scenarios.py -k {name}"


def run_scenario(
    scenario: Scenario,
    seed: int,
    *,
    time_scale: float = 1.0,
    artifacts_base: str | None = None,
    repro: str | None = None,
    notes: Mapping[str, Any] | None = None,
) -> RunResult:
    started = time.monotonic()
    clock = PhaseClock()
    repro = repro or repro_command(scenario.name, seed)
    run = RunDir.create(artifacts_base, scenario.name, seed, repro)
    run.notes.update({"time_scale": time_scale, "cluster": repr(scenario.cluster)})
    rng = random.Random(seed)
    cluster = Cluster(run.path, scenario.cluster)
    mesh: Any = None
    kernel: Any = None
    workload: WorkloadProcess | None = None
    nemesis_log = NemesisLog(run.file("nemesis.jsonl"))
    history_path = run.file("history.jsonl")
    dumps: list[ReplicaDump] = []
    counts: dict[str, Any] = {}
    unrecovered: list[int] = []
    error: BaseException | None = None
    try:
        for node in cluster.nodes.values():
            node.env.update(scenario.node_env)
        if scenario.needs_mesh:
            mesh = start_mesh(cluster, seed)
        if scenario.kernel_net:
            kernel = start_kernel_net(cluster)
        cluster.write_description()
        cluster.start_all()
        cluster.wait_ready(60.0 * time_scale)
        spec = WorkloadSpec(
            addresses=cluster.data_addresses(),
            token=cluster.token,
            shards=cluster.shards,
            history_path=history_path,
            seed=seed,
        )
        for key, value in scenario.workload.items():
            setattr(spec, key, value)
        workload = WorkloadProcess(spec, run.file("workload.json"), run.file("logs/workload.log"))
        workload.start()
        clock.mark("start")
        nemesis = Nemesis(
            cluster, nemesis_log, rng, mesh=mesh, kernel=kernel, time_scale=time_scale
        )
        ctx = RunContext(cluster, nemesis, rng, time_scale, mesh, run, HistoryTail(history_path))
        ctx.notes.update(notes or {})
        for shard in cluster.shards:
            ctx.wait_served("warm-up", shard, scenario.warmup_acks, fault="warm_up")
        clock.mark("warmup")
        nemesis_log.info("schedule", [], True, f"{scenario.name} seed {seed} begins")
        scenario.schedule(ctx)
        clock.mark("schedule")
        # Final heal: everything resumed, reconnected and restarted, one leader per shard.
        nemesis.heal()
        # A global "end": the checkers' final heal (L1 window, L2 deadline start here).
        heal_ns = nemesis_log.end("heal", [], "final heal: all resumed, healed, restarted").time_ns
        try:
            cluster.wait_ready(scenario.recover_window_s * time_scale)
        except TimeoutError as exc:
            nemesis_log.info("heal", [], False, f"not ready after the final heal: {exc}")
        clock.mark("heal")
        # Load goes on after the heal so that L1 is judged: until every shard acked again
        # (bounded by the recovery window), and at least tail_load_s.
        deadline = time.monotonic() + scenario.recover_window_s * time_scale
        ctx.sleep(scenario.tail_load_s)
        while time.monotonic() < deadline and not all(
            ctx.history.ok_appends_since(heal_ns, shard) > 0 for shard in cluster.shards
        ):
            time.sleep(0.25)
        # L1 for the final heal is judged here: the checker judges a heal only when the
        # history runs on past its whole window, which the load stopped here never does.
        unrecovered = [s for s in cluster.shards if ctx.history.ok_appends_since(heal_ns, s) == 0]
        counts = workload.stop()
        clock.mark("tail_load")
        run.notes["schedule"] = ctx.notes
        converge(cluster, nemesis_log, history_path, scenario.converge_window_s * time_scale)
        clock.mark("converge")
        online = None if _has_offline_dump() else _online_dumps(cluster)
        cluster.disconnect_probes()
        run.notes["exit_statuses"] = cluster.terminate_all()
        dumps = online if online is not None else dump_all(cluster)
        with open(run.file("dumps.jsonl"), "w") as f:
            for dump in dumps:
                f.write(to_json_line(dump) + "\n")
        clock.mark("stop_dump")
    except BaseException as exc:
        error = exc
    finally:
        if workload is not None:
            workload.close()
        cluster.close()
        if mesh is not None:
            mesh.close()
    evidence = collect_evidence(
        run, cluster, history_path, nemesis_log, dumps, scenario.check_events
    )
    options = _options(scenario, time_scale)
    if cluster.quarantined:
        options = replace(
            options,
            dumps_per_shard_min=max(1, options.dumps_per_shard_min - len(cluster.quarantined)),
        )
    violations = checker.check_all(evidence, options)
    for shard in unrecovered:
        violations.append(
            checker.Violation(
                "L1",
                shard,
                "no append succeeded within the recovery window after the final heal",
                (f"no ok append in {scenario.recover_window_s * time_scale} s after the heal",),
            )
        )
    if error is not None:
        violations.append(
            checker.Violation(
                "H", None, f"harness error: {type(error).__name__}: {error}", (repr(error),)
            )
        )
    report = checker.report(violations, evidence)
    run.write_text("report.txt", report)
    faults: dict[str, int] = {}
    for event in evidence.nemesis:
        if event.phase != "end" and event.applied:
            faults[event.fault] = faults.get(event.fault, 0) + 1
    clock.mark("check")
    run.notes["phases_s"] = clock.phases
    run.notes["faults"] = faults
    run.notes["counts"] = counts
    run.notes["violations"] = [f"[{v.check}] {v.message}" for v in violations]
    duration_s = time.monotonic() - started
    run.notes["duration_s"] = round(duration_s, 1)
    kept = run.finish(failed=bool(violations))
    return RunResult(
        scenario.name,
        seed,
        run.path,
        repro,
        violations,
        report,
        duration_s,
        counts.get("counts", {}),
        faults,
        kept,
        clock.phases,
    )


def assert_passed(result: RunResult) -> None:
    if result.passed:
        return
    shown = "\n".join(f"  [{v.check}] shard {v.shard}: {v.message}" for v in result.violations)
    raise AssertionError(
        f"chaos scenario {result.scenario} (seed {result.seed}) failed:\n{shown}\n"
        f"artifacts: {result.run_dir} (report.txt, history.jsonl, nemesis.jsonl, logs/, "
        f"events/, data.tar.gz)\nreproduce: {result.repro}\n\n" + result.report[:6000]
    )


# ---------------------------------------------------------------------- pieces


def start_mesh(cluster: Cluster, seed: int) -> Any:
    proxy = importlib.import_module("tests.chaos.harness.proxy")
    canonical = {
        node_id: {
            shard: cluster.raft_address(node_id, shard)
            for shard, replicas in cluster.replicas_of.items()
            if node_id in replicas
        }
        for node_id in cluster.node_ids
    }
    mesh = proxy.ProxyMesh(canonical, seed=seed).start()
    for node_id in cluster.node_ids:
        cluster.nodes[node_id].env.update(mesh.dial_env(node_id))
    return mesh


def start_kernel_net(cluster: Cluster) -> Any:
    """Each node under its own gid, and iptables rules keyed on those gids, in the private
    network namespace this process runs in (netns.py refuses anywhere else)."""
    netns = importlib.import_module("tests.chaos.harness.netns")
    nodes = {}
    for index, (node_id, node) in enumerate(cluster.nodes.items()):
        gid = netns.gid_for(index)
        node.popen_kwargs.update(netns.popen_group(gid))
        ports = tuple(node.ports.raft_base + shard for shard in cluster.shards)
        nodes[node_id] = netns.NodeNet(gid, ports)
    kernel = netns.KernelNet(nodes)
    kernel.install()
    return kernel


def converge(cluster: Cluster, log: NemesisLog, history_path: str, window_s: float) -> bool:
    """Poll (bounded) until every replica of every shard reports the same first and next
    LSN and commit index, and next LSN is past the highest acked LSN; log 'converged'."""
    acked = _max_acked(history_path)
    deadline = time.monotonic() + window_s
    last: dict[int, Any] = {}
    while True:
        done = True
        for shard in cluster.shards:
            statuses = cluster.statuses(shard)
            views = {
                n: None if s is None else (s.first_lsn, s.next_lsn) for n, s in statuses.items()
            }
            last[shard] = views
            values = set(views.values())
            if None in values or len(values) != 1:
                done = False
                continue
            ((_first_lsn, next_lsn),) = values  # type: ignore[misc]
            if next_lsn - 1 < acked.get(shard, 0):
                done = False
        if done:
            log.info(CONVERGED_FAULT, [], True, f"replicas agree: {last}")
            return True
        if time.monotonic() > deadline:
            log.info(CONVERGED_FAULT, [], False, f"not converged after {window_s} s: {last}")
            return False
        time.sleep(0.5)


def _max_acked(history_path: str) -> dict[int, int]:
    top: dict[int, int] = {}
    if not os.path.exists(history_path):
        return top
    for op in read_jsonl([history_path]).ops:
        if op.kind == "append" and op.outcome == "ok" and op.lsns:
            top[op.shard] = max(top.get(op.shard, 0), max(op.lsns))
    return top


def _has_offline_dump() -> bool:
    try:
        importlib.import_module("tests.chaos.harness.dump")
    except ImportError:
        return False
    return True


def _online_dumps(cluster: Cluster) -> list[ReplicaDump]:
    """Fallback while the offline reader does not exist: each replica's committed log as
    that node serves it (weaker: a node serves only what it applied)."""
    dumps = []
    for shard, replicas in cluster.replicas_of.items():
        for node_id in replicas:
            first_lsn, records = cluster.online_dump(node_id, shard)
            dumps.append(
                ReplicaDump(
                    node_id,
                    shard,
                    first_lsn,
                    first_lsn + len(records) - 1,
                    tuple((first_lsn + i, r) for i, r in enumerate(records)),
                )
            )
    return dumps


def dump_all(cluster: Cluster) -> list[ReplicaDump]:
    """Every replica's log, read offline (the nodes are stopped)."""
    dump = importlib.import_module("tests.chaos.harness.dump")
    dumps = []
    for shard, replicas in cluster.replicas_of.items():
        for node_id in replicas:
            if node_id in cluster.quarantined:
                continue  # it refused to start on detected corruption (nemesis log)
            node = cluster.nodes[node_id]
            dumps.append(dump.dump_replica(node.shard_data_dir(shard), node_id, shard))
    return dumps


def collect_evidence(
    run: RunDir,
    cluster: Cluster,
    history_path: str,
    nemesis_log: NemesisLog,
    dumps: list[ReplicaDump],
    with_events: bool,
) -> Evidence:
    paths = [p for p in (history_path, nemesis_log.path) if os.path.exists(p)]
    evidence = read_jsonl(paths)
    if with_events:
        events, remapped = cluster.read_events()
        evidence.events.extend(events)
        if remapped:
            run.notes["event_times_remapped"] = remapped
    evidence.dumps.extend(dumps)
    return evidence


def _options(scenario: Scenario, time_scale: float) -> checker.CheckOptions:
    base = checker.CheckOptions(
        recover_window_ns=int(scenario.recover_window_s * time_scale * S),
        converge_window_ns=int(scenario.converge_window_s * time_scale * S),
        acked_appends_min=300,
        reads_min=50,
        dumps_per_shard_min=scenario.cluster.replicas,
        faults_must_apply=True,
    )
    return replace(base, **dict(scenario.options))
