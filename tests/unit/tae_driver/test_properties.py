"""Property: whatever the completion order, crashes, truncations and restarts, the engine sees a
gap-free, duplicate-free DSN sequence and never loses a completed entry.

How: hypothesis draws a program of operations against one MemoryBackend that holds every
append until the program releases it (so completion order, hence LSN order, is arbitrary):
submit entries; release a held append; commit one now and deliver its reply later (replies
overtake each other, so the driver may learn a higher LSN first, §2.7 Q3); let a copy of one
commit without acknowledging it (a timed-out try, §2.7 Q7); fail one (the driver must
fail); put internal records in the log; checkpoint (the engine checkpoints what it knows
durable and calls `truncate`); and crash (the driver is aborted; each abandoned append then
lands or not, as the program says) followed by a restart that replays FOR_WRITE. A model
engine checks, at every restart:

* the handle sees strictly increasing DSNs (the `Recorder` asserts it);
* the applied DSNs are exactly checkpoint+1 .. last, with no gap and no repeat;
* every entry the engine knew durable (acknowledged, or applied by an earlier replay) above
  its checkpoint is applied again with the same bytes;
* every other applied entry is the one its writer generation submitted at that DSN (the
  newest generation that started at or below it: reused DSNs resolve to the new writer);
* the driver continues after everything it replayed.

At the end, replays at two read batch sizes agree. Waits are explicit hand-offs
(`wait_idle`, `release`, `tell`); nothing sleeps. `event()`s in the statistics
(`--hypothesis-show-statistics`) show how often restarts met trailing records, duplicate
copies, a truncated log and a failed driver. The one interleaving random programs are too
unlikely to hit (the Q3 race) has its own test in test_truncation.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tae_driver import ReplayMode, open_driver
from tae_driver.backends.memory import MemoryBackend
from tae_driver.driver import Driver
from tae_driver.errors import DriverClosed, DriverFailed, Overloaded
from tests.unit.tae_driver.harness import Recorder

Op = tuple[str, int]


def _op(name: str, values: st.SearchStrategy[int], weight: int) -> list[st.SearchStrategy[Op]]:
    return [st.tuples(st.just(name), values)] * weight


# Weighted by repetition: mostly traffic and out-of-order completions, now and then a
# checkpoint, an injected failure or a crash.
OPS = st.lists(
    st.one_of(
        *_op("submit", st.integers(1, 8), 4),
        *_op("release", st.integers(0, 1000), 5),
        *_op("commit", st.integers(0, 1000), 1),
        *_op("tell", st.integers(0, 1000), 1),
        *_op("copy", st.integers(0, 1000), 1),
        *_op("fail", st.integers(0, 1000), 1),
        *_op("internal", st.just(0), 1),
        *_op("checkpoint", st.integers(0, 30), 2),
        *_op("crash", st.integers(0, 2**16 - 1), 2),
    ),
    min_size=30,
    max_size=100,
)


@dataclass
class Generation:
    base_dsn: int
    entries: list[bytes] = field(default_factory=list)
    pending: list[tuple[int, bytes, asyncio.Future[int]]] = field(default_factory=list)


class Simulation:
    def __init__(self, window: int, batch: int) -> None:
        self.window = window
        self.batch = batch
        self.backend = MemoryBackend()
        self.checkpoint = 0
        self.known: dict[int, bytes] = {}  # durable entries above the checkpoint
        self.generations: list[Generation] = []
        self.driver: Driver | None = None

    # --- the model engine -----------------------------------------------------------------

    async def restart(self) -> None:
        self.backend.hold_appends = False
        recorder = Recorder(apply_from=self.checkpoint + 1)
        driver = open_driver(self.backend, window=self.window, read_batch_bytes=self.batch)
        summary = await driver.replay(recorder, mode=ReplayMode.FOR_WRITE)
        if self.generations:
            event(f"restart discarded trailing records: {summary.trailing_records > 0}")
            event(f"restart ignored duplicate copies: {summary.duplicates_ignored > 0}")
            event(f"restart found a truncated log: {summary.truncated_lsn > 0}")
        applied = recorder.applied
        expected_upto = applied[-1] if applied else self.checkpoint
        assert applied == list(range(self.checkpoint + 1, expected_upto + 1)), "gap or repeat"
        for dsn, entry in self.known.items():
            assert recorder.entries.get(dsn) == entry, f"lost or changed DSN {dsn}"
        for dsn in applied:
            if dsn not in self.known:
                assert recorder.entries[dsn] == self.submitted_at(dsn), f"foreign DSN {dsn}"
        self.known = {dsn: recorder.entries[dsn] for dsn in applied}
        assert driver.dsn() >= expected_upto
        assert driver.dsn() >= self.checkpoint
        self.generations.append(Generation(base_dsn=driver.dsn() + 1))
        self.driver = driver
        self.backend.hold_appends = True

    def submitted_at(self, dsn: int) -> bytes:
        owner = [g for g in self.generations if g.base_dsn <= dsn][-1]
        return owner.entries[dsn - owner.base_dsn]

    def collect_acks(self) -> None:
        generation = self.generations[-1]
        still: list[tuple[int, bytes, asyncio.Future[int]]] = []
        for dsn, entry, future in generation.pending:
            if not future.done():
                still.append((dsn, entry, future))
            elif future.exception() is None:
                assert future.result() == dsn
                if dsn > self.checkpoint:
                    self.known[dsn] = entry
        generation.pending = still

    # --- operations -----------------------------------------------------------------------

    async def run(self, ops: list[Op]) -> None:
        await self.restart()
        for name, arg in ops:
            await getattr(self, f"op_{name}")(arg)
            self.collect_acks()
        await self.op_crash(2**16 - 1)  # everything in flight lands
        await self.final_check()

    async def op_submit(self, count: int) -> None:
        driver, generation = self.driver, self.generations[-1]
        assert driver is not None
        for _ in range(count):
            entry = b"g%d-%d" % (len(self.generations), len(generation.entries))
            try:
                future = driver.submit(entry)
            except (Overloaded, DriverFailed):
                break
            dsn = generation.base_dsn + len(generation.entries)
            generation.entries.append(entry)
            generation.pending.append((dsn, entry, future))
        await driver.wait_idle()

    async def op_release(self, index: int) -> None:
        held = self.backend.held()
        if held:
            await self.backend.release(held[index % len(held)])
            assert self.driver is not None
            await self.driver.wait_idle()

    async def op_commit(self, index: int) -> None:
        """A held append commits; its appender hears of it only at a later `tell`."""
        held = self.backend.held()
        if held:
            self.backend.commit(held[index % len(held)])

    async def op_tell(self, index: int) -> None:
        untold = self.backend.untold()
        if untold:
            await self.backend.tell(untold[index % len(untold)])
            assert self.driver is not None
            await self.driver.wait_idle()

    async def op_copy(self, index: int) -> None:
        held = self.backend.held()
        if held:
            self.backend.commit_copy(held[index % len(held)])

    async def op_fail(self, index: int) -> None:
        held = self.backend.held()
        if held and index % 4 == 0:  # rarer than the rest
            await self.backend.fail(held[index % len(held)])

    async def op_internal(self, _: int) -> None:
        self.backend.put_internal()

    async def op_checkpoint(self, step: int) -> None:
        """The engine checkpoints up to `step` more of what it knows durable, then truncates."""
        known = sorted(self.known)
        assert known == list(range(self.checkpoint + 1, self.checkpoint + 1 + len(known)))
        if not known or step == 0:
            return
        self.checkpoint = known[min(step, len(known)) - 1]
        self.known = {d: e for d, e in self.known.items() if d > self.checkpoint}
        assert self.driver is not None
        self.driver.truncate(self.checkpoint)
        await self.driver.wait_idle()

    async def op_crash(self, mask: int) -> None:
        driver = self.driver
        assert driver is not None
        event(f"appends in flight at a crash: {min(len(self.backend.held()), 3)}")
        event(f"driver had failed: {driver.stats().state == 'failed'}")
        await driver.abort()
        self.collect_acks()
        for _, _, future in self.generations[-1].pending:
            assert future.done()
            assert isinstance(future.exception(), DriverClosed | DriverFailed)
        self.generations[-1].pending = []
        for committed in self.backend.untold():
            await self.backend.tell(committed)  # durable already; nobody is listening
        held = self.backend.held()
        if mask & 1:
            held.reverse()
        for bit, item in enumerate(held, start=1):
            if mask >> (bit % 16) & 1:
                await self.backend.release(item)  # lands after the crash
            else:
                await self.backend.fail(item)  # never lands
        await self.restart()

    async def final_check(self) -> None:
        assert self.driver is not None
        await self.driver.close()
        views = []
        for batch in (1, 1 << 20):
            recorder = Recorder(apply_from=self.checkpoint + 1)
            reader = open_driver(self.backend, read_batch_bytes=batch)
            await reader.replay(recorder, mode=ReplayMode.FOR_READ)
            views.append((recorder.handled, recorder.entries))
            assert {d: recorder.entries[d] for d in recorder.applied} == self.known
        assert views[0] == views[1]


@settings(max_examples=200, deadline=None)
@given(ops=OPS, window=st.sampled_from([1, 2, 3, 5, 8]), batch=st.sampled_from([1, 120, 1 << 20]))
def test_engine_sees_a_gap_free_sequence_that_keeps_every_completed_entry(
    ops: list[Op], window: int, batch: int
) -> None:
    asyncio.run(Simulation(window, batch).run(ops))
