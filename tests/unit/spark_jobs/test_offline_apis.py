"""The read-only APIs added to the owning modules for offline readers (issue 16) report what
their owners' recovery would decide, without raising on damage and without writing.

* `logsvc.store.records.read_segment_records`: whole records with their stored checksums; a
  torn tail of the newest segment is END_TORN (what recovery cuts); a flipped byte in a
  sealed segment is END_CORRUPT at the record's offset with the records before it; the
  header walk (`verify=False`) lists the same records without checksums.
* `tae_driver.backends.segment.read_segment_frames`: the same for the file backend.
* `logsvc.shard.raft.entries.command_of_entry_offline`: the command bytes of a regular journal
  entry, None for pysyncobj's own entries, and `JournalEntryUndecodable` for a pickle that
  names a global (it is never executed). Importing it, or `spark_jobs.journal`, loads no
  pysyncobj (a fresh interpreter checks `sys.modules`): Spark executors never load it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from logsvc.shard.raft import entries as raft_entries
from logsvc.store import Entry, ShardStore
from logsvc.store import records as store_records
from tae_driver.backends import segment as file_segment
from tests.unit.spark_jobs.logs import write_file_wal


def journal_bytes(tmp_path: Path, payloads: list[bytes]) -> tuple[str, bytes]:
    store = ShardStore.open(str(tmp_path / "journal"))
    try:
        store.append([Entry(i + 1, 1, p) for i, p in enumerate(payloads)])
        store.sync()
    finally:
        store.close()
    [name] = [n for n in os.listdir(tmp_path / "journal") if n.endswith(".seg")]
    path = str(tmp_path / "journal" / name)
    return path, Path(path).read_bytes()


def test_store_records_clean_torn_and_corrupt(tmp_path: Path) -> None:
    _, data = journal_bytes(tmp_path, [b"a" * 10, b"b" * 20, b"c" * 30])
    clean = store_records.read_segment_records(data, 1, newest=True)
    assert clean.end == store_records.END_CLEAN
    assert [r.index for r in clean.records] == [1, 2, 3]
    assert [data[r.payload_offset_bytes : r.end_bytes] for r in clean.records][1] == b"b" * 20
    assert len(set(clean.checksums)) == 3
    walked = store_records.read_segment_records(data, 1, newest=True, verify=False)
    assert walked.records == clean.records and walked.checksums == clean.checksums

    torn = store_records.read_segment_records(data[:-5], 1, newest=True)
    assert torn.end == store_records.END_TORN
    assert [r.index for r in torn.records] == [1, 2]
    assert torn.end_offset_bytes == clean.records[2].offset_bytes

    damaged = bytearray(data)
    damaged[clean.records[1].payload_offset_bytes] ^= 0xFF
    corrupt = store_records.read_segment_records(bytes(damaged), 1, newest=False)
    assert corrupt.end == store_records.END_CORRUPT
    assert [r.index for r in corrupt.records] == [1]
    assert corrupt.end_offset_bytes == clean.records[1].offset_bytes
    assert corrupt.end_reason == "record checksum mismatch"
    # Without checksums the flipped payload byte goes unseen: the walk is a listing.
    unverified = store_records.read_segment_records(bytes(damaged), 1, newest=False, verify=False)
    assert [r.index for r in unverified.records] == [1, 2, 3]


def test_file_frames_clean_torn_corrupt(tmp_path: Path) -> None:
    write_file_wal(str(tmp_path / "wal"), [b"x" * 50, b"y" * 60], truncate_lsn=1)
    [name] = [n for n in os.listdir(tmp_path / "wal") if n.endswith(".seg")]
    path = str(tmp_path / "wal" / name)
    data = Path(path).read_bytes()
    clean = file_segment.read_segment_frames(data, path, newest=True)
    assert clean.end == file_segment.END_CLEAN
    kinds = [(f.frame.frame_type.name, f.frame.lsn) for f in clean.frames]
    assert kinds == [("RECORD", 1), ("RECORD", 2), ("TRUNCATE", 1)]
    # The frames end before the file does (format 3 preallocates zeros): cut inside them.
    torn = file_segment.read_segment_frames(data[: clean.end_offset - 3], path, newest=True)
    assert torn.end == file_segment.END_TORN
    assert len(torn.frames) == 2
    damaged = bytearray(data)
    damaged[clean.frames[0].offset + 30] ^= 1
    corrupt = file_segment.read_segment_frames(bytes(damaged), path, newest=False)
    assert corrupt.end == file_segment.END_CORRUPT
    assert corrupt.frames == () and corrupt.end_offset == clean.frames[0].offset
    assert corrupt.end_reason is not None
    assert corrupt.end_reason.startswith("frame checksum mismatch; valid frames follow it")
    # The same flip in the newest segment: frames follow it, so it is corruption there too.
    newest = file_segment.read_segment_frames(bytes(damaged), path, newest=True)
    assert newest.end == file_segment.END_CORRUPT


def test_offline_unwrapping_refuses_globals() -> None:
    regular = b"\x00" + pickle.dumps((7, (b"LSC-bytes",)), protocol=4)
    assert raft_entries.command_of_entry_offline(regular) == b"LSC-bytes"
    assert raft_entries.journal_entry_kind(regular) == raft_entries.JOURNAL_ENTRY_REGULAR
    assert raft_entries.command_of_entry_offline(b"\x01") is None
    assert raft_entries.journal_entry_kind(b"\x01") == raft_entries.JOURNAL_ENTRY_NOOP
    assert raft_entries.journal_entry_kind(b"\x02abc") == raft_entries.JOURNAL_ENTRY_MEMBERSHIP
    hostile = b"\x00" + pickle.dumps((7, (os.getcwd,)), protocol=4)  # names a global
    with pytest.raises(raft_entries.JournalEntryUndecodable, match="may not reference"):
        raft_entries.command_of_entry_offline(hostile)
    with pytest.raises(raft_entries.JournalEntryUndecodable, match="is not"):
        raft_entries.command_of_entry_offline(b"\x00" + pickle.dumps((7, ("text",)), protocol=4))


@pytest.mark.parametrize(
    "module", ["spark_jobs.journal", "logsvc.shard.raft.entries", "logsvc.shard.raft.config"]
)
def test_offline_readers_do_not_import_pysyncobj(module: str) -> None:
    probe = f"import sys, {module}; print(sorted(m for m in sys.modules if 'pysyncobj' in m))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.stdout.strip() == "[]", done.stdout
