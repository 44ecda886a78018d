"""The chaos suite's real-process scenarios C0-C10 (chaos-plan.md §4.9), marked `chaos_ci`.

Each test runs one scenario end to end (`harness/scenario.py`): a fresh cluster of real
node processes on loopback, a workload subprocess recording its history, a seeded fault
schedule, final heal, convergence, SIGTERM, offline dumps of every replica, the nodes'
event logs, then `checker.check_all` with vacuity minimums (acked appends, reads, applied
faults, leader changes). A failure message names the artifact directory (history, nemesis
log, node logs, event logs, data tarball, checker report) and the one-line reproduction:

    CHAOS_SEED=N .venv/bin/pytest tests/chaos/test_scenarios.py -k C5

C0 is the fault-free run: the harness and the checkers must find nothing there (L8).
Scenarios run serially (2 cores: parallel runs would only add noise). Each starts its own
cluster: a shared one would put a previous scenario's records in the dumps this run's
history must account for, its terms in the leader-change counts, its damage, power losses
and node environments (failpoints, proxy dials, clocks, gids) in the next verdict.

The tests after the scenarios run no process: the confirmations the schedules wait for
(a shard served again, an old leader deposed) fail the run's vacuity check when the effect
does not happen, so a shortened schedule cannot pass hollow.
"""

from __future__ import annotations

import dataclasses
import random
import time
import warnings
from pathlib import Path
from typing import cast

import pytest

from logsvc.wire.messages import ShardStatus
from tests.chaos import checker
from tests.chaos.checks_base import CheckOptions
from tests.chaos.harness import netns
from tests.chaos.harness.artifacts import RunDir, env_scenarios, env_seed, env_time_scale
from tests.chaos.harness.cluster import Cluster
from tests.chaos.harness.nemesis import Nemesis, NemesisLog
from tests.chaos.harness.scenario import RunContext, assert_passed, run_scenario
from tests.chaos.harness.workload import HistoryTail
from tests.chaos.history import Evidence, Op, to_json_line
from tests.chaos.scenarios import SCENARIOS

# Run inside `unshare --net` (their kernel-level part) when netns.available().
KERNEL_SCENARIOS = frozenset({"C10"})
SCENARIO_TIMEOUT_S = 240  # per test; the scenario's own waits are all bounded below this


@pytest.mark.chaos_ci
@pytest.mark.timeout(SCENARIO_TIMEOUT_S, method="signal")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str, chaos_artifacts: str) -> None:
    wanted = env_scenarios()
    if wanted is not None and name not in wanted:
        pytest.skip(f"CHAOS_SCENARIOS={','.join(sorted(wanted))}")
    scenario = SCENARIOS[name]
    notes: dict[str, str] = {}
    if name in KERNEL_SCENARIOS:
        if not netns.inside_private_netns():
            ok, why = netns.available()
            if ok:  # run this very test again inside a throwaway network namespace
                inner = netns.pytest_in_netns(
                    f"tests/chaos/test_scenarios.py::test_scenario[{name}]",
                    timeout_s=SCENARIO_TIMEOUT_S - 20,
                    extra_args=["-s"],
                )
                print(inner.stdout[-3000:])
                output = f"{inner.stdout[-8000:]}\n{inner.stderr[-2000:]}"
                assert inner.returncode == 0, f"{name} in a network namespace failed:\n{output}"
                return
            notes["kernel"] = why
            warnings.warn(f"{name}: kernel-level case skipped: {why}", stacklevel=1)
        else:
            faults_min = {**scenario.options.get("faults_min", {}), "loss": 1}
            scenario = dataclasses.replace(
                scenario, kernel_net=True, options={**scenario.options, "faults_min": faults_min}
            )
    result = run_scenario(
        scenario,
        env_seed(),
        time_scale=env_time_scale(),
        artifacts_base=chaos_artifacts,
        notes=notes,
    )
    print(result.summary())
    assert_passed(result)


# ------------------------------------------------------------ the confirmations themselves
# The schedules wait for effects instead of fixed times (scenarios.py's timing rule). These
# tests, with no processes, show that an effect that does not happen fails the run's
# vacuity check, so that a shortened schedule cannot pass hollow.


class _FakeCluster:
    """What `Nemesis.confirm_term` reads: each node's own status of a shard."""

    def __init__(self, terms: dict[str, int | None]) -> None:
        self.terms = terms

    def status(self, node_id: str, shard: int) -> ShardStatus | None:
        term = self.terms[node_id]
        if term is None:
            return None
        return ShardStatus(shard, None, term, 1, 1, 0, False)


def _context(tmp_path: Path, terms: dict[str, int | None]) -> tuple[RunContext, NemesisLog]:
    log = NemesisLog(str(tmp_path / "nemesis.jsonl"))
    cluster = cast(Cluster, _FakeCluster(terms))
    nemesis = Nemesis(cluster, log, random.Random(1))
    history = str(tmp_path / "history.jsonl")
    open(history, "w").close()
    run = cast(RunDir, None)
    ctx = RunContext(cluster, nemesis, random.Random(1), 1.0, None, run, HistoryTail(history))
    return ctx, log


def _ok_append(shard: int, complete_ns: int, n: int) -> str:
    return to_json_line(
        Op(f"a{n}", "w0", "append", shard, complete_ns - 1, complete_ns, "ok", lsns=(n,))
    )


def _vacuity(log: NemesisLog, faults_min: dict[str, int]) -> list[str]:
    evidence = Evidence(nemesis=list(log.events))
    options = CheckOptions(faults_min=faults_min, faults_must_apply=True)
    return [f"{v.message}: {v.examples}" for v in checker.check_vacuity(evidence, options)]


def test_a_shard_that_acks_nothing_after_a_step_fails_the_run(tmp_path: Path) -> None:
    ctx, log = _context(tmp_path, {})
    assert not ctx.wait_served("after a partition", 1, count=3, wait_s=0.3)
    found = _vacuity(log, {"served": 1})
    assert any("a planned fault was not applied" in f and "served" in f for f in found), found
    assert any("too few applied 'served' faults" in f for f in found), found


def test_acks_after_the_step_confirm_it_and_earlier_ones_do_not(tmp_path: Path) -> None:
    ctx, log = _context(tmp_path, {})
    now_ns = time.monotonic_ns()
    with open(ctx.history.path, "a") as f:
        for n in range(5):  # acked before the step: they prove nothing about it
            f.write(_ok_append(1, now_ns - 1_000_000_000, n) + "\n")
    assert not ctx.wait_served("after a kill", 1, count=3, wait_s=0.3)
    with open(ctx.history.path, "a") as f:
        for n in range(5, 8):  # acked after it, but on another shard
            f.write(_ok_append(2, time.monotonic_ns() + 60_000_000_000, n) + "\n")
        for n in range(8, 11):  # acked after it, on the shard
            f.write(_ok_append(1, time.monotonic_ns() + 60_000_000_000, n) + "\n")
    assert ctx.wait_served("after a kill", 1, count=3, wait_s=5.0)
    assert [e.applied for e in log.events if e.fault == "served"] == [False, True]


def test_an_old_leader_still_in_its_term_is_not_deposed(tmp_path: Path) -> None:
    ctx, log = _context(tmp_path, {"n1": 4, "n2": 5, "n3": None})
    assert not ctx.nemesis.confirm_term("deposed", "n1", 1, 5, wait_s=0.3)
    assert not ctx.nemesis.confirm_term("deposed", "n3", 1, 5, wait_s=0.3)  # not answering
    assert ctx.nemesis.confirm_term("deposed", "n2", 1, 5, wait_s=0.3)
    found = _vacuity(log, {"deposed": 2})
    assert any("a planned fault was not applied (2 cases)" in f for f in found), found
    assert any("too few applied 'deposed' faults" in f and "1 < 2" in f for f in found), found


def test_every_scenario_with_faults_demands_their_effects() -> None:
    """Each faulty scenario asks for confirmed effects (a served shard after its steps, and
    a leader change wherever it removes a leader), so that its vacuity check fails if a
    shortened schedule stops producing them."""
    for name, scenario in SCENARIOS.items():
        faults_min = dict(scenario.options.get("faults_min", {}))
        if name == "C0":
            assert faults_min == {}
            continue
        assert faults_min.get("served", 0) >= 1, name
        removes_leaders = "leader_changes_min" in scenario.options
        assert removes_leaders or name == "C2", name  # C2 kills random nodes
