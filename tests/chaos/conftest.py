"""Fixtures of the chaos suite's process tier: where runs keep their artifacts.

Knobs (chaos-plan.md §4.13): CHAOS_SEED (default 1), CHAOS_TIME_SCALE (multiplies fault
durations and liveness windows), CHAOS_SCENARIOS=C1,C5 (run only these), CHAOS_KEEP=1
(keep a passing run's artifacts), CHAOS_ARTIFACTS=DIR (where runs go; default pytest's tmp
directory).
"""

from __future__ import annotations

import pytest


@pytest.fixture
def chaos_artifacts(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("chaos"))
