"""Every job on the local engine, on logs written by the real writers, with the numbers it
must find; and the CLI's exit codes, outputs and manifest.

The logsvc logs come from a real 3-node cluster (tests/unit/spark_jobs/logs.py): shard 1 is a
real engine's WAL, shard 2 holds a duplicate copy (DSN 3) and a gap (DSN 5, trailing), and
replica n3 of shard 1 was made to diverge at one entry and lag one append behind.

* lsn_audit finds exactly shard 2's duplicate and gap on every replica, and nothing else;
* replica_diff names n3's first divergent LSN (the LSN n1's state machine gave the rewritten
  entry, read through logsvc_segments' raft level) and its lag; n1 and n2 are identical;
* replay_as_of over logsvc (replica n1) equals the engine's snapshot scans at every
  timestamp; over several replicas of one shard it refuses (it would merge replicas);
* write_stats, txn_latency (and its PNG), inventory give the history's totals;
* a truncated shard shows its truncate row and truncation point, and replay refuses it;
* a journal's torn tail is dropped (true) or one row (report); damage inside synced records
  is `InputCorrupt` (true) or a last `corrupt` row (report); a compacted journal whose Raft
  snapshot is missing is refused (its LSNs cannot be known);
* `python -m spark_jobs`: outputs and `_manifest.json` in OUT/<job>/<run-id>/, exit 2 on bad
  usage, 1 on a refused input.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from logsvc.store import ShardStore, records
from spark_jobs import __main__ as cli
from spark_jobs import journal as journal_module
from spark_jobs import local, output, walread
from spark_jobs.errors import InputCorrupt, ReplayRefused
from spark_jobs.inputs import file_input, logsvc_input
from spark_jobs.jobs import JobParams
from spark_jobs.limits import LIVE_SEGMENT_READS_MAX
from spark_jobs.walread import ReadOptions
from tests.unit.spark_jobs.logs import History, LogsvcLogs, engine_history, logsvc_history


@pytest.fixture(scope="package")
def logsvc_logs(tmp_path_factory: pytest.TempPathFactory) -> LogsvcLogs:
    return logsvc_history(str(tmp_path_factory.mktemp("logsvc")))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return engine_history(str(tmp_path_factory.mktemp("engine")), big_rows=500)


def nodes(logs: LogsvcLogs, *names: str) -> list[str]:
    return [f"{name}={logs.nodes[name]}" for name in names or ("n1", "n2", "n3")]


def test_lsn_audit_finds_the_duplicate_and_the_gap(logsvc_logs: LogsvcLogs) -> None:
    result = local.run(JobParams("lsn_audit", logsvc_input(nodes(logsvc_logs))))
    found = result.tables["anomalies"].to_pylist()
    assert sorted(
        (a["replica"], a["shard"], a["kind"], a["dsn_lo"], a["dsn_hi"]) for a in found
    ) == [
        (replica, 2, kind, dsn, dsn)
        for replica in ("n1", "n2", "n3")
        for kind, dsn in (("duplicate", 3), ("gap", 5))
    ]
    duplicate = next(a for a in found if a["kind"] == "duplicate")
    # LSN 1 holds DSNs 1-2, LSNs 2 and 3 the two copies of DSN 3
    assert (duplicate["copies"], duplicate["lsn_lo"], duplicate["lsn_hi"]) == (2, 2, 3)
    by_log = {(s["replica"], s["shard"]): s for s in result.summary["logs"]}
    assert by_log[("n1", 2)]["entry_copies"] == 7 and by_log[("n1", 2)]["dsn_max"] == 7
    assert by_log[("n1", 1)]["gaps"] == 0 and by_log[("n1", 1)]["distinct_dsns"] == len(
        logsvc_logs.engine.timestamps
    )
    assert any("PROBLEMS" in line and "shard 2" in line for line in result.lines)


def test_replica_diff_names_the_first_divergent_lsn(logsvc_logs: LogsvcLogs) -> None:
    raft_rows = walread.read_level(
        JobParams("x", logsvc_input(nodes(logsvc_logs, "n1")), shards=frozenset({1})),
        ReadOptions("raft"),
    ).to_pylist()
    [rewritten] = [r for r in raft_rows if r["raft_index"] == logsvc_logs.diverged_raft_index]
    last_lsn = max(r["lsn_first"] + r["lsn_count"] - 1 for r in raft_rows if r["lsn_count"])
    result = local.run(JobParams("replica_diff", logsvc_input(nodes(logsvc_logs))))
    pairs = {(p["shard"], p["replica_a"], p["replica_b"]): p for p in result.summary["pairs"]}
    assert pairs[(1, "n1", "n2")]["first_divergent_lsn"] is None
    for peer in ("n1", "n2"):
        pair = pairs[(1, peer, "n3")]
        assert pair["first_divergent_lsn"] == rewritten["lsn_first"]
        assert (pair["diverged"], pair["holes"], pair["lagging"]) == (1, 0, "n3")
        assert pair["lag_lsns"] == last_lsn - rewritten["lsn_first"]
    assert all(p["first_divergent_lsn"] is None for (shard, _, _), p in pairs.items() if shard != 1)
    diffs = result.tables["differences"].to_pylist()
    assert [(d["replica_a"], d["replica_b"], d["lsn"], d["kind"]) for d in diffs] == [
        ("n1", "n3", rewritten["lsn_first"], "diverged"),
        ("n2", "n3", rewritten["lsn_first"], "diverged"),
    ]


def test_replay_over_logsvc_equals_the_engine(logsvc_logs: LogsvcLogs) -> None:
    scans = logsvc_logs.engine.scans
    assert len(scans) >= 20
    for ts, expected in scans.items():
        params = JobParams(
            "replay_as_of",
            logsvc_input(nodes(logsvc_logs, "n1")),
            shards=frozenset({1}),
            as_of=ts,
        )
        got = {
            name.split("/", 1)[1].replace("/", "."): table.to_pylist()
            for name, table in local.run(params).tables.items()
        }
        assert got == expected, ts


def test_replay_refuses_several_replicas_of_a_shard(
    logsvc_logs: LogsvcLogs, tmp_path: Path
) -> None:
    argv = ["replay_as_of", *(f"--node={n}" for n in nodes(logsvc_logs)), "--shard", "1"]
    code = cli.main([*argv, "--as-of", "5", "--out", str(tmp_path), "--engine", "local"])
    assert code == cli.EXIT_FAILED
    assert not os.path.exists(tmp_path / "replay_as_of" / "x" / output.MANIFEST)


def test_write_stats_and_latency_totals(history: History) -> None:
    stats = local.run(JobParams("write_stats", file_input(history.path)))
    # appended: 500 + 1 + 1 (the update's new version of key 10; key 8191 is not in a
    # 500-row table) + 7 + 1; deleted: 4 + 1 (the update's old version) + 1
    assert (stats.summary["rows_appended"], stats.summary["rows_deleted"]) == (510, 6)
    assert stats.summary["tables"] == 3  # orders, items, and items created again
    latency = local.run(JobParams("txn_latency", file_input(history.path)))
    assert latency.summary["txns"] == len(history.timestamps) - 1
    assert latency.summary["txns_without_start_ts"] == 1  # the first began before any commit
    assert sum(latency.tables["histogram"].column("txns").to_pylist()) == latency.summary["txns"]
    assert latency.files["latency.png"].startswith(b"\x89PNG\r\n\x1a\n")


def test_inventory_lists_every_segment(logsvc_logs: LogsvcLogs) -> None:
    result = local.run(JobParams("inventory", logsvc_input(nodes(logsvc_logs))))
    segments = result.tables["segments"].to_pylist()
    assert {(s["replica"], s["shard"]) for s in segments} == {
        (r, s) for r in ("n1", "n2", "n3") for s in (1, 2, 3)
    }
    sizes = {(s["replica"], s["shard"]): s["size_bytes"] for s in segments}
    assert sizes[("n3", 1)] < sizes[("n1", 1)] == sizes[("n2", 1)]
    assert all(s["end"] == "clean" and s["position"] == "raft_index" for s in segments)


def test_cli_writes_outputs_and_manifest_last(
    history: History, tmp_path: Path, capsys: Any
) -> None:
    out = str(tmp_path / "out")
    ts = history.timestamps[4]
    argv = ["replay_as_of", "--file-wal", history.path, "--as-of", str(ts), "--out", out]
    assert cli.main([*argv, "--engine", "local", "--run-id", "r1"]) == cli.EXIT_OK
    printed = capsys.readouterr().out
    run = os.path.join(out, "replay_as_of", "r1")
    manifest = output.read_manifest(run)
    assert manifest["engine"] == "local" and manifest["params"]["as_of"] == ts
    assert manifest["outputs"]["shard-0/shop/orders"]["rows"] == 496  # 500 inserted, 4 deleted
    table = pq.read_table(os.path.join(run, "shard-0/shop/orders"))
    assert table.to_pylist() == history.scans[ts]["shop.orders"]
    assert "shop.orders 496 rows" in printed and run in printed
    # The same run id again is refused: a finished run is never overwritten.
    assert cli.main([*argv, "--engine", "local", "--run-id", "r1"]) == cli.EXIT_FAILED
    assert "holds a finished run already" in capsys.readouterr().err
    assert cli.main(["replay_as_of", "--file-wal", history.path, "--out", out]) == cli.EXIT_USAGE
    assert cli.main(["inventory", "--file-wal", str(tmp_path / "nothing"), "--out", out]) == 2


def test_a_truncated_shard_is_audited_and_refused_for_replay(logsvc_logs: LogsvcLogs) -> None:
    n1 = logsvc_input(nodes(logsvc_logs, "n1"))
    rows = walread.read_level(
        JobParams("x", n1, shards=frozenset({3})), ReadOptions("record")
    ).to_pylist()
    assert [r["lsn"] for r in rows if r["kind"] == "truncate"] == [2]
    assert {3, 4, 5, 6} <= {r["lsn"] for r in rows if r["kind"] == "entry"}
    audit = local.run(JobParams("lsn_audit", n1, shards=frozenset({3})))
    assert audit.summary["logs"][0]["truncated_lsn"] == 2
    with pytest.raises(ReplayRefused, match="truncated up to LSN 2"):
        local.run(JobParams("replay_as_of", n1, shards=frozenset({3}), as_of=2**62))


def copy_node(logs: LogsvcLogs, tmp_path: Path) -> tuple[str, str]:
    """A copy of n1's data directory, and its shard 2 segment file."""
    target = str(tmp_path / "n1")
    shutil.copytree(logs.nodes["n1"], target)
    journal = os.path.join(target, "shards", "2", "journal")
    [segment] = [n for n in os.listdir(journal) if n.endswith(".seg")]
    return target, os.path.join(journal, segment)


def shard2_records(node_dir: str, verify: str = "true") -> list[dict[str, Any]]:
    params = JobParams("x", logsvc_input([f"n1={node_dir}"]), shards=frozenset({2}))
    rows: list[dict[str, Any]] = walread.read_level(
        params, ReadOptions("record", verify)
    ).to_pylist()
    return rows


def shard2_segments(node_dir: str) -> list[dict[str, Any]]:
    """The inventory rows (level segment) of shard 2's journal, in segment order."""
    params = JobParams("x", logsvc_input([f"n1={node_dir}"]), shards=frozenset({2}))
    rows: list[dict[str, Any]] = walread.read_level(
        params, ReadOptions("segment", "false")
    ).to_pylist()
    return rows


def test_journal_torn_tail_and_corruption(logsvc_logs: LogsvcLogs, tmp_path: Path) -> None:
    node, segment = copy_node(logsvc_logs, tmp_path / "torn")
    clean = shard2_records(node)
    with open(segment, "ab") as file:
        file.write(b"\x07" * 25)  # a partial record header
    assert shard2_records(node) == clean  # recovery would cut it: nothing acknowledged
    reported = shard2_records(node, "report")
    assert reported[:-1] == clean and reported[-1]["kind"] == "torn_tail"
    assert reported[-1]["error"].startswith("partial record header")

    node, segment = copy_node(logsvc_logs, tmp_path / "corrupt")
    data = bytearray(Path(segment).read_bytes())
    data[len(data) // 2] ^= 0x01  # inside a synced record, valid records after it
    Path(segment).write_bytes(bytes(data))
    with pytest.raises(InputCorrupt) as raised:
        shard2_records(node)
    assert raised.value.path == segment
    reported = shard2_records(node, "report")
    assert reported[-1]["kind"] == "corrupt" and not reported[-1]["checksum_ok"]
    assert len(reported) < len(clean)  # nothing after the damage: its LSNs are unknowable


class SegmentReads:
    """The journal reader's reads of `segment`, counted: the first `torn_reads` of them see
    `torn` (what a read copying the newest segment while the node writes can see), the
    rest the file's own bytes."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, segment: str, torn: bytes, torn_reads: int
    ) -> None:
        self.count = 0
        self._torn, self._torn_reads = torn, torn_reads
        whole = Path(segment).read_bytes()
        real = journal_module._read_file

        def read_file(path: str) -> bytes:
            if path != segment:
                return real(path)
            self.count += 1
            return self._torn if self.count <= self._torn_reads else whole

        monkeypatch.setattr(journal_module, "_read_file", read_file)

    def again(self, torn_reads: int) -> None:
        """Count from zero, the first `torn_reads` reads torn."""
        self.count, self._torn_reads = 0, torn_reads


def test_a_journal_segment_a_live_node_was_writing_is_read_again(
    logsvc_logs: LogsvcLogs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job beside a running node: the first read of the newest segment saw damage with
    whole records after it (a write being copied in); the second read is whole, and that
    one decides. Damage every read shows is still reported, after LIVE_SEGMENT_READS_MAX
    reads."""
    node, segment = copy_node(logsvc_logs, tmp_path)
    clean = shard2_records(node)
    damaged = bytearray(Path(segment).read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    reads = SegmentReads(monkeypatch, segment, bytes(damaged), torn_reads=1)
    assert shard2_records(node) == clean
    assert reads.count == 2
    reads.again(torn_reads=99)
    with pytest.raises(InputCorrupt):
        shard2_records(node)
    assert reads.count == LIVE_SEGMENT_READS_MAX


def test_the_inventory_reads_a_live_journal_segment_again(
    logsvc_logs: LogsvcLogs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inventory (level segment) walks record headers without checksums: a read that
    copied a record's header before the writer had, with whole records after it, ends
    early there. Read again, the segment is whole and its row says so; a tear every read
    shows is still its end, after LIVE_SEGMENT_READS_MAX reads."""
    node, segment = copy_node(logsvc_logs, tmp_path)
    [before] = shard2_segments(node)
    assert before["end"] == "clean" and before["records"] >= 3
    whole = Path(segment).read_bytes()
    middle = records.read_segment_records(whole, before["first_position"], newest=True).records[
        before["records"] // 2
    ]
    lo, hi = middle.offset_bytes, middle.end_bytes
    reads = SegmentReads(monkeypatch, segment, whole[:lo] + bytes(hi - lo) + whole[hi:], 1)
    assert shard2_segments(node) == [before]
    assert reads.count == 2
    reads.again(torn_reads=99)
    [after] = shard2_segments(node)
    assert after["end"] != "clean" and after["records"] < before["records"]
    assert reads.count == LIVE_SEGMENT_READS_MAX


def test_a_compacted_journal_without_its_snapshot_is_refused(
    logsvc_logs: LogsvcLogs, tmp_path: Path
) -> None:
    node, _ = copy_node(logsvc_logs, tmp_path)
    store = ShardStore.open(os.path.join(node, "shards", "2", "journal"))
    try:
        store.truncate_prefix(3)
    finally:
        store.close()
    with pytest.raises(InputCorrupt, match="snapshot is missing"):
        shard2_records(node)
