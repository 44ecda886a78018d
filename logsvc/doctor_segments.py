"""`logsvc doctor`'s check of one shard journal: recovery's steps (logsvc/store/recovery.py),
decided from its pure parts, reporting what recovery would trim, delete or refuse instead of
doing it (logsvc/doctor.py's checks 1-3)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from logsvc.doctor_findings import Finding, list_dir, read_file, unexpected_file
from logsvc.quarantine import is_quarantine_name
from logsvc.store import records
from logsvc.store.fs import LOCK_FILE_NAME
from logsvc.store.meta import META_FILE_NAME, META_TMP_FILE_NAME, Meta, decode_meta
from logsvc.store.recovery import SEGMENT_NAME


@dataclass(slots=True)
class JournalCheck:
    """What the journal holds once recovery ran (computed without running it)."""

    meta: Meta | None  # None: missing or corrupt (recovery refuses the journal)
    log_start: int  # meta's first_index; without a meta, the first segment's first index
    last_index: int
    segments: int
    corrupt: bool  # an error was found: indexes past it are unknown
    # (term, payload) of the entries asked for (the snapshot's two), where present.
    entries: dict[int, tuple[int, bytes]] = field(default_factory=dict)


def check_journal(
    journal_dir: str,
    payload_bytes_max: int,
    wanted_indexes: Iterable[int],
    findings: list[Finding],
) -> JournalCheck | None:
    """Recovery's steps (logsvc/store/recovery.py), reporting instead of repairing. Where
    recovery stops at a bad or missing meta, the segments are still checked (from the
    first one found), so every damaged file is reported at once. None: unreadable."""
    names = list_dir(journal_dir, findings)
    if names is None:
        return None
    wanted = set(wanted_indexes)
    segment_names: list[tuple[int, str]] = []
    for name in names:
        match = SEGMENT_NAME.match(name)
        if match:
            segment_names.append((int(match.group(1)), name))
        elif name == META_TMP_FILE_NAME:
            findings.append(
                Finding(
                    "info",
                    "meta_tmp_leftover",
                    os.path.join(journal_dir, name),
                    "an interrupted metadata write; deleted at recovery (meta holds the "
                    "last good value)",
                )
            )
        elif is_quarantine_name(name):
            findings.append(
                Finding(
                    "info",
                    "quarantine_kept",
                    os.path.join(journal_dir, name),
                    "a damaged suffix moved aside by `doctor --repair --yes` (ignored by "
                    "recovery; delete it once it is no longer needed)",
                )
            )
        elif name not in (META_FILE_NAME, LOCK_FILE_NAME):
            findings.append(
                unexpected_file(os.path.join(journal_dir, name), "file in the journal (ignored)")
            )
    segment_names.sort()
    meta_path = os.path.join(journal_dir, META_FILE_NAME)
    meta: Meta | None = None
    if META_FILE_NAME not in names:
        if not segment_names:
            findings.append(Finding("info", "journal_empty", journal_dir, "new, empty journal"))
            meta = Meta()  # what recovery writes for a new store
        else:
            findings.append(
                Finding(
                    "error",
                    "meta_missing",
                    meta_path,
                    "segments exist but meta is missing: recovery reports corruption",
                    offset_bytes=0,
                )
            )
    else:
        data = read_file(meta_path, findings)
        if data is None:
            return None
        decoded = decode_meta(data)
        if isinstance(decoded, tuple):
            offset, reason = decoded
            findings.append(
                Finding(
                    "error",
                    "meta_corrupt",
                    meta_path,
                    f"{reason}: recovery reports corruption (term and vote are unknown)",
                    offset_bytes=offset,
                )
            )
        else:
            meta = decoded
    result = _check_segments(journal_dir, meta, segment_names, payload_bytes_max, wanted, findings)
    result.corrupt = result.corrupt or meta is None
    return result


def _check_segments(
    journal_dir: str,
    meta: Meta | None,
    segment_names: list[tuple[int, str]],
    payload_bytes_max: int,
    wanted: set[int],
    findings: list[Finding],
) -> JournalCheck:
    """recovery._scan_segments and _check_continuity, reporting instead of repairing."""
    if meta is not None:
        log_start = meta.first_index
    else:
        log_start = segment_names[0][0] if segment_names else 1
    errors_before = _errors(findings)
    kept: list[tuple[str, records.SegmentScan | None]] = []  # None: unreadable or corrupt
    entries: dict[int, tuple[int, bytes]] = {}
    for position, (first_index, name) in enumerate(segment_names):
        path = os.path.join(journal_dir, name)
        newest = position == len(segment_names) - 1
        following_first = None if newest else segment_names[position + 1][0]
        if following_first is not None and following_first <= log_start:
            findings.append(_obsolete(path, log_start))
            continue
        scanned = _scan_file(path, first_index, newest, payload_bytes_max, findings)
        if isinstance(scanned, _Deleted):
            continue
        if scanned is None:
            kept.append((path, None))
            continue
        scan, data = scanned
        if scan.count == 0:
            findings.append(
                Finding("info", "segment_empty", path, "holds no whole record; deleted at recovery")
            )
            continue
        if scan.last_index < log_start:
            findings.append(_obsolete(path, log_start))
            continue
        kept.append((path, scan))
        entries.update(_entries_at(scan, data, wanted, payload_bytes_max))
    _check_continuity(kept, log_start, None if meta is None else meta.term, findings)
    scans = [scan for _, scan in kept if scan is not None]
    return JournalCheck(
        meta=meta,
        log_start=log_start,
        last_index=scans[-1].last_index if scans else log_start - 1,
        segments=len(kept),
        corrupt=_errors(findings) > errors_before,
        entries=entries,
    )


def _errors(findings: list[Finding]) -> int:
    return sum(1 for finding in findings if finding.severity == "error")


def _obsolete(path: str, log_start: int) -> Finding:
    return Finding(
        "info",
        "segment_obsolete",
        path,
        f"wholly below the log start {log_start} (a prefix truncation whose deletion had not "
        "finished); deleted at recovery",
    )


class _Deleted:
    """Recovery would delete the file (a torn header on the newest segment)."""


def _scan_file(
    path: str, first_index: int, newest: bool, payload_bytes_max: int, findings: list[Finding]
) -> tuple[records.SegmentScan, bytes] | _Deleted | None:
    """recovery._scan_one without the repair: (scan, bytes), _Deleted, or None with an
    error."""
    try:
        size_bytes = os.stat(path).st_size
    except OSError as exc:
        findings.append(Finding("error", "unreadable", path, f"cannot stat: {exc.strerror}"))
        return None
    if size_bytes > records.SEGMENT_BYTES_LIMIT:
        # Not read: no segment is this large, and reading it could exhaust memory.
        findings.append(
            Finding(
                "error",
                "segment_corrupt",
                path,
                f"{size_bytes} bytes: larger than any segment can be",
            )
        )
        return None
    data = read_file(path, findings)
    if data is None:
        return None
    try:
        scan = records.scan_segment(
            data, first_index, newest=newest, payload_bytes_max=payload_bytes_max
        )
    except records.TornHeader as torn:
        findings.append(
            Finding(
                "warning",
                "torn_tail",
                path,
                f"torn header ({torn}) and no whole record after it: the file would be "
                "deleted at recovery (unacknowledged tail: power was lost as it was created)",
                offset_bytes=0,
            )
        )
        return _Deleted()
    except records.ScanCorruption as bad:
        where = (
            "a sealed segment (damage at rest: it was synced whole before the next began)"
            if not newest
            else "the newest segment (synced bytes are damaged: not a torn tail)"
        )
        findings.append(
            Finding(
                "error",
                "segment_corrupt",
                path,
                f"corruption in {where} at offset {bad.offset_bytes}: {bad.reason}",
                offset_bytes=bad.offset_bytes,
            )
        )
        return None
    if scan.torn_reason is not None:
        cut_bytes = len(data) - scan.end_bytes
        dropped = scan.torn_records_dropped
        also = f", with {dropped} unsynced record(s) after a lost page" if dropped else ""
        findings.append(
            Finding(
                "warning",
                "torn_tail",
                path,
                f"torn tail at offset {scan.end_bytes} ({scan.torn_reason}): {cut_bytes} "
                f"bytes would be trimmed at recovery (unacknowledged tail){also}",
                offset_bytes=scan.end_bytes,
            )
        )
    return scan, data


def _entries_at(
    scan: records.SegmentScan, data: bytes, wanted: set[int], payload_bytes_max: int
) -> dict[int, tuple[int, bytes]]:
    """(term, payload) of each wanted index the scanned segment holds."""
    found: dict[int, tuple[int, bytes]] = {}
    for index in wanted:
        if scan.first_index <= index <= scan.last_index:
            record = records.parse_record(
                data, scan.offsets[index - scan.first_index], payload_bytes_max
            )
            assert isinstance(record, records.RecordView)  # the scan just accepted it
            found[index] = (record.term, data[record.payload_offset_bytes : record.end_bytes])
    return found


def _check_continuity(
    kept: list[tuple[str, records.SegmentScan | None]],
    log_start: int,
    stored_term: int | None,
    findings: list[Finding],
) -> None:
    """Gap-free from the log start (recovery._check_continuity), and Raft's rule that terms
    never go down along the log. A corrupt segment (None) breaks the chain: what follows
    it is only compared with what follows it."""
    expected: int | None = None
    term: int | None = None
    first = True
    for path, scan in kept:
        if scan is None:
            expected, term, first = None, None, False
            continue
        if first and scan.first_index > log_start:
            findings.append(
                Finding(
                    "error",
                    "segment_missing",
                    path,
                    f"missing segment: the log starts at {log_start} but the first segment "
                    f"starts at {scan.first_index}",
                    offset_bytes=0,
                )
            )
        if expected is not None and scan.first_index != expected:
            findings.append(
                Finding(
                    "error",
                    "segment_gap",
                    path,
                    f"gap or missing segment: expected first index {expected}, found "
                    f"{scan.first_index}",
                    offset_bytes=0,
                )
            )
        first_term = scan.term_runs[0][1]
        if term is not None and first_term < term:
            findings.append(
                Finding(
                    "error",
                    "term_decreases",
                    path,
                    f"the first entry's term {first_term} is below the previous segment's "
                    f"last term {term} (Raft terms never go down along a log)",
                    offset_bytes=records.SEGMENT_HEADER_BYTES,
                )
            )
        term = scan.term_runs[-1][1]
        expected = scan.last_index + 1
        first = False
    if stored_term is not None and term is not None and term > stored_term:
        findings.append(
            Finding(
                "warning",
                "term_above_meta",
                kept[-1][0],
                f"the last entry's term {term} is above the stored term {stored_term} "
                "(the replica starts at the larger one)",
            )
        )
