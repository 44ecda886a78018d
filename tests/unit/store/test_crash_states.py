"""Every state a power loss can leave is recoverable, and keeps every synced entry.

Crash-state enumeration (shared/reference/chaos-plan.md §4.5, after ALICE/CrashMonkey): a
workload runs over a tracing `FaultFS`: single appends, group-commit batches, segment rolls,
suffix truncation, prefix truncation with segment deletion, votes, and recovery after a
torn tail. For every prefix of the recorded operations that ends at a sync, and for torn
variants of the write after it, the test builds that on-disk state, opens a store on it and
asserts: it opens (no false corruption); the log start is one that was saved; every entry is
one that was appended at that index; and every entry acknowledged as durable before that
point is there.
"""

from __future__ import annotations

import random

from logsvc.store import Entry, ShardStore, StoreLimits
from tests.support.faultfs import FaultFS

DIR = "/shard"
LIMITS = StoreLimits(
    segment_bytes_max=700,
    group_commit_delay_ms_max=3_600_000,
    write_buffer_bytes_max=400,
    cache_bytes_max=4096,
)


class Workload:
    """Runs operations on a traced store and remembers what was acknowledged when."""

    def __init__(self, fs: FaultFS) -> None:
        self.fs = fs
        self.store = ShardStore.open(DIR, fs=fs, limits=LIMITS)
        self.ever: dict[int, set[bytes]] = {}  # every payload ever appended at an index
        self.starts = {1}  # every log start ever saved
        # (trace length when a sync returned, first index, {index: payload} durable then)
        self.acks: list[tuple[int, int, dict[int, bytes]]] = []
        self.current: dict[int, bytes] = {}
        self.first = 1
        self.term = 1

    def append(self, count: int, size: int) -> None:
        last = self.store.last_index
        batch = [
            Entry(last + 1 + i, self.term, f"{last + 1 + i}/{self.term}".encode() * size)
            for i in range(count)
        ]
        self.store.append(batch)
        for entry in batch:
            self.ever.setdefault(entry.index, set()).add(entry.payload)
            self.current[entry.index] = entry.payload

    def sync(self) -> None:
        self.store.sync()
        self.ack()

    def ack(self) -> None:
        self.acks.append((self.fs.trace_length(), self.first, dict(self.current)))

    def truncate_suffix(self, index: int) -> None:
        # From the moment the truncation starts, entries at or after `index` may be gone.
        self.term += 1
        self.current = {i: p for i, p in self.current.items() if i < index}
        self.ack()
        self.store.truncate_suffix(index)

    def truncate_prefix(self, index: int) -> None:
        self.starts.add(index)
        self.current = {i: p for i, p in self.current.items() if i >= index}
        self.ack()
        self.store.truncate_prefix(index)
        self.first = index
        self.ack()


def run_workload(fs: FaultFS) -> Workload:
    work = Workload(fs)
    work.append(1, 3)
    work.sync()  # a single append
    work.append(8, 10)
    work.sync()  # a group-commit batch spanning several segments
    work.append(3, 40)
    work.store.roll()
    work.append(2, 5)
    work.sync()
    work.truncate_suffix(11)  # Raft conflict: inside a segment, deleting a later one
    work.append(4, 20)
    work.sync()
    work.store.save_vote(2, "n2")
    work.truncate_prefix(6)
    work.append(5, 30)  # more than the write buffer: reaches the OS before any sync
    work.sync()
    work.store.close()  # the close also finishes the deletion of segments below the start
    work.ack()
    return work


def test_every_crash_state_recovers_with_every_acknowledged_entry() -> None:
    traced = FaultFS(trace=True)
    work = run_workload(traced)
    states = list(traced.crash_states(random.Random(7), 3, names=("revert", "keep")))
    assert len(states) > 60  # the workload really produced many sync points
    for state in states:
        acked = [ack for ack in work.acks if ack[0] <= state.crash_ops]
        with ShardStore.open(DIR, fs=state, limits=LIMITS) as store:
            context = f"{state.crash_point}: log [{store.first_index}, {store.last_index}]"
            assert store.first_index in work.starts, context
            entries = store.read(store.first_index, store.last_index + 1, 1 << 30)
            assert [e.index for e in entries] == list(
                range(store.first_index, store.last_index + 1)
            ), context
            for entry in entries:
                assert entry.payload in work.ever[entry.index], context
            if acked:
                _, first_then, durable_then = acked[-1]
                assert store.first_index >= first_then, context
                for index, payload in durable_then.items():
                    if index >= store.first_index:
                        assert index <= store.last_index, f"{context}: lost {index}"
                        assert entries[index - store.first_index].payload == payload, context


def test_recovery_after_a_torn_tail_is_itself_crash_safe() -> None:
    """Open a torn state, then enumerate crash states of that recovery and the writes
    after it: the cut, its fsync and the new appends must leave only recoverable states."""
    traced = FaultFS(trace=True)
    run_workload(traced)
    torn = [s for s in traced.crash_states(random.Random(3), 2) if "torn" in s.crash_point]
    assert torn
    for state in torn[:8]:
        state.start_trace()
        with ShardStore.open(DIR, fs=state, limits=LIMITS) as store:
            kept = store.read(store.first_index, store.last_index + 1, 1 << 30)
            last = store.last_index
            store.append([Entry(last + 1, 99, b"after recovery")])
            store.sync()
        for again in state.crash_states(random.Random(5), 2, names=("revert", "keep")):
            with ShardStore.open(DIR, fs=again, limits=LIMITS) as store:
                assert store.read(store.first_index, last + 1, 1 << 30) == kept
