"""Opening a store directory: find what is whole, cut what is torn, refuse what is corrupt.

Steps, in order (each crash case is listed in FORMAT.md, "Crash cases"):

1. Delete a leftover `meta.tmp` (a metadata write that never got renamed).
2. Load `meta` (term, vote, log start). A directory with segments but no `meta` is
   corrupt; an empty directory is a new store and gets a fresh `meta`.
3. List segment files by first index. Segments wholly below the log start (left behind
   by a prefix truncation whose deletion had not finished) are deleted.
4. Scan every other segment. Sealed segments must be whole; the newest may end in a torn
   tail, which is cut back to the last whole record (see `records.scan_segment` for how
   a torn tail is told apart from corruption), or in zero-ahead space, also cut. A
   newest segment whose header is torn, or that holds no whole record, is deleted.
5. Check that the segments hold a gap-free index sequence that covers the log start.
6. Make everything recovered durable: fdatasync the newest segment and fsync the
   directory. After a process crash the page cache may hold bytes that were never
   synced; once recovered, they are served, so they must survive a power loss from now on.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from logsvc.store import records
from logsvc.store.errors import Corruption, io_error
from logsvc.store.fs import LOCK_FILE_NAME, FileSystem
from logsvc.store.limits import StoreLimits
from logsvc.store.meta import META_FILE_NAME, META_TMP_FILE_NAME, Meta, load_meta, save_meta

log = logging.getLogger("logsvc.store")

SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")


def segment_file_name(first_index: int) -> str:
    return f"{first_index:020d}.seg"


@dataclass(slots=True)
class RecoveryReport:
    """What recovery changed on disk; logged and exported as metrics."""

    torn_tail_bytes_cut: int = 0
    torn_reason: str | None = None
    # Zeros after the newest segment's last record, cut: zero-ahead space (FORMAT.md).
    zero_tail_bytes_cut: int = 0
    deleted_files: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Recovered:
    meta: Meta
    segments: list[tuple[str, records.SegmentScan]]  # (path, scan), in index order
    report: RecoveryReport


def recover(fs: FileSystem, dir_path: str, limits: StoreLimits) -> Recovered:
    report = RecoveryReport()
    names = _list(fs, dir_path)
    if META_TMP_FILE_NAME in names:
        _delete(fs, dir_path, META_TMP_FILE_NAME, report)
    segment_names = _segment_names(names)
    meta = load_meta(fs, dir_path)
    if meta is None:
        if segment_names:
            raise Corruption(
                os.path.join(dir_path, META_FILE_NAME), 0, "segments exist but meta is missing"
            )
        meta = Meta()
        save_meta(fs, dir_path, meta)
    scans = _scan_segments(fs, dir_path, segment_names, meta.first_index, limits, report)
    _check_continuity(scans, meta.first_index)
    if report.deleted_files or report.torn_tail_bytes_cut or report.zero_tail_bytes_cut:
        _fsync_dir(fs, dir_path)
    if scans:
        _sync_file(fs, scans[-1][0])
    _fsync_dir(fs, dir_path)
    return Recovered(meta=meta, segments=scans, report=report)


def _list(fs: FileSystem, dir_path: str) -> list[str]:
    try:
        return fs.listdir(dir_path)
    except OSError as exc:
        raise io_error(exc, "listdir", dir_path) from exc


def _segment_names(names: list[str]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for name in names:
        match = SEGMENT_NAME.match(name)
        if match:
            found.append((int(match.group(1)), name))
        elif name not in (META_FILE_NAME, LOCK_FILE_NAME):
            log.warning("ignoring unknown file %r in the store directory", name)
    found.sort()
    return found


def _scan_segments(
    fs: FileSystem,
    dir_path: str,
    segment_names: list[tuple[int, str]],
    log_start: int,
    limits: StoreLimits,
    report: RecoveryReport,
) -> list[tuple[str, records.SegmentScan]]:
    scans: list[tuple[str, records.SegmentScan]] = []
    for position, (first_index, name) in enumerate(segment_names):
        newest = position == len(segment_names) - 1
        following_first = None if newest else segment_names[position + 1][0]
        if following_first is not None and following_first <= log_start:
            _delete(fs, dir_path, name, report)  # wholly below the log start
            continue
        scan = _scan_one(fs, dir_path, name, first_index, newest, limits, report)
        if scan is None or scan.count == 0 or scan.last_index < log_start:
            if scan is not None and scan.count and scan.last_index < log_start:
                log.info("deleting segment %s: wholly below the log start %d", name, log_start)
            _delete(fs, dir_path, name, report)
            continue
        scans.append((os.path.join(dir_path, name), scan))
    return scans


def _scan_one(
    fs: FileSystem,
    dir_path: str,
    name: str,
    first_index: int,
    newest: bool,
    limits: StoreLimits,
    report: RecoveryReport,
) -> records.SegmentScan | None:
    path = os.path.join(dir_path, name)
    try:
        data = fs.read_file(path)
    except OSError as exc:
        raise io_error(exc, "read", path) from exc
    try:
        scan = records.scan_segment(
            data,
            first_index,
            newest=newest,
            payload_bytes_max=limits.record_payload_bytes_max,
        )
    except records.TornHeader as torn:
        log.warning("newest segment %s has a torn header (%s): deleting it", path, torn)
        report.torn_reason = str(torn)
        report.torn_tail_bytes_cut += len(data)
        return None
    except records.ScanCorruption as bad:
        raise Corruption(path, bad.offset_bytes, bad.reason) from None
    if scan.torn_reason is not None:
        cut_bytes = len(data) - scan.end_bytes
        dropped = scan.torn_records_dropped
        log.warning(
            "torn tail in %s at offset %d: %s; cutting %d bytes%s",
            path,
            scan.end_bytes,
            scan.torn_reason,
            cut_bytes,
            f" ({dropped} unsynced records after a lost page)" if dropped else "",
        )
        report.torn_reason = scan.torn_reason
        report.torn_tail_bytes_cut += cut_bytes
        _truncate_file(fs, path, scan.end_bytes)
    elif scan.zero_tail_bytes:
        # The store's zero-ahead space (left by a kill or a power loss): the file ends at
        # its last record again, so the store's append position is the file's size.
        log.info("cutting %d bytes of zero-ahead space from %s", scan.zero_tail_bytes, path)
        report.zero_tail_bytes_cut += scan.zero_tail_bytes
        _truncate_file(fs, path, scan.end_bytes)
    return scan


def _check_continuity(scans: list[tuple[str, records.SegmentScan]], log_start: int) -> None:
    expected = None
    for path, scan in scans:
        if expected is None and scan.first_index > log_start:
            raise Corruption(
                path,
                0,
                f"missing segment: the log starts at {log_start} but the first "
                f"segment starts at {scan.first_index}",
            )
        if expected is not None and scan.first_index != expected:
            raise Corruption(
                path,
                0,
                f"gap or missing segment: expected first index {expected}, "
                f"found {scan.first_index}",
            )
        expected = scan.last_index + 1


def _delete(fs: FileSystem, dir_path: str, name: str, report: RecoveryReport) -> None:
    path = os.path.join(dir_path, name)
    try:
        fs.unlink(path)
    except OSError as exc:
        raise io_error(exc, "unlink", path) from exc
    report.deleted_files.append(name)


def _truncate_file(fs: FileSystem, path: str, size_bytes: int) -> None:
    try:
        handle = fs.open_write(path, create=False)
        try:
            handle.truncate(size_bytes)
            handle.fdatasync()
        finally:
            handle.close()
    except OSError as exc:
        raise io_error(exc, "truncate", path) from exc


def _sync_file(fs: FileSystem, path: str) -> None:
    try:
        handle = fs.open_write(path, create=False)
        try:
            handle.fdatasync()
        finally:
            handle.close()
    except OSError as exc:
        raise io_error(exc, "fdatasync", path) from exc


def _fsync_dir(fs: FileSystem, dir_path: str) -> None:
    try:
        fs.fsync_dir(dir_path)
    except OSError as exc:
        raise io_error(exc, "fsync_dir", dir_path) from exc
