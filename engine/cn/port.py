"""What a compute node needs of a TN: the `TNPort` protocol (shared/STYLE.md "Ports are
Protocols with an in-memory implementation next to them": `LocalTN` here runs on an Engine in
the same process; engine/cn/client.py speaks to a TN daemon over the network).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.logtail import Logtail, TailEntry
from engine.writeset import WriteSet


@dataclass(frozen=True, slots=True)
class TNStatus:
    visible_ts: int
    """The TN's newest visible commit timestamp: a CN can read up to it."""
    checkpoint_ts: int
    """The newest checkpoint's ckp_ts (0: none)."""
    role: str
    """"active" or "standby"."""


class TNPort(Protocol):
    async def status(self) -> TNStatus: ...

    async def logtail(self, t0: int, t1: int) -> Logtail:
        """The committed changes in (t0, t1] (engine/logtail.py); t1 is clamped to the TN's
        visible timestamp. Raises `LogtailUnavailable` when the TN cannot answer yet."""
        ...

    async def commit(self, write_set: WriteSet) -> int:
        """Run the transaction on the TN; its commit_ts. Raises the engine's typed errors
        (WriteConflict, DuplicateKey, ...), or `OutcomeUnknown` when no TN could say."""
        ...

    async def subscribe(
        self,
        on_entry: Callable[[TailEntry], None],
        *,
        on_gap: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        """Push every entry from now on as it becomes visible; returns unsubscribe. When
        the pushes cannot go on without skipping entries (after a reconnect, entries only a
        checkpoint still holds), `on_gap` is called: the consumer must pull."""
        ...


class LocalTN:
    """The port over an `Engine` in this process (tests, and the engine's own CN tests)."""

    def __init__(self, engine: object) -> None:
        from engine.engine import Engine

        assert isinstance(engine, Engine)
        self._engine = engine

    async def status(self) -> TNStatus:
        engine = self._engine
        newest = engine.checkpointer.newest if engine.checkpointer is not None else None
        return TNStatus(
            engine.visible_ts,
            newest.ckp_ts if newest is not None else 0,
            "standby" if engine.standby else "active",
        )

    async def logtail(self, t0: int, t1: int) -> Logtail:
        return self._engine.logtail(t0, t1)

    async def commit(self, write_set: WriteSet) -> int:
        return await self._engine.execute(write_set)

    async def subscribe(
        self,
        on_entry: Callable[[TailEntry], None],
        *,
        on_gap: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        del on_gap  # in one process every entry is pushed: there is no gap
        return self._engine.subscribe(on_entry)
