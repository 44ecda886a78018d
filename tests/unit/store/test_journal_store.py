"""Stores sharing a node journal: one fdatasync for every shard's appends, acknowledged only
after it; today's data directories open unchanged; a damaged journal is refused; an abandoned
store's journaled operations come back; `logsvc doctor` checks the journal.

How: stores over `FaultFS` (in memory, counts fdatasyncs) attached to one `NodeJournal`; a
gate holds the journal's fdatasync in flight to show that nobody is acknowledged before it
returns and that the stores queued behind it share the next one. The doctor test writes real
files under tmp_path.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from logsvc.doctor import DoctorOptions, examine
from logsvc.store import Corruption, Entry, ShardStore, StoreLimits
from logsvc.store.fs import WritableFile
from logsvc.store.journal import NodeJournal
from logsvc.store.limits import JournalLimits
from tests.support.faultfs import FaultFS

BASE = "/node"
JOURNAL_DIR = "/node/node-journal"
LIMITS = StoreLimits(segment_bytes_max=4096, group_commit_delay_ms_max=3_600_000)
JOURNAL_LIMITS = JournalLimits(file_bytes_max=2048, bytes_max=1 << 20)
WAIT_S_MAX = 30.0


def store_dir(shard: int) -> str:
    return f"/node/shards/{shard}/journal"


def open_journal(fs: FaultFS, *, limits: JournalLimits = JOURNAL_LIMITS) -> NodeJournal:
    return NodeJournal.open(
        JOURNAL_DIR, base_dir=BASE, fs=fs, limits=limits, store_limits=LIMITS, background=False
    )


class _GatedFile:
    def __init__(self, real: WritableFile, gate: _Gate) -> None:
        self._real = real
        self._gate = gate

    def write(self, data: bytes) -> None:
        self._real.write(data)

    def truncate(self, size_bytes: int) -> None:
        self._real.truncate(size_bytes)

    def write_zeros(self, upto_bytes: int) -> None:
        self._real.write_zeros(upto_bytes)

    def allocated_bytes(self) -> int:
        return self._real.allocated_bytes()

    def fdatasync(self) -> None:
        self._gate.pass_through()
        self._real.fdatasync()

    def size(self) -> int:
        return self._real.size()

    def close(self) -> None:
        self._real.close()


class _Gate:
    """Holds the first journal fdatasync after `arm()` until `release()`."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.released = threading.Event()

    def arm(self) -> None:
        self.armed = True

    def pass_through(self) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.released.wait(WAIT_S_MAX)


class GatedFS(FaultFS):
    def __init__(self) -> None:
        super().__init__(rng=random.Random(0))
        self.gate = _Gate()

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        real = super().open_write(path, create=create)
        return _GatedFile(real, self.gate) if path.endswith(".jnl") else real


def test_one_fdatasync_covers_every_shard_and_nobody_is_acked_before_it() -> None:
    fs = GatedFS()
    journal = open_journal(fs)
    stores = [
        ShardStore.open(store_dir(s), fs=fs, limits=LIMITS, journal=journal) for s in (1, 2, 3)
    ]
    for store in stores:
        store.append([Entry(1, 1, b"first")])
    syncs_before = fs.stats.fdatasync_count
    stores[0].sync()
    # One fdatasync of the journal made all three durable; no segment was synced.
    assert fs.stats.fdatasync_count - syncs_before == 1
    assert [s.durable_index for s in stores] == [1, 1, 1]

    # Hold the next journal fdatasync in flight: shard 1's append is not acknowledged
    # before it returns, and shards 2 and 3, which append meanwhile, share the next one.
    stores[0].append([Entry(2, 1, b"a")])
    fs.gate.arm()
    first = threading.Thread(target=stores[0].sync)
    first.start()
    assert fs.gate.entered.wait(WAIT_S_MAX)
    assert stores[0].durable_index == 1
    stores[1].append([Entry(2, 1, b"b")])
    stores[2].append([Entry(2, 1, b"c")])
    others = [threading.Thread(target=s.sync) for s in stores[1:]]
    for thread in others:
        thread.start()
    assert [s.durable_index for s in stores] == [1, 1, 1]
    syncs_before = fs.stats.fdatasync_count
    fs.gate.released.set()
    for thread in [first, *others]:
        thread.join(WAIT_S_MAX)
        assert not thread.is_alive()
    assert [s.durable_index for s in stores] == [2, 2, 2]
    assert fs.stats.fdatasync_count - syncs_before == 2  # the held one, then one for both
    for store in stores:
        store.close()
    journal.close()


def test_a_directory_in_todays_layout_opens_unchanged_both_ways() -> None:
    fs = FaultFS(rng=random.Random(1))
    with ShardStore.open(store_dir(1), fs=fs, limits=LIMITS) as store:  # no journal
        store.save_vote(4, "n3")
        store.append([Entry(i, 4, f"old {i}".encode()) for i in range(1, 11)])
        store.sync()
    journal = open_journal(fs)
    assert journal.stats().replayed_stores == 0
    store = ShardStore.open(store_dir(1), fs=fs, limits=LIMITS, journal=journal)
    assert (store.first_index, store.last_index, store.term, store.voted_for) == (1, 10, 4, "n3")
    store.append([Entry(11, 5, b"new")])
    store.save_vote(5, None)
    store.sync()
    store.close()
    journal.close()
    # And back: without the journal, the store's own files hold everything (close
    # checkpointed it), as today's build would read them.
    with ShardStore.open(store_dir(1), fs=fs, limits=LIMITS) as store:
        assert store.last_index == 11
        assert store.read(1, 12, 1 << 20)[-1] == Entry(11, 5, b"new")
        assert (store.term, store.voted_for) == (5, None)


def test_an_abandoned_store_gets_its_journaled_entries_back_when_it_reattaches() -> None:
    fs = FaultFS(rng=random.Random(2))
    journal = open_journal(fs)
    store = ShardStore.open(store_dir(1), fs=fs, limits=LIMITS, journal=journal)
    store.append([Entry(i, 1, b"x" * 50) for i in range(1, 21)])
    store.save_vote(2, "n1")
    store.sync()
    store.abandon()  # as kill -9 of the replica: the segments never got the entries
    again = ShardStore.open(store_dir(1), fs=fs, limits=LIMITS, journal=journal)
    assert again.last_index == 20
    assert (again.term, again.voted_for) == (2, "n1")
    again.close()
    journal.close()


def test_a_damaged_sealed_journal_file_is_refused_and_nothing_changes() -> None:
    fs = FaultFS(rng=random.Random(3))
    journal = open_journal(fs)
    stores = [ShardStore.open(store_dir(s), fs=fs, limits=LIMITS, journal=journal) for s in (1, 2)]
    stores[1].append([Entry(1, 1, b"held")])
    stores[1].sync()
    stores[1].abandon()  # its journaled entry keeps the first file from being deleted
    for index in range(1, 40):
        stores[0].append([Entry(index, 1, b"y" * 40)])
        stores[0].sync()
    names = sorted(n for n in fs.listdir(JOURNAL_DIR) if n.endswith(".jnl"))
    assert len(names) >= 2  # sealed files are kept
    stores[0].abandon()
    journal.abandon()
    fs.power_loss("trunc", random.Random(4))
    sealed = f"{JOURNAL_DIR}/{names[0]}"
    fs.flip_bit(sealed, 8 * 200)
    before = {name: fs.content(f"{JOURNAL_DIR}/{name}") for name in names}
    with pytest.raises(Corruption) as caught:
        open_journal(fs)
    assert caught.value.path == sealed
    assert {name: fs.content(f"{JOURNAL_DIR}/{name}") for name in names} == before


def test_doctor_checks_the_node_journal(tmp_path: Path) -> None:
    data_dir = tmp_path / "n1"
    journal_dir = data_dir / "node-journal"
    journal = NodeJournal.open(
        str(journal_dir), base_dir=str(data_dir), limits=JOURNAL_LIMITS, background=False
    )
    store = ShardStore.open(
        str(data_dir / "shards" / "1" / "journal"), limits=LIMITS, journal=journal
    )
    store.append([Entry(i, 1, b"z" * 30) for i in range(1, 6)])
    store.save_vote(1, "n1")
    store.sync()
    store.abandon()  # the journal keeps operations the segments lack
    journal.abandon()
    report = examine(DoctorOptions(data_dir=str(data_dir)))
    codes = {f.code for f in report.findings}
    assert "journal_pending_replay" in codes
    assert report.exit_code == 0
    pending = next(f for f in report.findings if f.code == "journal_pending_replay")
    assert "5 entries, 1 votes" in pending.message
    # A bit flip in the middle of the (newest) file, with records after it: corruption.
    [jnl] = sorted(journal_dir.glob("*.jnl"))
    data = bytearray(jnl.read_bytes())
    data[100] ^= 0x01
    jnl.write_bytes(bytes(data))
    report = examine(DoctorOptions(data_dir=str(data_dir)))
    corrupt = [f for f in report.findings if f.code == "journal_corrupt"]
    assert corrupt
    assert corrupt[0].path == str(jnl)
    assert report.exit_code == 1
    with pytest.raises(Corruption):
        NodeJournal.open(str(journal_dir), base_dir=str(data_dir), background=False)


def test_the_journal_stays_bounded_without_any_sync() -> None:
    """Appends that nobody waits for still cannot grow the journal past `bytes_max` (plus
    the file being filled): the appending thread checkpoints the stores itself."""
    fs = FaultFS(rng=random.Random(5))
    limits = JournalLimits(file_bytes_max=1024, bytes_max=4096, write_buffer_bytes_max=512)
    journal = open_journal(fs, limits=limits)
    stores = [ShardStore.open(store_dir(s), fs=fs, limits=LIMITS, journal=journal) for s in (1, 2)]
    for index in range(1, 301):
        for store in stores:
            store.append([Entry(index, 1, b"w" * 60)])
        assert journal.stats().live_bytes <= limits.bytes_max + limits.file_bytes_max + 256
    assert journal.stats().deleted_files > 0
    for store in stores:
        store.close()
    journal.close()
    with ShardStore.open(store_dir(1), fs=fs, limits=LIMITS) as store:
        assert store.last_index == 300
