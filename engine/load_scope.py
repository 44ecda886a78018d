"""`LoadScope`: what one read needs of persisted blocks, loaded off the event loop and pinned
while the read runs.

    async with host.loaded(blocks, keys=True, columns=["id"]) as view: ...

Why a module of its own: the engine, a compute node and a historical view all read blocks the
same way (engine/txn.py `TxnHost.loaded`), and none of them should import another to do it.
What the cache holds is pinned on the event loop; only a miss costs a worker thread
(engine/storage/loader.py `BlockLoader.load` is blocking).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from engine.storage import NOTHING_LOADED, LoadedBlocks, PersistedBlock
from engine.storage.loader import BlockLoader, PinnedBlocks


class LoadScope:
    """`async with LoadScope(loader, blocks, ...) as view`: the blocks' keys and `columns`,
    pinned until the block ends. A class, not an asynccontextmanager: every read enters one,
    and most need nothing loaded."""

    __slots__ = ("_blocks", "_columns", "_keys", "_loader", "_pinned", "_whole")

    def __init__(
        self,
        loader: BlockLoader | None,
        blocks: Sequence[PersistedBlock],
        keys: bool | str,
        columns: Sequence[str] | None,
        whole: bool = False,
    ) -> None:
        self._loader = loader
        self._blocks = blocks
        self._keys = keys
        self._columns = columns
        self._whole = whole
        self._pinned: PinnedBlocks | None = None

    async def __aenter__(self) -> LoadedBlocks:
        if not self._blocks:
            return NOTHING_LOADED
        loader = self._loader
        assert loader is not None, "persisted blocks without an object store"
        # What the cache holds is pinned right here; only a miss costs a worker thread.
        pinned = loader.load(
            self._blocks,
            keys=self._keys,
            columns=self._columns,
            whole_objects=self._whole,
            cached_only=True,
        )
        if pinned is None:
            pinned = await asyncio.to_thread(
                loader.load,
                self._blocks,
                keys=self._keys,
                columns=self._columns,
                whole_objects=self._whole,
            )
        assert pinned is not None
        self._pinned = pinned
        return pinned

    async def __aexit__(self, *exc: object) -> None:
        if self._pinned is not None:
            self._pinned.release()
            self._pinned = None


class LoadsBlocks:
    """`TxnHost.loaded` for a host that reads blocks through `_loader` (the engine, a compute
    node, a historical view): one definition instead of one per host."""

    _loader: BlockLoader | None

    def loaded(
        self,
        blocks: Sequence[PersistedBlock],
        *,
        keys: bool | str = False,
        columns: Sequence[str] | None = None,
        whole_objects: bool = False,
    ) -> LoadScope:
        return LoadScope(self._loader, blocks, keys, columns, whole_objects)
