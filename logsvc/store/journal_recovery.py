"""Opening the node journal: scan its files, replay every store's operations into the store's
own files, then delete the journal files (docs/decisions/0011-shared-journal.md, "Recovery";
FORMAT.md, "Node journal", crash cases). Used by `journal.NodeJournal.open`.

1. List `<file_seq>.jnl` files; a hole in the sequence is corruption.
2. Scan each (`journal_records.scan_file`): a sealed file must be whole; the newest may end
   in a torn tail (ignored) or a torn header (the file is deleted); anything else is
   `Corruption(path, offset)` and nothing is changed.
3. Group the records by store directory (ATTACH declares a store id per file).
4. For each store whose directory still has `meta`: open it (its own recovery first),
   `replay_into` it, close it (fdatasyncs what the replay wrote). A store directory without
   `meta` belonged to a removed replica: skipped with a warning.
5. Delete every journal file, fsync the directory.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from logsvc.store import journal_records as jr
from logsvc.store.errors import Corruption, io_error
from logsvc.store.fs import FileSystem
from logsvc.store.journal_port import ReplayTarget
from logsvc.store.journal_replay import (
    AppendOp,
    ReplayGap,
    StoreOp,
    TruncateOp,
    VoteOp,
    plan_replay,
)
from logsvc.store.limits import JournalLimits, StoreLimits
from logsvc.store.meta import META_FILE_NAME
from logsvc.store.records import Entry
from logsvc.store.store import ShardStore

log = logging.getLogger("logsvc.store.journal")

JOURNAL_FILE_NAME = re.compile(r"^(\d{20})\.jnl$")


@dataclass(frozen=True, slots=True)
class JournalRecovery:
    next_file_seq: int
    replayed_stores: int
    torn_tail_bytes_cut: int


def recover_journal_dir(
    fs: FileSystem,
    dir_path: str,
    base_dir: str,
    limits: JournalLimits,
    store_limits: StoreLimits,
) -> JournalRecovery:
    scans, next_file_seq, torn_bytes = _scan_all(fs, dir_path, limits.record_payload_bytes_max)
    replayed = 0
    for rel_path, ops in sorted(ops_by_path(scans).items()):
        store_dir = os.path.join(base_dir, rel_path)
        if not fs.exists(os.path.join(store_dir, META_FILE_NAME)):
            log.warning(
                "journal holds operations of %s, which no longer exists (replica removed): "
                "skipping them",
                store_dir,
            )
            continue
        store = ShardStore.open(store_dir, fs=fs, limits=store_limits, background_sync=False)
        try:
            replay_into(store, ops, store_dir)
        finally:
            store.close()  # fdatasyncs the segments and meta the replay wrote
        replayed += 1
    # Every operation is durable in its store's files: the journal is not needed.
    try:
        for name in fs.listdir(dir_path):
            if JOURNAL_FILE_NAME.match(name):
                fs.unlink(os.path.join(dir_path, name))
        fs.fsync_dir(dir_path)
    except OSError as exc:
        raise io_error(exc, "delete replayed journal files", dir_path) from exc
    return JournalRecovery(next_file_seq, replayed, torn_bytes)


def _scan_all(
    fs: FileSystem, dir_path: str, payload_bytes_max: int
) -> tuple[list[tuple[str, jr.FileScan]], int, int]:
    """(path, scan) of every readable file in order, the next file_seq, torn bytes."""
    try:
        names = fs.listdir(dir_path)
    except OSError as exc:
        raise io_error(exc, "listdir", dir_path) from exc
    numbered = sorted(
        (int(m.group(1)), name) for name in names if (m := JOURNAL_FILE_NAME.match(name))
    )
    scans: list[tuple[str, jr.FileScan]] = []
    next_file_seq = 1
    torn_bytes = 0
    for position, (file_seq, name) in enumerate(numbered):
        path = os.path.join(dir_path, name)
        if position and file_seq != numbered[position - 1][0] + 1:
            raise Corruption(path, 0, f"missing journal file before {name}")
        next_file_seq = file_seq + 1
        try:
            data = fs.read_file(path)
        except OSError as exc:
            raise io_error(exc, "read", path) from exc
        newest = position == len(numbered) - 1
        try:
            scan = jr.scan_file(data, file_seq, newest=newest, payload_bytes_max=payload_bytes_max)
        except jr.TornHeader as torn:
            log.warning("newest journal file %s has a torn header (%s)", path, torn)
            torn_bytes += len(data)
            continue
        except jr.ScanCorruption as bad:
            raise Corruption(path, bad.offset_bytes, bad.reason) from None
        if scan.torn_reason is not None:
            cut = len(data) - scan.end_bytes
            log.warning(
                "torn tail in %s at offset %d: %s; ignoring %d bytes",
                path,
                scan.end_bytes,
                scan.torn_reason,
                cut,
            )
            torn_bytes += cut
        scans.append((path, scan))
    return scans, next_file_seq, torn_bytes


def live_ops(
    fs: FileSystem, files: list[tuple[str, int]], store_ids: set[int], payload_bytes_max: int
) -> list[StoreOp]:
    """The operations of `store_ids` in the given (path, file_seq) files, as written so far
    (the page cache of a running journal: every record whole)."""
    ops: list[StoreOp] = []
    for path, file_seq in files:
        try:
            data = fs.read_file(path)
        except OSError as exc:
            raise io_error(exc, "read", path) from exc
        try:
            scan = jr.scan_file(data, file_seq, newest=False, payload_bytes_max=payload_bytes_max)
        except jr.ScanCorruption as bad:
            raise Corruption(path, bad.offset_bytes, bad.reason) from None
        for record in scan.records:
            if record.store_id in store_ids and record.rtype != jr.TYPE_ATTACH:
                ops.append(_op_of(record, path))
    return ops


def _op_of(record: jr.JournalRecord, path: str) -> StoreOp:
    if record.rtype == jr.TYPE_ENTRY:
        return AppendOp((Entry(record.a, record.b, record.body),))
    if record.rtype == jr.TYPE_VOTE:
        return VoteOp(record.a, record.body.decode("utf-8") if record.b else None)
    assert record.rtype == jr.TYPE_TRUNCATE, (path, record)
    return TruncateOp(record.a)


def ops_by_path(scans: list[tuple[str, jr.FileScan]]) -> dict[str, list[StoreOp]]:
    """Every store's operations in journal order, by store directory (relative path)."""
    found: dict[str, list[StoreOp]] = {}
    for path, scan in scans:
        names: dict[int, str] = {}  # store ids are per file: ATTACH declares them
        for record in scan.records:
            if record.rtype == jr.TYPE_ATTACH:
                names[record.store_id] = record.body.decode("utf-8")
                continue
            rel_path = names.get(record.store_id)
            if rel_path is None:
                raise Corruption(
                    path,
                    record.offset_bytes,
                    f"record of store id {record.store_id}, which no ATTACH declared",
                )
            found.setdefault(rel_path, []).append(_op_of(record, path))
    return found


def replay_into(store: ReplayTarget, ops: list[StoreOp], store_dir: str) -> None:
    """Bring a store (not attached to a journal) to the state its journaled operations lead
    to, durably (`journal_replay.plan_replay`; idempotent)."""
    try:
        plan = plan_replay(
            ops,
            first_index=store.first_index,
            last_index=store.last_index,
            term_at=store.term_at,
            term=store.term,
            voted_for=store.voted_for,
        )
    except ReplayGap as gap:
        raise Corruption(store_dir, 0, f"journal replay: {gap}") from None
    if plan.empty:
        return
    log.info(
        "replaying the journal into %s: cut from %s, %d entries, vote %s",
        store_dir,
        plan.cut_from,
        len(plan.appends),
        plan.vote,
    )
    if plan.cut_from is not None:
        store.truncate_suffix(plan.cut_from)
    if plan.appends:
        store.append(list(plan.appends))
    if plan.vote is not None:
        store.save_vote(*plan.vote)
    store.sync()
