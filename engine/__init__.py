"""The TAE engine: a catalog, MVCC transactions with snapshot isolation and a commit pipeline
whose write-ahead log goes through `tae_driver` to a local file log or a logsvc shard.

    from engine import Engine, Schema, Column, WriteConflict, DuplicateKey, SchemaError

    eng = await Engine.open("DIR")                                    # WAL in DIR/wal
    eng = await Engine.open("DIR", wal="logsvc", client_config="client.toml", shard=1)
    async with eng.transaction() as txn:
        await txn.create_database("shop")
        await txn.create_table("shop", "orders", Schema(
            [Column("id", "int64"), Column("amount", "float64")], primary_key=["id"]))
    async with eng.transaction() as txn:
        await txn.table("shop", "orders").insert([{"id": 1, "amount": 9.5}])
    await eng.close()

Modules, by the noun each holds: `engine` (the asyncio shell), `txn` (transactions and their
workspace), `pipeline` (the commit pipeline core), `conflicts` (the conflict index),
`catalog`, `storage` (a table's blocks and versions), `state` (applying committed entries),
`clock` (hybrid logical clock), `schema`, `wal/` (entries and their codec, FORMAT.md),
`sync` (SyncEngine), `cli` (`python -m engine`), `bench`, `limits`, `errors`.

Table data lives in memory until issue 14 (column blocks on an object store, checkpoints): a
restart rebuilds it by replaying the whole WAL, which is never truncated yet.
"""

from engine.checkpoint.errors import CheckpointDamaged
from engine.engine import Engine, EngineStats
from engine.errors import (
    AlreadyExists,
    BadInput,
    DuplicateKey,
    EngineClosed,
    EngineError,
    EngineLocked,
    Fenced,
    NotAnEngine,
    NotFound,
    OpenFailed,
    OutcomeUnknown,
    Overloaded,
    SchemaError,
    SnapshotUnavailable,
    StandbyFailed,
    TimestampInFuture,
    TxnClosed,
    TxnError,
    TxnTooLarge,
    WalCorruption,
    WalFailed,
    WriteConflict,
)
from engine.limits import TxnLimits
from engine.schema import Column, Schema
from engine.sync import SyncEngine
from engine.txn import TableHandle, Transaction, TxnState

__all__ = [
    "AlreadyExists",
    "BadInput",
    "CheckpointDamaged",
    "Column",
    "DuplicateKey",
    "Engine",
    "EngineClosed",
    "EngineError",
    "EngineLocked",
    "EngineStats",
    "Fenced",
    "NotAnEngine",
    "NotFound",
    "OpenFailed",
    "OutcomeUnknown",
    "Overloaded",
    "Schema",
    "SchemaError",
    "SnapshotUnavailable",
    "StandbyFailed",
    "SyncEngine",
    "TableHandle",
    "TimestampInFuture",
    "Transaction",
    "TxnClosed",
    "TxnError",
    "TxnLimits",
    "TxnState",
    "TxnTooLarge",
    "WalCorruption",
    "WalFailed",
    "WriteConflict",
]
