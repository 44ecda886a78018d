"""The shard store: checksummed segment files, group-commit fsync, torn-tail repair and
prefix truncation. It is the Raft journal of one shard replica (ARCHITECTURE.md §1, §3).

Format: FORMAT.md beside this file. Entry point: `ShardStore.open(dir_path)`.
"""

from logsvc.store.errors import (
    Compacted,
    Corruption,
    DiskFull,
    EntryTruncated,
    RecordTooLarge,
    StoreClosed,
    StoreError,
    StoreFailed,
    StoreIOError,
    StoreLocked,
    SyncTimeout,
)
from logsvc.store.limits import DEFAULT_LIMITS, StoreLimits
from logsvc.store.records import Entry
from logsvc.store.store import ShardStore, StoreStats

__all__ = [
    "DEFAULT_LIMITS",
    "Compacted",
    "Corruption",
    "DiskFull",
    "Entry",
    "EntryTruncated",
    "RecordTooLarge",
    "ShardStore",
    "StoreClosed",
    "StoreError",
    "StoreFailed",
    "StoreIOError",
    "StoreLimits",
    "StoreLocked",
    "StoreStats",
    "SyncTimeout",
]
