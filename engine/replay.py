"""Reading the WAL into the engine's state: the replay at open, and the handler a standby's
endless tail (engine/standby.py) runs too.

Why one handler: the replay at open and the standby's tail apply entries the same way
(decode, skip what the checkpoint holds, apply through `EngineState.apply`, make visible,
feed the logtail), so a standby's state is exactly what a restart would build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from engine.clock import HybridClock
from engine.errors import WalCorruption
from engine.logtail import TailEntry
from engine.pipeline import CommitPipeline
from engine.state import ApplyError, EngineState
from engine.waiter import CommitWaiter
from engine.wal.codec import decode_entry, peek_commit_ts
from engine.wal.entry import TxnEntry
from tae_driver import Driver, ReplayDecision, ReplayMode
from tae_driver import errors as driver_errors
from tae_driver.driver import ReplayHandle, ReplaySummary

if TYPE_CHECKING:
    from engine.checkpoint.runner import Checkpointer


class ReplayHost(Protocol):
    """What a replay needs of the engine (engine/engine.py implements it)."""

    read_only: bool
    standby: bool

    @property
    def state(self) -> EngineState:
        """Looked up for each entry: a standby's catch-up replaces it."""
        ...

    @property
    def visible_dsn(self) -> int: ...

    @property
    def skip_decoding_below_checkpoint(self) -> bool: ...

    @property
    def pipeline(self) -> CommitPipeline[CommitWaiter]: ...

    @property
    def clock(self) -> HybridClock: ...

    @property
    def driver(self) -> Driver: ...

    @property
    def checkpointer(self) -> Checkpointer | None: ...

    def replayed(self, dsn: int) -> None: ...

    def replayed_duplicate(self, dsn: int) -> None: ...

    def wal_starts_at(self, dsn: int) -> None: ...

    def checkpoint_logged(self, ckp_ts: int, name: str) -> None: ...

    def became_visible(self, tail: TailEntry) -> None: ...


def handler(engine: ReplayHost) -> ReplayHandle:
    """The driver's replay handle for `engine`: decode each entry, skip what the checkpoint
    holds, apply it through `EngineState.apply`, make it visible, feed the logtail. A new
    one per replay (it checks that the first entry follows the state's DSN)."""
    first_dsn: list[int] = []

    def handle(dsn: int, payload: bytes) -> ReplayDecision:
        state = engine.state  # looked up each time: a standby's catch-up replaces it
        if not first_dsn:
            first_dsn.append(dsn)
            if dsn > engine.visible_dsn + 1:
                raise WalCorruption(dsn, gap(engine, dsn))
            engine.wal_starts_at(dsn)
        if engine.skip_decoding_below_checkpoint:
            peeked = peek_commit_ts(payload)
            if peeked is not None and peeked <= state.applied_ts:
                # Held by the restored checkpoint: not decoded (a history window keeps a long
                # WAL, decision 0010; the driver checked the record's checksum).
                engine.replayed_duplicate(dsn)
                return ReplayDecision.INTERNAL
        entry = decode_entry(payload, dsn)
        if not isinstance(entry, TxnEntry):
            if engine.standby:  # a writer's checkpoint, as a standby sees it go by
                engine.checkpoint_logged(entry.ckp_ts, entry.location)
            return ReplayDecision.INTERNAL  # CKP: the checkpoint itself was read first
        engine.replayed(dsn)
        if entry.commit_ts <= state.applied_ts:
            # A second copy of a transaction already applied (commit_ts order is DSN
            # order, so nothing newer can be at or below the applied one).
            engine.replayed_duplicate(dsn)
            return ReplayDecision.INTERNAL
        try:
            state.apply(entry)
        except ApplyError as exc:
            raise WalCorruption(dsn, f"does not apply: {exc}") from None
        engine.pipeline.visible_ts = state.applied_ts  # a standby serves reads as it goes
        engine.became_visible(TailEntry(entry.commit_ts, dsn, bytes(payload)))
        return ReplayDecision.APPLY

    return handle


async def replay_wal(engine: ReplayHost) -> ReplaySummary:
    """Replay the WAL into the state (restart, or a read-only open); what the driver read.
    A standby's endless tail is engine/standby.py's, over the same handler."""
    mode = ReplayMode.FOR_READ if engine.read_only else ReplayMode.FOR_WRITE
    driver = engine.driver
    try:
        summary = await driver.replay(handler(engine), mode)
    except driver_errors.ReplayCorruptionError as exc:
        # A record the driver cannot decode (not a WAL driver record at all, say): the
        # log is not an engine's WAL, or it is damaged. Typed as the engine promises.
        raise WalCorruption(driver.dsn() + 1, f"undecodable log record: {exc}") from exc
    if summary.entries_handled == 0 and driver.dsn() > engine.visible_dsn:
        raise WalCorruption(driver.dsn(), gap(engine, driver.dsn()))
    settle(engine)
    return summary


def settle(engine: ReplayHost) -> None:
    """After a replay that finished: the clock, the visible timestamp and the conflict
    index's floor stand at the last applied commit."""
    state = engine.state
    engine.clock.observe(state.applied_ts)
    engine.pipeline.visible_ts = state.applied_ts
    engine.pipeline.conflicts.floor_ts = state.applied_ts


def gap(engine: ReplayHost, dsn: int) -> str:
    checkpointer = engine.checkpointer
    if checkpointer is not None:
        checkpointer.refuse_fallback(dsn)  # a damaged checkpoint: CheckpointDamaged
    newest = checkpointer.newest if checkpointer is not None else None
    if newest is None:
        return f"the WAL starts at DSN {dsn} and there is no checkpoint before it"
    return (
        f"the WAL starts at DSN {dsn}, past the newest checkpoint's DSN {newest.ckp_dsn} "
        f"(ckp_ts {newest.ckp_ts}): entries in between are missing"
    )
