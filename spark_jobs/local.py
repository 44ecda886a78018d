"""The plain-Python engine (`--engine local`): the same readers and the same job semantics
as the Spark engine, on pyarrow alone, in this process (no JVM). For logs that fit one
machine it is the faster path (spark.md §1: Spark costs ~5x the CPU per record); the
Spark engine is for many shards on shared storage. Tests assert both give equal outputs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import checkpoints, jobs, plot
from spark_jobs.audit import lsn_audit
from spark_jobs.jobs import JobParams, JobResult
from spark_jobs.local_replay import replay_as_of
from spark_jobs.verify import VERIFY_TRUE
from spark_jobs.walread import (
    LEVEL_COMMAND,
    LEVEL_ENTRY,
    LEVEL_RECORD,
    LEVEL_SEGMENT,
    ReadOptions,
    read_level,
)


def run(params: JobParams, directory: str | None = None) -> JobResult:
    """The job on the local engine. `directory`: the run directory, where replay_as_of
    writes each log's tables once that log is done (`JobResult.written`); the other jobs'
    tables, and every table without one, are `JobResult.tables`, for the caller to write."""
    if params.job == "replay_as_of":
        return replay_as_of(params, directory)
    runner = {
        "lsn_audit": lsn_audit,
        "replica_diff": replica_diff,
        "write_stats": write_stats,
        "txn_latency": txn_latency,
        "inventory": inventory,
    }[params.job]
    return runner(params)


# --- replica_diff --------------------------------------------------------------------------------


def replica_diff(params: JobParams) -> JobResult:
    records = read_level(
        params, ReadOptions(LEVEL_RECORD, params.verify or VERIFY_TRUE, params.bounds())
    )
    checksums: dict[tuple[int, str], dict[int, int]] = defaultdict(dict)
    for row in records.select(["shard", "replica", "kind", "lsn", "record_checksum"]).to_pylist():
        if row["kind"] in ("entry", "marker", "skip"):
            checksums[(row["shard"], row["replica"])][row["lsn"]] = row["record_checksum"]
    diffs: list[dict[str, Any]] = []
    pairs = []
    for shard, a, b in diff_pairs(params):
        found, summary = diff_pair(
            shard, a, b, checksums.get((shard, a), {}), checksums.get((shard, b), {})
        )
        diffs.extend(found)
        pairs.append(summary)
    table = pa.Table.from_pylist(diffs, schema=jobs.DIFF) if diffs else jobs.DIFF.empty_table()
    result = JobResult(tables={"differences": jobs.sort_table(table, jobs.DIFF_ORDER)})
    result.summary = {"pairs": pairs}
    result.lines = diff_lines(pairs)
    return result


def diff_pairs(params: JobParams) -> list[tuple[int, str, str]]:
    replicas: dict[int, set[str]] = defaultdict(set)
    for unit in params.units():
        replicas[unit.shard].add(unit.replica)
    return [
        (shard, a, b)
        for shard, names in sorted(replicas.items())
        for i, a in enumerate(sorted(names))
        for b in sorted(names)[i + 1 :]
    ]


def diff_pair(
    shard: int, a: str, b: str, in_a: dict[int, int], in_b: dict[int, int]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    max_a = max(in_a, default=0)
    max_b = max(in_b, default=0)
    low = max(min(in_a, default=1), min(in_b, default=1))  # below it one side truncated
    found = []
    for lsn in sorted(set(in_a) | set(in_b)):
        if lsn < low:
            continue
        ca, cb = in_a.get(lsn), in_b.get(lsn)
        if ca is not None and cb is not None:
            if ca != cb:
                found.append(diff_row(shard, a, b, lsn, "diverged", None, ca, cb))
        elif ca is None and lsn <= max_a:
            found.append(diff_row(shard, a, b, lsn, "hole", a, None, cb))
        elif cb is None and lsn <= max_b:
            found.append(diff_row(shard, a, b, lsn, "hole", b, ca, None))
    return found, pair_summary(shard, a, b, max_a, max_b, found, len(set(in_a) & set(in_b)))


def diff_row(
    shard: int,
    a: str,
    b: str,
    lsn: int,
    kind: str,
    missing: str | None,
    ca: int | None,
    cb: int | None,
) -> dict[str, Any]:
    return {
        "shard": shard,
        "replica_a": a,
        "replica_b": b,
        "lsn": lsn,
        "kind": kind,
        "missing_in": missing,
        "checksum_a": ca,
        "checksum_b": cb,
    }


def pair_summary(
    shard: int, a: str, b: str, max_a: int, max_b: int, found: list[dict[str, Any]], compared: int
) -> dict[str, Any]:
    return {
        "shard": shard,
        "replica_a": a,
        "replica_b": b,
        "last_lsn_a": max_a,
        "last_lsn_b": max_b,
        "compared": compared,
        "diverged": sum(1 for f in found if f["kind"] == "diverged"),
        "holes": sum(1 for f in found if f["kind"] == "hole"),
        "first_divergent_lsn": min((f["lsn"] for f in found), default=None),
        "lagging": a if max_a < max_b else b if max_b < max_a else None,
        "lag_lsns": abs(max_a - max_b),
    }


def diff_lines(pairs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for p in pairs:
        state = (
            "identical"
            if p["first_divergent_lsn"] is None
            else f"FIRST DIVERGENT LSN {p['first_divergent_lsn']} "
            f"({p['diverged']} diverged, {p['holes']} holes)"
        )
        lag = f"; {p['lagging']} lags by {p['lag_lsns']} LSNs" if p["lagging"] else ""
        lines.append(
            f"replica_diff: shard {p['shard']} {p['replica_a']} vs {p['replica_b']}: {state} over "
            f"{p['compared']} common LSNs{lag}"
        )
    return lines or ["replica_diff: no shard has two replicas in the input"]


# --- write_stats ---------------------------------------------------------------------------------


def write_stats(params: JobParams) -> JobResult:
    commands = read_level(
        params, ReadOptions(LEVEL_COMMAND, params.verify or VERIFY_TRUE, params.bounds())
    )
    best: dict[tuple[int, int, int], dict[str, Any]] = {}
    for row in commands.select(
        [
            "replica",
            "shard",
            "lsn",
            "dsn",
            "cmd_index",
            "cmd_kind",
            "db_id",
            "table_id",
            "commit_ts",
            "n_rows",
            "cmd_bytes",
            "block_id",
        ]
    ).to_pylist():
        key = (row["shard"], row["dsn"], row["cmd_index"])
        held = best.get(key)
        if held is None or (row["replica"], row["lsn"]) < (held["replica"], held["lsn"]):
            best[key] = row
    # A Delete on a block its own entry creates restates a user's delete on the rewritten
    # rows (engine/FORMAT.md CreateBlock): not counted again.
    created = {
        (row["shard"], row["dsn"], row["table_id"], row["block_id"])
        for row in best.values()
        if row["cmd_kind"] == "create_block"
    }
    groups: dict[tuple[int, int, int, int], dict[str, Any]] = {}
    for row in best.values():
        if row["cmd_kind"] not in ("append", "delete"):
            continue
        if (row["shard"], row["dsn"], row["table_id"], row["block_id"]) in created:
            continue
        bucket = jobs.physical_ms(row["commit_ts"]) // params.bucket_ms * params.bucket_ms
        group_key = (row["shard"], row["db_id"], row["table_id"], bucket)
        g = groups.setdefault(
            group_key,
            {
                "dsns": set(),
                "commands": 0,
                "rows_appended": 0,
                "rows_deleted": 0,
                "bytes": 0,
                "first": row["commit_ts"],
                "last": row["commit_ts"],
            },
        )
        g["dsns"].add(row["dsn"])
        g["commands"] += 1
        g["rows_appended" if row["cmd_kind"] == "append" else "rows_deleted"] += row["n_rows"]
        g["bytes"] += row["cmd_bytes"]
        g["first"] = min(g["first"], row["commit_ts"])
        g["last"] = max(g["last"], row["commit_ts"])
    out = [
        {
            "shard": key[0],
            "db_id": key[1],
            "table_id": key[2],
            "bucket_start_ms": key[3],
            "txns": len(g["dsns"]),
            "commands": g["commands"],
            "rows_appended": g["rows_appended"],
            "rows_deleted": g["rows_deleted"],
            "bytes": g["bytes"],
            "first_commit_ts": g["first"],
            "last_commit_ts": g["last"],
        }
        for key, g in groups.items()
    ]
    table = pa.Table.from_pylist(out, schema=jobs.STATS) if out else jobs.STATS.empty_table()
    table = jobs.sort_table(table, jobs.STATS_ORDER)
    result = JobResult(tables={"write_stats": table})
    result.summary = stats_summary(table)
    result.lines = stats_lines(result.summary)
    return result


def stats_summary(table: pa.Table) -> dict[str, Any]:
    def total(name: str) -> int:
        return int(pc.sum(table.column(name)).as_py() or 0)

    return {
        "groups": table.num_rows,
        "tables": len(
            {
                (s, d, t)
                for s, d, t in zip(
                    *(table.column(c).to_pylist() for c in ("shard", "db_id", "table_id")),
                    strict=True,
                )
            }
        ),
        "rows_appended": total("rows_appended"),
        "rows_deleted": total("rows_deleted"),
        "bytes": total("bytes"),
    }


def stats_lines(summary: dict[str, Any]) -> list[str]:
    return [
        f"write_stats: {summary['tables']} table(s), {summary['groups']} (table, bucket) rows: "
        f"{summary['rows_appended']} rows appended, {summary['rows_deleted']} deleted, "
        f"{summary['bytes']} bytes of appended batches"
    ]


# --- txn_latency ---------------------------------------------------------------------------------


def txn_latency(params: JobParams) -> JobResult:
    entries = read_level(
        params, ReadOptions(LEVEL_ENTRY, params.verify or VERIFY_TRUE, params.bounds())
    )
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for row in entries.select(
        ["replica", "shard", "lsn", "dsn", "entry_type", "start_ts", "commit_ts"]
    ).to_pylist():
        if row["entry_type"] != "txn":
            continue
        key = (row["shard"], row["dsn"])
        held = best.get(key)
        if held is None or (row["replica"], row["lsn"]) < (held["replica"], held["lsn"]):
            best[key] = row
    latencies = sorted(
        jobs.physical_ms(r["commit_ts"]) - jobs.physical_ms(r["start_ts"])
        for r in best.values()
        if r["start_ts"] > 0
    )
    without_start = sum(1 for r in best.values() if r["start_ts"] == 0)
    counts: dict[int, int] = defaultdict(int)
    for value in latencies:
        counts[jobs.log2_bucket(value)] += 1
    histogram = [
        {"bucket_lo_ms": lo, "bucket_hi_ms": 1 if lo == 0 else 2 * lo, "txns": n}
        for lo, n in sorted(counts.items())
    ]
    table = (
        pa.Table.from_pylist(histogram, schema=jobs.HISTOGRAM)
        if histogram
        else jobs.HISTOGRAM.empty_table()
    )
    return latency_result(table, jobs.latency_summary(latencies, without_start))


def latency_result(histogram: pa.Table, summary: dict[str, Any]) -> JobResult:
    result = JobResult(tables={"histogram": histogram}, summary=summary)
    result.lines = jobs.latency_lines(summary)
    result.files["latency.png"] = plot.histogram_png(
        histogram.column("bucket_lo_ms").to_pylist(), histogram.column("txns").to_pylist(), summary
    )
    result.lines.append("txn_latency: histogram drawn in latency.png")
    return result


# --- inventory -----------------------------------------------------------------------------------


def inventory(params: JobParams) -> JobResult:
    table = read_level(params, ReadOptions(LEVEL_SEGMENT, VERIFY_TRUE, params.bounds()))
    table = jobs.sort_table(table, ["replica", "shard", "first_position", "segment"])
    found = checkpoint_inventory(params)
    result = JobResult(tables={"segments": table, "checkpoints": found})
    result.summary = inventory_summary(table.to_pylist(), found.to_pylist())
    result.lines = inventory_lines(result.summary)
    return result


def checkpoint_inventory(params: JobParams) -> pa.Table:
    """Every checkpoint directory of every shard's objects directory (both engines: the
    lists are small and read on the driver). Sizes from listing the store; only the
    manifests are decoded."""
    shards = sorted({unit.shard for unit in params.units()})
    rows = []
    for shard in shards:
        directory = params.objects_dir(shard)
        if directory is None:
            continue
        store = checkpoints.open_store(directory)
        sizes = {info.name: info.size_bytes for info in store.list("")}
        for found in checkpoints.list_checkpoints(store):
            manifest = found.manifest
            named = manifest.objects if manifest is not None else ()
            rows.append(
                {
                    "shard": shard,
                    "objects_dir": directory,
                    "directory": found.directory,
                    "state": found.state,
                    "error": found.error,
                    "ckp_ts": found.ckp_ts,
                    "ckp_dsn": None if manifest is None else manifest.ckp_dsn,
                    "kind": None if manifest is None else manifest.kind,
                    "tables": None if manifest is None else manifest.tables,
                    "blocks": None if manifest is None else manifest.block_count,
                    "live_rows": None if manifest is None else manifest.live_rows,
                    "objects": len(named) if manifest is not None else None,
                    "objects_bytes": sum(sizes.get(name, 0) for name in named),
                    "objects_missing": sum(1 for name in named if name not in sizes),
                    "dir_objects": found.objects,
                    "dir_bytes": found.size_bytes,
                }
            )
    table = pa.Table.from_pylist(rows, schema=jobs.CHECKPOINTS) if rows else None
    return jobs.CHECKPOINTS.empty_table() if table is None else table


def inventory_summary(
    rows: list[dict[str, Any]], checkpoint_rows: list[dict[str, Any]]
) -> dict[str, Any]:
    logs: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        log = logs.setdefault(
            (row["replica"], row["shard"]),
            {
                "replica": row["replica"],
                "shard": row["shard"],
                "backend": row["backend"],
                "segments": 0,
                "bytes": 0,
                "records": 0,
                "first": None,
                "last": None,
                "position": row["position"],
                "not_clean": 0,
            },
        )
        log["segments"] += 1
        log["bytes"] += row["size_bytes"]
        log["records"] += row["records"]
        if row["records"]:
            first, last = row["first_position"], row["last_position"]
            log["first"] = first if log["first"] is None else min(log["first"], first)
            log["last"] = last if log["last"] is None else max(log["last"], last)
        log["not_clean"] += row["end"] != "clean"
    return {"logs": [logs[key] for key in sorted(logs)], "checkpoints": checkpoint_rows}


def inventory_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        f"inventory: replica {log['replica']} shard {log['shard']} ({log['backend']}): "
        f"{log['segments']} segment(s), {log['bytes']} bytes, {log['records']} records, "
        f"{log['position']} {log['first']}-{log['last']}"
        + (f", {log['not_clean']} not ending clean" if log["not_clean"] else "")
        for log in summary["logs"]
    ]
    for ckp in summary["checkpoints"]:
        if ckp["state"] == "complete":
            lines.append(
                f"inventory: shard {ckp['shard']} checkpoint ckp_ts {ckp['ckp_ts']} "
                f"({ckp['kind']}, ckp_dsn {ckp['ckp_dsn']}): {ckp['tables']} table(s), "
                f"{ckp['blocks']} block(s), {ckp['live_rows']} live rows, {ckp['objects']} "
                f"object(s) of {ckp['objects_bytes']} bytes"
                + (f", {ckp['objects_missing']} MISSING" if ckp["objects_missing"] else "")
            )
        else:
            why = f": {ckp['error']}" if ckp["error"] else " (no manifest: ignored)"
            lines.append(
                f"inventory: shard {ckp['shard']} checkpoint directory {ckp['directory']} "
                f"{ckp['state'].upper()}{why}"
            )
    if not summary["checkpoints"]:
        lines.append("inventory: no checkpoint (no objects directory, or none written yet)")
    return lines
