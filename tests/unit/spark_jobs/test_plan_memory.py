"""One log's replay holds memory that does not grow with its record count (issue 23: the
plan held ~270 bytes a record, so a worker passed 1 GB at ~3.7M records).

How: the same replay (`local_replay.replay_log`, the one-read path a clean log takes) of a
file WAL of N one-entry records and of 4N, with rows spilled past a small bound, under
tracemalloc; the peaks may differ by a constant (a chunk and a segment are bounded by their
limits, not by the log), not by ~200 bytes for each of the 3N more records. Before the plan
was streamed (plan_stream.py), the 4N replay's peak was ~10 MB above the N one's. The same
for a log with what a crashed driver leaves near its tail (copies, a skip record:
`one_entry_records_wal(crashed=True)`), which the streamed plan now takes (before, it was
planned record by record: ~300 bytes a record, refused past REPLAY_PLAN_RECORDS_MAX).
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path
from typing import Any

from spark_jobs import local_replay
from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from tests.unit.spark_jobs.logs import one_entry_records_wal

RECORDS = 20_000  # more than a chunk's entries (entries.CHUNK_ENTRIES_MAX), so both fill chunks
PEAK_GROWTH_BYTES_MAX = 2 << 20
"""What the 4N replay may hold above the N one: 3N more records at even 30 bytes each would
pass it (the old plan: ~200)."""


def _replay_peak_bytes(wal: str) -> tuple[int, dict[str, Any]]:
    params = JobParams("replay_as_of", file_input(wal), as_of=2**62, rows_held_bytes=1 << 20)
    gc.collect()
    tracemalloc.start()
    try:
        summary, tables = local_replay.replay_log(params, "file", 0)
        del tables
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, summary


def test_a_replay_peak_does_not_grow_with_the_records(tmp_path: Path) -> None:
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    one_entry_records_wal(small, RECORDS)
    one_entry_records_wal(large, 4 * RECORDS)
    assert len(os.listdir(large)) > 4  # several segments, each bounded
    _replay_peak_bytes(small)  # imports and caches warmed, not counted
    small_peak, small_summary = _replay_peak_bytes(small)
    large_peak, large_summary = _replay_peak_bytes(large)
    assert small_summary["records_replayed"] == RECORDS
    assert large_summary["records_replayed"] == 4 * RECORDS
    assert large_summary["entries_replayed"] == 4 * RECORDS
    assert large_peak - small_peak < PEAK_GROWTH_BYTES_MAX, (small_peak, large_peak)


def test_a_crashed_log_s_replay_peak_does_not_grow_with_the_records(tmp_path: Path) -> None:
    small, large = str(tmp_path / "small"), str(tmp_path / "large")
    one_entry_records_wal(small, RECORDS, crashed=True)
    one_entry_records_wal(large, 4 * RECORDS, crashed=True)
    _replay_peak_bytes(small)  # imports and caches warmed, not counted
    small_peak, small_summary = _replay_peak_bytes(small)
    large_peak, large_summary = _replay_peak_bytes(large)
    for summary, count in ((small_summary, RECORDS), (large_summary, 4 * RECORDS)):
        assert summary["records_replayed"] == summary["entries_replayed"] == count
        assert summary["duplicate_copies_ignored"] == 3
        assert summary["records_skipped_by_skip_records"] == 1
        assert summary["tables"] == {"db.kv": count - 2}
    assert large_peak - small_peak < PEAK_GROWTH_BYTES_MAX, (small_peak, large_peak)
