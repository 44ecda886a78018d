"""`logsvc doctor` (logsvc/doctor.py) tells a healthy data directory from a damaged one, says
what recovery would do with each kind of damage, and never writes.

How: data directories are made by the real thing, a `ShardStore` (several segments, synced
in batches so records carry real durable hints) or a real single-replica `ShardReplica`
that appended, truncated and compacted its journal behind a snapshot; then bytes are
damaged on disk as a crash or a bad disk would: a torn tail, a bit flip in a sealed
segment, a cut segment header, a damaged meta, a removed segment, a removed snapshot.
Every journal case is also opened with the real store (on a copy): the store refuses
exactly the directories in which the doctor reports an error, at the same file and offset,
and after its recovery the doctor finds nothing left to trim. A byte-for-byte listing
before and after shows the doctor changed nothing. One test runs the CLI as a subprocess
for its exit codes (0 healthy, 1 problems, 2 config error, 3 node running).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsvc import doctor
from logsvc.doctor import DoctorOptions, DoctorReport, Finding, examine
from logsvc.shard import snapshot_file
from logsvc.shard.raft.config import RaftConfig, RaftFatal
from logsvc.shard.raft.node import RaftNode
from logsvc.shard.replica import ReplicaConfig, ShardReplica
from logsvc.shard.state_machine import ShardStateMachine
from logsvc.store import Corruption, Entry, ShardStore, StoreLimits
from logsvc.store.meta import META_FILE_NAME
from logsvc.store.records import SEGMENT_HEADER_BYTES

from .shard.raft_harness import SECRET, free_port, wait_until

# ~14 records of 100 bytes per segment: 60 entries make 5 segments.
LIMITS = StoreLimits(segment_bytes_max=2048, group_commit_delay_ms_max=0)
ENTRIES = 60
BATCH = 10
TERM = 3


def make_journal(journal_dir: Path, entries: int = ENTRIES) -> None:
    """A journal written as the Raft layer writes it: term and vote first, then batches of
    entries, each made durable before the next (so later records carry durable hints)."""
    store = ShardStore.open(str(journal_dir), limits=LIMITS)
    try:
        store.save_vote(TERM, "n2")
        for lo in range(1, entries + 1, BATCH):
            hi = min(lo + BATCH, entries + 1)
            store.append([Entry(i, TERM, f"entry-{i:04d}".encode() * 9) for i in range(lo, hi)])
            store.sync()
    finally:
        store.close()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "n1"


@pytest.fixture
def journal(data_dir: Path) -> Path:
    path = data_dir / "shards" / "1" / "journal"
    make_journal(path)
    return path


def segments(journal_dir: Path) -> list[Path]:
    return sorted(journal_dir.glob("*.seg"))


def check(data_dir: Path, **options: object) -> DoctorReport:
    return examine(DoctorOptions(data_dir=str(data_dir), **options))  # type: ignore[arg-type]


def codes(report: DoctorReport, severity: str | None = None) -> list[str]:
    return [f.code for f in report.findings if severity in (None, f.severity)]


def only(report: DoctorReport, code: str) -> Finding:
    [found] = [f for f in report.findings if f.code == code]
    return found


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under root: (mode, content hash). Directories by name."""
    listing: dict[str, tuple[int, str]] = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        listing[str(path.relative_to(root))] = (stat.st_mode, digest)
    return listing


def open_copy(journal_dir: Path, tmp_path: Path) -> ShardStore:
    """The real store's verdict on the same bytes, on a copy (recovery repairs in place)."""
    shard_copy = tmp_path / "copy" / "shards" / "1"
    shutil.rmtree(tmp_path / "copy", ignore_errors=True)
    shutil.copytree(journal_dir.parent, shard_copy)  # the journal and the snapshot, if any
    return ShardStore.open(str(shard_copy / "journal"), limits=LIMITS)


# ------------------------------------------------------------------------- healthy


def test_a_healthy_journal_is_healthy_and_summarized(data_dir: Path, journal: Path) -> None:
    report = check(data_dir)

    assert report.findings == []
    assert report.exit_code == doctor.EXIT_HEALTHY
    [shard] = report.shards
    assert (shard.shard, shard.term, shard.voted_for) == (1, TERM, "n2")
    assert (shard.first_index, shard.last_index) == (1, ENTRIES)
    assert shard.segments == len(segments(journal)) >= 4
    assert shard.snapshot_index is None
    text = doctor.format_text(report)
    assert "healthy: 0 error(s), 0 warning(s)" in text
    assert json.loads(json.dumps(report.to_json()))["shards"][0]["last_index"] == ENTRIES


@pytest.fixture
def replica_dir(data_dir: Path) -> Iterator[Path]:
    """A shard directory left by a real single-replica shard that appended, truncated
    twice and so compacted its journal behind a snapshot, then closed cleanly."""
    shard_dir = data_dir / "shards" / "7"
    raft = RaftConfig(
        self_address=f"127.0.0.1:{free_port()}",
        peers=(),
        secret=SECRET,
        snapshot_path=str(shard_dir / "snapshot"),
        election_timeout_ms_min=200,
        election_timeout_ms_max=400,
        heartbeat_ms=50,
        leader_fallback_ms=1000,
    )
    replica = ShardReplica(
        ReplicaConfig(
            data_dir=str(shard_dir), raft=raft, store_limits=StoreLimits(segment_bytes_max=4096)
        )
    )
    try:
        replica.start()
        wait_until(lambda: replica.is_leader, "the single replica to lead")
        seq = 0
        for round_ in range(2):
            for _ in range(10):
                seq += 1
                records = tuple(f"r{round_}-{seq}-{i}".encode() * 8 for i in range(5))
                replica.append("writer", seq, records)
            replica.truncate(int(replica.status()["next_lsn"]) - 3)
        wait_until(lambda: replica.store.first_index > 1, "the journal to be compacted")
    finally:
        replica.close()
    yield shard_dir


def test_a_compacted_replica_with_its_snapshot_is_healthy(
    data_dir: Path, replica_dir: Path
) -> None:
    report = check(data_dir)

    assert report.findings == [], doctor.format_text(report)
    [shard] = report.shards
    assert shard.first_index is not None and shard.first_index > 1
    assert shard.snapshot_index == shard.first_index + 1  # the snapshot's (prev, last)
    assert shard.last_index is not None and shard.last_index >= shard.snapshot_index


def test_a_compacted_journal_without_its_snapshot_is_fatal(
    data_dir: Path, replica_dir: Path
) -> None:
    (replica_dir / "snapshot").unlink()

    report = check(data_dir)

    finding = only(report, "snapshot_missing")
    assert finding.severity == "error"
    assert finding.shard == 7
    assert "refuses to start" in finding.message
    assert report.exit_code == doctor.EXIT_PROBLEMS
    # The replica agrees: it refuses before binding any port.
    store = ShardStore.open(str(replica_dir / "journal"))
    try:
        raft = RaftConfig("127.0.0.1:1", (), SECRET, str(replica_dir / "snapshot"))
        with pytest.raises(RaftFatal, match="snapshot"):
            RaftNode(raft, store, handler=None)  # type: ignore[arg-type]
    finally:
        store.close()


def test_a_damaged_or_foreign_snapshot_is_an_error(data_dir: Path, replica_dir: Path) -> None:
    path = replica_dir / "snapshot"
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    assert codes(check(data_dir), "error") == ["snapshot_corrupt"]

    decoded = snapshot_file.decode(good)
    other_term = snapshot_file.SnapshotFile(
        last=snapshot_file.JournalEntry(
            decoded.last.index, decoded.last.term + 5, decoded.last.command
        ),
        prev=decoded.prev,
        cluster=decoded.cluster,
        state=decoded.state,
    )
    path.write_bytes(snapshot_file.encode(other_term))
    assert codes(check(data_dir), "error") == ["snapshot_mismatch"]

    bad_state = snapshot_file.SnapshotFile(
        last=decoded.last, prev=decoded.prev, cluster=decoded.cluster, state=b"LSS\x01junk"
    )
    path.write_bytes(snapshot_file.encode(bad_state))
    assert codes(check(data_dir), "error") == ["snapshot_state_corrupt"]


def write_snapshot(journal: Path, prev_index: int) -> None:
    """The snapshot file raft/snapshot_points.py writes at a snapshot point: the journal's entries
    (prev_index, prev_index + 1) and a state machine image (a fresh one will do)."""
    store = ShardStore.open(str(journal), limits=LIMITS)
    try:
        prev, last = store.read(prev_index, prev_index + 2, 1 << 20)
    finally:
        store.close()
    snapshot = snapshot_file.SnapshotFile(
        last=snapshot_file.JournalEntry(last.index, last.term, last.payload),
        prev=snapshot_file.JournalEntry(prev.index, prev.term, prev.payload),
        cluster=("127.0.0.1:7301",),
        state=ShardStateMachine().snapshot(),
    )
    (journal.parent / "snapshot").write_bytes(snapshot_file.encode(snapshot))


def test_a_damaged_members_file_is_an_error(data_dir: Path, replica_dir: Path) -> None:
    members = replica_dir / "members"
    assert members.exists()  # the replica keeps its membership next to its journal
    flip(members, members.stat().st_size - 2)

    finding = only(check(data_dir), "members_corrupt")

    assert finding.severity == "error"
    assert "checksum mismatch" in finding.message


def test_a_snapshot_over_an_uncompacted_journal_is_a_note(data_dir: Path, journal: Path) -> None:
    """Snapshot written, crash before the journal's prefix truncation: the start finishes
    it (raft/snapshot_points.py loads the snapshot and deletes the entries below it)."""
    write_snapshot(journal, 30)

    report = check(data_dir)

    assert codes(report) == ["compaction_pending"]
    assert report.exit_code == doctor.EXIT_HEALTHY
    assert report.shards[0].snapshot_index == 31


# ------------------------------------------------------- damage, checked against the store


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def cut(path: Path, size_bytes: int) -> None:
    with path.open("r+b") as file:
        file.truncate(size_bytes)


def torn_partial_record(journal: Path) -> None:
    newest = segments(journal)[-1]
    cut(newest, newest.stat().st_size - 7)


def torn_zero_tail(journal: Path) -> None:
    # The size was committed, the pages of the last record's end never written. (Zeros
    # from a record boundary to the end are zero-ahead space, no finding: the test below.)
    newest = segments(journal)[-1]
    cut(newest, newest.stat().st_size - 7)
    with newest.open("ab") as file:
        file.write(bytes(512))


def torn_header_of_new_segment(journal: Path) -> None:
    (journal / f"{ENTRIES + 1:020d}.seg").write_bytes(b"LOGSVSEG\x01\x00")


def bitflip_in_sealed_segment(journal: Path) -> None:
    flip(segments(journal)[1], SEGMENT_HEADER_BYTES + 60)  # in the first record's payload


def bitflip_mid_newest_segment(journal: Path) -> None:
    flip(segments(journal)[-1], SEGMENT_HEADER_BYTES + 60)  # valid records follow it


def truncated_sealed_header(journal: Path) -> None:
    cut(segments(journal)[0], SEGMENT_HEADER_BYTES - 12)


def bitflip_in_meta(journal: Path) -> None:
    flip(journal / META_FILE_NAME, 17)  # inside the term


def meta_removed(journal: Path) -> None:
    (journal / META_FILE_NAME).unlink()


def middle_segment_removed(journal: Path) -> None:
    segments(journal)[2].unlink()


def first_segment_removed(journal: Path) -> None:
    segments(journal)[0].unlink()


def leftover_meta_tmp(journal: Path) -> None:
    (journal / "meta.tmp").write_bytes(b"LOGSVMET half-written")


def segment_below_log_start(journal: Path) -> None:
    """A prefix truncation whose asynchronous deletion never ran."""
    first = segments(journal)[0]
    kept = first.read_bytes()
    write_snapshot(journal, 40)
    store = ShardStore.open(str(journal), limits=LIMITS)
    try:
        store.truncate_prefix(40)  # as the compaction at that snapshot point does
    finally:
        store.close()  # deletes the segments below 40
    first.write_bytes(kept)


DAMAGE: list[tuple[Callable[[Path], None], str, str]] = [
    # (damage, the finding's code, its severity)
    (torn_partial_record, "torn_tail", "warning"),
    (torn_zero_tail, "torn_tail", "warning"),
    (torn_header_of_new_segment, "torn_tail", "warning"),
    (bitflip_in_sealed_segment, "segment_corrupt", "error"),
    (bitflip_mid_newest_segment, "segment_corrupt", "error"),
    (truncated_sealed_header, "segment_corrupt", "error"),
    (bitflip_in_meta, "meta_corrupt", "error"),
    (meta_removed, "meta_missing", "error"),
    (middle_segment_removed, "segment_gap", "error"),
    (first_segment_removed, "segment_missing", "error"),
    (leftover_meta_tmp, "meta_tmp_leftover", "info"),
    (segment_below_log_start, "segment_obsolete", "info"),
]


@pytest.mark.parametrize(
    ("damage", "code", "severity"), DAMAGE, ids=[d[0].__name__ for d in DAMAGE]
)
def test_damage_is_reported_as_recovery_would_treat_it(
    tmp_path: Path,
    data_dir: Path,
    journal: Path,
    damage: Callable[[Path], None],
    code: str,
    severity: str,
) -> None:
    damage(journal)

    report = check(data_dir)

    finding = only(report, code)
    assert finding.severity == severity
    assert finding.shard == 1
    assert [f.code for f in report.findings if f.severity == "error"] == (
        [code] if severity == "error" else []
    )
    assert report.exit_code == (doctor.EXIT_PROBLEMS if severity == "error" else 0)
    if code == "torn_tail":
        assert "would be trimmed at recovery (unacknowledged tail)" in finding.message or (
            "deleted at recovery (unacknowledged tail" in finding.message
        )
    if severity == "error":
        # The store refuses the same bytes, naming the same file and offset.
        with pytest.raises(Corruption) as refused:
            open_copy(journal, tmp_path)
        assert os.path.basename(refused.value.path) == os.path.basename(finding.path)
        assert refused.value.offset_bytes == finding.offset_bytes
        return
    # The store opens them, and what its recovery left is clean.
    store = open_copy(journal, tmp_path)
    try:
        assert store.last_index == report.shards[0].last_index
        assert store.first_index == report.shards[0].first_index
    finally:
        store.close()
    recovered = check(tmp_path / "copy")
    assert recovered.findings == []
    assert recovered.shards[0].last_index == report.shards[0].last_index


def test_zero_ahead_space_after_the_last_record_is_no_finding(
    tmp_path: Path, data_dir: Path, journal: Path
) -> None:
    # What a killed node's newest segment holds (store FORMAT.md "Zero-ahead"): zeros from a
    # record boundary to the end. Recovery cuts them quietly; the doctor reports nothing.
    before = check(data_dir).shards[0].last_index
    with segments(journal)[-1].open("ab") as file:
        file.write(bytes(64 * 1024))
    report = check(data_dir)
    assert report.findings == []
    assert report.shards[0].last_index == before
    store = open_copy(journal, tmp_path)
    try:
        assert store.last_index == before
        assert store.stats().recovery.zero_tail_bytes_cut == 64 * 1024
        assert store.stats().recovery.torn_reason is None
    finally:
        store.close()


def test_a_sealed_segment_bitflip_names_the_file_and_the_record_offset(
    data_dir: Path, journal: Path
) -> None:
    sealed = segments(journal)[1]
    flip(sealed, SEGMENT_HEADER_BYTES + 60)

    finding = only(check(data_dir), "segment_corrupt")

    assert finding.path == str(sealed)
    assert finding.offset_bytes == SEGMENT_HEADER_BYTES  # the record holding the flip
    assert "sealed segment" in finding.message
    assert "checksum mismatch" in finding.message


def test_unexpected_files_are_listed_and_not_fatal(data_dir: Path, journal: Path) -> None:
    (data_dir / "notes.txt").write_text("x")
    (data_dir / "shards" / "backup").mkdir()
    (journal / "00000000000000000001.seg.bak").write_text("x")
    (journal.parent / "snapshot.tmp").write_bytes(b"partial")

    report = check(data_dir)

    unexpected = sorted(
        os.path.basename(f.path) for f in report.findings if f.code == "unexpected_file"
    )
    assert unexpected == ["00000000000000000001.seg.bak", "backup", "notes.txt"]
    assert codes(report, "info") == ["snapshot_temp_leftover"]
    assert report.exit_code == doctor.EXIT_HEALTHY


def test_the_doctor_never_writes(data_dir: Path, journal: Path) -> None:
    torn_partial_record(journal)
    bitflip_in_sealed_segment(journal)
    leftover_meta_tmp(journal)
    before = tree(data_dir)

    check(data_dir)
    check(data_dir, allow_running=True, only_shard=1)

    assert tree(data_dir) == before


def test_a_running_node_is_refused_unless_allowed(data_dir: Path, journal: Path) -> None:
    store = ShardStore.open(str(journal), limits=LIMITS)  # holds the directory lock
    try:
        refused = check(data_dir)
        assert refused.exit_code == doctor.EXIT_RUNNING
        assert refused.shards == []
        assert "node running" in only(refused, "node_running").message

        allowed = check(data_dir, allow_running=True)
        assert allowed.exit_code == doctor.EXIT_HEALTHY
        assert "results may be inconsistent" in only(allowed, "node_running").message
        assert allowed.shards[0].running
    finally:
        store.close()
    assert check(data_dir).exit_code == doctor.EXIT_HEALTHY  # the lock went with the store


def test_config_placement_and_shard_selection(data_dir: Path, journal: Path) -> None:
    make_journal(data_dir / "shards" / "2" / "journal", entries=3)

    report = check(data_dir, hosted_shards=(1, 3), only_shard=None)
    assert [s.shard for s in report.shards] == [1, 2]
    assert sorted(codes(report, "info")) == ["shard_not_created", "shard_not_in_config"]

    one = check(data_dir, only_shard=2)
    assert [s.shard for s in one.shards] == [2]
    assert one.shards[0].last_index == 3

    missing = check(data_dir, only_shard=9)
    assert codes(missing, "error") == ["shard_missing"]
    assert check(data_dir.parent / "nowhere").exit_code == doctor.EXIT_PROBLEMS


# ------------------------------------------------------------------------------- CLI


def logsvc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logsvc.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_exit_codes(tmp_path: Path, data_dir: Path, journal: Path) -> None:
    """0 healthy, 1 problems, 2 config error, 3 running; --json is one JSON document."""
    configs = Path(__file__).resolve().parents[2] / "configs"
    shutil.copy(configs / "local-n1.toml", tmp_path / "local-n1.toml")
    for name, value in (("secret", SECRET + "-padding"), ("token", "t0ken-t0ken-t0ken-t0ken")):
        (tmp_path / name).write_text(value)
        os.chmod(tmp_path / name, 0o600)

    healthy = logsvc("--config", str(tmp_path / "local-n1.toml"))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "(node n1)" in healthy.stdout  # data_dir "n1" is relative to the config file
    assert "shard 2" in healthy.stdout  # placed here by the config, not created yet

    bitflip_in_sealed_segment(journal)
    damaged = logsvc("--data-dir", str(data_dir), "--json")
    assert damaged.returncode == 1
    document = json.loads(damaged.stdout)
    assert document["exit_code"] == 1
    assert document["findings"][0]["code"] == "segment_corrupt"

    bad_config = logsvc("--config", str(tmp_path / "missing.toml"))
    assert bad_config.returncode == 2
    assert "config error" in bad_config.stderr
    assert "Traceback" not in bad_config.stderr

    store = ShardStore.open(str(data_dir / "shards" / "2" / "journal"), limits=LIMITS)
    try:
        running = logsvc("--data-dir", str(data_dir), "--shard", "2")
    finally:
        store.close()
    assert running.returncode == 3
    assert "--allow-running" in running.stdout
