"""`SnapshotPoints`, a part of `adapter.ShardRaft`: pysyncobj's log compaction replaced by
compaction at the state machine's snapshot points only (hole 6), and its snapshot load by
one that makes a bad snapshot fatal and resets the journal to it (hole 4)."""

from __future__ import annotations

import logging

from logsvc.shard import snapshot_file
from logsvc.shard.raft.adapter_base import AdapterBase
from logsvc.shard.raft.config import FailReason, RaftFatal
from logsvc.shard.raft.snapshot_transfer import _make_durable, _write_durably

log = logging.getLogger("logsvc.raft")


class SnapshotPoints(AdapterBase):
    """The compaction and snapshot-load part of `ShardRaft` (mixed in; no state of its own)."""

    def _SyncObj__tryLogCompaction(self) -> None:
        point = self._logsvc_handler.compaction_point()
        if point is None:
            return
        raft_index, state = point
        store = self._logsvc_journal.store
        if raft_index <= self._logsvc_compacted_at or raft_index - 1 <= store.first_index:
            return
        if raft_index > self._SyncObj__raftLastApplied:
            return
        journal = self._logsvc_journal
        last, prev = journal.entry(raft_index), journal.entry(raft_index - 1)
        nodes = set(self._SyncObj__otherNodes)
        if self._SyncObj__selfNode is not None:  # None: a learner
            nodes.add(self._SyncObj__selfNode)
        cluster = tuple(sorted(node.id for node in nodes))
        if journal.membership is not None:  # the configuration as of the snapshot's entry
            cluster = journal.membership.members_at(raft_index)
        data = snapshot_file.encode(
            snapshot_file.SnapshotFile(
                last=snapshot_file.JournalEntry(last[1], last[2], bytes(last[0])),
                prev=snapshot_file.JournalEntry(prev[1], prev[2], bytes(prev[0])),
                cluster=cluster,
                state=state,
            )
        )
        _write_durably(self._logsvc_fs, self._logsvc_snapshot_path, data)
        for node in self._SyncObj__otherNodes:
            self._SyncObj__serializer.cancelTransmisstion(node)
        journal.deleteEntriesTo(raft_index - 1 - store.first_index)
        self._logsvc_compacted_at = raft_index
        log.info(
            "compacted the journal to raft index %d (snapshot point)",
            raft_index,
            extra={"term": self.raftCurrentTerm},
        )

    def _logsvc_answer_skipped_waiters(self, applied_upto: int) -> None:
        """Answer UNKNOWN_OUTCOME to every command waiting for an entry at or below
        `applied_upto`, which a snapshot just applied in one step.

        pysyncobj answers a command when its entry is applied (SUCCESS, or DISCARDED if
        another term's entry was applied there) and never otherwise: a snapshot install
        skips the entries it covers, so their waiters were never answered. They were a
        cut-off leader's proposals (chaos C4: the minority's stale leader of one partition
        got the snapshot at the heal, then won the next election): each held one of the
        shard's proposals_inflight_per_shard_max slots until proposal_timeout_ms (10 s),
        so the new leader proposed nothing, not even the barrier of a status, and served
        nothing for seconds. Whether the snapshot holds that command is unknown here (it
        has no terms for the entries it replaces), hence UNKNOWN_OUTCOME: the client
        retries, and the shard's deduplication returns the first outcome if it was
        committed (pysyncobj answers a forwarded command overtaken by a snapshot the
        same way)."""
        waiting = self._SyncObj__commandsWaitingCommit
        for index in sorted(i for i in waiting if i <= applied_upto):
            for _term, callback in waiting.pop(index):
                callback(None, FailReason.UNKNOWN_OUTCOME)

    # -- hole 4: a snapshot that cannot be loaded is fatal ----------------------------------

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        path = self._logsvc_snapshot_path
        try:
            data = self._logsvc_fs.read_file(path)
            snapshot = snapshot_file.decode(data)
            # A received snapshot must be durable before we rely on it.
            _make_durable(self._logsvc_fs, path)
        except (OSError, snapshot_file.SnapshotFileCorrupt) as exc:
            raise RaftFatal(f"cannot load the snapshot {path}: {exc}") from exc
        journal = self._logsvc_journal
        store = journal.store
        last, prev = snapshot.last, snapshot.prev
        have_last = store.first_index <= last.index <= store.last_index and (
            journal.entry(last.index)[2] == last.term
        )
        if have_last:
            # Raft §7: our log already holds the snapshot's last entry: keep what follows.
            if store.first_index < prev.index:
                journal.deleteEntriesTo(prev.index - store.first_index)
        else:
            # Raft §7: a snapshot holds committed state only, so a journal that lacks its
            # last entry (shorter, or conflicting there) is replaced by it. At start
            # (clearJournal False) this is a follower killed after it made a received
            # snapshot durable but before it reset its journal: refusing to start would
            # leave the replica down for good (found by the chaos suite's review).
            if not clearJournal:
                log.warning(
                    "the snapshot at raft index %d is ahead of the journal [%d, %d]: "
                    "finishing its installation (the journal is reset to it)",
                    last.index,
                    store.first_index,
                    store.last_index,
                )
            # The configuration first, durably, then the log: a crash between the two
            # leaves a members file naming the snapshot's configuration over a log that
            # lacks its entry, and the restart (node.py `_snapshot_to_finish`) installs
            # the durable snapshot again without validating that file. The other order
            # could leave the snapshot's entries in the log under the old configuration,
            # which a restart would take as the log's (chaos C8, seed 2, found the
            # journal-first order's window the other way: a restart that refused to start).
            if journal.membership is not None:
                journal.membership.on_reset(last.index, last.term, snapshot.cluster)
            journal.install_snapshot_entries(prev, last)
        self._logsvc_handler.install_snapshot(last.index, snapshot.state)
        self._SyncObj__raftLastApplied = last.index
        self._logsvc_answer_skipped_waiters(last.index)
        self._logsvc_compacted_at = max(self._logsvc_compacted_at, last.index)
        if self._SyncObj__raftCommitIndex < last.index:
            self._SyncObj__raftCommitIndex = last.index
        if journal.membership is not None:
            # Our own log's configuration (a snapshot we already had the entries of may
            # carry an older one).
            self._logsvc_follow_membership()
        else:
            self._SyncObj__updateClusterConfiguration(
                [node for node in snapshot.cluster if node != self._SyncObj__selfNode.id]
            )
        self._SyncObj__onSetCodeVersion(0)
        log.info(
            "installed the snapshot at raft index %d",
            last.index,
            extra={"term": self.raftCurrentTerm},
        )
