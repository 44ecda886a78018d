"""The port through which reads get persisted blocks' keys, blooms and columns.

Why a port (shared/STYLE.md "Ports are Protocols"): the table code is pure and never does I/O;
the engine's shell implements `BlockLoader` over the object store and the buffer cache
(engine/blockstore.py) and calls it from a worker thread, so the event loop never waits on an
object. What `load` returns stays pinned in the cache until `release()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.storage.blocks import LoadedBlocks, PersistedBlock


class PinnedBlocks(LoadedBlocks, Protocol):
    def release(self) -> None:
        """Unpin everything `load` pinned (idempotent)."""
        ...


class BlockLoader(Protocol):
    def load(
        self,
        blocks: Sequence[PersistedBlock],
        *,
        keys: bool | str = False,
        columns: Sequence[str] | None = None,
        whole_objects: bool = False,
        cached_only: bool = False,
    ) -> PinnedBlocks | None:
        """Load (from the cache, or from the objects) what a read needs of `blocks`: their
        sorted keys and bloom filters when `keys` (only the blooms when `keys="blooms"`), and
        `columns` (plus nothing else) when given; with `whole_objects`, those columns of the
        blocks' whole objects (scans). Thread-safe; blocking. Raises the object store's typed
        errors. `cached_only`: load nothing, and answer None unless the cache holds it all
        (then it never blocks: the event loop tries it before a worker thread)."""
        ...
