"""The Spark jobs' operating errors. Each carries what a person needs to act on it; the CLI
prints it and exits 1 (2 for bad usage). Programmer errors are asserts.

    SparkJobError
     ├── BadInput          a path, option or argument the job cannot use
     ├── NotALog           a path named as a log holds none (exit 4, not 2)
     ├── InputCorrupt      damaged bytes in a log (path, byte offset, reason)
     ├── CopiesDisagree    two copies of one DSN (or one LSN) hold different bytes
     ├── LogHole           a DSN missing below a durable watermark: acknowledged data lost
     ├── ReplayRefused     the log (and its checkpoints) cannot answer the requested timestamp
     ├── AuditRefused      a log too damaged for lsn_audit to list within a worker's memory
     ├── ReplayFailed      a replayed entry does not apply (the engine would refuse it)
     ├── ObjectsUnreadable a checkpoint or block object replay needs is missing or damaged
     ├── DataLost          a stream's next LSNs were truncated away before it read them
     ├── ChangesRefused    the change stream cannot decode what the retained log holds
     └── JvmArchiveNotBuilt the driver JVM's class-data archive could not be built
"""

from __future__ import annotations


class SparkJobError(Exception):
    """Base of every operating error of spark_jobs."""


class BadInput(SparkJobError):
    pass


class NotALog(SparkJobError):
    """The input named holds no log: no WAL segment in a `--file-wal` directory, no shard
    journal in a `--node` directory (after the --shard/--replica filters)."""


class InputCorrupt(SparkJobError):
    def __init__(self, path: str, offset_bytes: int, reason: str) -> None:
        super().__init__(f"{path} @ offset {offset_bytes}: {reason}")
        self.path = path
        self.offset_bytes = offset_bytes
        self.reason = reason


class CopiesDisagree(SparkJobError):
    pass


class LogHole(SparkJobError):
    pass


class ReplayRefused(SparkJobError):
    pass


class AuditRefused(SparkJobError):
    """lsn_audit would hold more of a log's anomalies than spark_jobs/limits.py lets one
    worker hold (AUDIT_SPANS_HELD_MAX, AUDIT_DETAIL_COPIES_MAX); the message names the limit
    and what to do."""


class ReplayFailed(SparkJobError):
    """A replayed entry does not apply to the state before it (the engine would refuse to
    open with `WalCorruption` for the same entry)."""


class ObjectsUnreadable(SparkJobError):
    """A checkpoint (its manifest, lists, dumps, deltas) or a block object that replay needs
    is missing or does not decode. `name` is the object, relative to the objects directory."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"object {name}: {reason}")
        self.name = name
        self.reason = reason


class DataLost(SparkJobError):
    """A streaming query's next records, LSNs [lo, hi] of `shard`, were truncated from the
    log before the query read them (Kafka's `failOnDataLoss`): the query stops rather than
    skip them. `failOnDataLoss=false` skips them instead and says so (spark_jobs/README)."""

    def __init__(self, shard: int, lo: int, hi: int, reason: str) -> None:
        super().__init__(
            f"shard {shard}: LSNs {lo}..{hi} were lost before they were read: {reason}"
        )
        self.shard = shard
        self.lo = lo
        self.hi = hi


class ChangesRefused(SparkJobError):
    """The change stream cannot turn the retained log into changes: a table whose schema is
    not in it (created below the log's truncation point, held only by a checkpoint, which
    the stream does not read), or a replay rule the log breaks (a hole, an overlap)."""


class JvmArchiveNotBuilt(SparkJobError):
    """`python -m spark_jobs.jvm_archive build` made no archive (no java or Spark jars, a
    cache path the JVM cannot be given, a JVM that did not exit or wrote none): runs go on
    without one (spark_jobs/jvm_archive.py)."""
