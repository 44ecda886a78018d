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

Modules, by the noun each holds: `engine` (the asyncio shell), `core` (the engine's state and
what the modules it hosts may do with it), `txn` (transactions), `workspace` (a transaction's
writes), `snapshot_reads`, `pipeline` (the commit pipeline core), `conflicts` (the conflict index),
`catalog`, `storage` (a table's blocks and versions), `state` (applying committed entries),
`clock` (hybrid logical clock), `schema`, `wal/` (entries and their codec, FORMAT.md),
`sync` (SyncEngine), `cli` (`python -m engine`), `history` (commits from the WAL), `bench`,
`limits`, `errors`.

New rows live in L0 blocks in memory; full or old blocks are flushed to objects (a directory
beside the WAL, or S3), merged and compacted by background transactions, and checkpoints write
the state to objects and truncate the WAL below them (decision 0006). A restart reads the
newest checkpoint, then replays the WAL after it.
"""

from typing import TYPE_CHECKING, Any

from engine.checkpoint.errors import CheckpointDamaged
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
    SqlError,
    SqlUnavailable,
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

if TYPE_CHECKING:
    from engine.engine import Engine, EngineStats
    from engine.schema import Column, Schema
    from engine.sync import SyncEngine
    from engine.txn import TableHandle, Transaction, TxnState

# The engine itself (pyarrow, numpy, the storage and the WAL driver) is imported on first
# use, not by `import engine`: a tool that needs one submodule (`engine.clock`,
# `engine.wal.codec` in a Spark worker, a CLI's argument parsing) starts ~0.5 s sooner.
_LAZY = {
    "Engine": "engine.engine",
    "EngineStats": "engine.engine",
    "Column": "engine.schema",
    "Schema": "engine.schema",
    "SyncEngine": "engine.sync",
    "TableHandle": "engine.txn",
    "Transaction": "engine.txn",
    "TxnState": "engine.txn",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
    "SqlError",
    "SqlUnavailable",
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


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
