"""A standby's tail of the WAL, supervised, and its promotion to writer (issue 15; issue 25,
decision 0008).

A standby engine (`Engine.open(..., standby=True)`, a standby TN) applies the writer's WAL
entries as they are appended, through the same handler a restart uses (engine/replay.py).
The writer truncates its WAL after each checkpoint without knowing who still reads it, so a
standby that falls behind (paused, on a slow disk, cut off from the shard's leader while it
elected a new one) can find the next record it needs gone. Before issue 25 the driver then
resumed above the truncation point, the replay found a hole, the tail task died unwatched,
the standby kept answering "standby", and the next failover lost the service.

What happens now (ARCHITECTURE.md §11 "anything that truncates a log must know who still
reads it"):

* **Fell behind** (`TailTruncated` from the driver): the standby catches up from the newest
  checkpoint, which covers the gap because the writer truncates only below a checkpoint it
  has made durable first: it loads that checkpoint's state, as an open would, and tails on
  from its DSN with a new driver. It never skips an entry. Not a failure: a warning and a
  counter.
* **Any other failure** of the tail (the log service unreachable past the client's bounds, an
  entry that does not apply, a checkpoint that cannot be read): the standby logs it at once,
  says `failed` in its status and metrics (`standby_failure`), and tries again after a
  bounded back-off (`TailRetries`), from the newest checkpoint when that is ahead of its
  state. Retries that make no progress are bounded: after `STANDBY_TAIL_ATTEMPTS_MAX` the
  tail gives up with `StandbyFailed`, which the TN daemon turns into a non-zero exit with the
  reason, so a supervisor restarts it (a fresh open starts from the newest checkpoint too).
* **Promotion** (`promote`): takes the WAL's lease with a new epoch (fencing the old writer),
  then lets the tail read to the end of the log and finish as the writer. A promotion that
  arrives while the tail is failing cuts the back-off short and makes the attempt at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine import limits, replay
from engine.blockstore import ObjectBlockStore
from engine.checkpoint.layout import Manifest
from engine.errors import BadInput, StandbyFailed
from engine.replay import ReplayHost
from tae_driver import LogBackend, ReplayMode
from tae_driver.driver import ReplaySummary
from tae_driver.errors import TailTruncated

if TYPE_CHECKING:
    from engine.maintenance import BlockStore, Maintenance

log = logging.getLogger("engine.standby")


class StandbyHost(ReplayHost, Protocol):
    """What a standby's tail and its promotion need of the engine, besides a replay's
    (engine/engine.py implements it)."""

    @property
    def backend(self) -> LogBackend: ...

    @property
    def block_store(self) -> BlockStore | None: ...

    @property
    def maintenance(self) -> Maintenance | None: ...

    @property
    def standby_tail(self) -> StandbyTail | None: ...

    def new_driver(self) -> None: ...

    def restored_from(self, manifest: Manifest) -> None: ...

    def promoted(self, summary: ReplaySummary) -> None:
        """The tail read the WAL to its end: the engine is the writer from now on."""
        ...

    def took_objects(self) -> None: ...

    def forget_logged_checkpoints(self) -> None: ...


@dataclass(slots=True)
class TailRetries:
    """When a failed tail tries again (pure: the standby's DSN at each failure in, a delay or
    "give up" out). The delay doubles from `delay_ms_min` to `delay_ms_max`; the count of
    failures starts again once the tail has made progress (its DSN moved past the one at the
    previous failure), so a standby that keeps up between rare failures never gives up, and
    one that fails at the same place gives up after `attempts_max` tries."""

    attempts_max: int = limits.STANDBY_TAIL_ATTEMPTS_MAX
    delay_ms_min: int = limits.STANDBY_TAIL_RETRY_MS_MIN
    delay_ms_max: int = limits.STANDBY_TAIL_RETRY_MS_MAX
    failures: int = 0
    failed_at_dsn: int = field(default=-1)

    def failed(self, dsn: int) -> int | None:
        """The tail failed with the standby's state at `dsn`: milliseconds to wait before
        the next attempt, or None when it should give up."""
        if dsn > self.failed_at_dsn:
            self.failures = 0
        self.failed_at_dsn = max(self.failed_at_dsn, dsn)
        self.failures += 1
        if self.failures > self.attempts_max:
            return None
        return int(min(self.delay_ms_max, self.delay_ms_min * 2 ** (self.failures - 1)))


class StandbyTail:
    """The standby's supervised tail: one task, started by `start`, ended by `promote` (or
    cancelled at close)."""

    def __init__(self, engine: StandbyHost, retries: TailRetries | None = None) -> None:
        self._engine = engine
        self._retries = retries or TailRetries()
        self._failure: str | None = None
        self._failed_driver: object = None
        """The driver whose replay failed last; a newer one that has read clears `_failure`."""
        self._promoting = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[ReplaySummary] | None = None
        self.gave_up: StandbyFailed | None = None
        """Set when the tail stopped for good (the daemon exits with it)."""
        self.catchups = 0
        """Times the standby fell behind the WAL's truncation and caught up from a
        checkpoint."""
        self.failures = 0
        """Tail attempts that failed (each logged, each followed by a retry or the end)."""

    @property
    def failure(self) -> str | None:
        """Why the tail is failing now, or None while it tails (a retry that has read from
        the log since clears it)."""
        driver = self._engine.driver
        if self._failure is not None and driver is not self._failed_driver and driver.tail_reads:
            self._failure = None
        if self.gave_up is not None:
            return str(self.gave_up)
        return self._failure

    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    async def promote(self) -> ReplaySummary:
        """Read the WAL to its end and finish as the writer (the caller took the lease)."""
        assert self._task is not None
        self._promoting = True
        self._engine.driver.stop_tailing(ReplayMode.FOR_WRITE)
        self._wake.set()
        return await self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _ended(self, task: asyncio.Task[ReplaySummary]) -> None:
        if not task.cancelled() and isinstance(task.exception(), StandbyFailed):
            log.error("standby stopped: %s", task.exception())

    async def _run(self) -> ReplaySummary:
        engine = self._engine
        fresh_driver = False
        from_checkpoint = False
        while True:
            try:
                if fresh_driver:
                    await self._new_driver()
                fresh_driver = True
                if from_checkpoint:
                    await self._catch_up()
                if self._promoting:
                    engine.driver.stop_tailing(ReplayMode.FOR_WRITE)
                return await engine.driver.replay(replay.handler(engine), ReplayMode.FOREVER)
            except asyncio.CancelledError:
                raise
            except TailTruncated as exc:
                log.warning(
                    "the standby fell behind the WAL's truncation (%s, DSN %d applied): "
                    "catching up from the newest checkpoint",
                    exc,
                    engine.visible_dsn,
                )
                from_checkpoint = True
                continue
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
                self.failures += 1
                delay_ms = self._retries.failed(engine.visible_dsn)
                if delay_ms is None:
                    self.gave_up = StandbyFailed(
                        f"the standby's tail of the WAL failed {self._retries.attempts_max} "
                        f"times at DSN {engine.visible_dsn} without progress; last: {problem}"
                    )
                    raise self.gave_up from exc
                self._failure = problem
                self._failed_driver = engine.driver
                log.error(
                    "standby tail failed (attempt %d of %d; retrying from the newest "
                    "checkpoint in %d ms): %s",
                    self._retries.failures,
                    self._retries.attempts_max,
                    delay_ms,
                    problem,
                )
                await self._pause(delay_ms)
                from_checkpoint = True

    async def _pause(self, delay_ms: int) -> None:
        """The back-off; a promotion cuts it short."""
        if self._promoting:
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay_ms / 1000)

    async def _new_driver(self) -> None:
        """A driver for the next attempt: a replay runs once per driver, and a failed one
        keeps its failure. The backend (the shard's client) is the same."""
        engine = self._engine
        await engine.driver.abort()
        engine.new_driver()

    async def _catch_up(self) -> None:
        """Load the newest checkpoint when it is ahead of the standby's state (the replay
        then starts at its DSN, skipping nothing it holds); else the tail retries from where
        the state is."""
        engine = self._engine
        checkpointer = engine.checkpointer
        if checkpointer is None:
            return  # no object store: the WAL was never truncated by a checkpoint
        found = await asyncio.to_thread(checkpointer.read_newest, engine.visible_dsn)
        if found is None:
            return
        manifest, state, older = found
        checkpointer.adopt(manifest, state, older)
        engine.restored_from(manifest)
        self.catchups += 1
        log.warning(
            "the standby caught up from checkpoint %s (ckp_dsn %d, ckp_ts %d)",
            manifest.name,
            manifest.ckp_dsn,
            manifest.ckp_ts,
        )


def start(engine: StandbyHost) -> StandbyTail:
    tail = StandbyTail(engine)
    tail.start()
    return tail


async def promote(engine: StandbyHost) -> None:
    """A standby becomes the writer (TN failover, issue 15): take the WAL's lease with a
    new epoch (the old writer's next append is fenced), read the WAL to its end, then
    serve commits, flushes and checkpoints."""
    if not engine.standby:
        raise BadInput("only a standby engine can be promoted")
    tail = engine.standby_tail
    assert tail is not None
    if tail.gave_up is not None:
        raise StandbyFailed(f"this standby cannot be promoted: {tail.gave_up}")
    acquire = getattr(engine.backend, "acquire_lease", None)
    if acquire is not None:
        await acquire()
    engine.promoted(await tail.promote())  # the tail object stays for its counters
    replay.settle(engine)
    store = engine.block_store
    if isinstance(store, ObjectBlockStore) and await asyncio.to_thread(store.writable):
        engine.took_objects()  # its lock is released at close, not at exit
    if engine.checkpointer is not None:
        await engine.checkpointer.collect_orphans()  # adopts the writer's newer checkpoints
    engine.forget_logged_checkpoints()  # from now on its own retained ones say it
    if engine.maintenance is not None:
        engine.maintenance.start()
