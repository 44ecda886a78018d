"""A shard replica's Raft: pysyncobj 0.3.17 made durable (docs/decisions/0001, 0005).

Modules, by concern (import the one you need; this package re-exports nothing, so that a
reader of journal files does not load pysyncobj):

- `config`: `RaftConfig`, `RaftHandler`, `FailReason`, `RaftFatal` (no pysyncobj).
- `entries`: the journal entry format for offline readers (no pysyncobj).
- `patches`: the import-time patches of pysyncobj and the simulator's clock seam.
- `journal`: `StoreJournal`, pysyncobj's journal over the shard store.
- `transport`: the durable transport (replies after the tick's sync) and `_DialNode`.
- `snapshot_transfer`: the snapshot file shipped, received and written durably.
- `adapter`: `ShardRaft`, the one class that reaches into pysyncobj's privates.
- `node`: `RaftNode`, what the replica and the scheduler drive.
"""
