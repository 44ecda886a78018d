"""spark_jobs' thresholds and bounds, each with its unit and the reason for its value.

Relations between them are asserted at import (shared/STYLE.md).
"""

from __future__ import annotations

AUTO_SPARK_INPUT_BYTES_MIN = 1 << 30
"""`--engine auto` runs a job on Spark when its input (the log units it reads: WAL segment
files, logsvc shard journals) holds at least this many bytes, else on the local engine.
Why 1 GiB: a Spark job costs about 35 CPU-seconds and 10-20 s of wall time before its first
row (JVM, session, Python workers; README "Measured"), and Spark spends 3-12x the local
engine's CPU per entry, so it only pays off once its cores outnumber that overhead on a log
the local engine takes minutes over. 1 GiB is about 2M entries (542 bytes each in the
benchmark): the local audit reads it in about 2 s and replay in about a minute, under Spark's
start-up plus its per-entry cost on a small machine. `--master` (a cluster named by the user)
or a run under spark-submit always means Spark, whatever the size."""

PROGRESS_INTERVAL_S = 0.5
"""How often the local engine's progress line is redrawn (a terminal only): twice a second
is smooth enough to see movement and costs one small /proc read each time."""

PROGRESS_STOP_S_MAX = 5.0
"""How long the end of a run waits for the progress thread to finish its last line."""

assert PROGRESS_INTERVAL_S < PROGRESS_STOP_S_MAX

OUTPUT_PART_BYTES_MAX = 64 << 20
"""A Spark task writing a run's table to an object store (objectsource.py) starts a new
Parquet object every this many bytes of Arrow data: what bounds the task's memory (the
store's port takes an object whole), and the size Spark's own writers aim at per file."""
