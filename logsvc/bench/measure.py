"""The two measures every benchmark in the repository takes, taken one way: latency
percentiles and CPU seconds. Used by engine/bench/, logsvc/bench/, tae_driver/bench.py,
spark_jobs/bench.py and spark_jobs' latency job, so that a p99 or a "CPU per commit" means the
same thing in every table of the README (issue 21: seven percentile functions with three rules
before this module).

**Percentile rule: linear interpolation between the closest ranks.** For ascending samples
`x[0..n)` and a fraction `f` in [0, 1], the position is `f * (n - 1)`; the value is `x[lo]`
plus the position's fractional part times `x[hi] - x[lo]`, `lo`/`hi` the floor and ceiling
of the position. This is numpy's default ("linear"), Excel's PERCENTILE.INC and Spark SQL's
exact `percentile`, which is why it was chosen over nearest rank: spark_jobs' latency job must
give Spark's figures to the digit, and with this rule one function serves it and every
benchmark. p50 is the median (`statistics.median`'s value). An empty list has no percentile:
`None` (JSON `null`), never a made-up 0. Results are rounded to 3 decimal places: latencies
here are kept in ms (so to the microsecond) and times in s (to the millisecond), and the last
bits of an interpolation depend on the order of its operations (Spark gives 39.2 where Python
gives 39.20000000000001).

**CPU reader: user + system seconds of whole processes, every thread included.** This
process: `time.process_time()` (CLOCK_PROCESS_CPUTIME_ID, all threads, nanosecond
resolution). Another live process: utime + stime of /proc/PID/stat (all its threads; clock
ticks, usually 10 ms). Children this process started and has reaped: `RUSAGE_CHILDREN`. A
benchmark of several processes reports the sum over the processes it measured, each read the
same way before and after. Linux only (/proc), as the benchmarks are.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Mapping, Sequence

PERCENTILE_DIGITS = 3
"""Decimal places of a percentile: microseconds for samples in ms, milliseconds in s."""
_STAT_UTIME_FIELD = 11
"""utime, stime: fields 14 and 15 of /proc/PID/stat (proc(5)), counted from the first field
after the command's closing parenthesis (field 3) as index 0."""
_STAT_STIME_FIELD = 12


def percentile(sorted_samples: Sequence[float], fraction: float) -> float | None:
    """The `fraction` percentile (0.99 for p99) of ascending `sorted_samples` by linear
    interpolation between the closest ranks, rounded to PERCENTILE_DIGITS; None when there
    are no samples. The caller sorts once for all the percentiles it takes."""
    assert 0.0 <= fraction <= 1.0, fraction
    count = len(sorted_samples)
    if count == 0:
        return None
    position = fraction * (count - 1)
    lower = int(position)  # floor: position >= 0
    upper = min(lower + 1, count - 1)
    low, high = sorted_samples[lower], sorted_samples[upper]
    # Ascending is the caller's promise; checked where it costs nothing.
    assert sorted_samples[0] <= low <= high <= sorted_samples[-1], "samples not ascending"
    value = low + (position - lower) * (high - low)
    return round(value, PERCENTILE_DIGITS)


def own_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process, all its threads."""
    return time.process_time()


def stat_cpu_s(stat_text: str) -> float:
    """CPU seconds (utime + stime, all threads) in the text of a /proc/PID/stat file. The
    command name (field 2, in parentheses) may hold spaces and parentheses, so fields are
    counted after its last ')'."""
    fields = stat_text.rsplit(")", 1)[1].split()
    ticks = int(fields[_STAT_UTIME_FIELD]) + int(fields[_STAT_STIME_FIELD])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) used so far by live process `pid`; None once
    it is gone (a reaped child's CPU is in `reaped_children_cpu_s`)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return stat_cpu_s(text)


def processes_cpu_s(pids: Mapping[str, int]) -> dict[str, float]:
    """`process_cpu_s` of each named process still alive (the gone ones are left out)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        cpu_s = process_cpu_s(pid)
        if cpu_s is not None:
            out[name] = cpu_s
    return out


def reaped_children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children that have exited and been
    waited for (and of their reaped descendants): what /proc can no longer tell."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
