"""tests/support/stalls.py: a stall of the whole process (here a full collection, which holds
the GIL throughout) is reported at its length. The collection's own duration is the
yardstick, so the load of the machine does not matter."""

from __future__ import annotations

import gc
import time

from tests.support.stalls import StallWatch


def test_a_full_collection_is_reported_as_a_stall_of_its_length() -> None:
    heap = [[i] for i in range(1_500_000)]
    with StallWatch() as watch:
        time.sleep(0.2)  # the watch's thread is running
        began = time.monotonic()
        gc.collect()
        pause_s = time.monotonic() - began
        time.sleep(0.2)  # the watch wakes after the collection and measures it
    del heap
    assert pause_s > 0.1  # a stall worth measuring
    assert watch.longest_s >= pause_s - 0.06  # its own 50 ms sleep may overlap the pause
