"""`logsvc doctor`: check a node's data directory, offline and read-only, and report.

    logsvc doctor --config /etc/logsvc/n1.toml [--shard N] [--json] [--allow-running]
    logsvc doctor --data-dir /var/lib/logsvc/n1 [--shard N] [--json] [--allow-running]

What a node keeps on disk (logsvc/store/FORMAT.md, logsvc/shard/snapshot_file.py):

    <data_dir>/placement                    which shards the node hosts (node/placement.py)
    <data_dir>/removed/                     replicas it stopped hosting, archived (not checked)
    <data_dir>/shards/<shard id>/journal/   the shard store: LOCK, meta, <first index>.seg
    <data_dir>/shards/<shard id>/snapshot   the Raft snapshot file (once compacted)
    <data_dir>/shards/<shard id>/members    the replica's membership (shard/membership.py)

Checks, per shard directory (every one found, or only `--shard N`):

1. `journal/meta` decodes: magic, version, lengths, checksum; gives term, vote, log start.
2. Every segment recovery would read: header (magic, version, checksum, first index equal
   to the file name), then every record (checksum, type, dense index, term never going
   down), with the store's own decoder `records.scan_segment`. The newest segment may end
   in a torn tail: a *warning*, "would be trimmed at recovery (unacknowledged tail)":
   recovery cuts it and nothing in it was ever acknowledged. Damage anywhere else (a
   sealed segment, or the middle of the newest one) is corruption: an *error* naming the
   file and the byte offset.
3. The segments are gap-free and cover the log start; terms never go down from one segment
   to the next; the last entry's term is not above the stored term.
4. The snapshot decodes (layout, checksum), its state machine image restores, and its last
   entry is in the journal with the same term and bytes; a journal compacted past index 1
   without its snapshot is fatal. (On both the replica refuses to start:
   raft/snapshot_points.py, hole 4.)
5. The node's small checksummed files (`<data_dir>/placement`, `<shard dir>/members`,
   logsvc/shard/small_file.py) pass their framing and checksum. Files the node never
   writes are listed (warnings); leftovers recovery or the next write removes by itself
   (meta.tmp, segments below the log start, temporary files) are notes.

What recovery would trim, delete or refuse is decided exactly as `logsvc/store/recovery.py`
decides it, step for step, from its pure parts (`scan_segment`, `decode_meta`, the segment
name rule; checks 1-3 in logsvc/doctor_segments.py): `recover()` itself deletes and
truncates files, so it is never called here. The repair below is logsvc/doctor_repair.py.
tests/unit/test_doctor.py opens a copy of each damaged directory with the real store and
checks that the store agrees with the doctor.

Read-only: files are opened O_RDONLY; nothing is created, renamed, truncated or deleted,
except by `--repair --yes` (below).

Repair, on request only (ARCHITECTURE.md §11; issue 20):

    logsvc doctor --data-dir DIR --shard N --repair [--yes]

For a journal that recovery would refuse because a segment is corrupt (an error
`segment_corrupt`), `--repair` prints what a repair would do: move the damaged suffix (from
the first bad record to the end of its segment, and every later segment) into
`journal/quarantine-<UTC>-index-<lo>/` (logsvc/quarantine.py: copied and renamed durably,
never deleted; recovery ignores that directory), and which Raft indexes the replica then no
longer has. It changes nothing and exits 1. With `--yes` it does it (the node must be
stopped: it takes the journal's lock), checks again, and exits as the check does. The
replica then starts with a shorter log: Raft counted on it holding entries it acknowledged,
so repair one replica only while the others are healthy, or rather remove the replica and
add it back (it catches up from the leader).

A running node: an open store holds an exclusive flock on journal/LOCK. The doctor tries a
*shared* flock on an existing LOCK, non-blocking, and drops it at once. If it is held, the
node (or another process) has the store open and its newest segment and meta change while
they are read: the doctor refuses (exit 3), or with `--allow-running` checks anyway and
adds "node running: results may be inconsistent" to that shard. (The probe holds the lock
for microseconds; a node starting in exactly that instant fails with StoreLocked and is
restarted by its supervisor.)

Severities and exit codes:

    error    the replica would refuse to start, or synced (maybe acknowledged) data is
             damaged                                                     -> exit 1
    warning  the replica starts, but look: a torn tail it will trim, an unexpected file,
             a node running during the check                             -> exit 0
    info     leftovers the node removes by itself                        -> exit 0
    exit 2   config or usage error (as every logsvc command); exit 3 refused: node running
    --repair: exit 1 damage found and nothing changed (pass --yes); exit 3 node running or
             nothing a repair can move; with --yes the exit of the check after it
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from logsvc.doctor_findings import SEVERITIES, Severity, list_dir, read_file, unexpected_file
from logsvc.doctor_findings import Finding as Finding  # re-exported: callers import it here
from logsvc.doctor_journal import check_node_journal
from logsvc.doctor_repair import plan_journal_repair, repair_journal
from logsvc.doctor_segments import JournalCheck, check_journal
from logsvc.node import placement
from logsvc.shard import membership, small_file, snapshot_file
from logsvc.shard.errors import SnapshotCorrupt
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits
from logsvc.shard.state_machine import ShardStateMachine
from logsvc.store import records
from logsvc.store.fs import LOCK_FILE_NAME
from logsvc.store.journal import JOURNAL_DIR_NAME

EXIT_HEALTHY: Final = 0
EXIT_PROBLEMS: Final = 1
EXIT_RUNNING: Final = 3

SHARDS_DIR: Final = "shards"
JOURNAL_DIR: Final = "journal"
SNAPSHOT_FILE: Final = "snapshot"
# Temporary files of the two snapshot writers (raft._write_durably, and pysyncobj receiving
# one from the leader): a crash can leave one behind; the next snapshot replaces it.
SNAPSHOT_TEMP_FILES: Final = ("snapshot.tmp", "snapshot.1.tmp")
# The node's placement file and the archive of replicas it stopped hosting
# (logsvc/node/placement.py); lost+found: the data directory may be its own file system.
DATA_DIR_EXPECTED: Final = (
    SHARDS_DIR,
    placement.FILE_NAME,
    placement.ARCHIVE_DIR_NAME,
    "lost+found",
    JOURNAL_DIR_NAME,  # the node journal (logsvc/doctor_journal.py checks it)
)
# The small checksummed files (logsvc/shard/small_file.py): (file name, magic, version).
SMALL_FILES: Final = (
    (placement.FILE_NAME, placement.MAGIC, placement.VERSION),
    (membership.FILE_NAME, membership.MAGIC, membership.VERSION),
)
SHARD_DIR_NAME = re.compile(r"[1-9][0-9]{0,9}")


@dataclass(slots=True)
class ShardSummary:
    """What one shard directory holds, as recovery would leave it. None: unknown."""

    shard: int
    path: str
    term: int | None = None
    voted_for: str | None = None
    first_index: int | None = None  # the log start (meta)
    last_index: int | None = None  # after trimming a torn tail; first_index - 1 if empty
    segments: int = 0  # segment files recovery keeps
    snapshot_index: int | None = None  # raft index of the snapshot's last entry
    running: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "path": self.path,
            "term": self.term,
            "voted_for": self.voted_for,
            "first_index": self.first_index,
            "last_index": self.last_index,
            "segments": self.segments,
            "snapshot_index": self.snapshot_index,
            "running": self.running,
        }


@dataclass(slots=True)
class DoctorReport:
    data_dir: str
    node_id: str | None
    shards: list[ShardSummary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    refused_running: bool = False  # running node, no --allow-running: nothing was checked

    def count(self, severity: Severity) -> int:
        return sum(1 for finding in self.findings if finding.severity == severity)

    @property
    def exit_code(self) -> int:
        if self.refused_running:
            return EXIT_RUNNING
        return EXIT_PROBLEMS if self.count("error") else EXIT_HEALTHY

    def to_json(self) -> dict[str, object]:
        return {
            "data_dir": self.data_dir,
            "node": self.node_id,
            "exit_code": self.exit_code,
            "healthy": self.exit_code == EXIT_HEALTHY,
            "refused_running": self.refused_running,
            "counts": {severity: self.count(severity) for severity in SEVERITIES},
            "shards": [shard.to_json() for shard in self.shards],
            "findings": [finding.to_json() for finding in self.findings],
        }


@dataclass(frozen=True, slots=True)
class DoctorOptions:
    data_dir: str
    node_id: str | None = None
    # The shards the config places on this node (None with --data-dir: not known).
    hosted_shards: tuple[int, ...] | None = None
    only_shard: int | None = None
    # The node's limits when a config was given. Without one, the format's hard cap: a
    # record the node's own limit refuses is then not flagged, but nothing valid is.
    payload_bytes_max: int = records.PAYLOAD_BYTES_LIMIT
    shard_limits: ShardLimits = DEFAULT_SHARD_LIMITS
    allow_running: bool = False


# ------------------------------------------------------------------------- the walk


def examine(options: DoctorOptions) -> DoctorReport:
    """Check the data directory; never writes to it."""
    data_dir = options.data_dir
    report = DoctorReport(data_dir=data_dir, node_id=options.node_id)
    if not os.path.isdir(data_dir):
        report.findings.append(
            Finding("error", "data_dir_missing", data_dir, "the data directory does not exist")
        )
        return report
    shard_dirs = _shard_dirs(options, report.findings)
    running = [shard for shard, path in shard_dirs if journal_locked(_journal_of(path))]
    if running and not options.allow_running:
        report.refused_running = True
        report.findings.append(
            Finding(
                "warning",
                "node_running",
                data_dir,
                f"node running (journal lock held for shard(s) "
                f"{', '.join(map(str, running))}): stop it first, or pass --allow-running "
                "to check anyway (results may be inconsistent)",
            )
        )
        return report
    report.findings.extend(check_node_journal(data_dir, options.payload_bytes_max))
    for shard, path in shard_dirs:
        summary = ShardSummary(shard=shard, path=path, running=shard in running)
        findings: list[Finding] = []
        if summary.running:
            findings.append(
                Finding(
                    "warning",
                    "node_running",
                    _journal_of(path),
                    "node running: results may be inconsistent (the newest segment and "
                    "meta change while they are read)",
                )
            )
        check_shard_dir(path, summary, options, findings)
        report.shards.append(summary)
        report.findings.extend(_with_shard(findings, shard))
    return report


def journal_locked(journal_dir: str) -> bool:
    """Whether some process holds the store's directory lock (the node is running). Takes a
    shared lock on an existing LOCK file for an instant; never creates the file."""
    try:
        fd = os.open(os.path.join(journal_dir, LOCK_FILE_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no LOCK: no store was ever opened here, so none is open now
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the shared lock, if taken
    return False


def _journal_of(shard_dir: str) -> str:
    return os.path.join(shard_dir, JOURNAL_DIR)


def _with_shard(findings: Iterable[Finding], shard: int) -> list[Finding]:
    return [Finding(f.severity, f.code, f.path, f.message, shard, f.offset_bytes) for f in findings]


def _small_file(dir_path: str, name: str, findings: list[Finding]) -> bool:
    """Check `name` if it is one of the small checksummed files (or a leftover temporary
    of one); False if it is not."""
    path = os.path.join(dir_path, name)
    for file_name, magic, version in SMALL_FILES:
        if name == file_name + small_file.TMP_SUFFIX:
            findings.append(
                Finding(
                    "info",
                    "temp_leftover",
                    path,
                    f"temporary file of an interrupted write of {file_name}; the next write "
                    "removes it",
                )
            )
            return True
        if name != file_name:
            continue
        data = read_file(path, findings)
        if data is not None:
            try:
                small_file.decode(path, data, magic, version)
            except small_file.SmallFileCorrupt as exc:
                findings.append(
                    Finding(
                        "error",
                        f"{file_name}_corrupt",
                        path,
                        f"{exc.reason}: the node refuses to guess what it held",
                    )
                )
        return True
    return False


def _shard_dirs(options: DoctorOptions, findings: list[Finding]) -> list[tuple[int, str]]:
    data_dir = options.data_dir
    for name in list_dir(data_dir, findings) or []:
        if not _small_file(data_dir, name, findings) and name not in DATA_DIR_EXPECTED:
            findings.append(
                unexpected_file(os.path.join(data_dir, name), "entry in the data directory")
            )
    shards_path = os.path.join(data_dir, SHARDS_DIR)
    found: dict[int, str] = {}
    if os.path.isdir(shards_path):
        for name in list_dir(shards_path, findings) or []:
            path = os.path.join(shards_path, name)
            if SHARD_DIR_NAME.fullmatch(name) and os.path.isdir(path):
                found[int(name)] = path
            else:
                findings.append(unexpected_file(path, "entry (not a shard directory)"))
    hosted = options.hosted_shards
    if hosted is not None:
        for shard in hosted:
            if shard not in found and options.only_shard in (None, shard):
                findings.append(
                    Finding(
                        "info",
                        "shard_not_created",
                        os.path.join(shards_path, str(shard)),
                        "the config places this shard here but it has no directory yet "
                        "(the node creates it at start)",
                        shard,
                    )
                )
        for shard in sorted(set(found) - set(hosted)):
            if options.only_shard in (None, shard):
                findings.append(
                    Finding(
                        "info",
                        "shard_not_in_config",
                        found[shard],
                        "the config does not place this shard here (a replica added by a "
                        "membership change, or one left behind after its removal)",
                        shard,
                    )
                )
    if options.only_shard is not None:
        if options.only_shard not in found:
            findings.append(
                Finding(
                    "error",
                    "shard_missing",
                    os.path.join(shards_path, str(options.only_shard)),
                    "no such shard directory",
                    options.only_shard,
                )
            )
        return [(s, p) for s, p in sorted(found.items()) if s == options.only_shard]
    return sorted(found.items())


# --------------------------------------------------------------------------- one shard


def check_shard_dir(
    shard_dir: str, summary: ShardSummary, options: DoctorOptions, findings: list[Finding]
) -> None:
    names = list_dir(shard_dir, findings)
    if names is None:
        return
    snapshot_path = os.path.join(shard_dir, SNAPSHOT_FILE)
    for name in names:
        path = os.path.join(shard_dir, name)
        if name in SNAPSHOT_TEMP_FILES:
            findings.append(
                Finding(
                    "info",
                    "snapshot_temp_leftover",
                    path,
                    "temporary file of an interrupted snapshot write; the next snapshot "
                    "replaces it",
                )
            )
        elif not _small_file(shard_dir, name, findings) and name not in (
            JOURNAL_DIR,
            SNAPSHOT_FILE,
        ):
            findings.append(unexpected_file(path, "file in the shard directory"))
    snapshot: snapshot_file.SnapshotFile | None = None
    if SNAPSHOT_FILE in names:
        data = read_file(snapshot_path, findings)
        if data is not None:
            snapshot = check_snapshot_bytes(snapshot_path, data, options.shard_limits, findings)
    if snapshot is not None:
        summary.snapshot_index = snapshot.last.index
    journal_dir = _journal_of(shard_dir)
    if JOURNAL_DIR not in names:
        if SNAPSHOT_FILE in names:
            findings.append(
                Finding(
                    "error",
                    "journal_missing",
                    journal_dir,
                    "a snapshot but no journal: the replica would start an empty journal "
                    "that cannot hold the snapshot's entries, and refuses to start",
                )
            )
        else:
            findings.append(
                Finding("info", "journal_missing", journal_dir, "no journal yet (never started)")
            )
        return
    wanted = () if snapshot is None else (snapshot.prev.index, snapshot.last.index)
    journal = check_journal(journal_dir, options.payload_bytes_max, wanted, findings)
    if journal is None:
        return  # the journal is unreadable: the snapshot cannot be matched
    if journal.meta is not None:
        summary.term = journal.meta.term
        summary.voted_for = journal.meta.voted_for
        summary.first_index = journal.meta.first_index
    summary.last_index = journal.last_index
    summary.segments = journal.segments
    if journal.corrupt or (snapshot is None and SNAPSHOT_FILE in names):
        return  # already reported: what is left to compare is not known
    findings.extend(check_snapshot_matches(snapshot_path, snapshot, journal))


def check_snapshot_bytes(
    path: str, data: bytes, shard_limits: ShardLimits, findings: list[Finding]
) -> snapshot_file.SnapshotFile | None:
    """The decoded snapshot file, or None with an error (the replica refuses to start on
    a snapshot it cannot load: raft/snapshot_points.py, hole 4)."""
    try:
        snapshot = snapshot_file.decode(data)
    except snapshot_file.SnapshotFileCorrupt as exc:
        findings.append(
            Finding(
                "error",
                "snapshot_corrupt",
                path,
                f"{exc.reason}: the replica refuses to start on a snapshot it cannot load",
            )
        )
        return None
    try:
        ShardStateMachine.restore(snapshot.state, shard_limits)
    except SnapshotCorrupt as exc:
        findings.append(
            Finding(
                "error",
                "snapshot_state_corrupt",
                path,
                f"the state machine image does not restore: {exc}",
            )
        )
    return snapshot


def check_snapshot_matches(
    snapshot_path: str, snapshot: snapshot_file.SnapshotFile | None, journal: JournalCheck
) -> list[Finding]:
    """What the replica checks at start (raft.RaftNode and _SyncObj__loadDumpFile): a
    journal that starts past index 1 needs its snapshot, and the snapshot's last entry must
    be in the journal with the same term."""
    first, last_index = journal.log_start, journal.last_index
    if snapshot is None:
        if first > 1:
            return [
                Finding(
                    "error",
                    "snapshot_missing",
                    snapshot_path,
                    f"the journal is compacted (it starts at raft index {first}) but the "
                    "snapshot is missing: the replica refuses to start with an empty state",
                )
            ]
        return []
    last, prev = snapshot.last, snapshot.prev
    held = journal.entries.get(last.index) if first <= last.index <= last_index else None
    if held is None:
        return [
            Finding(
                "error",
                "snapshot_mismatch",
                snapshot_path,
                f"the snapshot's last entry (raft index {last.index}) is not in the journal "
                f"[{first}, {last_index}]: the replica refuses to start",
            )
        ]
    term, payload = held
    if term != last.term:
        return [
            Finding(
                "error",
                "snapshot_mismatch",
                snapshot_path,
                f"the snapshot's last entry has term {last.term}, the journal's entry "
                f"{last.index} has term {term}: the replica refuses to start",
            )
        ]
    if payload != last.command:
        return [
            Finding(
                "error",
                "snapshot_mismatch",
                snapshot_path,
                f"the journal's entry {last.index} has the snapshot's term but other bytes "
                "(two entries with one index and term must be identical: damage or a bug)",
            )
        ]
    if first < prev.index:
        return [
            Finding(
                "info",
                "compaction_pending",
                snapshot_path,
                f"the journal still starts at {first}, below the snapshot's entries "
                f"({prev.index}): an interrupted compaction, finished at start",
            )
        ]
    return []


# ------------------------------------------------------------------------- repair
def _repair(options: DoctorOptions, yes: bool) -> int:
    assert options.only_shard is not None
    shard_dir = os.path.join(options.data_dir, "shards", str(options.only_shard))
    journal_dir = _journal_of(shard_dir)
    if not os.path.isdir(journal_dir):
        print(f"error: no journal at {journal_dir}", file=sys.stderr)
        return EXIT_RUNNING
    if journal_locked(journal_dir):
        print(
            f"error: the node is running ({journal_dir} is locked): stop it first", file=sys.stderr
        )
        return EXIT_RUNNING
    plan = plan_journal_repair(journal_dir, options.payload_bytes_max)
    if plan is None:
        print(f"{journal_dir}: no corrupt segment; nothing a repair would move")
        report = examine(options)
        print(format_text(report))
        return EXIT_RUNNING if report.exit_code != EXIT_HEALTHY else EXIT_HEALTHY
    print(plan.describe().rstrip("\n"))
    print(
        "warning: the replica will start without these entries; Raft counted on it holding "
        "the ones it acknowledged. Repair one replica only while the others are healthy, or "
        "remove it from the shard and add it back instead."
    )
    if not yes:
        print("nothing changed: pass --yes to move the damaged suffix aside", file=sys.stderr)
        return EXIT_PROBLEMS
    try:
        target = repair_journal(plan)
    except BlockingIOError:
        print(f"error: the node is running ({journal_dir} is locked)", file=sys.stderr)
        return EXIT_RUNNING
    print(f"repaired: the damaged suffix is in {target}")
    report = examine(options)
    print(format_text(report))
    return report.exit_code


# ------------------------------------------------------------------------- the output


def format_text(report: DoctorReport) -> str:
    """The human report: a table of shards, then every finding, then the verdict."""
    title = f"logsvc doctor: {report.data_dir}"
    if report.node_id is not None:
        title += f" (node {report.node_id})"
    lines = [title]
    if report.shards:
        header = ("SHARD", "TERM", "VOTE", "FIRST", "LAST", "SEGMENTS", "SNAPSHOT", "STATUS")
        rows = [header, *(_row(shard, report.findings) for shard in report.shards)]
        widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
        lines.append("")
        for row in rows:
            lines.append(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )
    ordered = sorted(
        report.findings,
        key=lambda f: (SEVERITIES.index(f.severity), -1 if f.shard is None else f.shard),
    )
    if ordered:
        lines.append("")
    for finding in ordered:
        where = "node" if finding.shard is None else f"shard {finding.shard}"
        at = "" if finding.offset_bytes is None else f" @ offset {finding.offset_bytes}"
        lines.append(f"{finding.severity.upper():<8}{where}: {finding.path}{at}")
        lines.append(f"        {finding.message}")
    counts = {severity: report.count(severity) for severity in SEVERITIES}
    verdict = {
        EXIT_HEALTHY: "healthy",
        EXIT_PROBLEMS: "problems found",
        EXIT_RUNNING: "refused: the node is running",
    }[report.exit_code]
    lines.append("")
    lines.append(
        f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), "
        f"{counts['info']} note(s); exit {report.exit_code}"
    )
    return "\n".join(lines)


def _row(shard: ShardSummary, findings: list[Finding]) -> tuple[str, ...]:
    def text(value: int | str | None) -> str:
        return "-" if value is None else str(value)

    own = [f for f in findings if f.shard == shard.shard]
    errors = sum(1 for f in own if f.severity == "error")
    warnings = sum(1 for f in own if f.severity == "warning")
    status = "ok"
    if errors or warnings:
        status = ", ".join(
            part
            for part in (
                f"{errors} error(s)" if errors else "",
                f"{warnings} warning(s)" if warnings else "",
            )
            if part
        )
    return (
        str(shard.shard),
        text(shard.term),
        text(shard.voted_for),
        text(shard.first_index),
        text(shard.last_index),
        str(shard.segments),
        text(shard.snapshot_index),
        status,
    )


def main(
    *,
    config_path: str | None,
    data_dir: str | None,
    shard: int | None,
    json_output: bool,
    allow_running: bool,
    repair: bool = False,
    yes: bool = False,
) -> int:
    """`logsvc doctor`: print the report, return the exit code (module docstring)."""
    from logsvc.config import ConfigError, load_node_config, main_config_error

    assert (config_path is None) != (data_dir is None)
    if config_path is not None:
        try:
            config = load_node_config(config_path)
        except ConfigError as exc:
            return main_config_error(exc)
        options = DoctorOptions(
            data_dir=config.data_dir,
            node_id=config.node_id,
            hosted_shards=tuple(s.id for s in config.shards_hosted()),
            only_shard=shard,
            payload_bytes_max=config.store_limits.record_payload_bytes_max,
            shard_limits=config.shard_limits,
            allow_running=allow_running,
        )
    else:
        assert data_dir is not None
        options = DoctorOptions(
            data_dir=os.path.abspath(data_dir), only_shard=shard, allow_running=allow_running
        )
    if repair:
        return _repair(options, yes)
    report = examine(options)
    if json_output:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_text(report))
    return report.exit_code
