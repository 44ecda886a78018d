"""Dense LSNs, monotonic truncation, LSN -> raft index, and snapshot/compaction points.

How: commands applied at chosen raft indexes (with gaps, as when pysyncobj's own entries are
skipped) and the state checked after each step against tables: the LSNs each append gets,
the first retained LSN after each truncate, where each LSN lives (raft index, offset) or
which typed error it raises, which snapshot points are kept and which one is compactable,
and that the index of retained entries shrinks when truncation passes them.
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
    NotLeaseHolder,
    Truncate,
    Truncated,
)
from logsvc.shard.errors import LsnNotAssigned, LsnTruncated, LsnUnavailable
from logsvc.shard.limits import ShardLimits
from logsvc.shard.state_machine import ShardStateMachine


def append(seq: int, count: int, epoch: int = 0) -> AppendBatch:
    return AppendBatch("w", seq, epoch, (b"r",) * count)


def test_lsns_are_dense_and_refused_appends_consume_none() -> None:
    machine = ShardStateMachine()
    steps: list[tuple[Command, object]] = [
        (append(1, 3), Appended(1, 3, False)),
        (append(2, 5, epoch=9), NotLeaseHolder(None, 0)),
        (append(3, 0), Appended(4, 0, False)),
        (Barrier(1), BarrierDone(1, 4)),
        (append(1, 3), Appended(1, 3, True)),
        (append(4, 2), Appended(4, 2, False)),
        (AcquireLease("h", 1), None),
        (append(5, 1), None),  # stale epoch 0
        (append(6, 1, epoch=1), Appended(6, 1, False)),
    ]
    for raft_index, (command, expected) in enumerate(steps, start=1):
        result = machine.apply(raft_index * 2, command)
        if expected is not None:
            assert result == expected, raft_index
    assert machine.next_lsn == 7


TRUNCATE_TABLE: list[tuple[int, int]] = [
    # (Truncate(lsn), first retained LSN afterwards); next_lsn is 11 throughout
    (0, 1),  # below: no-op, reports the current value
    (1, 1),  # equal: no-op
    (4, 4),
    (3, 4),  # lower: no-op
    (4, 4),  # equal: no-op
    (10, 10),
    (11, 11),  # everything truncated
    (50, 11),  # clamped to next_lsn: a future LSN is never truncated in advance
    (5, 11),
]


def test_truncate_is_monotonic_and_clamped() -> None:
    machine = ShardStateMachine()
    machine.apply(1, append(1, 10))
    for step, (lsn, first_lsn) in enumerate(TRUNCATE_TABLE, start=2):
        assert machine.apply(step, Truncate(lsn)) == Truncated(first_lsn), lsn
        assert machine.first_lsn == first_lsn
        assert machine.next_lsn == 11
    assert machine.apply(100, append(2, 2)) == Appended(11, 2, False)


def entries_machine() -> ShardStateMachine:
    """Entries: raft 3 holds LSNs 1-3, raft 5 is empty, raft 8 holds 4-5, raft 12 holds 6."""
    machine = ShardStateMachine()
    machine.apply(1, Barrier(0))
    machine.apply(3, append(1, 3))
    machine.apply(5, append(2, 0))
    machine.apply(8, append(3, 2))
    machine.apply(12, append(4, 1))
    return machine


LOCATE_TABLE: list[tuple[int, tuple[int, int] | type[LsnUnavailable]]] = [
    (0, LsnTruncated),
    (1, (3, 0)),
    (2, (3, 1)),
    (3, (3, 2)),
    (4, (8, 0)),
    (5, (8, 1)),
    (6, (12, 0)),
    (7, LsnNotAssigned),
    (10**12, LsnNotAssigned),
]


@pytest.mark.parametrize(("lsn", "where"), LOCATE_TABLE)
def test_lsn_to_raft_index(lsn: int, where: tuple[int, int] | type[LsnUnavailable]) -> None:
    machine = entries_machine()
    if isinstance(where, tuple):
        assert machine.lsn_to_raft_index(lsn) == where
    else:
        with pytest.raises(where):
            machine.lsn_to_raft_index(lsn)


def test_truncation_prunes_whole_entries_and_keeps_the_partial_one() -> None:
    machine = entries_machine()
    assert machine.entries_retained_count == 3
    machine.apply(13, Truncate(3))  # LSN 3 is still in raft 3's entry
    assert machine.entries_retained_count == 3
    assert machine.lsn_to_raft_index(3) == (3, 2)
    with pytest.raises(LsnTruncated) as caught:
        machine.lsn_to_raft_index(2)
    assert (caught.value.lsn, caught.value.first_lsn) == (2, 3)
    machine.apply(14, Truncate(5))
    assert machine.entries_retained_count == 2
    assert machine.lsn_to_raft_index(5) == (8, 1)
    machine.apply(15, Truncate(7))
    assert machine.entries_retained_count == 0
    with pytest.raises(LsnNotAssigned) as not_yet:
        machine.lsn_to_raft_index(7)
    assert not_yet.value.next_lsn == 7
    machine.apply(16, append(5, 2))
    assert machine.lsn_to_raft_index(8) == (16, 1)
    assert machine.entries_retained_count == 1


def test_lsn_lookup_in_many_entries() -> None:
    machine = ShardStateMachine()
    for entry in range(1, 2001):
        machine.apply(entry * 3, append(entry, entry % 3 + 1))
    lsn = 1
    for entry in range(1, 2001):
        for offset in range(entry % 3 + 1):
            assert machine.lsn_to_raft_index(lsn) == (entry * 3, offset)
            lsn += 1
    assert lsn == machine.next_lsn


# A table of truncations: after each step, the raft indexes of the kept snapshot points and
# of the compaction point. Raft index = step number. snapshot_points_max = 3.
COMPACTION_TABLE: list[tuple[Command, tuple[int, ...], int | None]] = [
    (append(1, 3), (), None),  # 1: LSNs 1-3
    (Truncate(2), (2,), None),  # 2: point next_lsn 4 > first 2
    (append(2, 2), (2,), None),  # 3: LSNs 4-5
    (Truncate(4), (2, 4), 2),  # 4: point@2 next_lsn 4 <= first 4: compactable
    (Truncate(4), (2, 4, 5), 2),  # 5: no-op truncate still records a point
    (append(3, 1), (2, 4, 5), 2),  # 6: LSN 6
    (Truncate(6), (5, 7), 5),  # 7: @4 and @5 (next 6) compactable; older ones dropped
    (Truncate(3), (5, 7, 8), 5),  # 8: no-op (first stays 6)
    (append(4, 1), (5, 7, 8), 5),  # 9: LSN 7
    (Truncate(1), (5, 8, 10), 5),  # 10: over max 3: drops @7, never the compaction point
    (Truncate(7), (8, 10, 11), 8),  # 11: @8 (next 7) compactable, @10 (next 8) not yet
    (Truncate(99), (12,), 12),  # 12: clamped to next_lsn 8: everything compactable
]


def test_compaction_point_table() -> None:
    machine = ShardStateMachine(ShardLimits(snapshot_points_max=3).validate())
    for raft_index, (command, kept, compactable) in enumerate(COMPACTION_TABLE, start=1):
        machine.apply(raft_index, command)
        points = machine.snapshot_points
        assert tuple(point.raft_index for point in points) == kept, raft_index
        point = machine.compaction_point()
        assert (None if point is None else point.raft_index) == compactable, raft_index


def test_a_point_holds_the_state_right_after_its_truncate() -> None:
    machine = ShardStateMachine()
    machine.apply(1, append(1, 3))
    machine.apply(4, Truncate(4))
    machine.apply(5, append(2, 1))
    (point,) = machine.snapshot_points
    assert (point.raft_index, point.next_lsn, point.first_lsn) == (4, 4, 4)
    assert machine.compaction_point() == point
    restored = ShardStateMachine.restore(point.data)
    assert restored.last_applied_raft_index == 4
    assert (restored.next_lsn, restored.first_lsn, restored.entries_retained_count) == (4, 4, 0)
    assert restored.snapshot_points == ()
    assert restored.remembered_seqs("w") == {1: (1, 3)}
    assert restored.apply(5, append(2, 1)) == Appended(4, 1, False)
    assert restored.snapshot() == machine.snapshot()
