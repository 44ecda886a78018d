"""Lease and fencing rules of the state machine, as in decision 0001 "Leases, fencing, dedupe".

How: tables of (command, expected result) applied in order to a fresh state machine, with
the lease and next LSN checked after each step. Covers grant/idempotent/stale lease
requests, the append and truncate epoch rules (stale, not holder, epoch 0 before any
lease), that a fenced writer can never write, truncate or take the lease back with its
epoch, that every refused command leaves the state unchanged and consumes no LSN, and that
a refused truncate records no snapshot point.
"""

from __future__ import annotations

import pytest

from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Appended,
    Barrier,
    BarrierDone,
    Command,
    LeaseGranted,
    NotLeaseHolder,
    Result,
    StaleEpoch,
    Truncate,
    Truncated,
    UnfencedTruncate,
)
from logsvc.shard.state_machine import Lease, ShardStateMachine

Step = tuple[Command, Result]


def run(steps: list[Step]) -> ShardStateMachine:
    machine = ShardStateMachine()
    for raft_index, (command, expected) in enumerate(steps, start=1):
        before = state(machine)
        result = machine.apply(raft_index, command)
        assert result == expected, (raft_index, command)
        if isinstance(result, (StaleEpoch, NotLeaseHolder)):
            # A refused command changes nothing (but the last applied index).
            assert state(machine) == before
    return machine


def state(machine: ShardStateMachine) -> tuple[object, ...]:
    return (
        machine.lease,
        machine.next_lsn,
        machine.first_lsn,
        machine.remembered_seqs("w"),
        machine.snapshot_points,
    )


def append(epoch: int, seq: int, count: int = 1, client: str = "w") -> AppendBatch:
    return AppendBatch(client, seq, epoch, (b"r",) * count)


LEASE_TABLES: dict[str, list[Step]] = {
    "first grant at any epoch >= 1": [
        (AcquireLease("a", 5), LeaseGranted("a", 5)),
    ],
    "idempotent retry by the holder": [
        (AcquireLease("a", 1), LeaseGranted("a", 1)),
        (AcquireLease("a", 1), LeaseGranted("a", 1)),
    ],
    "same epoch, other holder: stale": [
        (AcquireLease("a", 1), LeaseGranted("a", 1)),
        (AcquireLease("b", 1), StaleEpoch("a", 1)),
    ],
    "lower epoch: stale, whoever asks": [
        (AcquireLease("a", 3), LeaseGranted("a", 3)),
        (AcquireLease("b", 2), StaleEpoch("a", 3)),
        (AcquireLease("a", 2), StaleEpoch("a", 3)),
    ],
    "higher epoch takes over; the holder itself can move up": [
        (AcquireLease("a", 1), LeaseGranted("a", 1)),
        (AcquireLease("b", 2), LeaseGranted("b", 2)),
        (AcquireLease("b", 3), LeaseGranted("b", 3)),
    ],
    "a fenced writer can never take the lease back with its epoch": [
        (AcquireLease("a", 1), LeaseGranted("a", 1)),
        (append(1, 1), Appended(1, 1, False)),
        (AcquireLease("b", 2), LeaseGranted("b", 2)),
        # "a" retries everything it knows, again and again (MatrixOne's reconnect loop).
        (AcquireLease("a", 1), StaleEpoch("b", 2)),
        (append(1, 2), StaleEpoch("b", 2)),
        (AcquireLease("a", 2), StaleEpoch("b", 2)),
        (AcquireLease("a", 1), StaleEpoch("b", 2)),
        (append(1, 3), StaleEpoch("b", 2)),
        (append(2, 4, client="b"), Appended(2, 1, False)),  # LSN 2: a's refusals took none
        (AcquireLease("a", 1), StaleEpoch("b", 2)),
        (Truncate(2, 1), StaleEpoch("b", 2)),  # nor truncate the shared log
        (Truncate(2), StaleEpoch("b", 2)),  # not even at epoch 0
        (Truncate(2, 3), NotLeaseHolder("b", 2)),  # nor jump ahead of the lease
        (Barrier(7), BarrierDone(7, 3)),
        (Truncate(2, 2), Truncated(2)),  # the holder truncates
    ],
}


@pytest.mark.parametrize("name", list(LEASE_TABLES))
def test_lease_table(name: str) -> None:
    run(LEASE_TABLES[name])


APPEND_EPOCH_TABLE: list[tuple[str, Lease, int, Result]] = [
    ("no lease ever, epoch 0: accepted", Lease(None, 0), 0, Appended(1, 2, False)),
    ("no lease ever, epoch 1: acquire first", Lease(None, 0), 1, NotLeaseHolder(None, 0)),
    ("lease at 2, epoch 0: stale", Lease("h", 2), 0, StaleEpoch("h", 2)),
    ("lease at 2, epoch 1: stale", Lease("h", 2), 1, StaleEpoch("h", 2)),
    ("lease at 2, epoch 2: accepted", Lease("h", 2), 2, Appended(1, 2, False)),
    ("lease at 2, epoch 3: not holder", Lease("h", 2), 3, NotLeaseHolder("h", 2)),
]


@pytest.mark.parametrize(
    ("name", "lease", "epoch", "expected"),
    APPEND_EPOCH_TABLE,
    ids=[row[0] for row in APPEND_EPOCH_TABLE],
)
def test_append_epoch_rules(name: str, lease: Lease, epoch: int, expected: Result) -> None:
    machine = ShardStateMachine()
    if lease.holder is not None:
        assert machine.apply(1, AcquireLease(lease.holder, lease.epoch)) == LeaseGranted(
            lease.holder, lease.epoch
        )
    assert machine.lease == lease
    assert machine.apply(10, append(epoch, 1, count=2)) == expected
    # Refused or not, the next accepted append gets the next dense LSN.
    next_lsn = 3 if isinstance(expected, Appended) else 1
    assert machine.next_lsn == next_lsn
    assert machine.apply(11, append(lease.epoch, 2)) == Appended(next_lsn, 1, False)


def test_epoch_0_writers_are_fenced_by_the_first_lease() -> None:
    run(
        [
            (append(0, 1), Appended(1, 1, False)),
            (Truncate(1), Truncated(1)),
            (AcquireLease("tn", 1), LeaseGranted("tn", 1)),
            (append(0, 2), StaleEpoch("tn", 1)),
            (Truncate(2), StaleEpoch("tn", 1)),
            (append(1, 2), Appended(2, 1, False)),
            (Truncate(2, 1), Truncated(2)),
        ]
    )


TRUNCATE_EPOCH_TABLE: list[tuple[str, Lease, int, Result]] = [
    ("no lease ever, epoch 0: accepted", Lease(None, 0), 0, Truncated(3)),
    ("no lease ever, epoch 1: acquire first", Lease(None, 0), 1, NotLeaseHolder(None, 0)),
    ("lease at 2, epoch 0: stale", Lease("h", 2), 0, StaleEpoch("h", 2)),
    ("lease at 2, epoch 1: stale", Lease("h", 2), 1, StaleEpoch("h", 2)),
    ("lease at 2, epoch 2: accepted", Lease("h", 2), 2, Truncated(3)),
    ("lease at 2, epoch 3: not holder", Lease("h", 2), 3, NotLeaseHolder("h", 2)),
]


def leased_machine(lease: Lease) -> ShardStateMachine:
    """`lease` granted at raft index 1 (if any), then LSNs 1-4 appended at 2."""
    machine = ShardStateMachine()
    if lease.holder is not None:
        machine.apply(1, AcquireLease(lease.holder, lease.epoch))
    assert machine.apply(2, append(lease.epoch, 1, count=4)) == Appended(1, 4, False)
    assert machine.lease == lease
    return machine


@pytest.mark.parametrize(
    ("name", "lease", "epoch", "expected"),
    TRUNCATE_EPOCH_TABLE,
    ids=[row[0] for row in TRUNCATE_EPOCH_TABLE],
)
def test_truncate_epoch_rules(name: str, lease: Lease, epoch: int, expected: Result) -> None:
    """The append rule exactly (the table above with Truncated for Appended); a refused
    truncate changes nothing, first_lsn included, and records no snapshot point."""
    machine = leased_machine(lease)
    assert machine.apply(10, Truncate(3, epoch)) == expected
    if isinstance(expected, Truncated):
        assert machine.first_lsn == 3
        assert [point.raft_index for point in machine.snapshot_points] == [10]
    else:
        assert machine.first_lsn == 1
        assert machine.snapshot_points == ()
        # The whole state is that of a machine that applied a no-op at the same index.
        unchanged = leased_machine(lease)
        unchanged.apply(10, Barrier(0))
        assert machine.snapshot() == unchanged.snapshot()
    # The holder's truncate is accepted afterwards either way.
    assert machine.apply(11, Truncate(3, lease.epoch)) == Truncated(3)
    assert machine.snapshot_points[-1].raft_index == 11


def test_an_unfenced_truncate_of_an_earlier_build_applies_as_it_did() -> None:
    """Type tag 2 entries (no epoch) replay as earlier builds applied them: unchecked."""
    machine = leased_machine(Lease("h", 2))
    assert machine.apply(10, UnfencedTruncate(3)) == Truncated(3)
    assert machine.first_lsn == 3
    assert [point.raft_index for point in machine.snapshot_points] == [10]


def test_raft_indexes_may_skip_but_never_go_back() -> None:
    machine = ShardStateMachine()
    machine.apply(5, Barrier(1))
    machine.apply(9, Barrier(2))
    assert machine.last_applied_raft_index == 9
    with pytest.raises(AssertionError):
        machine.apply(9, Barrier(3))
