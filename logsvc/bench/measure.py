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

import contextlib
import os
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


# ---------------------------------------------------------------------------- a quiet machine
# A benchmark that compares us with a peer measures both on a machine nobody else is using:
# it waits until the machine is idle before a measurement and tells how much CPU others used
# during it (logsvc/bench/peers.py).

IDLE_WAIT_S_MAX = 30.0
IDLE_WINDOW_S = 0.5
IDLE_WINDOWS_NEEDED = 4  # 2 s quiet in a row
IDLE_BUSY_MAX = 0.15  # fraction of all cores' time


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate `cpu` line of /proc/stat.

    Busy is user + nice + system + steal: time charged to processes (or taken by the
    host). irq and softirq are left out of busy, since loopback traffic is handled there
    and is not charged to any process, so it would pass for someone else's CPU."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
            user, nice, system, _idle, _iowait, _irq, _softirq, steal = values[:8]
            total = sum(values[:8])  # guest time is already counted in user
            return user + nice + system + steal, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    return busy / total if total > 0 else 0.0


def read_cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        return cpu_times(f.read())


def wait_for_idle(
    max_wait_s: float = IDLE_WAIT_S_MAX, busy_max: float = IDLE_BUSY_MAX
) -> tuple[bool, float]:
    """Wait until the machine is idle-ish (IDLE_WINDOWS_NEEDED quiet windows in a row).

    Returns (settled, last busy fraction); never waits longer than max_wait_s."""
    deadline = time.monotonic() + max_wait_s
    quiet = 0
    busy = 1.0
    previous = read_cpu_times()
    while time.monotonic() < deadline:
        time.sleep(IDLE_WINDOW_S)
        current = read_cpu_times()
        busy = busy_fraction(previous, current)
        previous = current
        quiet = quiet + 1 if busy <= busy_max else 0
        if quiet >= IDLE_WINDOWS_NEEDED:
            return True, busy
    return False, busy


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    wall_s: float
    machine_busy_s: float  # all processes, all cores
    own_s: float  # this process and its reaped children (the clusters it started)


def cpu_snapshot() -> CpuSnapshot:
    busy, _ = read_cpu_times()
    own = own_cpu_s() + reaped_children_cpu_s()
    return CpuSnapshot(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own)


def foreign_fraction(before: CpuSnapshot, after: CpuSnapshot, cores: int) -> float:
    """Share of the machine's CPU used by processes other than ours between two snapshots
    (taken around a whole measurement, after its servers were stopped and reaped)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0 or cores <= 0:
        return 0.0
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / (wall * cores))


def filesystem_of(path: str) -> str:
    """The type of the filesystem holding path (so a reader sees fsync is real)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                mount = parts[1]
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    return kind
