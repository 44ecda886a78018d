"""spark_jobs' thresholds and bounds, each with its unit and the reason for its value.

Relations between them are asserted at import (shared/STYLE.md).
"""

from __future__ import annotations

from tae_driver import limits as driver_limits

AUTO_SPARK_INPUT_BYTES_MIN = 1 << 30
"""`--engine auto` runs a job on Spark when its input (the log units it reads: WAL segment
files, logsvc shard journals) holds at least this many bytes, else on the local engine. Why
1 GiB: a Spark job pays 5-8 CPU-seconds before its first row (JVM with the class-data
archive, session, Python workers; without the archive 8-12) and then 1.4-1.9x the local
engine's CPU per entry (README "Measured": Spark per core is 0.53-0.7x local at 10M
entries), so it only pays off once several cores share a log the local engine takes tens of
seconds over. 1 GiB is about 6M entries (172 bytes each in the benchmark): the local audit
reads it in about 6 CPU-s and replay in about 12. `--master` (a cluster named by the user)
or a run under spark-submit always means Spark, whatever the size."""

LIVE_SEGMENT_READS_MAX = 3
"""Reads of the newest segment of a log (a file WAL's or a logsvc journal's) that a job may
make before it reports damage found there: the newest segment may be being written as the
job reads it (a job beside a running engine or node), and a read that copies it while a
write is copied in can see that write's first frame half-written and, descheduled in
between, the frames after it whole: damage that is not on disk. The same rule as
tae_driver's read-only look (`FILE_READ_ONLY_SCAN_ATTEMPTS_MAX`, where a CI run hit it);
damage every read shows is reported, so a damaged log costs two more reads and pauses."""

LIVE_SEGMENT_REREAD_PAUSE_S = 0.05
"""Pause before reading the newest segment again: the writer's copy of one group write into
the page cache takes well under a millisecond; 50 ms outlasts a descheduling of the reader."""

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

STREAM_READ_BYTES_MAX = 4 << 20
"""Payload bytes one `read` call of a streaming source asks logsvc for (the server caps it
too): what one partition holds at once before it hands the records to Spark as one Arrow
batch, and small enough that one call answers well within the client's request timeout."""

STREAM_PARTITION_LSNS_MAX = 200_000
"""LSNs per input partition of a `logsvc` micro-batch: a shard's range (start, end] is cut
into partitions this long, so one big backlog spreads over the executors' cores instead of
being one task (Spark's Kafka source does the same with `minPartitions`)."""

STREAM_READ_WAIT_S_MAX = 60.0
"""How long a partition waits for LSNs the plan promised but no replica it reaches hands out
yet (a lagging replica answers a shorter prefix; the leader is asked next): past this the
task fails with the reason (Spark retries it) rather than hang."""

STREAM_CHANGES_PER_BATCH_MAX = 50_000
"""Changes one `logsvc_changes` micro-batch holds at most (more when one record's entries
alone exceed it: a batch ends only where nothing is pending): the change stream reads in
the driver's Python process (a simple stream reader, one ordered stream), which keeps a
batch's rows until Spark plans it, so this bounds that process's memory (about 1 KiB a
change: ~50 MiB)."""

REPLAY_ROWS_HELD_BYTES_MAX = 256 << 20
"""Bytes of one table's replayed rows (Arrow bytes, plus 16 a row for their sort key) and,
apart, of its deleted row keys, a replay holds in memory before it writes them to local disk
as a sorted run (spark_jobs/spill.py): what keeps a Python worker's memory bounded whatever
a log's size (issue 23: at most 1 GB a worker). Why 256 MiB: a 2.5M-entry log of the
benchmark's one-row transactions (~100 MiB of rows) stays in memory as before, and a
worker's other holdings (a 64 MiB segment, a decoded chunk of 16,384 entries, the merge
below) still leave room under 1 GB."""

SPILL_BATCH_BYTES_MAX = 4 << 20
"""Arrow bytes of one batch of a spilled run (about: by the run's average row): what the
merge holds per run."""

SPILL_MERGE_FAN_IN = 16
"""Runs merged at once; more are merged a group at a time into longer runs first. With
SPILL_BATCH_BYTES_MAX: at most 64 MiB of batches held, about 3x that while a merged chunk
is put in order."""

assert STREAM_READ_BYTES_MAX <= 16 << 20  # logsvc's own read cap (logsvc/wire/limits.py)

SEGMENT_BUFFER_BYTES_MAX = 128 << 20
"""The largest buffer a reader keeps between segment files (spark_jobs/segment_buffers.py:
faulted in once rather than mapped afresh per file). Twice the file backend's default
segment size (64 MiB), so that a writer configured a little larger still gains; a larger
file is read into a buffer of its own, let go after. At most one is kept idle."""

REPLAY_PLAN_SKIPS_HELD_MAX = 65_536
"""LSNs named by skip records that the streaming replay plan (spark_jobs/plan_stream.py)
holds: 8 bytes each in a list, about 2 MiB at most. A skip record is written only by a
repair (one per diverged copy), so a log with more is planned record by record instead."""

REPLAY_PLAN_WINDOW_RECORDS = 4096
"""Entry records (the most recent ones that began a DSN range: start DSN, count, checksum,
LSN, ordinal; five int64 arrays, 160 KiB) that the streaming replay plan
(spark_jobs/plan_stream.py) remembers to recognise a copy: a record re-appended with the
same DSNs and bytes at a higher LSN, which a driver writes after a crash or a timeout (a
retried append, tae_driver/replay.py). A driver re-appends only what was in flight, at most
its window (tae_driver WINDOW_RECORDS_MAX, 256 records) behind the newest record, so a copy
lies well inside this (16 windows); and at 160 KiB it is too small to show in a replay's
peak (tests/unit/spark_jobs/test_plan_memory.py). A copy of an older record (or one whose
DSNs or bytes differ, or that overlaps part of a range) makes the streamed plan give up:
the log is planned record by record, which names the exact error, or, past
REPLAY_PLAN_RECORDS_MAX records, is refused."""

REPLAY_PLAN_COPIES_HELD_MAX = 16_384
"""Copies (a tuple of seven ints each, ~250 bytes: ~4 MiB at most) that the streaming
replay plan holds to resolve skip records and to list the LSNs it leaves out of its kept
span: one crash leaves at most a few copies of each record in flight (tae_driver
RECORD_COPIES_MAX times WINDOW_RECORDS_MAX: 1,024), so this is 16 such crashes at their
worst; a log with more is planned record by record (and refused past
REPLAY_PLAN_RECORDS_MAX records)."""

REPLAY_PLAN_RECORDS_MAX = 1_000_000
"""Backend records a log that is not clean (copies, skip records, gaps, records out of LSN
order: plan_stream.py's module doc) may have for its replay plan to be made record by record
(spark_jobs/replay.py `plan_replay`, ~300 bytes a record in objects and sets): past it the
replay is refused (`ReplayRefused`, naming this limit) rather than let one worker pass 1 GB
(issue 23). A clean log is planned in constant memory whatever its size; a log past this
limit is made clean by the driver's repair (run lsn_audit for what is wrong) or replayed
from a newer checkpoint after a truncation."""

REPLAY_UNSORTED_ENTRIES_MAX = 100_000
"""Entries a replay holds when a log's entries are not read in DSN order (`_replay_log_sorted`
in spark_jobs/local_replay.py: every kept entry held, then sorted): an entry is a decoded
transaction with its Arrow batch (~6 KB for a one-row append), so ~600 MiB at most; past it
the replay is refused (`ReplayRefused`, naming this limit). The driver and the file backend
always write a log in DSN order; only a log pieced together by hand is out of it."""

assert REPLAY_PLAN_SKIPS_HELD_MAX * 8 <= 4 << 20
assert REPLAY_PLAN_WINDOW_RECORDS * 5 * 8 <= 256 << 10
assert REPLAY_PLAN_WINDOW_RECORDS >= 16 * driver_limits.WINDOW_RECORDS_MAX
assert REPLAY_PLAN_COPIES_HELD_MAX * 250 <= 4 << 20
assert REPLAY_PLAN_COPIES_HELD_MAX >= driver_limits.RECORD_COPIES_MAX * 256
assert REPLAY_PLAN_RECORDS_MAX * 300 + REPLAY_ROWS_HELD_BYTES_MAX < 1 << 30

AUDIT_HELD_BYTES_MAX = 64 << 20
"""The audit level's batches lsn_audit holds while it streams a log (spark_jobs/audit.py
`audit_of`): a log found to have something to report within them is audited whole without
decoding its records again (each record decoded once, as the Spark engine's tasks are
tested for). Past it they are let go, so a clean log's audit stays bounded whatever its
size, and a larger log with something to report is audited in two passes (spark_jobs/
audit_stream.py: pass 1 takes over from the clean prefix, pass 2 reads the log a second
time from its start)."""

AUDIT_SPANS_HELD_MAX = 100_000
"""What pass 1 of the streamed audit of a log with something to report holds (spark_jobs/
audit_stream.py `CoverageScan`), counted together: intervals of covered DSNs, of DSNs held
more than once and of covered LSNs, skip pairs, damaged records. Each is a few Python ints
and strings (150-250 bytes with its list or set slots and labels; a damaged record's row, a
small dict, up to ~500): ~50 MB at most. Every one of them is an anomaly or borders one (a
gap, a copy, an LSN gap, a skip, damage), so a log past it is damaged throughout and a
per-anomaly report of it would not be read; the audit is refused (`AuditRefused`) rather
than let a worker pass 1 GB (issue 23)."""

AUDIT_DETAIL_COPIES_MAX = 100_000
"""DSN copies pass 2 of the streamed audit (audit_stream.py `CopyDetail`) keeps in detail:
every copy of a DSN held more than once and every skipped copy (32 bytes each in arrays),
and with them the anomalies they make (a duplicate, conflict or skipped copy: a dict of
1.25 KB each, measured with tracemalloc), so ~130 MB at most; past it the audit is refused
(`AuditRefused`). Like AUDIT_SPANS_HELD_MAX: a log with more is damaged throughout."""

assert AUDIT_HELD_BYTES_MAX + AUDIT_SPANS_HELD_MAX * 512 + AUDIT_DETAIL_COPIES_MAX * 1300 < 1 << 30
