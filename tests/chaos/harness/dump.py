"""Read one shard replica's log OFFLINE into a `ReplicaDump` (shared/reference/chaos-plan.md
§4.7 "Final dumps"), with the product's own readers only.

How:
1. Copy the replica's directory (`journal/` and `snapshot`) to a temporary directory, and
   open the copy. `ShardStore.open` WRITES during recovery (it deletes `meta.tmp`, cuts a
   torn tail, deletes segments below the log start, fsyncs, creates `LOCK`), so the real
   directory is never opened: the dump changes nothing, and a later restart of the node
   still sees exactly what the node left.
2. Rebuild the shard state machine as the replica would on start: restore it from the Raft
   snapshot if there is one (the state at its raft index T; the journal must then hold T
   with the snapshot's term, as `ShardRaft._SyncObj__loadDumpFile` requires), then apply
   every journal entry after T (from the log start without a snapshot; the journal must
   then start at raft index 1) in raft-index order: `raft.command_of_entry` (pysyncobj's
   own no-op and membership entries are skipped) -> `decode_command` ->
   `ShardStateMachine.apply`. LSNs are thus assigned by the product's code, AppendGroups
   and refused batches included, and `first_lsn` is the state machine's after every
   applied truncation.
3. Read `[first_lsn, next_lsn)` like `ShardReplica.read`: `locate(lsn)` -> the entry ->
   `decode_entry_records` -> the slice.

Caveat: the commit index is never persisted (pysyncobj hole 13), so the dump applies every
entry in the journal, committed or not. Dump after the cluster converged (the harness heals
and waits first), or pass `raft_index_max` (e.g. a commit index read from the node's status
before it was stopped) to stop there.

Damage: whatever the product's readers refuse (recovery's `Corruption`, a snapshot that does
not decode or restore, a journal that does not match the snapshot, a record that fails its
checksum on read, an undecodable command) is listed in `corruptions`, and nothing damaged
is ever returned. If the store does not open at all (as the node would refuse to), the dump
holds no records; if damage is met while replaying or reading, the records before it are
kept (a prefix of the replica's log) and replay stops there.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from logsvc.shard import snapshot_file
from logsvc.shard.commands import decode_command, decode_entry_records
from logsvc.shard.errors import CommandCorrupt, LsnNotAssigned, ShardError
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits
from logsvc.shard.raft import journal as raft_journal
from logsvc.shard.state_machine import ShardStateMachine
from logsvc.store import Corruption, ShardStore, StoreError, StoreLimits
from logsvc.store import records as store_records
from tests.chaos.history import ReplicaDump

# The reader accepts any record the format allows (a node may run with a higher limit than
# the default); the store's other limits only size caches.
DUMP_STORE_LIMITS = StoreLimits(record_payload_bytes_max=store_records.PAYLOAD_BYTES_LIMIT)
READ_CHUNK_BYTES = 4 * 1024 * 1024


class _Damaged(Exception):
    """Replay or read met damaged data: stop and report it."""


def dump_replica(
    shard_data_dir: str,
    node_id: str,
    shard: int,
    *,
    shard_limits: ShardLimits = DEFAULT_SHARD_LIMITS,
    raft_index_max: int | None = None,
) -> ReplicaDump:
    """The replica's log as `ReplicaDump`. `shard_data_dir` holds `journal/` and `snapshot`
    (`NodeConfig.shard_data_dir(shard)`, i.e. `<node data_dir>/shards/<shard>`). The node
    must not be running. `shard_limits` must be the node's (they bound decoding)."""
    with tempfile.TemporaryDirectory(prefix="logsvc-dump-") as scratch:
        journal = os.path.join(shard_data_dir, "journal")
        if os.path.isdir(journal):
            shutil.copytree(journal, os.path.join(scratch, "journal"))
        snapshot_path = os.path.join(shard_data_dir, "snapshot")
        copied_snapshot = None
        if os.path.isfile(snapshot_path):
            copied_snapshot = os.path.join(scratch, "snapshot")
            shutil.copyfile(snapshot_path, copied_snapshot)
        return _dump_copy(scratch, copied_snapshot, node_id, shard, shard_limits, raft_index_max)


def _dump_copy(
    scratch: str,
    snapshot_path: str | None,
    node_id: str,
    shard: int,
    limits: ShardLimits,
    raft_index_max: int | None,
) -> ReplicaDump:
    corruptions: list[str] = []
    try:
        store = ShardStore.open(os.path.join(scratch, "journal"), limits=DUMP_STORE_LIMITS)
    except Corruption as exc:
        return ReplicaDump(node_id, shard, 1, 0, (), (_strip(str(exc), scratch),))
    try:
        machine = ShardStateMachine(limits)
        try:
            after = _restore_snapshot(store, snapshot_path, machine, limits)
            machine = after[1]
            _replay(store, machine, after[0] + 1, raft_index_max, limits)
        except _Damaged as exc:
            corruptions.append(_strip(str(exc), scratch))
        out, damage = _read_records(store, machine, limits)
        if damage is not None:
            corruptions.append(_strip(damage, scratch))
    finally:
        store.close()
    first_lsn = machine.first_lsn
    return ReplicaDump(
        node_id,
        shard,
        first_lsn,
        first_lsn + len(out) - 1,
        tuple(out),
        tuple(corruptions),
    )


def _strip(text: str, scratch: str) -> str:
    """Name files by their place in the replica's directory, not the temporary copy."""
    return text.replace(scratch + os.sep, "")


def _restore_snapshot(
    store: ShardStore, snapshot_path: str | None, fresh: ShardStateMachine, limits: ShardLimits
) -> tuple[int, ShardStateMachine]:
    """(raft index the machine is at, the machine) before the journal is replayed."""
    if snapshot_path is None:
        if store.first_index > 1:
            raise _Damaged(
                f"the journal starts at raft index {store.first_index} but there is no "
                "snapshot (the node refuses to start)"
            )
        return store.first_index - 1, fresh
    with open(snapshot_path, "rb") as f:
        data = f.read()
    try:
        snapshot = snapshot_file.decode(data)
        machine = ShardStateMachine.restore(snapshot.state, limits)
    except (snapshot_file.SnapshotFileCorrupt, ShardError) as exc:
        raise _Damaged(f"snapshot: {exc}") from None
    last = snapshot.last
    try:
        have_last = (
            store.first_index <= last.index <= store.last_index
            and store.term_at(last.index) == last.term
        )
    except StoreError as exc:
        raise _Damaged(f"journal at the snapshot's raft index {last.index}: {exc}") from None
    if not have_last:
        raise _Damaged(
            f"snapshot at raft index {last.index} (term {last.term}) does not match the "
            f"journal [{store.first_index}, {store.last_index}] (the node refuses to start)"
        )
    return last.index, machine


def _replay(
    store: ShardStore,
    machine: ShardStateMachine,
    lo: int,
    raft_index_max: int | None,
    limits: ShardLimits,
) -> None:
    hi = store.last_index + 1
    if raft_index_max is not None:
        hi = min(hi, raft_index_max + 1)
    while lo < hi:
        try:
            chunk = store.read(lo, hi, READ_CHUNK_BYTES)
        except StoreError as exc:
            raise _Damaged(f"journal read at raft index {lo}: {exc}") from None
        if not chunk:
            return
        for entry in chunk:
            command_bytes = raft_journal.command_of_entry(entry.payload)
            if command_bytes is None:
                continue  # pysyncobj's own entry (no-op, membership)
            try:
                command = decode_command(command_bytes, limits)
            except CommandCorrupt as exc:
                raise _Damaged(f"raft index {entry.index}: undecodable command: {exc}") from None
            machine.apply(entry.index, command)
        lo = chunk[-1].index + 1


def _read_records(
    store: ShardStore, machine: ShardStateMachine, limits: ShardLimits
) -> tuple[list[tuple[int, bytes]], str | None]:
    """Every retained record `[first_lsn, next_lsn)` with its LSN, as the read path finds
    it; stops at the first damaged entry and says why."""
    out: list[tuple[int, bytes]] = []
    lsn = machine.first_lsn
    while True:
        try:
            where = machine.locate(lsn)
        except LsnNotAssigned:
            return out, None
        try:
            [entry] = store.read(where.raft_index, where.raft_index + 1, 0)
            command_bytes = raft_journal.command_of_entry(entry.payload)
            assert command_bytes is not None, f"raft index {where.raft_index} holds no command"
            flat = decode_entry_records(command_bytes, limits)
        except (StoreError, CommandCorrupt) as exc:
            return out, f"LSN {lsn} at raft index {where.raft_index}: {exc}"
        for record in flat[where.offset : where.stop]:
            out.append((lsn, record))
            lsn += 1
