"""The chaos suite's real-process scenarios C0-C10 (chaos-plan.md §4.9), marked `chaos_ci`.

Each test runs one scenario end to end (`harness/scenario.py`): a fresh cluster of real
node processes on loopback, a workload subprocess recording its history, a seeded fault
schedule, final heal, convergence, SIGTERM, offline dumps of every replica, the nodes'
event logs, then `checker.check_all` with vacuity minimums (acked appends, reads, applied
faults, leader changes). A failure message names the artifact directory (history, nemesis
log, node logs, event logs, data tarball, checker report) and the one-line reproduction:

    CHAOS_SEED=N .venv/bin/pytest tests/chaos/test_scenarios.py -k C5

C0 is the fault-free run: the harness and the checkers must find nothing there (L8).
Scenarios run serially (2 cores: parallel runs would only add noise).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from tests.chaos.harness import netns
from tests.chaos.harness.artifacts import env_scenarios, env_seed, env_time_scale
from tests.chaos.harness.scenario import assert_passed, run_scenario
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
