"""A commit whose snapshot is below the conflict index's floor, checked exactly against the
table data instead of refused (issue 21, "A cliff under concurrency").

Why: the conflict index forgets the oldest row changes when it holds more than `keys_max`
keys (its memory stays bounded however long a transaction stays open) and raises its floor
past them. A transaction that started below the floor used to be refused ("snapshot too
old", a WriteConflict) even when no key it wrote had changed: under snapshot isolation it
must commit. The table data remembers every change a snapshot at `start_ts` could conflict
with (`TableData.last_change_after`: versions keep their commit_ts through flushes and
merges; deletes stay on blocks held while the snapshot is open). So the commit asks it, for
each key it wrote, up to the visible timestamp, and the index answers for what is newer
(queued commits, above the visible timestamp, are never forgotten). Only for a transaction
that began at or above the engine's `_history_floor_ts` (every transaction begun here: blocks
dropped after an open snapshot are not collected); below it, changes may be gone with
collected blocks or a checkpoint restore, and the commit stays refused as too old.

The loads (keys and `__commit_ts` of the blocks that may hold a key) run in a worker thread;
the check itself is synchronous at the end, and the caller prepares the commit right after
it returns, with no suspension in between: nothing becomes visible meanwhile, so "checked up
to `visible_ts`" still holds when the index takes over. A block that appeared during the load
(a flush of one of the keys) is loaded in one more round; the rounds are bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

from engine.conflicts import BulkInsert, KeyConflict, RowWrite
from engine.errors import WriteConflict
from engine.objects.blockfile import COMMIT_TS_COLUMN
from engine.storage import LoadedBlocks, PersistedBlock, TableData

LOAD_ROUNDS_MAX = 8
"""Load rounds before giving up (each one is needed only if a block that may hold one of the
keys appeared while the previous round loaded: a flush or merge finished meanwhile)."""

Loader = Callable[[list[PersistedBlock]], AbstractAsyncContextManager[LoadedBlocks]]
"""Loads the keys and the `__commit_ts` column of blocks, pinned for the block's duration."""


def _keys_by_table(
    rows: Sequence[RowWrite], bulk: Sequence[BulkInsert]
) -> dict[int, list[tuple[Any, bool]]]:
    """table id -> (key, insert_only) of every row key the transaction wrote."""
    out: dict[int, list[tuple[Any, bool]]] = {}
    for row in rows:
        key: Any = row.key
        out.setdefault(key[0], []).append((key[1], row.insert_only))
    for written in bulk:
        keys = out.setdefault(written.table_id, [])
        keys.extend((key, written.live_after) for key in written.key_list())
    return out


async def check(
    tables: Mapping[int, TableData],
    load: Loader,
    visible_ts: Callable[[], int],
    start_ts: int,
    rows: Sequence[RowWrite],
    bulk: Sequence[BulkInsert],
) -> KeyConflict | int:
    """The first key changed in (start_ts, visible_ts] as a `KeyConflict`, or the visible
    timestamp it checked up to (for `ConflictIndex.check`'s `checked_ts`). Raises
    `WriteConflict` only if blocks kept appearing for `LOAD_ROUNDS_MAX` rounds."""
    wanted = _keys_by_table(rows, bulk)
    for _ in range(LOAD_ROUNDS_MAX):
        async with AsyncExitStack() as stack:
            # One load per table (block ids are a table's own).
            views: dict[int, tuple[set[int], LoadedBlocks]] = {}
            for table_id, keys in wanted.items():
                data = tables.get(table_id)
                if data is None:
                    continue  # dropped since: the catalog guard decides
                blocks: dict[int, PersistedBlock] = {}
                for found in data.change_candidates_many([key for key, _ in keys], start_ts):
                    for block in found:
                        blocks[block.block_id] = block
                loaded = await stack.enter_async_context(load(list(blocks.values())))
                views[table_id] = (set(blocks), loaded)
            # Synchronous from here to the caller's prepare: nothing becomes visible.
            now_ts = visible_ts()
            verdict = _check_loaded(tables, wanted, views, start_ts, now_ts)
            if verdict is not None:
                return verdict
    raise WriteConflict(
        f"snapshot at {start_ts} below the conflict index's floor: blocks kept changing "
        f"while its keys were checked ({LOAD_ROUNDS_MAX} rounds)"
    )


COLUMNS = [COMMIT_TS_COLUMN]
"""What `check` needs loaded beside the keys."""


def _check_loaded(
    tables: Mapping[int, TableData],
    wanted: dict[int, list[tuple[Any, bool]]],
    views: dict[int, tuple[set[int], LoadedBlocks]],
    start_ts: int,
    now_ts: int,
) -> KeyConflict | int | None:
    """The verdict from what was loaded; None when a block appeared during the load."""
    for table_id, keys in wanted.items():
        data = tables.get(table_id)
        view = views.get(table_id)
        if data is None or view is None:
            continue  # dropped meanwhile, or before: the catalog guard decides
        loaded_ids, loaded = view
        per_key = data.change_candidates_many([key for key, _ in keys], start_ts)
        for (key, insert_only), found in zip(keys, per_key, strict=True):
            if any(block.block_id not in loaded_ids for block in found):
                return None  # a flush or merge wrote it during the load: one more round
            change = data.last_change_after(key, start_ts, now_ts, found, loaded)
            if change is not None:
                commit_ts, live = change
                return KeyConflict((table_id, key), commit_ts, duplicate=insert_only and live)
    return now_ts
