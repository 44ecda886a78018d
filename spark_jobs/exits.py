"""The CLI's exit codes, and the rules that say when a finished job found problems in its
input or found its input is not the log it was said to be. Pure: reads a job's summary.

    0  done, and nothing wrong found
    1  the job refused its input (a typed SparkJobError, printed: corruption, copies that
       disagree, a timestamp the log cannot answer, a missing object, ...)
    2  bad usage (an argument, an option, a path that is not a directory)
    3  PROBLEMS: the job ran to the end, wrote its outputs, and found problems in the log
       (`problems_of`); `--allow-problems` exits 0 instead
    4  NOT A LOG: the input is not what it says: no WAL segment or logsvc shard where one
       was named (`--file-wal /etc`), or a log whose bytes gave no record at all (every
       frame damaged, read with `--verify report`) - outputs, when written, are empty

Why distinct codes: a script running `lsn_audit` nightly must tell "the audit found a gap"
(3: look at anomalies/) from "the audit could not run" (1) and "it read the wrong path" (4),
without parsing stdout.
"""

from __future__ import annotations

from typing import Any

from spark_jobs.inputs import BACKEND_FILE, Unit
from tae_driver.limits import FILE_SEGMENT_HEADER_BYTES

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3
EXIT_NOT_A_LOG = 4


def problems_of(job: str, summary: dict[str, Any]) -> list[str]:
    """One line per problem a finished job found (empty: none). What counts:

    * lsn_audit: a log with DSN gaps, conflicting copies, backend LSN gaps or damage (the
      job's own PROBLEMS rule; duplicate copies and skipped copies are normal);
    * replica_diff: a pair of replicas that diverge or have holes (a lagging tail is not);
    * inventory: a damaged checkpoint, or one whose manifest names missing objects;
    * the other jobs find no problems of this kind (they refuse bad input: exit 1)."""
    found = []
    if job == "lsn_audit":
        for log in summary.get("logs", []):
            counts = {k: log[k] for k in ("gaps", "conflicts", "lsn_gaps", "damaged") if log[k]}
            if counts:
                what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())
                found.append(f"replica {log['replica']} shard {log['shard']}: {what}")
    elif job == "replica_diff":
        for pair in summary.get("pairs", []):
            if pair["first_divergent_lsn"] is not None:
                found.append(
                    f"shard {pair['shard']}: {pair['replica_a']} and {pair['replica_b']} "
                    f"differ from LSN {pair['first_divergent_lsn']}"
                )
    elif job == "inventory":
        for ckp in summary.get("checkpoints", []):
            if ckp["state"] == "damaged":
                found.append(f"shard {ckp['shard']}: checkpoint {ckp['directory']} damaged")
            elif ckp["state"] == "complete" and ckp["objects_missing"]:
                found.append(
                    f"shard {ckp['shard']}: checkpoint {ckp['directory']} names "
                    f"{ckp['objects_missing']} missing object(s)"
                )
    return found


def empty_log_of(job: str, summary: dict[str, Any], units: list[Unit]) -> str | None:
    """Why a finished job's input is not a log (None: it is). replay_as_of over a file WAL
    whose segments hold frames (bytes past their headers) but gave no record: every frame
    was damaged and skipped (`--verify report`), or the files are not an engine's WAL. The
    summary's `records_replayed` counts the records read whatever --as-of is. (A logsvc
    journal always holds Raft entries of its own, so it is not judged by size.)"""
    if job != "replay_as_of":
        return None
    for log in summary.get("logs", []):
        mine = [
            u
            for u in units
            if u.backend == BACKEND_FILE and (u.replica, u.shard) == (log["replica"], log["shard"])
        ]
        framed = sum(max(0, u.size_bytes - FILE_SEGMENT_HEADER_BYTES) for u in mine)
        if framed and not log["records_replayed"]:
            return (
                f"replica {log['replica']} shard {log['shard']}: {framed} bytes of WAL frames "
                "gave no record (damaged, or not an engine's WAL: run lsn_audit to see where)"
            )
    return None
