"""Clock faults for node processes through libfaketime (chaos-plan §4.6).

    env = {**base_env, **faketime_env(offset_s=+30)}       # wall clock 30 s ahead
    env = {**base_env, **faketime_env(rate=1.5)}            # every clock 1.5x fast

A node is started with LD_PRELOAD naming libfaketime and FAKETIME describing the fault;
the fault holds for that process's life, so a scenario changes a node's clock at a
(re)start. (Changing it while running through FAKETIME_TIMESTAMP_FILE did not take
effect here, and FAKETIME_NO_CACHE=1 made Python raise OSError EINVAL: neither is used,
and a caller must not add them.)

* offset only (rate 1): only the wall clock moves (time.time(), datetime); the monotonic
  clock stays real (FAKETIME_DONT_FAKE_MONOTONIC), so timers and pysyncobj's timeouts are
  unchanged. That is clock skew between nodes.
* rate != 1: every clock runs at `rate` x real time, monotonic and sleeps included, so
  the node's election and heartbeat timers run fast or slow against its peers'. The
  monotonic clock's absolute value then jumps too (pysyncobj uses only differences).

File timestamps are left real (NO_FAKE_STAT): the fault is the node's sense of time, not
what the file system records. The multi-threaded build (libfaketimeMT) is preferred:
a node has many threads. Debian package: libfaketime (pulled in by `faketime`).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess

# dpkg-installed paths first; the last one is `make install`'s default.
KNOWN_LIBRARY_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
LIBRARY_NAMES = ("libfaketimeMT.so.1", "libfaketime.so.1")  # preferred first
# A skew beyond ten years, or a rate beyond 100x either way, is a unit mistake.
OFFSET_S_MAX = 10 * 365 * 86_400
RATE_MIN = 0.01
RATE_MAX = 100.0
DPKG_S_MAX = 10.0


class FaketimeUnavailable(RuntimeError):
    """libfaketime is not installed (apt-get install -y faketime)."""


def faketime_spec(offset_s: float = 0.0, rate: float = 1.0) -> str:
    """The FAKETIME value: "+3600", "-1.5", "+0 x2", "+30 x0.5" (a "." decimal point: node
    processes run in the C numeric locale)."""
    if not (math.isfinite(offset_s) and abs(offset_s) <= OFFSET_S_MAX):
        raise ValueError(f"offset_s must be within +-{OFFSET_S_MAX} s (got {offset_s})")
    if not (math.isfinite(rate) and RATE_MIN <= rate <= RATE_MAX):
        raise ValueError(f"rate must be in [{RATE_MIN}, {RATE_MAX}] (got {rate})")
    offset = f"{offset_s:+.6f}".rstrip("0").rstrip(".")
    return offset if rate == 1.0 else f"{offset} x{rate:.6g}"


def faketime_env(offset_s: float = 0.0, rate: float = 1.0) -> dict[str, str]:
    """The variables to add to a node's environment for this clock fault ({} for none).
    It sets LD_PRELOAD (replacing any other preload). FaketimeUnavailable if libfaketime
    is not installed."""
    spec = faketime_spec(offset_s, rate)
    if offset_s == 0 and rate == 1.0:
        return {}
    library = library_path()
    if library is None:
        raise FaketimeUnavailable(available()[1])
    env = {"LD_PRELOAD": library, "FAKETIME": spec, "NO_FAKE_STAT": "1"}
    if rate == 1.0:
        # Both spellings: libfaketime 0.9.10 reads FAKETIME_DONT_FAKE_MONOTONIC, older
        # releases DONT_FAKE_MONOTONIC.
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
        env["DONT_FAKE_MONOTONIC"] = "1"
    return env


@functools.cache
def library_path() -> str | None:
    """libfaketime's preload library: from `dpkg -L libfaketime`, else a known path."""
    listed: list[str] = []
    if shutil.which("dpkg") is not None:
        try:
            done = subprocess.run(
                ["dpkg", "-L", "libfaketime"], capture_output=True, text=True, timeout=DPKG_S_MAX
            )
            listed = done.stdout.splitlines() if done.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            listed = []
    for name in LIBRARY_NAMES:
        for path in listed:
            if os.path.basename(path) == name and os.path.isfile(path):
                return path
    for path in KNOWN_LIBRARY_PATHS:
        if os.path.isfile(path):
            return path
    return None


def available() -> tuple[bool, str]:
    """(True, the library) if clock faults can be applied, else (False, why not)."""
    library = library_path()
    if library is None:
        return False, "libfaketime not found (apt-get install -y faketime)"
    return True, library
