"""What the engine's shell attaches to a commit pipeline ticket (engine/pipeline.py `T`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from engine.wal.entry import TxnEntry

if TYPE_CHECKING:
    from engine.txn import Transaction


class CommitWaiter:
    """What the shell attaches to a pipeline ticket."""

    __slots__ = ("dsn", "durable", "entry", "future", "payload", "txn")

    def __init__(self, txn: Transaction | None, future: asyncio.Future[None]) -> None:
        self.txn = txn
        """None for the engine's own rewrites (flush, merge, compaction)."""
        self.future = future
        self.entry: TxnEntry | None = None
        self.dsn = 0
        """The entry's DSN, once durable."""
        self.payload = b""
        """The encoded entry (the logtail serves these bytes)."""
        self.durable: asyncio.Future[int] | None = None
        """The driver's future for the entry, once submitted."""

    def resolved(self) -> bool:
        """The entry is durable and its durable event is on its way (the pipeline holds a
        group back for it, engine/pipeline.py)."""
        durable = self.durable
        return (
            durable is not None
            and durable.done()
            and not durable.cancelled()
            and durable.exception() is None
        )
