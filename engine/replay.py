"""Reading the WAL into the engine's state: the replay at open, the standby's endless tail,
and the standby's promotion to writer (issue 15).

Why one module: all three run the same handler over the driver's replay (decode, skip what
the checkpoint holds, apply through `EngineState.apply`, make visible, feed the logtail), so
a standby's state is exactly what a restart would build.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from engine.blockstore import ObjectBlockStore
from engine.errors import BadInput, WalCorruption
from engine.logtail import TailEntry
from engine.state import ApplyError
from engine.wal.codec import decode_entry
from engine.wal.entry import TxnEntry
from tae_driver import ReplayDecision, ReplayMode
from tae_driver import errors as driver_errors

if TYPE_CHECKING:
    from engine.engine import Engine


async def replay_wal(engine: Engine, *, forever: bool = False) -> None:
    """Replay the WAL into the state (restart); with `forever` (a standby) keep tailing
    it in a background task until `promote()`."""
    state = engine._state
    first_dsn: list[int] = []

    def handle(dsn: int, payload: bytes) -> ReplayDecision:
        if not first_dsn:
            first_dsn.append(dsn)
            if dsn > engine._visible_dsn + 1:
                raise WalCorruption(dsn, gap(engine, dsn))
        entry = decode_entry(payload, dsn)
        if not isinstance(entry, TxnEntry):
            return ReplayDecision.INTERNAL  # CKP: the checkpoint itself was read first
        engine._visible_dsn = max(engine._visible_dsn, dsn)
        if entry.commit_ts <= state.applied_ts:
            # A second copy of a transaction already applied (commit_ts order is DSN
            # order, so nothing newer can be at or below the applied one).
            engine._replay_duplicates += 1
            return ReplayDecision.INTERNAL
        try:
            state.apply(entry)
        except ApplyError as exc:
            raise WalCorruption(dsn, f"does not apply: {exc}") from None
        engine._pipeline.visible_ts = state.applied_ts  # a standby serves reads as it goes
        engine._became_visible(TailEntry(entry.commit_ts, dsn, bytes(payload)))
        return ReplayDecision.APPLY

    if forever:
        engine._tail_task = asyncio.get_running_loop().create_task(
            engine._driver.replay(handle, ReplayMode.FOREVER)
        )
        return
    mode = ReplayMode.FOR_READ if engine.read_only else ReplayMode.FOR_WRITE
    try:
        engine._replay = await engine._driver.replay(handle, mode)
    except driver_errors.ReplayCorruptionError as exc:
        # A record the driver cannot decode (not a WAL driver record at all, say): the
        # log is not an engine's WAL, or it is damaged. Typed as the engine promises.
        raise WalCorruption(engine._driver.dsn() + 1, f"undecodable log record: {exc}") from exc
    if not first_dsn and engine._driver.dsn() > engine._visible_dsn:
        raise WalCorruption(engine._driver.dsn(), gap(engine, engine._driver.dsn()))
    engine._clock.observe(state.applied_ts)
    engine._pipeline.visible_ts = state.applied_ts
    engine._pipeline.conflicts.floor_ts = state.applied_ts


async def promote(engine: Engine) -> None:
    """A standby becomes the writer (TN failover, issue 15): take the WAL's lease with a
    new epoch (the old writer's next append is fenced), read the WAL to its end, then
    serve commits, flushes and checkpoints."""
    if not engine.standby:
        raise BadInput("only a standby engine can be promoted")
    assert engine._tail_task is not None
    acquire = getattr(engine._backend, "acquire_lease", None)
    if acquire is not None:
        await acquire()
    engine._driver.stop_tailing(ReplayMode.FOR_WRITE)
    engine._replay = await engine._tail_task
    engine._tail_task = None
    engine.standby = False
    engine.read_only = False
    state = engine._state
    engine._clock.observe(state.applied_ts)
    engine._pipeline.visible_ts = state.applied_ts
    engine._pipeline.conflicts.floor_ts = state.applied_ts
    store = engine._block_store
    if isinstance(store, ObjectBlockStore) and await asyncio.to_thread(store.writable):
        engine._owns_objects = True  # its lock is released at close, not at exit
    if engine._checkpointer is not None:
        await engine._checkpointer.collect_orphans()
    if engine._maintenance is not None:
        engine._maintenance.start()


def gap(engine: Engine, dsn: int) -> str:
    if engine._checkpointer is not None:
        engine._checkpointer.refuse_fallback(dsn)  # a damaged checkpoint: CheckpointDamaged
    newest = engine._checkpointer.newest if engine._checkpointer is not None else None
    if newest is None:
        return f"the WAL starts at DSN {dsn} and there is no checkpoint before it"
    return (
        f"the WAL starts at DSN {dsn}, past the newest checkpoint's DSN {newest.ckp_dsn} "
        f"(ckp_ts {newest.ckp_ts}): entries in between are missing"
    )
