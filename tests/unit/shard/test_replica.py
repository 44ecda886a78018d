"""A 3-replica shard (real pysyncobj on loopback, real stores) does what issue 3 asks.

Dense LSNs and reads; an append retried after a leader failover gets its original LSNs back
(exactly once); a fenced writer stays fenced, for appends and truncates; truncation
compacts the journal at a snapshot point and a replica that was down meanwhile catches up
from the snapshot plus the retained entries, ending with the same state and journal; a
brand-new replica catches up from scratch; a whole-cluster kill and restart keeps every
acknowledged record. Waits are bounded polls.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from logsvc.shard.commands import (
    Appended,
    LeaseGranted,
    StaleEpoch,
    Truncated,
    UnfencedTruncate,
)
from logsvc.shard.errors import CommandCorrupt, CommandInvalid, LsnTruncated
from logsvc.shard.raft.config import RaftConfig
from logsvc.shard.replica import (
    MembershipChangeInProgress,
    NotLeader,
    OutcomeUnknown,
    ReplicaConfig,
    ShardReplica,
)
from logsvc.store import StoreLimits

from .raft_harness import SECRET, WAIT_S_MAX, free_port, free_ports, wait_until

LIMITS = StoreLimits(segment_bytes_max=64 * 1024)
T = TypeVar("T")


class Shard:
    def __init__(self, base: Path, size: int = 3) -> None:
        self.base = base
        self.addresses = [f"127.0.0.1:{port}" for port in free_ports(size)]
        self.replicas: dict[str, ShardReplica] = {}

    def config(self, address: str, peers: list[str]) -> ReplicaConfig:
        data_dir = str(self.base / address.replace(":", "_"))
        raft = RaftConfig(
            self_address=address,
            peers=tuple(p for p in peers if p != address),
            secret=SECRET,
            snapshot_path=os.path.join(data_dir, "snapshot"),
            election_timeout_ms_min=400,
            election_timeout_ms_max=900,
            heartbeat_ms=50,
            leader_fallback_ms=2000,
        )
        return ReplicaConfig(data_dir=data_dir, raft=raft, store_limits=LIMITS)

    def start(self, address: str, peers: list[str] | None = None) -> ShardReplica:
        replica = ShardReplica(self.config(address, peers or self.addresses))
        replica.start()
        self.replicas[address] = replica
        return replica

    def start_all(self) -> None:
        for address in self.addresses:
            self.start(address)

    def stop(self, address: str) -> None:
        self.replicas.pop(address).close()

    def kill(self, address: str) -> None:
        self.replicas.pop(address).kill()

    def close(self) -> None:
        for address in list(self.replicas):
            self.stop(address)

    def leader(self) -> ShardReplica:
        found: list[ShardReplica] = []

        def one() -> bool:
            found[:] = [r for r in self.replicas.values() if r.is_leader]
            return len(found) == 1

        wait_until(one, "one leader")
        return found[0]

    def call(self, operation: Callable[[ShardReplica], T]) -> T:
        """Run a write on the current leader, retrying on NotLeader / OutcomeUnknown as a
        client does (the same (client_id, seq) makes an append retry exactly-once)."""
        deadline = time.monotonic() + WAIT_S_MAX
        while True:
            try:
                return operation(self.leader())
            except (NotLeader, OutcomeUnknown):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def append(self, client: str, seq: int, records: tuple[bytes, ...], epoch: int = 0) -> object:
        return self.call(lambda r: r.append(client, seq, records, epoch=epoch))

    def converged(self) -> None:
        """Every running replica applied everything the leader committed."""
        self.call(lambda r: r.barrier())
        target = self.leader().status()["last_applied_raft_index"]
        for replica in self.replicas.values():
            wait_until(partial(applied_up_to, replica, target), f"{replica.address} to apply")


def applied_up_to(replica: ShardReplica, raft_index: int) -> bool:
    return int(replica.status()["last_applied_raft_index"]) >= raft_index


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[Shard]:
    cluster = Shard(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


def batch(prefix: str, count: int) -> tuple[bytes, ...]:
    return tuple(f"{prefix}-{i}".encode() for i in range(count))


def appended(result: object) -> Appended:
    assert isinstance(result, Appended), result
    return result


def test_dense_lsns_and_reads_on_every_replica(shard: Shard) -> None:
    shard.start_all()
    first = appended(shard.append("w", 1, batch("a", 5)))
    second = appended(shard.append("w", 2, batch("b", 3)))
    assert (first.first_lsn, first.count, second.first_lsn) == (1, 5, 6)
    shard.converged()
    for replica in shard.replicas.values():
        read = replica.read(1, 1 << 20)
        assert read.records == (*batch("a", 5), *batch("b", 3))
        assert read.next_lsn == 9
        assert replica.read(9, 100).records == ()  # end of the log: next == lsn
        assert replica.read(9, 100).next_lsn == 9
        assert replica.read(2, 0).records == (b"a-1",)  # at least one record
    follower = next(r for r in shard.replicas.values() if not r.is_leader)
    with pytest.raises(NotLeader) as raised:
        follower.append("w", 3, batch("c", 1))
    assert raised.value.leader_hint in shard.addresses  # where to redirect


def test_a_state_machine_that_disagrees_with_the_journal_fails_a_read_not_hangs_it(
    shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state machine maps LSNs to more records than their journal entry holds (an entry
    replaced under a disk that lied about a sync: the simulator's negative control): the
    read raises `CommandCorrupt` naming the entry. It used to serve what it found here, and
    to loop on an LSN for ever when the entry held none of its records (DST seed 7 of the
    negative control, once elections changed its path)."""
    shard.start_all()
    appended(shard.append("w", 1, batch("a", 3)))
    shard.converged()
    replica = shard.leader()
    machine = replica._machine
    real = machine.locate

    def beyond(lsn: int) -> object:
        where = real(lsn)
        return dataclasses.replace(where, count=where.count + 2)

    monkeypatch.setattr(machine, "locate", beyond)
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(_read_or_error(replica)), daemon=True)
    reader.start()
    reader.join(WAIT_S_MAX)
    assert not reader.is_alive(), "the read never ended"
    [error] = outcome
    assert isinstance(error, CommandCorrupt) and "holds 3 records" in str(error), error


def _read_or_error(replica: ShardReplica) -> object:
    try:
        return replica.read(1, 1 << 20)
    except CommandCorrupt as exc:
        return exc


def test_a_retry_after_failover_gets_the_original_lsns(shard: Shard) -> None:
    shard.start_all()
    appended(shard.append("w", 1, batch("a", 4)))
    original = appended(shard.append("w", 2, batch("b", 2)))
    shard.converged()
    shard.kill(shard.leader().address)
    retried = appended(shard.append("w", 2, batch("b", 2)))
    assert retried.duplicate
    assert (retried.first_lsn, retried.count) == (original.first_lsn, original.count)
    after = appended(shard.append("w", 3, batch("c", 1)))
    assert after.first_lsn == original.first_lsn + original.count  # nothing appended twice
    assert shard.leader().read(1, 1 << 20).records == (
        *batch("a", 4),
        *batch("b", 2),
        *batch("c", 1),
    )


def test_a_fenced_writer_can_never_take_the_lease_back(shard: Shard) -> None:
    shard.start_all()
    assert shard.call(lambda r: r.acquire_lease("tn-1", 1)) == LeaseGranted("tn-1", 1)
    appended(shard.append("tn-1", 1, batch("x", 1), epoch=1))
    assert shard.call(lambda r: r.acquire_lease("tn-2", 2)) == LeaseGranted("tn-2", 2)
    assert shard.append("tn-1", 2, batch("y", 1), epoch=1) == StaleEpoch("tn-2", 2)
    assert shard.call(lambda r: r.acquire_lease("tn-1", 1)) == StaleEpoch("tn-2", 2)
    assert shard.call(lambda r: r.truncate(2, epoch=1)) == StaleEpoch("tn-2", 2)
    assert shard.leader().status()["first_lsn"] == 1  # the fenced truncate changed nothing
    with pytest.raises(CommandInvalid, match="never proposed"):  # no way around the fence
        shard.leader().submit(UnfencedTruncate(2), lambda _outcome: None)
    shard.kill(shard.leader().address)  # the fence survives a leader change
    assert shard.call(lambda r: r.acquire_lease("tn-1", 2)) == StaleEpoch("tn-2", 2)
    appended(shard.append("tn-2", 1, batch("z", 1), epoch=2))
    assert shard.call(lambda r: r.truncate(2, epoch=2)) == Truncated(2)


def compact(shard: Shard) -> tuple[int, int]:
    """Append and truncate twice so the first truncate's snapshot point is compactable.
    Returns (first retained LSN, next LSN)."""
    seq = 100
    for round_ in range(2):
        for _ in range(20):
            seq += 1
            appended(shard.append("w", seq, batch(f"r{round_}-{seq}", 10)))
        point = int(shard.leader().status()["next_lsn"]) - 5
        assert isinstance(shard.call(partial(ShardReplica.truncate, lsn=point)), Truncated)
    status = shard.leader().status()
    return status["first_lsn"], status["next_lsn"]


def test_truncation_compacts_and_a_replica_that_was_down_catches_up(shard: Shard) -> None:
    shard.start_all()
    shard.converged()
    down = next(a for a, r in shard.replicas.items() if not r.is_leader)
    shard.stop(down)
    first_lsn, next_lsn = compact(shard)
    leader = shard.leader()
    wait_until(lambda: leader.store.first_index > 1, "the leader to compact its journal")
    with pytest.raises(LsnTruncated):
        leader.read(first_lsn - 1, 100)
    shard.start(down)
    shard.converged()
    caught_up = shard.replicas[down]
    assert caught_up.store.first_index > 1  # it installed the snapshot: 1.. were gone
    assert caught_up.read(first_lsn, 1 << 20) == leader.read(first_lsn, 1 << 20)
    assert caught_up.read(first_lsn, 1 << 20).next_lsn == next_lsn
    assert caught_up.status()["state_digest"] == leader.status()["state_digest"]
    lo = max(caught_up.store.first_index, leader.store.first_index)
    hi = leader.store.last_index + 1
    assert caught_up.store.read(lo, hi, 1 << 30) == leader.store.read(lo, hi, 1 << 30)


def test_a_brand_new_replica_catches_up_from_scratch(shard: Shard) -> None:
    shard.start_all()
    first_lsn, next_lsn = compact(shard)
    newcomer = f"127.0.0.1:{free_port()}"
    shard.call(lambda r: r.add_member(newcomer))
    shard.start(newcomer, peers=[*shard.addresses, newcomer])
    shard.converged()
    leader = shard.leader()
    replica = shard.replicas[newcomer]
    assert replica.store.first_index > 1  # caught up from the snapshot, not from index 1
    assert replica.read(first_lsn, 1 << 20) == leader.read(first_lsn, 1 << 20)
    assert replica.status()["state_digest"] == leader.status()["state_digest"]
    assert replica.read(first_lsn, 1 << 20).next_lsn == next_lsn


def test_a_whole_cluster_kill_and_restart_keeps_every_acknowledged_record(shard: Shard) -> None:
    shard.start_all()
    first_lsn, next_lsn = compact(shard)
    more = appended(shard.append("w", 999, batch("last", 7)))
    expected = shard.leader().read(first_lsn, 1 << 30)
    for address in list(shard.replicas):  # all killed within milliseconds
        shard.kill(address)
    shard.start_all()
    shard.converged()
    for replica in shard.replicas.values():
        assert replica.read(first_lsn, 1 << 30) == expected
    after = appended(shard.append("w", 1000, batch("again", 1)))
    assert after.first_lsn == more.first_lsn + more.count
    assert next_lsn <= more.first_lsn


def test_kill_any_replica_at_any_time_keeps_acked_records_and_replicas_identical(
    shard: Shard,
) -> None:
    """Five rounds: a writer appends while a random replica (leader or follower) is
    killed at a random moment and restarted. Every acknowledged batch must be readable, in
    order, with its LSNs, on every replica; the replicas' states must be identical."""
    rng = random.Random(20261121)
    shard.start_all()
    acked: dict[int, tuple[int, tuple[bytes, ...]]] = {}
    seq = 0
    for round_ in range(5):
        victim = rng.choice(shard.addresses)
        kill_after = rng.randint(0, 15)
        for step in range(20):
            seq += 1
            records = batch(f"k{round_}-{seq}", rng.randint(1, 4))
            if step == kill_after:
                shard.kill(victim)
            result = appended(shard.append("writer", seq, records))
            acked[seq] = (result.first_lsn, records)
        shard.start(victim)
    shard.converged()
    expected = tuple(r for _, (_, records) in sorted(acked.items()) for r in records)
    digests = set()
    for replica in shard.replicas.values():
        assert replica.read(1, 1 << 30).records == expected
        for first_lsn, records in acked.values():
            assert replica.read(first_lsn, 1 << 30).records[: len(records)] == records
        digests.add(replica.status()["state_digest"])
    assert len(digests) == 1


def test_one_membership_change_at_a_time(shard: Shard) -> None:
    shard.start_all()
    leader = shard.leader()
    with leader._membership_lock, pytest.raises(MembershipChangeInProgress):
        leader.add_member(f"127.0.0.1:{free_port()}")


def test_the_leader_applies_the_commands_it_proposed_without_decoding_them(
    shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    from logsvc.shard import replica as replica_module

    shard.start_all()
    leader = shard.leader()
    decoded_on: list[int] = []
    from logsvc.shard.commands import Command, decode_command
    from logsvc.shard.limits import ShardLimits

    def counting_decode(data: bytes, limits: ShardLimits) -> Command:
        decoded_on.append(id(threading.current_thread()))
        return decode_command(data, limits)

    monkeypatch.setattr(replica_module, "decode_command", counting_decode)
    results = [appended(leader.append("w", seq, batch(f"s{seq}", 3))) for seq in range(1, 21)]
    assert [r.first_lsn for r in results] == list(range(1, 61, 3))
    shard.converged()
    leader_thread = id(leader._node.tick_thread)
    assert leader_thread not in decoded_on  # the leader used what it encoded...
    assert len(decoded_on) >= 40  # ...the followers decoded every entry
    assert not leader._proposed and leader._proposed_bytes == 0  # nothing left behind
    for replica in shard.replicas.values():
        assert replica.read(1, 1 << 20).records == tuple(
            record for seq in range(1, 21) for record in batch(f"s{seq}", 3)
        )


def test_the_proposed_commands_kept_for_the_leader_are_bounded(
    shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    from logsvc.shard import replica as replica_module
    from logsvc.shard.commands import AppendBatch

    monkeypatch.setattr(replica_module, "PROPOSED_CACHED_MAX", 4)
    shard.start_all()
    leader = shard.leader()
    for seq in range(10):  # as if never applied: a leadership lost before the commit
        leader._remember_proposed(b"entry %d" % seq, AppendBatch("w", seq, 0, (b"x",)))
    assert list(leader._proposed) == [b"entry %d" % seq for seq in range(6, 10)]
    assert leader._proposed_bytes == sum(len(key) for key in leader._proposed)
