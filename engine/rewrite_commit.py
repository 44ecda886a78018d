"""The commit of a flush, merge or compaction (decision 0006), and the re-resolution of a
user transaction's deletes of rows such a rewrite moved.

Why apart from engine.py: these are the two places where the commit pipeline meets the
storage's row moves; both run inside the pipeline's synchronous prepare step (nothing else
can be prepared in between), which is what makes the carried deletes exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pyroaring import BitMap, FrozenBitMap

from engine import conflicts
from engine.catalog import TableEntry
from engine.clock import HybridClock
from engine.compaction import Rewrite, Task, WrittenBlock
from engine.errors import Overloaded, TxnTooLarge, WalFailed
from engine.pipeline import CommitPipeline, Ticket
from engine.schema import Key
from engine.state import EngineState
from engine.storage import TS_NEVER
from engine.storage.moves import Move
from engine.waiter import CommitWaiter
from engine.wal.entry import CreateBlock, Delete, DeletedKeys, DropBlock, TxnEntry, memo_of


class RewriteHost(Protocol):
    """What a rewrite's commit needs of the engine (engine/engine.py implements it)."""

    @property
    def state(self) -> EngineState: ...

    @property
    def accepts_commits(self) -> bool: ...

    @property
    def visible_ts(self) -> int: ...

    @property
    def pipeline(self) -> CommitPipeline[CommitWaiter]: ...

    @property
    def clock(self) -> HybridClock: ...

    def submit_commit(
        self, ticket: Ticket[CommitWaiter], entry: TxnEntry, undo: Callable[[], None]
    ) -> None:
        """The engine's one submit (`Engine.submit_commit`): on failure `undo` runs, the
        ticket is cancelled and a typed error raised."""
        ...


def resolve_moved(tables: Mapping[int, TableEntry], deletes: list[Delete]) -> list[Delete] | None:
    """`deletes` with rows of blocks a rewrite moved re-resolved to where they are now
    (decision 0006); None when one did not survive the move. Runs after the conflict
    check, which proved no other commit wrote those keys since the snapshot."""
    if not any(d.block_id in tables[d.table_id].data.moves for d in deletes):
        return deletes
    merged: dict[tuple[int, int, int], BitMap] = {}
    keys: dict[tuple[int, int, int], dict[int, Key]] = {}
    key_columns: dict[int, tuple[tuple[str, str], ...]] = {}
    for delete in deletes:
        moves = tables[delete.table_id].data.moves
        if delete.keys is not None:  # each row's key goes where the row went
            key_columns[delete.table_id] = delete.keys.columns
            for offset, key in zip(delete.rows, delete.keys.values, strict=True):
                place = moves.resolve_row(delete.block_id, offset)
                if place is None:
                    return None
                target = (delete.db_id, delete.table_id, place[0])
                merged.setdefault(target, BitMap()).add(place[1])
                keys.setdefault(target, {})[place[1]] = key
            continue
        where = moves.resolve(delete.block_id, BitMap(delete.rows))
        if where is None:
            return None
        for block_id, rows in where.items():
            merged.setdefault((delete.db_id, delete.table_id, block_id), BitMap()).update(rows)
    resolved = []
    for target, rows in sorted(merged.items()):
        db_id, table_id, block_id = target
        known = keys.get(target, {})
        deleted = None
        if len(known) == len(rows):  # a transaction logs keys for all its deletes or none
            deleted = DeletedKeys(key_columns[table_id], tuple(known[row] for row in rows))
        resolved.append(Delete(db_id, table_id, block_id, FrozenBitMap(rows), deleted))
    return resolved


async def commit_rewrite(
    engine: RewriteHost,
    task: Task,
    start_ts: int,
    rewrite: Rewrite,
    outputs: Sequence[WrittenBlock],
) -> int | None:
    """Commit a flush, merge or compaction whose objects are written (decision 0006):
    the outputs enter, the inputs leave, and the deletes committed on the inputs since
    `start_ts` (applied, or still queued in the pipeline) are carried onto the outputs.
    Returns its commit_ts, or None when it no longer applies (the table or an input is
    gone, the engine failed): the caller deletes the objects."""
    table = engine.state.catalog.tables.get(task.table_id)
    if not engine.accepts_commits:
        return None
    if table is None or not table.visible(engine.visible_ts):
        return None
    data = table.data
    inputs = [data.blocks.get(block_id) for block_id in task.inputs]
    for block in inputs:
        if block is None or block.drop_ts != TS_NEVER or block.block_id in data.moves:
            return None
    loop = asyncio.get_running_loop()
    commit = CommitWaiter(None, loop.create_future())
    pipeline = engine.pipeline
    guards = (
        conflicts.catalog_table_drop(table.table_id),
        conflicts.catalog_db_drop(table.db_id),
    )
    prepared = pipeline.prepare(start_ts, (), guards, (), engine.clock.next, commit)
    if not isinstance(prepared, Ticket):
        return None
    ticket = prepared
    mark = data.reservation()
    output_ids = data.allocate_block_ids(len(outputs))
    deleted: dict[int, BitMap] = {}
    for block in inputs:
        assert block is not None
        for _, rows in block.deletes.since(start_ts):
            deleted.setdefault(block.block_id, BitMap()).update(rows)
    for queued in pipeline.queued():
        if queued is ticket:
            continue
        assert queued.waiter.entry is not None
        for cmd in queued.waiter.entry.commands:
            if (
                type(cmd) is Delete
                and cmd.table_id == table.table_id
                and cmd.block_id in task.inputs
            ):
                deleted.setdefault(cmd.block_id, BitMap()).update(cmd.rows)
    carried = rewrite.carried(deleted)
    commands: list[Any] = []
    for block_id, out in zip(output_ids, outputs, strict=True):
        commands.append(
            CreateBlock(
                table.db_id,
                table.table_id,
                block_id,
                task.level,
                out.object_name,
                out.row_group,
                out.rows,
            )
        )
        engine.state.pending_meta[(out.object_name, out.row_group)] = out.meta
    # Without keys: a carried delete repeats deletes logged before (with their keys, issue
    # 23); the change stream gives a rewrite's entry no change.
    for index, carried_rows in sorted(carried.items()):
        commands.append(
            Delete(table.db_id, table.table_id, output_ids[index], FrozenBitMap(carried_rows))
        )
    commands.extend(DropBlock(table.db_id, table.table_id, b) for b in task.inputs)
    for block_id in task.inputs:
        data.moves.register(block_id, Move(rewrite.positions[block_id], output_ids))
    entry = TxnEntry(start_ts, ticket.commit_ts, memo_of(commands), tuple(commands))

    def undo() -> None:
        for block_id in task.inputs:
            data.moves.forget(block_id)
        for out in outputs:
            engine.state.pending_meta.pop((out.object_name, out.row_group), None)
        data.restore(mark)

    try:
        engine.submit_commit(ticket, entry, undo)
    except (Overloaded, TxnTooLarge, WalFailed):
        return None  # not submitted (the WAL's intake is full, or it failed): abandoned
    await commit.future
    return ticket.commit_ts
