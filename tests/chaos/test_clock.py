"""Clock faults (tests/chaos/harness/clock.py): a child started with `faketime_env` sees the
clock the fault describes.

How: FAKETIME strings are checked as a table (no process). With libfaketime installed, a
child Python with rate x2 reports how far time.monotonic() moved between two lines on its
stdin that the parent sends 0.5 s apart (by its own real monotonic clock): about 1.0 s.
A child with offset +3600 reports time.time() an hour ahead of the parent's, and its
monotonic clock still agrees with the parent's (only the wall clock is skewed). Without
libfaketime the process tests skip with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.chaos.harness import clock

pytestmark = pytest.mark.timeout(60)

CHILD = """
import sys, time
sys.stdout.write(f"{time.monotonic()!r} {time.time()!r}\\n"); sys.stdout.flush()
sys.stdin.readline()
sys.stdout.write(f"{time.monotonic()!r} {time.time()!r}\\n"); sys.stdout.flush()
"""


def run_child(
    env_extra: dict[str, str], interval_s: float
) -> tuple[list[float], list[float], float]:
    """(child's first reading, child's second reading, parent's interval) where each reading
    is [monotonic, time] and the parent measures between receiving the first and sending
    its line."""
    env = {**os.environ, **env_extra}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        first = [float(x) for x in child.stdout.readline().split()]
        start_s = time.monotonic()
        time.sleep(interval_s)
        elapsed_s = time.monotonic() - start_s
        child.stdin.write("go\n")
        child.stdin.flush()
        second = [float(x) for x in child.stdout.readline().split()]
        assert child.wait(10) == 0
        return first, second, elapsed_s
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def require_faketime() -> None:
    ok, reason = clock.available()
    if not ok:
        pytest.skip(f"clock faults unavailable: {reason}")


@pytest.mark.parametrize(
    ("offset_s", "rate", "spec"),
    [
        (3600, 1.0, "+3600"),
        (-1.5, 1.0, "-1.5"),
        (0, 2.0, "+0 x2"),
        (30, 0.5, "+30 x0.5"),
        (-7200.25, 1.25, "-7200.25 x1.25"),
    ],
)
def test_faketime_spec(offset_s: float, rate: float, spec: str) -> None:
    assert clock.faketime_spec(offset_s, rate) == spec


@pytest.mark.parametrize(
    ("offset_s", "rate"), [(0, 0.0), (0, -1.0), (0, 1000.0), (1e12, 1.0), (float("nan"), 1.0)]
)
def test_bad_clock_faults_are_refused(offset_s: float, rate: float) -> None:
    with pytest.raises(ValueError):
        clock.faketime_spec(offset_s, rate)


def test_no_fault_is_no_environment() -> None:
    assert clock.faketime_env() == {}
    _ok, reason = clock.available()
    assert reason


def test_rate_x2_runs_the_monotonic_clock_twice_as_fast() -> None:
    require_faketime()
    env = clock.faketime_env(rate=2.0)
    assert env["FAKETIME"] == "+0 x2"
    assert "FAKETIME_DONT_FAKE_MONOTONIC" not in env
    first, second, parent_s = run_child(env, interval_s=0.5)
    ratio = (second[0] - first[0]) / parent_s
    assert 1.6 <= ratio <= 2.6, f"child monotonic moved {ratio:.2f}x the parent's"


def test_an_offset_moves_the_wall_clock_only() -> None:
    require_faketime()
    env = clock.faketime_env(offset_s=3600)
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    first, second, parent_s = run_child(env, interval_s=0.2)
    skew_s = first[1] - time.time()
    assert 3590 <= skew_s <= 3601, f"wall clock skew {skew_s:.1f} s"
    assert abs(first[0] - time.monotonic()) < 10, "the monotonic clock must stay real"
    assert 0.5 * parent_s <= second[0] - first[0] <= 2 * parent_s + 0.2  # runs at rate 1
