"""No synced entry is ever lost and nothing unsynced is invented, whatever the crash.

A hypothesis state machine (shared/reference/chaos-plan.md §4.11) drives the real
`ShardStore` over `FaultFS` (in-memory files that know what was synced) with append / sync /
roll / truncate-prefix / truncate-suffix / vote / read / disk-full / crash / power loss
(trunc, torn, zeros) / reopen / corrupt-a-sealed-segment. The model is the list of entries
the store was given plus the durable floor: the store's own `durable_index`, read after the
crash froze the disk, so it is also checked that nothing was reported durable before its
fdatasync returned. After every reopen:

* the log start equals the last prefix truncation (durable on return);
* the log is a prefix of the model that contains every entry up to the durable floor;
* every entry reads back byte-exact (whole-range and bounded reads);
* term and vote are the last saved ones;
* a flipped bit in a sealed segment is reported as `Corruption`, never served.

Syncs happen only when a rule asks (the delay is an hour), so a failing example replays
exactly.
"""

from __future__ import annotations

import random
from typing import cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from logsvc.store import (
    Corruption,
    DiskFull,
    Entry,
    ShardStore,
    StoreError,
    StoreFailed,
    StoreLimits,
)
from tests.support.faultfs import POWER_LOSS_MODES, FaultFS, PowerLossMode

DIR = "/shard"
LIMITS = StoreLimits(
    segment_bytes_max=1024,
    record_payload_bytes_max=4096,
    group_commit_bytes_max=1 << 30,
    group_commit_delay_ms_max=3_600_000,
    write_buffer_bytes_max=600,  # small: entries often reach the OS before any sync
    cache_bytes_max=4096,
    sync_wait_ms_max=10_000,
)


class StoreCrashMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fs = FaultFS(rng=random.Random(0))
        self.store: ShardStore | None = ShardStore.open(DIR, fs=self.fs, limits=LIMITS)
        self.log: list[Entry] = []  # the model: entries [first, last]
        self.first = 1
        self.durable = 0  # every entry up to here must survive any crash
        self.term = 1
        self.vote: tuple[int, str | None] = (0, None)
        self.failed = False
        self.serial = 0

    # ----------------------------------------------------------------- helpers

    @property
    def last(self) -> int:
        return self.first + len(self.log) - 1

    def open_store(self) -> ShardStore:
        assert self.store is not None
        return self.store

    def payload(self, size: int) -> bytes:
        self.serial += 1
        return (f"<{self.serial}>".encode() * (size // 3 + 1))[:size]

    # ----------------------------------------------------------------- rules

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule(sizes=st.lists(st.integers(0, 400), min_size=1, max_size=8), new_term=st.booleans())
    def append_batch(self, sizes: list[int], new_term: bool) -> None:
        if new_term:
            self.term += 1
        batch = [
            Entry(self.last + 1 + i, self.term, self.payload(size)) for i, size in enumerate(sizes)
        ]
        assert self.open_store().append(batch) == batch[-1].index
        self.log.extend(batch)

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule()
    def sync(self) -> None:
        assert self.open_store().sync() == self.last
        self.durable = self.last

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule()
    def roll(self) -> None:
        self.open_store().roll()

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule(data=st.data())
    def truncate_prefix(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(self.first, self.last + 3), label="prefix")
        start = self.open_store().truncate_prefix(index)
        assert start == max(index, self.first)
        if index > self.first:  # at or below the start it is a no-op and syncs nothing
            dropped = min(index, self.last + 1) - self.first
            self.log = self.log[dropped:]
            self.first = index
            self.durable = self.last  # it syncs first: the start never passes vanishing entries

    @precondition(lambda self: self.store is not None and not self.failed and self.log)
    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(self.first, self.last + 1), label="suffix")
        self.open_store().truncate_suffix(index)
        if index <= self.last:  # past the end it is a no-op and syncs nothing
            del self.log[index - self.first :]
            self.durable = self.last

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule(voted=st.sampled_from([None, "n1", "n2"]))
    def save_vote(self, voted: str | None) -> None:
        term = self.vote[0] + 1
        self.open_store().save_vote(term, voted)
        self.vote = (term, voted)

    @precondition(lambda self: self.store is not None and self.log)
    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        lo = data.draw(st.integers(self.first, self.last), label="lo")
        hi = data.draw(st.integers(lo, self.last + 2), label="hi")
        budget = data.draw(st.integers(0, 3000), label="max_bytes")
        got = self.open_store().read(lo, hi, budget)
        expected: list[Entry] = []
        for entry in self.log[lo - self.first : hi - self.first]:
            if expected and len(entry.payload) > budget:
                break
            expected.append(entry)
            budget -= len(entry.payload)
        assert got == expected

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule(size=st.integers(1, 700))
    def disk_full(self, size: int) -> None:
        """ENOSPC in the middle of a write: the append is never acknowledged, the store
        refuses more writes, and every entry stays readable."""
        self.fs.inject_error("write", 28, partial=True)  # ENOSPC
        store = self.open_store()
        entry = Entry(self.last + 1, self.term, self.payload(size))
        with pytest.raises(StoreError) as raised:
            try:
                store.append([entry])  # may write the buffer out itself (back-pressure)
            finally:
                self.log.append(entry)
            store.sync()
        error = raised.value
        assert isinstance(error, DiskFull | StoreFailed)
        if isinstance(error, StoreFailed):
            assert isinstance(error.cause, DiskFull)
        assert store.durable_index < entry.index
        self.fs.clear_injected_errors()
        self.failed = True
        assert store.read(self.first, self.last + 1, 1 << 30) == self.log

    @precondition(lambda self: self.store is not None)
    @rule(mode=st.sampled_from(["process", *POWER_LOSS_MODES]), seed=st.integers(0, 2**16))
    def crash(self, mode: str, seed: int) -> None:
        store = self.open_store()
        store.abandon()  # the process dies: nothing more is written
        # Whatever the store called durable by then really was synced.
        self.durable = max(self.durable, store.durable_index)
        if mode != "process":
            power_loss_mode = cast(PowerLossMode, mode)
            self.fs.power_loss(power_loss_mode, random.Random(seed), names="random")
        else:
            self.fs.crash()
        self.store = None
        self.failed = False

    @precondition(lambda self: self.store is None)
    @rule()
    def reopen(self) -> None:
        store = ShardStore.open(DIR, fs=self.fs, limits=LIMITS)
        self.store = store
        assert store.first_index == self.first
        assert self.durable <= store.last_index <= self.last, (
            f"recovered last {store.last_index}, durable floor {self.durable}, "
            f"model last {self.last}"
        )
        del self.log[store.last_index + 1 - self.first :]
        assert store.read(self.first, self.last + 1, 1 << 30) == self.log
        assert (store.term, store.voted_for) == self.vote
        assert store.durable_index == store.last_index  # recovery fsyncs what it kept
        self.durable = self.last
        if self.log:
            assert self.term >= self.log[-1].term

    @precondition(lambda self: self.store is not None and not self.failed)
    @rule(data=st.data())
    def corrupt_sealed_segment(self, data: st.DataObject) -> None:
        """Close cleanly, flip one bit of a sealed, retained segment: the reopen must
        refuse with Corruption. Flip it back and the store opens again."""
        self.open_store().close()
        self.store = None
        self.durable = self.last
        names = [n for n in self.fs.listdir(DIR) if n.endswith(".seg")]
        firsts = [int(n.split(".")[0]) for n in names]
        # Sealed = not the newest; retained = its successor starts after the log start.
        candidates = [
            name
            for name, following in zip(names, firsts[1:], strict=False)
            if following > self.first
        ]
        if candidates:
            path = f"{DIR}/{data.draw(st.sampled_from(candidates), label='segment')}"
            bit = data.draw(st.integers(0, len(self.fs.content(path)) * 8 - 1), label="bit")
            self.fs.flip_bit(path, bit)
            with pytest.raises(Corruption) as raised:
                ShardStore.open(DIR, fs=self.fs, limits=LIMITS)
            assert raised.value.path == path
            self.fs.flip_bit(path, bit)
        self.reopen()

    # ----------------------------------------------------------------- invariants

    @invariant()
    def bookkeeping_matches(self) -> None:
        if self.store is not None:
            assert (self.store.first_index, self.store.last_index) == (self.first, self.last)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()


StoreCrashMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_store_survives_crashes = StoreCrashMachine.TestCase


def test_entries_recovered_from_the_page_cache_are_made_durable_by_open() -> None:
    """kill -9 leaves written-but-unsynced entries in the page cache; the reopened store
    serves them, so they must survive a power loss that follows."""
    fs = FaultFS()
    store = ShardStore.open(DIR, fs=fs, limits=LIMITS)
    entries = [Entry(i, 1, bytes([i]) * 300) for i in range(1, 6)]
    store.append(entries)  # over the write buffer: written to the OS, not synced
    assert store.durable_index == 0
    store.abandon()
    fs.crash()
    reopened = ShardStore.open(DIR, fs=fs, limits=LIMITS)
    recovered = reopened.read(1, 10, 1 << 30)
    assert recovered and recovered == entries[: len(recovered)]
    reopened.abandon()
    fs.power_loss("trunc", random.Random(0))
    with ShardStore.open(DIR, fs=fs, limits=LIMITS) as after:
        assert after.read(1, 10, 1 << 30) == recovered
