"""An opt-in pytest plugin: full collections of about a second while the tests run.

`pytest -p tests.support.gcpause ...`. The CI runs the Raft tests after ~3,000 others in
one pytest process, where a gen-2 collection of that large heap holds the GIL for about a
second and stalls every thread of the process at once (scheduler workers, Raft timers,
the test's own waits), which a run of the same tests alone never shows. Here a heap kept
alive is collected every `GCPAUSE_EVERY_S` seconds (env, default 4), its size adjusted
after each collection so that one takes about `GCPAUSE_TARGET_S` (env, default 1.0)
whatever the machine's load; the pauses are summed up at the end of the run. It
reproduced the quiet-connection failure of tests/unit/shard/test_failover.py (CI, 2026-11-27)
in one run of two, where runs without it passed.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest

HEAP_OBJECTS_FIRST = 500_000
HEAP_OBJECTS_MIN = 50_000
# ~0.6 GiB of one-element lists: the most this plugin keeps alive, whatever the pauses.
HEAP_OBJECTS_MAX = 8_000_000

_heap: list[list[int]] = []
_pauses_s: list[float] = []
_stop = threading.Event()


def _collect_now_and_then(every_s: float, target_s: float) -> None:
    while not _stop.wait(every_s):
        began = time.monotonic()
        gc.collect()
        pause_s = time.monotonic() - began
        _pauses_s.append(pause_s)
        count = len(_heap)
        wanted = int(count * target_s / max(pause_s, 1e-3))
        wanted = max(HEAP_OBJECTS_MIN, min(HEAP_OBJECTS_MAX, wanted))
        if wanted > count:
            _heap.extend([i] for i in range(wanted - count))
        else:
            del _heap[wanted:]


def pytest_configure(config: pytest.Config) -> None:
    every_s = float(os.environ.get("GCPAUSE_EVERY_S", "4"))
    target_s = float(os.environ.get("GCPAUSE_TARGET_S", "1.0"))
    assert every_s > 0 and target_s > 0
    _heap.extend([i] for i in range(HEAP_OBJECTS_FIRST))
    threading.Thread(
        target=_collect_now_and_then, args=(every_s, target_s), name="gcpause", daemon=True
    ).start()


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop.set()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _pauses_s:
        terminalreporter.write_sep("=", "gcpause")
        terminalreporter.write_line(
            f"{len(_pauses_s)} full collections, {sum(_pauses_s):.1f} s in all, "
            f"median {sorted(_pauses_s)[len(_pauses_s) // 2]:.2f} s, max {max(_pauses_s):.2f} s"
        )
