"""The process tier's node-side disk tools work on real files (tests/chaos/harness/ledger_fs.py,
disk.py, dump.py, node_main.py), so the scenarios built on them are not vacuous.

How: a shard store writes real files through `LedgerFileSystem`, some entries synced (acked)
and some only written; a crash is `store.abandon()` or a real writer process killed with
SIGKILL; then `power_loss` in each mode cuts the directory back to what the ledger says was
durable, and the product's recovery reopens it. Proven:

* every synced entry survives, byte for byte; what survives after it is a gap-free prefix of
  what was appended (unsynced entries may vanish); recovery reports the torn tails that
  `torn` and `zeros` leave; the vote saved before the crash survives;
* directory entries: an unsynced create is removed, an unsynced rename or unlink undone;
* mutation check: with a ledger told not to record the segment syncs, the same power loss
  loses acknowledged entries and the check above catches it, so the ledger is what protects
  them;
* damage at rest: a flipped bit in a sealed segment is reported as corruption (the store
  does not open and the offline dump lists it, with no records); a torn tail is cut and
  reported; a Zipf truncation is either cut or reported, never served as data;
* `dump_replica` reads without writing, and dumps of every replica of a real shard
  (in-process replicas with a compacted journal and a snapshot; and a real 3-node
  `logsvc dev-cluster`, whose nodes also write the event log) are identical and hold the
  appended payloads at their LSNs; a node restarted under `node_main --ledger`, killed and
  power-cut, comes back and converges.

Process tests are bounded (timeouts) and stop what they start by PID in `finally`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsvc import devcluster, events, failpoints
from logsvc.client import LogsvcError, SyncClient
from logsvc.config import load_client_config
from logsvc.store import Corruption, Entry, ShardStore, StoreLimits
from logsvc.store.recovery import RecoveryReport
from tests.chaos import history
from tests.chaos.harness import disk
from tests.chaos.harness.disk import POWER_LOSS_MODES, PowerLossMode, power_loss
from tests.chaos.harness.dump import dump_replica
from tests.chaos.harness.ledger_fs import LedgerFileSystem
from tests.unit.shard.test_replica import Shard, compact

REPO = Path(__file__).resolve().parents[2]
PROCESS_WAIT_S_MAX = 60.0
NODE_MAIN = (sys.executable, "-m", "tests.chaos.harness.node_main")

# Small segments (several rolls per test); the syncer never syncs on its own (only
# `store.sync()` does), while a small write buffer hands unsynced bytes to the OS.
LIMITS = StoreLimits(
    segment_bytes_max=4096,
    record_payload_bytes_max=64 * 1024,
    group_commit_bytes_max=1 << 30,
    group_commit_delay_ms_max=600_000,
    write_buffer_bytes_max=64,
    cache_bytes_max=1 << 20,
    sync_wait_ms_max=20_000,
)


def payload(index: int) -> bytes:
    return (f"{index:08d}|" * (1 + index % 11)).encode()


def write_entries(
    store: ShardStore, rng: random.Random, count: int, sync_probability: float = 0.3
) -> tuple[int, int]:
    """Append `count` entries, syncing after some; return (last synced, last appended)."""
    acked = store.durable_index
    index = store.last_index
    for _ in range(count):
        index += 1
        store.append([Entry(index, 1, payload(index))])
        if rng.random() < sync_probability:
            store.sync()
            acked = index
    return acked, index


def recovered_problems(store_dir: str, acked: int, appended: int) -> tuple[list[str], ShardStore]:
    """Open the store (the product's recovery) and compare with what was appended: every
    entry up to `acked` must be there, and what is there must be exactly entries
    1..last with their payloads. Returns (problems, the open store)."""
    store = ShardStore.open(store_dir, limits=LIMITS)
    problems: list[str] = []
    if store.first_index != 1:
        problems.append(f"log starts at {store.first_index}")
    entries = store.read(1, store.last_index + 1, 1 << 30)
    if [e.index for e in entries] != list(range(1, store.last_index + 1)):
        problems.append("indexes are not 1..last")
    for entry in entries:
        if entry.payload != payload(entry.index) or entry.term != 1:
            problems.append(f"entry {entry.index} is not what was appended")
    if store.last_index < acked:
        problems.append(f"lost acked entries {store.last_index + 1}..{acked}")
    if store.last_index > appended:
        problems.append(f"entries past {appended} appeared")
    return problems, store


def tree_digest(root: str) -> dict[str, str]:
    found = {}
    for dir_path, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dir_path, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


# --------------------------------------------------------------------- power loss, in process


@pytest.mark.parametrize("mode", POWER_LOSS_MODES)
def test_power_loss_keeps_every_synced_entry(tmp_path: Path, mode: PowerLossMode) -> None:
    repaired = 0
    for seed in range(6):
        rng = random.Random(seed)
        data_dir = tmp_path / str(seed) / "data"
        store_dir = str(data_dir / "journal")
        ledger = str(tmp_path / str(seed) / "ledger")
        fs = LedgerFileSystem(ledger)
        store = ShardStore.open(store_dir, fs=fs, limits=LIMITS)
        acked, appended = write_entries(store, rng, 80)
        store.save_vote(3, "n2")
        acked, appended = write_entries(store, rng, 30)
        _, appended = write_entries(store, rng, 10, sync_probability=0.0)
        store.abandon()  # kill -9: the page cache keeps the unsynced bytes
        fs.close()
        report = power_loss(str(data_dir), ledger, mode, rng)
        assert not report.vacuous, report.describe()
        assert report.mismatches == ()
        assert report.unrestorable_names == ()
        problems, reopened = recovered_problems(store_dir, acked, appended)
        try:
            assert problems == [], (seed, report.describe())
            assert (reopened.term, reopened.voted_for) == (3, "n2")
            recovery: RecoveryReport = reopened.stats().recovery
            # A torn tail, or unsynced entries lost to zeroed pages: with zero-ahead
            # (store FORMAT.md) a page of records that never reached the disk reads as the
            # zeros written ahead, which recovery cuts as zero-ahead space, not a torn tail.
            lost = reopened.last_index < appended and recovery.zero_tail_bytes_cut > 0
            repaired += recovery.torn_reason is not None or lost
        finally:
            reopened.close()
        # The ledger was reset: a second power loss right away finds nothing unsynced.
        again = power_loss(str(data_dir), ledger, mode, rng)
        assert again.vacuous, again.describe()
    if mode != "trunc":
        assert repaired > 0, "no power loss left a damaged tail for recovery to cut"


def test_a_clean_close_leaves_nothing_to_lose(tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger")
    fs = LedgerFileSystem(ledger)
    store = ShardStore.open(str(tmp_path / "data" / "journal"), fs=fs, limits=LIMITS)
    write_entries(store, random.Random(1), 40)
    store.close()  # syncs everything
    fs.close()
    report = power_loss(str(tmp_path / "data"), ledger, "torn", random.Random(2))
    assert report.vacuous, report.describe()
    assert "vacuous" in report.describe()


def test_directory_entries_revert_to_the_last_directory_fsync(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ledger = str(tmp_path / "ledger")
    fs = LedgerFileSystem(ledger)
    fs.makedirs(str(data))

    def create(name: str, content: bytes, *, sync: bool = True) -> None:
        handle = fs.open_write(str(data / name), create=True)
        handle.write(content)
        if sync:
            handle.fdatasync()
        handle.close()

    create("kept", b"kept")
    create("replaced", b"old")
    create("unlinked", b"was here")
    create("moved", b"moving")
    fs.fsync_dir(str(data))
    create("new", b"never dir-synced")
    create("replaced.tmp", b"new")
    fs.rename(str(data / "replaced.tmp"), str(data / "replaced"))
    fs.unlink(str(data / "unlinked"))
    fs.rename(str(data / "moved"), str(data / "moved-to"))
    with open(data / "kept", "ab") as f:  # unsynced bytes after the synced ones
        f.write(b" and more")
    fs.close()

    report = power_loss(str(data), ledger, "trunc", random.Random(0))
    assert sorted(os.listdir(data)) == ["kept", "moved", "replaced", "unlinked"]
    assert (data / "kept").read_bytes() == b"kept"
    assert (data / "replaced").read_bytes() == b"old"
    assert (data / "unlinked").read_bytes() == b"was here"
    assert (data / "moved").read_bytes() == b"moving"
    assert sorted(os.path.basename(p) for p in report.removed_names) == ["moved-to", "new"]
    assert sorted(os.path.basename(p) for p in report.restored_names) == [
        "moved",
        "replaced",
        "unlinked",
    ]
    assert report.unsynced_bytes == len(b" and more")
    assert not os.path.exists(ledger + ".keep")  # the reset dropped the kept inodes


def test_mutation_a_ledger_that_misses_syncs_loses_acked_entries(tmp_path: Path) -> None:
    """The ledger is what protects acked entries: drop its segment-sync lines and the same
    crash and power loss lose entries that were acked, which the check reports."""
    data_dir = tmp_path / "data"
    ledger = str(tmp_path / "ledger")
    fs = LedgerFileSystem(ledger, unrecorded_sync_suffix=".seg")
    store = ShardStore.open(str(data_dir / "journal"), fs=fs, limits=LIMITS)
    acked, appended = write_entries(store, random.Random(3), 40)
    assert acked > 0
    store.abandon()
    fs.close()
    power_loss(str(data_dir), ledger, "trunc", random.Random(3))
    try:
        problems, reopened = recovered_problems(str(data_dir / "journal"), acked, appended)
    except Corruption as exc:
        problems = [f"corruption: {exc}"]  # also a detected loss (a sealed segment emptied)
    else:
        reopened.close()
    assert any("lost acked" in p or "corruption" in p for p in problems), problems


# --------------------------------------------------------------------- a real SIGKILLed writer

WRITER = """
import random, sys
from logsvc.store import Entry, ShardStore
from tests.chaos.test_harness_disk import LIMITS, payload
from tests.chaos.harness.ledger_fs import LedgerFileSystem

store = ShardStore.open(sys.argv[1], fs=LedgerFileSystem(sys.argv[2]), limits=LIMITS)
rng = random.Random(int(sys.argv[3]))
index, term = store.last_index, store.term
while True:
    index += 1
    store.append([Entry(index, 1, payload(index))])
    if rng.random() < 0.3:
        store.sync()
        print(f"acked {index}", flush=True)
    if rng.random() < 0.05:
        term += 1
        store.save_vote(term, "n2")
        print(f"term {term}", flush=True)
"""


@pytest.mark.parametrize("mode", POWER_LOSS_MODES)
def test_sigkilled_writer_process_then_power_loss(tmp_path: Path, mode: PowerLossMode) -> None:
    data_dir = tmp_path / "data"
    store_dir = str(data_dir / "journal")
    ledger = str(tmp_path / "ledger")
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, store_dir, ledger, "7"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    acked = term = 0
    try:
        deadline = time.monotonic() + PROCESS_WAIT_S_MAX
        assert process.stdout is not None
        while acked < 150:
            assert time.monotonic() < deadline, "the writer is too slow"
            line = process.stdout.readline()
            assert line, f"the writer stopped (exit {process.poll()})"
            kind, _, value = line.partition(" ")
            if kind == "acked":
                acked = int(value)
            else:
                term = int(value)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(PROCESS_WAIT_S_MAX)
        if process.stdout is not None:
            process.stdout.close()
    assert process.returncode == -signal.SIGKILL
    report = power_loss(str(data_dir), ledger, mode, random.Random(11))
    assert report.mismatches == ()
    assert report.unrestorable_names == ()
    problems, reopened = recovered_problems(store_dir, acked, 1 << 40)
    try:
        assert problems == [], report.describe()
        assert reopened.term >= term  # every vote printed was durable before it was printed
    finally:
        reopened.close()


# --------------------------------------------------------------------- damage at rest


def sealed_store(tmp_path: Path) -> tuple[str, str, int]:
    """A closed replica directory `<node>/shards/1/journal` with several sealed segments;
    returns (node data dir, journal dir, last index)."""
    node_dir = tmp_path / "node"
    journal = disk.shard_journal_dir(str(node_dir), 1)
    with ShardStore.open(journal, limits=LIMITS) as store:
        _, last = write_entries(store, random.Random(5), 200)
    assert len([n for n in os.listdir(journal) if n.endswith(".seg")]) >= 4
    return str(node_dir), journal, last


def test_bitflip_in_a_sealed_segment_is_corruption_and_never_served(tmp_path: Path) -> None:
    node_dir, journal, _ = sealed_store(tmp_path)
    for seed in range(8):
        before = tree_digest(node_dir)
        mutation = disk.bitflip_sealed_segment(node_dir, 1, random.Random(seed))
        assert mutation.applied, mutation.describe()
        newest = max(n for n in os.listdir(journal) if n.endswith(".seg"))
        assert os.path.basename(mutation.path) != newest
        with pytest.raises(Corruption) as caught:
            ShardStore.open(journal, limits=LIMITS).close()
        assert caught.value.path == mutation.path
        damaged = tree_digest(node_dir)
        dump = dump_replica(os.path.dirname(journal), "n1", 1)
        assert dump.records == ()
        assert len(dump.corruptions) == 1
        assert os.path.basename(mutation.path) in dump.corruptions[0]
        assert tree_digest(node_dir) == damaged  # the dump changed nothing
        # Undo the flip for the next seed (flip the same bit back).
        with open(mutation.path, "r+b") as f:
            f.seek(mutation.offset_bytes)
            byte = f.read(1)[0]
            f.seek(mutation.offset_bytes)
            bit = int(mutation.detail.rsplit(" ", 1)[1])
            f.write(bytes([byte ^ (1 << bit)]))
        assert tree_digest(node_dir) == before


def test_no_sealed_segment_means_no_bitflip(tmp_path: Path) -> None:
    with ShardStore.open(disk.shard_journal_dir(str(tmp_path), 1), limits=LIMITS) as store:
        store.append([Entry(1, 1, b"one")])
    mutation = disk.bitflip_sealed_segment(str(tmp_path), 1, random.Random(0))
    assert not mutation.applied
    assert "not applied" in mutation.describe()


def test_torn_tail_is_cut_and_reported(tmp_path: Path) -> None:
    node_dir, journal, last = sealed_store(tmp_path)
    kinds = set()
    for seed in range(10):
        mutation = disk.torn_tail(node_dir, 1, random.Random(seed))
        assert mutation.applied
        kinds.add(mutation.detail.split()[0])
        problems, store = recovered_problems(journal, 0, last)
        try:
            assert problems == []
            assert store.stats().recovery.torn_reason is not None, mutation.describe()
            assert store.last_index >= last - 1  # at most the damaged last record is gone
            last = store.last_index
        finally:
            store.close()
    assert kinds == {"cut", "appended"}


def test_torn_tail_cuts_into_the_record_not_the_zero_ahead_space(tmp_path: Path) -> None:
    """A running node's newest segment ends in zero-ahead space (FORMAT.md "Zero-ahead"),
    which recovery cuts without a tear: a cut that landed there damaged nothing, and C7's
    S14 (injected damage must be detected) failed on it."""
    node_dir, journal, last = sealed_store(tmp_path)
    cuts = 0
    for seed in range(12):
        newest = max(n for n in os.listdir(journal) if n.endswith(".seg"))
        with open(os.path.join(journal, newest), "ab") as f:
            f.write(bytes(256 * 1024))  # zero-ahead space, far longer than a record
        mutation = disk.torn_tail(node_dir, 1, random.Random(seed))
        assert mutation.applied
        cuts += mutation.detail.startswith("cut")
        problems, store = recovered_problems(journal, 0, last)
        try:
            assert problems == []
            assert store.stats().recovery.torn_reason is not None, mutation.describe()
            last = store.last_index
        finally:
            store.close()
    assert cuts >= 3


def test_truncate_file_is_cut_or_reported_never_served(tmp_path: Path) -> None:
    for seed in range(10):
        node_dir, journal, last = sealed_store(tmp_path / str(seed))
        mutation = disk.truncate_file(node_dir, 1, random.Random(seed))
        assert mutation.applied
        try:
            problems, store = recovered_problems(journal, 0, last)
        except Corruption:
            continue  # a sealed segment cut short: reported
        store.close()
        assert problems == [], mutation.describe()


# --------------------------------------------------------------------- dumps of real replicas


def test_dumps_of_a_compacted_in_process_shard_are_identical(tmp_path: Path) -> None:
    shard = Shard(tmp_path)
    try:
        shard.start_all()
        first_lsn, next_lsn = compact(shard)
        leader = shard.leader()
        deadline = time.monotonic() + PROCESS_WAIT_S_MAX
        while leader.store.first_index <= 1:
            assert time.monotonic() < deadline, "the leader never compacted"
            time.sleep(0.05)
        shard.converged()
        expected = leader.read(first_lsn, 1 << 30)
        data_dirs = {a: shard.config(a, shard.addresses).data_dir for a in shard.addresses}
    finally:
        shard.close()
    dumps = [dump_replica(d, a, 1) for a, d in data_dirs.items()]
    assert os.path.exists(os.path.join(data_dirs[leader.address], "snapshot"))
    for dump in dumps:
        assert dump.corruptions == ()
        assert (dump.first_lsn, dump.last_lsn) == (first_lsn, next_lsn - 1)
        assert dump.records == tuple(zip(range(first_lsn, next_lsn), expected.records, strict=True))
    assert len({(d.first_lsn, d.records) for d in dumps}) == 1


def _client_for(address: str, token: str) -> SyncClient:
    return SyncClient([address], token)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PROCESS_WAIT_S_MAX
    while True:
        try:
            if condition():
                return
        except (LogsvcError, OSError, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def dev_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 3-node, 1-shard `logsvc dev-cluster` whose nodes write one event log."""
    cluster_dir = tmp_path / "cluster"
    monkeypatch.setenv(events.ENV_VAR, str(tmp_path / "events.jsonl"))
    try:
        devcluster.up(str(cluster_dir), nodes=3, shards=1)
        yield cluster_dir
    finally:
        devcluster.down(str(cluster_dir))


def _converged_next_lsn(addresses: list[str], token: str) -> int:
    """Poll each node until all applied the same LSNs; return next_lsn."""
    seen: dict[str, int] = {}

    def same() -> bool:
        for address in addresses:
            client = _client_for(address, token)
            try:
                seen[address] = client.status(1).next_lsn
            finally:
                client.close()
        return len(set(seen.values())) == 1

    _wait(same, "every replica to apply the same LSNs")
    return next(iter(seen.values()))


def test_dev_cluster_dumps_events_and_a_power_cut_node_main(
    dev_cluster: Path, tmp_path: Path
) -> None:
    client_config = load_client_config(str(dev_cluster / "client.toml"))
    token = client_config.token
    addresses = list(client_config.addresses)
    rng = random.Random(2)
    acked: dict[int, bytes] = {}
    client = SyncClient(addresses, token)
    try:
        seq = 0
        for _ in range(12):
            batch = []
            for _ in range(rng.randint(1, 4)):
                seq += 1
                batch.append(history.make_payload(f"w-{seq:08d}", 1, rng))
            acked.update(zip(client.append(1, batch), batch, strict=True))
        first_lsn = client.truncate(1, 6)
        assert first_lsn == 6
    finally:
        client.close()
    next_lsn = _converged_next_lsn(addresses, token)
    assert next_lsn == max(acked) + 1

    # Restart n3 under node_main with a ledger and a failpoint that exits between a journal
    # write and its fdatasync (so unsynced bytes are certain), append through the cluster
    # until n3 dies there, cut its power, restart it as a plain node: it must come back
    # and converge.
    devcluster.kill_node(str(dev_cluster), "n3")
    ledger = str(tmp_path / "n3.ledger")
    disk.reset_ledger(str(dev_cluster / "n3"), ledger)
    log_path = dev_cluster / "n3-node-main.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        failpoints.ENV_VAR: "store_after_write_before_sync=exit@5",
    }
    with open(log_path, "ab") as log:
        node_main = subprocess.Popen(
            [*NODE_MAIN, "--config", str(dev_cluster / "n3.toml"), "--ledger", ledger],
            cwd=dev_cluster,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        client = SyncClient(addresses, token)
        try:
            deadline = time.monotonic() + PROCESS_WAIT_S_MAX
            while node_main.poll() is None:
                assert time.monotonic() < deadline, "n3 never reached its failpoint"
                batch = [history.make_payload(f"x-{rng.random()}", 1, rng) for _ in range(3)]
                acked.update(zip(client.append(1, batch), batch, strict=True))
        finally:
            client.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node_main.pid, signal.SIGKILL)
        node_main.wait(PROCESS_WAIT_S_MAX)
    assert node_main.returncode == failpoints.EXIT_CODE
    assert "FAILPOINT store_after_write_before_sync exit@5" in log_path.read_text()
    report = power_loss(str(dev_cluster / "n3"), ledger, "torn", random.Random(4))
    assert not report.vacuous, report.describe()
    assert report.mismatches == (), report.describe()
    next_lsn = max(acked) + 1
    devcluster.start_node(str(dev_cluster), "n3")
    assert _converged_next_lsn(addresses, token) == next_lsn
    devcluster.down(str(dev_cluster))

    dumps = [
        dump_replica(str(dev_cluster / f"n{i}" / "shards" / "1"), f"n{i}", 1) for i in (1, 2, 3)
    ]
    for dump in dumps:
        assert dump.corruptions == ()
        assert (dump.first_lsn, dump.last_lsn) == (6, next_lsn - 1)
        assert dict(dump.records) == {lsn: p for lsn, p in acked.items() if lsn >= 6}
        for _, record in dump.records:
            history.parse_payload(record)  # intact
    assert len({d.records for d in dumps}) == 1
    before = tree_digest(str(dev_cluster / "n1"))
    dump_replica(str(dev_cluster / "n1" / "shards" / "1"), "n1", 1)
    assert tree_digest(str(dev_cluster / "n1")) == before  # read-only

    logged = history.read_jsonl([str(tmp_path / "events.jsonl")]).events
    by_node = {node: [e for e in logged if e.node_id == node] for node in ("n1", "n2", "n3")}
    for node, node_events in by_node.items():
        starts = [e for e in node_events if e.kind == "start"]
        assert len(starts) == (3 if node == "n3" else 1), node  # n3 started three times
        assert all(e.shard == 1 for e in node_events)
    leaders = [e for e in logged if e.kind == "leader"]
    votes = [e for e in logged if e.kind == "vote"]
    assert leaders and votes
    for leader in leaders:  # a leader was voted for by itself in its term
        assert any(v.term == leader.term and v.node_id == leader.node_id for v in votes)
