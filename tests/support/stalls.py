"""How long this process went unscheduled while a test ran.

Tests that run several Raft replicas in one process (tests/unit/shard, tests/chaos/
test_proxy_raft.py) share its stalls: a full collection of the CI's large heap, or a
starved machine, stops every thread at once, and every follower then finds its leader
silent for as long, which is a real lapse and makes standing right. Such a test can run
again when its run stalled past its election timeout, and must hold exactly otherwise.
"""

from __future__ import annotations

import threading
import time

WAKE_S = 0.05


class StallWatch:
    """The longest this process went unscheduled while the watch ran: a thread that wakes
    every `WAKE_S` records how late it woke. A full collection of a large heap (the CI's one
    pytest process) or a starved machine stalls every thread of the process at once."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(WAKE_S):
            now = time.monotonic()
            self.longest_s = max(self.longest_s, now - last - WAKE_S)
            last = now

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
