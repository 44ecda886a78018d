"""Power loss at every sync point of the node journal keeps every acknowledged operation.

Crash-state enumeration (as tests/unit/store/test_crash_states.py, chaos-plan §4.5): three
stores share one `NodeJournal` over a tracing `FaultFS`. The workload interleaves their
appends, group-commit syncs (one store's sync covers the others), journal rolls and the
deletion of checkpointed journal files, a vote, a Raft suffix truncation and a prefix
truncation. For every prefix of the recorded file operations that ends at an fdatasync or a
directory fsync (names reverted or kept), and for torn variants of the write after it, the
test cuts the power, opens the journal (which replays into the stores) and each store, and
asserts: it opens (no false corruption); every entry is one that was appended at that
index; every entry, vote and log start acknowledged before that point is there; and the
journal directory is empty after the replay (it was truncated).

A second test opens a torn state, writes more, and enumerates the crash states of that
recovery and of the writes after it.
"""

from __future__ import annotations

import random

from logsvc.store import Entry, ShardStore, StoreLimits
from logsvc.store.journal import NodeJournal
from logsvc.store.limits import JournalLimits
from tests.support.faultfs import POWER_LOSS_MODES, FaultFS

BASE = "/node"
JOURNAL_DIR = "/node/node-journal"
STORE_DIRS = [f"/node/shards/{shard}/journal" for shard in (1, 2, 3)]
STORE_LIMITS = StoreLimits(
    segment_bytes_max=700,
    group_commit_delay_ms_max=3_600_000,
    write_buffer_bytes_max=400,
    cache_bytes_max=4096,
)
BIG_SEGMENTS = StoreLimits(
    segment_bytes_max=256 * 1024,
    group_commit_delay_ms_max=3_600_000,
    write_buffer_bytes_max=1024,
    cache_bytes_max=64 * 1024,
)
# Checkpoints rare (big journal files): segment tails stay unsynced for many pages.
BIG_JOURNAL = JournalLimits(file_bytes_max=1 << 20, bytes_max=4 << 20)
JOURNAL_LIMITS = JournalLimits(file_bytes_max=900, bytes_max=2700, write_buffer_bytes_max=500)

Ack = tuple[int, list[int], list[dict[int, bytes]], list[tuple[int, str | None]]]


def open_node(
    fs: FaultFS,
    store_limits: StoreLimits = STORE_LIMITS,
    journal_limits: JournalLimits | None = None,
) -> tuple[NodeJournal, list[ShardStore]]:
    journal = NodeJournal.open(
        JOURNAL_DIR,
        base_dir=BASE,
        fs=fs,
        limits=journal_limits or JOURNAL_LIMITS,
        store_limits=store_limits,
        background=False,
    )
    stores = [ShardStore.open(d, fs=fs, limits=store_limits, journal=journal) for d in STORE_DIRS]
    return journal, stores


class Workload:
    """Drives three journaled stores; remembers what was acknowledged when."""

    def __init__(
        self,
        fs: FaultFS,
        store_limits: StoreLimits = STORE_LIMITS,
        journal_limits: JournalLimits | None = None,
    ) -> None:
        self.fs = fs
        self.store_limits = store_limits
        self.journal_limits = journal_limits
        self.journal, self.stores = open_node(fs, store_limits, journal_limits)
        fs.start_trace()
        self.ever: list[dict[int, set[bytes]]] = [{} for _ in STORE_DIRS]
        self.current: list[dict[int, bytes]] = [{} for _ in STORE_DIRS]
        self.durable: list[dict[int, bytes]] = [{} for _ in STORE_DIRS]
        self.firsts = [1 for _ in STORE_DIRS]
        self.votes: list[tuple[int, str | None]] = [(0, None) for _ in STORE_DIRS]
        self.acks: list[Ack] = []
        self.term = 1

    def append(self, shard: int, count: int, size: int) -> None:
        store = self.stores[shard]
        last = store.last_index
        batch = [
            Entry(last + 1 + i, self.term, f"{shard}:{last + 1 + i}/{self.term}".encode() * size)
            for i in range(count)
        ]
        store.append(batch)
        for entry in batch:
            self.ever[shard].setdefault(entry.index, set()).add(entry.payload)
            self.current[shard][entry.index] = entry.payload

    def sync(self, shard: int) -> None:
        """One store's sync: the shared fdatasync makes every store's appends durable."""
        self.stores[shard].sync()
        for other, store in enumerate(self.stores):
            durable = store.durable_index
            self.durable[other] = {i: p for i, p in self.current[other].items() if i <= durable}
        self.ack()

    def ack(self) -> None:
        self.acks.append(
            (
                self.fs.trace_length(),
                list(self.firsts),
                [dict(d) for d in self.durable],
                list(self.votes),
            )
        )

    def vote(self, shard: int, term: int, voted_for: str) -> None:
        self.stores[shard].save_vote(term, voted_for)
        self.votes[shard] = (term, voted_for)
        self.ack()

    def truncate_suffix(self, shard: int, index: int) -> None:
        self.term += 1
        for table in (self.current[shard], self.durable[shard]):
            for gone in [i for i in table if i >= index]:
                del table[gone]
        self.ack()
        self.stores[shard].truncate_suffix(index)

    def truncate_prefix(self, shard: int, index: int) -> None:
        self.stores[shard].truncate_prefix(index)
        self.firsts[shard] = index
        self.ack()


def run_workload(fs: FaultFS) -> Workload:
    work = Workload(fs)
    work.append(0, 1, 3)
    work.append(1, 1, 3)
    work.append(2, 1, 3)
    work.sync(0)  # one fdatasync for three shards
    work.append(0, 4, 10)
    work.append(1, 2, 10)
    work.sync(1)
    work.vote(2, 2, "n2")  # durable in the journal, not yet in meta
    work.append(2, 6, 12)  # past the journal's write buffer and file size: a roll
    work.append(0, 3, 12)
    work.sync(2)
    work.truncate_suffix(0, 4)  # Raft conflict, journaled before the segment cut
    work.append(0, 3, 8)
    work.append(1, 5, 15)  # more rolls; sealed files checkpointed and deleted
    work.sync(0)
    work.truncate_prefix(1, 3)
    work.append(1, 2, 9)
    work.append(2, 2, 9)
    work.sync(1)
    for store in work.stores:
        store.close()
    work.journal.close()
    work.ack()
    return work


def check_state(state: FaultFS, work: Workload) -> None:
    acked = [ack for ack in work.acks if ack[0] <= state.crash_ops]
    journal, stores = open_node(state, work.store_limits, work.journal_limits)
    try:
        assert journal.stats().files == 0
        assert not [n for n in state.listdir(JOURNAL_DIR) if n.endswith(".jnl")]
        for shard, store in enumerate(stores):
            span = f"[{store.first_index}, {store.last_index}]"
            context = f"{state.crash_point}: shard {shard} {span}"
            entries = store.read(store.first_index, store.last_index + 1, 1 << 30)
            assert [e.index for e in entries] == list(
                range(store.first_index, store.last_index + 1)
            ), context
            for entry in entries:
                assert entry.payload in work.ever[shard][entry.index], context
            if not acked:
                continue
            _, firsts, durables, votes = acked[-1]
            assert store.first_index >= firsts[shard], context
            assert (store.term, store.voted_for) >= votes[shard], context
            for index, payload in durables[shard].items():
                if index >= store.first_index:
                    assert index <= store.last_index, f"{context}: lost acknowledged {index}"
                    assert entries[index - store.first_index].payload == payload, context
    finally:
        for store in stores:
            store.close()
        journal.close()


def test_every_journal_crash_state_recovers_every_acknowledged_operation() -> None:
    traced = FaultFS(trace=True)
    work = run_workload(traced)
    stats = work.journal.stats()
    assert stats.deleted_files >= 2  # the workload rolled and truncated the journal
    states = list(traced.crash_states(random.Random(11), 2, names=("revert", "keep")))
    assert len(states) > 60
    for state in states:
        check_state(state, work)


def test_recovery_from_a_torn_journal_is_itself_crash_safe() -> None:
    traced = FaultFS(trace=True)
    run_workload(traced)
    torn = [s for s in traced.crash_states(random.Random(3), 2) if "torn" in s.crash_point]
    assert torn
    for state in torn[:6]:
        state.start_trace()
        journal, stores = open_node(state)
        kept = [s.read(s.first_index, s.last_index + 1, 1 << 30) for s in stores]
        firsts = [s.first_index for s in stores]
        for store in stores:
            store.append([Entry(store.last_index + 1, 99, b"after recovery")])
        stores[0].sync()
        for store in stores:
            store.close()
        journal.close()
        for again in state.crash_states(random.Random(5), 2, names=("revert", "keep")):
            journal2, stores2 = open_node(again)
            try:
                for store, before, first in zip(stores2, kept, firsts, strict=True):
                    end = first + len(before)
                    assert store.read(first, end, 1 << 30) == before, again.crash_point
            finally:
                for store in stores2:
                    store.close()
                journal2.close()


def test_random_power_losses_in_every_mode_keep_acknowledged_entries() -> None:
    """Random workloads cut by a power loss in `trunc`, `torn` and `zeros` mode (zeroed
    unsynced pages: the case where a segment record's durable hint, if it counted the
    journal instead of the segment files, would turn a lazily written tail into false
    corruption). Every state opens and keeps what was acknowledged."""
    for seed in range(40):
        rng = random.Random(seed)
        for mode in POWER_LOSS_MODES:
            fs = FaultFS(rng=random.Random(seed))
            # Segments of several pages, written out often: unsynced segment pages can be
            # lost with valid ones after them.
            work = Workload(fs, BIG_SEGMENTS, BIG_JOURNAL)
            for _ in range(rng.randint(5, 60)):
                shard = rng.randrange(len(STORE_DIRS))
                roll = rng.random()
                if roll < 0.6:
                    work.append(shard, rng.randint(1, 8), rng.randint(1, 120))
                elif roll < 0.9:
                    work.sync(shard)
                elif roll < 0.95:
                    work.stores[shard].checkpoint()  # segments written and synced now
                elif work.stores[shard].last_index > 1:
                    work.truncate_suffix(shard, work.stores[shard].last_index)
            fs.power_loss(mode, random.Random(seed))
            fs.crash_ops = 1 << 60  # every acknowledgement happened before the power loss
            fs.crash_point = f"seed {seed} {mode}"
            check_state(fs, work)
