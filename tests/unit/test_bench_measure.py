"""logsvc/bench/measure.py, the one percentile rule and CPU reader of every benchmark.

Proves: percentiles are linear interpolation between the closest ranks (position
fraction * (n - 1)) on small known lists, equal to `statistics.median` at 0.5 and to
`statistics.quantiles(method="inclusive")` at every whole percent, None for no samples,
rounded to 3 places, refusing unsorted input and fractions outside [0, 1]; the CPU reader
parses /proc/PID/stat past a command name holding spaces and parentheses, counts the work of
every thread of this process, reads another live process, says None for a gone one, and
finds a reaped child's CPU in `reaped_children_cpu_s`. CPU is checked with lower bounds on
work the test itself burns (never a timing on the clock), so a loaded machine only slows it.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time

import pytest

from logsvc.bench import measure

CHILD_WAIT_S_MAX = 60.0
BURN_S = 0.2
"""CPU seconds the test burns in a thread or a child; far above one clock tick (10 ms)."""
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(
    ("samples", "fraction", "expected"),
    [
        ([7.0], 0.0, 7.0),
        ([7.0], 0.5, 7.0),
        ([7.0], 1.0, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),  # between the two middle samples
        ([10.0, 20.0], 0.99, 19.9),
        ([float(i) for i in range(1, 101)], 0.0, 1.0),
        ([float(i) for i in range(1, 101)], 0.5, 50.5),
        ([float(i) for i in range(1, 101)], 0.99, 99.01),
        ([float(i) for i in range(1, 101)], 1.0, 100.0),
        ([1, 2, 3, 4, 5], 0.9, 4.6),  # ints, as spark_jobs' latencies are
        ([0.12345678], 0.5, 0.123),  # rounded to 3 places
        ([0.0, 1.0, 1.0, 1.0], 0.25, 0.75),
    ],
)
def test_percentile_interpolates_linearly_between_the_closest_ranks(
    samples: list[float], fraction: float, expected: float
) -> None:
    assert measure.percentile(samples, fraction) == expected


def test_no_samples_have_no_percentile() -> None:
    assert measure.percentile([], 0.5) is None
    assert measure.percentile([], 0.99) is None


def test_percentile_agrees_with_the_standard_library_on_random_lists() -> None:
    rng = random.Random(21)
    for _ in range(200):
        samples = sorted(rng.uniform(0, 50) for _ in range(rng.randint(2, 300)))
        assert measure.percentile(samples, 0.5) == round(statistics.median(samples), 3)
        inclusive = statistics.quantiles(samples, n=100, method="inclusive")
        for percent in (1, 50, 90, 99):
            got = measure.percentile(samples, percent / 100)
            assert got == pytest.approx(inclusive[percent - 1], abs=0.0006), (percent, samples)


def test_percentile_refuses_unsorted_samples_and_bad_fractions() -> None:
    with pytest.raises(AssertionError):
        measure.percentile([3.0, 1.0, 2.0], 0.5)
    with pytest.raises(AssertionError):
        measure.percentile([1.0, 2.0], 1.5)
    with pytest.raises(AssertionError):
        measure.percentile([1.0, 2.0], -0.1)


def test_stat_cpu_s_reads_utime_and_stime_past_an_odd_command_name() -> None:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...: utime 150, stime 50; cutime/cstime (99) are not ours.
    text = "4242 (a (b) c) S 1 4242 4242 0 -1 4194304 10 0 0 0 150 50 99 99 20 0 3 0\n"
    assert measure.stat_cpu_s(text) == pytest.approx(200 * TICK_S)


def _burn(seconds: float) -> None:
    """Use `seconds` of this thread's CPU (by the thread's own CPU clock)."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def test_own_cpu_s_counts_every_thread_of_the_process() -> None:
    before = measure.own_cpu_s()
    before_proc = measure.process_cpu_s(os.getpid())
    thread = threading.Thread(target=_burn, args=(BURN_S,))
    thread.start()
    thread.join(CHILD_WAIT_S_MAX)
    assert not thread.is_alive()
    assert measure.own_cpu_s() - before >= BURN_S
    after_proc = measure.process_cpu_s(os.getpid())
    assert before_proc is not None and after_proc is not None
    # /proc counts whole ticks: at most one lost at each end.
    assert after_proc - before_proc >= BURN_S - 2 * TICK_S


def test_a_child_is_read_while_alive_and_from_rusage_once_reaped() -> None:
    code = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {BURN_S}: pass\n"
    code += "print('burnt', flush=True)\nimport sys\nsys.stdin.read()\n"  # until stdin closes
    before_reaped = measure.reaped_children_cpu_s()
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "burnt\n"  # it has burnt BURN_S by now
        alive = measure.processes_cpu_s({"child": child.pid, "self": os.getpid()})
        assert set(alive) == {"child", "self"}
        assert alive["child"] >= BURN_S - 2 * TICK_S
        child.stdin.close()
        assert child.wait(CHILD_WAIT_S_MAX) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(CHILD_WAIT_S_MAX)
    assert measure.process_cpu_s(child.pid) is None  # reaped: gone from /proc
    assert measure.processes_cpu_s({"child": child.pid}) == {}
    assert measure.reaped_children_cpu_s() - before_reaped >= BURN_S - 2 * TICK_S
