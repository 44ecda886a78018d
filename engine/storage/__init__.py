"""A table's storage (decision 0006): blocks (`blocks`), their delete nodes (`deletes`), and
the table's rows with placement, applying and reads (`table`)."""

from engine.storage.blocks import (
    NOTHING_LOADED,
    TS_NEVER,
    Block,
    BlockKeys,
    Bloom,
    L0Block,
    LoadedBlocks,
    MappedLoadedBlocks,
    NothingLoaded,
    PersistedBlock,
)
from engine.storage.table import (
    ApplyError,
    MetaSource,
    PersistedMeta,
    Reservation,
    RowVersion,
    TableData,
)

__all__ = [
    "NOTHING_LOADED",
    "TS_NEVER",
    "ApplyError",
    "Block",
    "BlockKeys",
    "Bloom",
    "L0Block",
    "LoadedBlocks",
    "MappedLoadedBlocks",
    "MetaSource",
    "NothingLoaded",
    "PersistedBlock",
    "PersistedMeta",
    "Reservation",
    "RowVersion",
    "TableData",
]
