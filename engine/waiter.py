"""What the engine's shell attaches to a commit pipeline ticket (engine/pipeline.py `T`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from engine.wal.entry import TxnEntry

if TYPE_CHECKING:
    from engine.txn import Transaction


class CommitWaiter:
    """What the shell attaches to a pipeline ticket."""

    __slots__ = ("dsn", "entry", "future", "payload", "txn")

    def __init__(self, txn: Transaction | None, future: asyncio.Future[None]) -> None:
        self.txn = txn
        """None for the engine's own rewrites (flush, merge, compaction)."""
        self.future = future
        self.entry: TxnEntry | None = None
        self.dsn = 0
        """The entry's DSN, once durable."""
        self.payload = b""
        """The encoded entry (the logtail serves these bytes)."""
