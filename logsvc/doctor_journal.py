"""`logsvc doctor`'s check of the node journal (`<data_dir>/node-journal/`, logsvc/store/
journal.py, docs/decisions/0011-shared-journal.md). Offline and read-only, as the rest of the
doctor (logsvc/doctor.py): files are read, never repaired.

What it reports, deciding exactly as `NodeJournal.open` would, from the same pure parts
(`journal_records.scan_file`, `journal_replay.plan_replay`'s record mapping):

* no journal directory, or no journal files: nothing (today's layout, or a clean stop);
* the file sequence has a hole: an *error* `journal_missing_file`;
* damage in a sealed file, or in the middle of the newest one: an *error* `journal_corrupt`
  naming the file and the byte offset (the node refuses to open);
* a torn tail of the newest file: a *warning* `journal_torn_tail` (cut at open; nothing in
  it was acknowledged);
* a record of a store no ATTACH declared: an *error* `journal_corrupt`;
* operations waiting to be replayed: a *note* `journal_pending_replay` per store (how many
  entries, votes and truncations): the store's own files are behind until the node opens,
  so the per-shard checks describe the checkpoint, not the latest state;
* operations of a store directory that no longer exists: a *warning*
  `journal_orphan_store` (the replica was removed; the open skips them).
"""

from __future__ import annotations

import os
from collections import Counter

from logsvc.doctor_findings import Finding
from logsvc.store import journal_records as jr
from logsvc.store.journal import JOURNAL_DIR_NAME
from logsvc.store.journal_recovery import JOURNAL_FILE_NAME
from logsvc.store.meta import META_FILE_NAME


def check_node_journal(data_dir: str, payload_bytes_max: int) -> list[Finding]:
    journal_dir = os.path.join(data_dir, JOURNAL_DIR_NAME)
    findings: list[Finding] = []
    if not os.path.isdir(journal_dir):
        return findings
    numbered = sorted(
        (int(m.group(1)), name)
        for name in os.listdir(journal_dir)
        if (m := JOURNAL_FILE_NAME.match(name))
    )
    counts: dict[str, Counter[str]] = {}
    for position, (file_seq, name) in enumerate(numbered):
        path = os.path.join(journal_dir, name)
        if position and file_seq != numbered[position - 1][0] + 1:
            findings.append(
                Finding(
                    "error", "journal_missing_file", path, "a journal file before it is missing"
                )
            )
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            findings.append(Finding("error", "journal_unreadable", path, str(exc)))
            continue
        newest = position == len(numbered) - 1
        try:
            scan = jr.scan_file(data, file_seq, newest=newest, payload_bytes_max=payload_bytes_max)
        except jr.TornHeader as torn:
            findings.append(
                Finding(
                    "warning",
                    "journal_torn_tail",
                    path,
                    f"newest journal file has a torn header ({torn}): deleted at open "
                    "(unacknowledged)",
                )
            )
            continue
        except jr.ScanCorruption as bad:
            findings.append(
                Finding(
                    "error",
                    "journal_corrupt",
                    path,
                    f"{bad.reason}: the node refuses to open",
                    offset_bytes=bad.offset_bytes,
                )
            )
            continue
        if scan.torn_reason is not None:
            findings.append(
                Finding(
                    "warning",
                    "journal_torn_tail",
                    path,
                    f"{scan.torn_reason}: {len(data) - scan.end_bytes} bytes would be cut at "
                    "open (unacknowledged tail)",
                    offset_bytes=scan.end_bytes,
                )
            )
        names: dict[int, str] = {}
        for record in scan.records:
            if record.rtype == jr.TYPE_ATTACH:
                names[record.store_id] = record.body.decode("utf-8")
                continue
            rel_path = names.get(record.store_id)
            if rel_path is None:
                findings.append(
                    Finding(
                        "error",
                        "journal_corrupt",
                        path,
                        f"record of store id {record.store_id}, which no ATTACH declared",
                        offset_bytes=record.offset_bytes,
                    )
                )
                break
            kind = {jr.TYPE_ENTRY: "entries", jr.TYPE_VOTE: "votes"}.get(
                record.rtype, "truncations"
            )
            counts.setdefault(rel_path, Counter())[kind] += 1
    for rel_path, counter in sorted(counts.items()):
        store_dir = os.path.join(data_dir, rel_path)
        what = ", ".join(f"{counter[k]} {k}" for k in ("entries", "votes", "truncations"))
        if not os.path.exists(os.path.join(store_dir, META_FILE_NAME)):
            findings.append(
                Finding(
                    "warning",
                    "journal_orphan_store",
                    store_dir,
                    f"the journal holds {what} of a store that no longer exists (replica "
                    "removed): skipped at open",
                )
            )
            continue
        findings.append(
            Finding(
                "info",
                "journal_pending_replay",
                store_dir,
                f"the node journal holds {what} not yet checkpointed into this store: "
                "replayed at open (the store's files are the older checkpoint)",
            )
        )
    return findings
