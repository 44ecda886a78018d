"""A compute node's transaction, as the TN runs it: its snapshot and its operations in order
(issue 15 "commit a CN-prepared write set"; decision 0007).

Why operations, not a finished WAL entry: the CN prepared them against its copy of the state
at `start_ts`, but ids (databases, tables, blocks) and row placement are the TN's to decide,
and the TN must check them again (dedupe against its snapshot, conflicts with everything
committed since `start_ts`). So the TN opens a transaction at the CN's `start_ts` and runs
the same operations through the same `Transaction` code a local caller uses; a CN's commit
therefore has exactly the outcome it would have had on the TN. `(client_id, seq)` becomes
the entry's Origin command: a retry (after a lost answer or a TN failover) gets the first
outcome back instead of running twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from engine.errors import BadInput, SnapshotUnavailable
from engine.schema import Key, Schema

if TYPE_CHECKING:
    from engine.state import EngineState
    from engine.txn import Transaction


class WriteSetHost(Protocol):
    """What running a compute node's write set needs of the engine (engine/engine.py)."""

    @property
    def state(self) -> EngineState: ...

    @property
    def visible_ts(self) -> int: ...

    @property
    def history_floor_ts(self) -> int: ...

    @property
    def origins_running(self) -> dict[tuple[str, int], asyncio.Future[int]]: ...

    async def begin_at(self, start_ts: int) -> Transaction: ...


OP_KINDS = frozenset(
    {
        "create_database",
        "drop_database",
        "create_table",
        "drop_table",
        "insert",
        "delete",
        "update",
    }
)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: DDL by name, or rows of `database.table` (`rows` to insert, `keys` to
    delete or update with `values`)."""

    kind: str
    database: str
    table: str = ""
    schema: Schema | None = None
    rows: pa.Table | None = None
    keys: tuple[Key, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in OP_KINDS:
            raise BadInput(f"unknown operation {self.kind!r}")


@dataclass(frozen=True, slots=True)
class WriteSet:
    start_ts: int
    ops: tuple[Op, ...]
    client_id: str
    seq: int


async def execute(engine: WriteSetHost, write_set: WriteSet) -> int:
    """Run a compute node's transaction; its commit_ts (its start_ts when it wrote nothing).
    Raises what a local commit raises (WriteConflict, DuplicateKey, NotFound, ...), and
    `SnapshotUnavailable` when the TN no longer holds the snapshot it started from (retry
    the transaction from a newer one)."""
    origin = (write_set.client_id, write_set.seq)
    done = engine.state.origins.commit_ts(*origin)
    if done is not None:
        return done  # a retry of a commit that landed
    running = engine.origins_running.get(origin)
    if running is not None:
        return await asyncio.shield(running)  # the same commit, still on its way
    # The write set runs as its own task: a caller cancelled while the commit waits for the
    # WAL must not let a retry of the same origin run the write set a second time.
    task = asyncio.ensure_future(_run(engine, write_set))
    engine.origins_running[origin] = task

    def forget(finished: asyncio.Future[int]) -> None:
        if engine.origins_running.get(origin) is finished:
            del engine.origins_running[origin]
        if not finished.cancelled():
            finished.exception()  # retrieved: nobody may be waiting any more

    task.add_done_callback(forget)
    return await asyncio.shield(task)


async def _run(engine: WriteSetHost, write_set: WriteSet) -> int:
    start_ts = write_set.start_ts
    floor = engine.history_floor_ts
    if not floor <= start_ts <= engine.visible_ts:
        raise SnapshotUnavailable(
            f"a transaction from {start_ts}: this engine holds snapshots in "
            f"[{floor}, {engine.visible_ts}]; start it again"
        )
    txn = await engine.begin_at(start_ts)
    txn.origin = (write_set.client_id, write_set.seq)
    try:
        for op in write_set.ops:
            await _apply(txn, op)
    except BaseException:
        await txn.rollback()
        raise
    await txn.commit()
    commit_ts: int | None = txn.commit_ts
    assert commit_ts is not None
    return commit_ts


async def _apply(txn: Any, op: Op) -> None:
    if op.kind == "create_database":
        await txn.create_database(op.database)
    elif op.kind == "drop_database":
        await txn.drop_database(op.database)
    elif op.kind == "create_table":
        if op.schema is None:
            raise BadInput("create_table without a schema")
        await txn.create_table(op.database, op.table, op.schema)
    elif op.kind == "drop_table":
        await txn.drop_table(op.database, op.table)
    else:
        table = txn.table(op.database, op.table)
        if op.kind == "insert":
            if op.rows is None:
                raise BadInput("insert without rows")
            rows: object = op.rows
            batches = op.rows.to_batches()
            if len(batches) == 1:
                # One batch (what the TN protocol decodes) takes `to_batch`'s fast path when
                # its schema is the table's; a Table always took the general conversion.
                rows = batches[0]
            await table.insert(rows)
        elif op.kind == "delete":
            await table.delete(list(op.keys))
        else:
            await table.update(list(op.keys), op.values)
