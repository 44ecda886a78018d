"""engine/wal/batch.py gathers the values of string and binary columns in bounded steps
(`_gather_runs`: an index of 8 bytes per value byte, at most GATHER_BYTES_MAX bytes a step,
so a chunk of mostly strings does not make an index 8 times its size), or, when every run is
short (RUN_WINDOW_BYTES_MAX), as rows of one sliding window: the runs joined, as slicing each
and joining gives, for runs empty, short, longer than a step, across steps, and (windows) at
the buffer's end."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.wal import batch_gather as batch


@settings(max_examples=200, deadline=None)
@given(
    st.binary(min_size=0, max_size=400),
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 60)), max_size=30),
    st.integers(1, 80),
    st.sampled_from([0, 8, 64]),
)
# A short run at the buffer's end, after a longer one: its window row is moved back.
@example(bytes(range(100)), [(0, 50), (95, 5)], 80, 64)
@example(bytes(range(10)), [(0, 3), (8, 2)], 80, 8)
def test_runs_gathered_in_steps_are_the_runs_joined(
    raw: bytes, runs: list[tuple[int, int]], step_bytes: int, window_bytes: int
) -> None:
    runs = [(start, min(length, len(raw) - start)) for start, length in runs if start < len(raw)]
    data = np.frombuffer(raw, dtype=np.uint8)
    starts = np.array([s for s, _ in runs], dtype=np.int64)
    lengths = np.array([n for _, n in runs], dtype=np.int64)
    steps: list[int] = []
    original_arange = np.arange

    def counting_arange(*args: object, **kwargs: object) -> object:
        found = original_arange(*args, **kwargs)  # type: ignore[call-overload]
        steps.append(len(found))
        return found

    with (
        mock.patch.object(batch, "GATHER_BYTES_MAX", step_bytes),
        mock.patch.object(batch, "RUN_WINDOW_BYTES_MAX", window_bytes),
        mock.patch.object(np, "arange", counting_arange),
    ):
        found = batch._gather_runs(data, starts, lengths)
    assert found.tobytes() == b"".join(raw[s : s + n] for s, n in runs)
    # Each step's index covers at most GATHER_BYTES_MAX bytes, or a single longer run.
    assert all(size <= max(step_bytes, int(lengths.max(initial=0))) for size in steps)
