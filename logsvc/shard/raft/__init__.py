"""A shard replica's Raft: pysyncobj 0.3.17 made durable (docs/decisions/0001, 0005).

pysyncobj 0.3.17 runs elections, replication, membership and leader transfer for a shard.
As shipped it is not crash-safe (shared/reference/pysyncobj.md §8.4). This package closes
each hole that applies to our design through pysyncobj's extension points, and where that is
not enough, by overriding a private method in `adapter.ShardRaft`, against the pinned version
only (asserted at import). Each fix is named where it is made and has a test that fails on
stock behaviour (tests/unit/shard/test_raft_fixes.py).

Hole (pysyncobj.md §8.4)                 Fix
1/2 no fsync; acks before durability      `StoreJournal` writes into the shard store; the
                                           transport holds every next_node_idx, request_vote
                                           and response_vote until one store.sync() after the
                                           tick (group commit); the leader's own sync runs
                                           beside the tick (scheduler's syncer) and its
                                           commit count takes it only up to its durable
                                           index (`_logsvc_count_durable_leader`)
(term/vote)                               `setCurrentTerm` held, then `store.save_vote`
                                           (once per tick) before anything is sent: the
                                           tick's flush, or a send that is not held
3 nextIndex rewind, blind truncation      `_on_message`: a late success ack never moves
                                           nextIndex back, a refusal never moves it forward
                                           (stock could livelock a lagging follower with a
                                           conflicting suffix); an AppendEntries is trimmed to its
                                           first conflicting entry so a follower deletes only
                                           on a term conflict, and its commit index never
                                           passes what the leader vouched for (a snapshot
                                           chunk vouches for nothing until installed)
4 dump load errors swallowed              `_SyncObj__loadDumpFile` replaced: a bad snapshot
                                           is fatal; a compacted journal without its snapshot
                                           refuses to start; the snapshot file is shipped,
                                           received and found through the file-system port
                                           (`_SnapshotTransfer`), a received one durably
5 state-init race, creator-thread ticks    autoTick off; ticks driven by the node's
                                           scheduler (scheduler.py: a few worker threads
                                           for every shard, pysyncobj's poller replaced
                                           by the worker's epoll; docs/decisions/0005-...)
6 in-place compaction, all in RAM          pysyncobj compaction off; compaction only at
                                           snapshot points (docs/decisions/0001-...)
10 pickle RCE without password            the cluster secret is mandatory; messages are
                                           sealed with it by `MessageSealer` (AES-GCM, a
                                           key per sender) instead of pysyncobj's Fernet
                                           (docs/decisions/0003-raft-seal.md)
13 commit index hint                      never persisted: it restarts at the log start and
                                           is relearned from the leader (clamped by design)
(listener)  closed for good by one failed   `listener.SteadyServer`: a failed accept
accept (EMFILE...) or error event           (EMFILE when descriptors run out...) is logged
                                           and costs that attempt only; an error event on
                                           the listening socket binds it again
Quiescence (quiescence.py, liveness.py; 0005): an idle shard's leader and followers agree
to stop heartbeats and election timers; our own messages (`logsvc_quiesce`, its ack,
`logsvc_alive` for node liveness) ride on the shard's Raft connection and never reach
pysyncobj; any Raft message, proposal or connection change wakes the shard, and a quiet
follower whose leader's node lapses times out exactly as an active one would.
Membership "one change at a time" is serialized by the replica (replica.py).
Membership across restarts: the log's configuration is kept in a members file and
pysyncobj's follows it (membership.py; docs/decisions/0002-membership.md).

Modules, by concern (import the one you need; this package re-exports nothing, so that a
reader of journal files does not load pysyncobj):

- `config`: `RaftConfig`, `RaftHandler`, `FailReason`, `RaftFatal` (no pysyncobj).
- `entries`: the journal entry format for offline readers (no pysyncobj).
- `patches`: the import-time patches of pysyncobj and the simulator's clock seam.
- `journal`: `StoreJournal`, pysyncobj's journal over the shard store.
- `transport`: the durable transport (replies after the tick's sync) and `_DialNode`.
- `listener`: the Raft listener a failed accept does not close.
- `snapshot_transfer`: the snapshot file shipped, received and written durably.
- `chunks`: a large entry's AppendEntries chunks reassembled before the checks.
- `adapter`: `ShardRaft`, the one class that reaches into pysyncobj's privates, assembled
  from its parts by concern: `adapter_base` (the shared state, our message kinds),
  `message_fixes`, `elections`, `quiet`, `snapshot_points` (only these and `listener`
  touch them).
- `node`: `RaftNode`, what the replica and the scheduler drive.
"""
