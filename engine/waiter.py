"""What the engine's shell attaches to a commit pipeline ticket (engine/pipeline.py `T`)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from engine.errors import Fenced, WalFailed
from engine.wal.entry import TxnEntry
from tae_driver import errors as driver_errors
from tae_driver.completion import Completion

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
        self.durable: Completion | None = None
        """The driver's completion of the entry, once submitted."""

    def resolved(self) -> bool:
        """The entry is durable and its durable event is on its way (the pipeline holds a
        group back for it, engine/pipeline.py)."""
        durable = self.durable
        return durable is not None and durable.done() and durable.exception() is None


def wal_failure(exc: BaseException) -> WalFailed:
    """What the engine fails with when its WAL failed with `exc`: `Fenced` when a newer
    engine holds the WAL's lease (with `exc` as its cause, for the TN's one line), else
    `WalFailed`."""
    if _fenced(exc):
        failure: WalFailed = Fenced(f"fenced: a newer engine holds the WAL's lease ({_root(exc)})")
        failure.__cause__ = exc
        return failure
    return WalFailed(f"the WAL failed, the engine is read-only: {_root(exc)!r}")


def _fenced(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, driver_errors.BackendFenced):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _root(exc: BaseException) -> BaseException:
    seen = 0
    while exc.__cause__ is not None and seen < 16:
        exc = exc.__cause__
        seen += 1
    return exc
