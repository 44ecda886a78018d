"""Grouped appends (`AppendGroup`, tag 5): many writers' batches in one Raft entry behave
exactly as the same batches in separate entries, and every LSN reads back its record.

How: (1) a hypothesis test applies random scripts (batches from 5 clients with random seqs,
epochs and records, leases and truncations between them, small dedupe limits so clients and
seqs are forgotten) twice: replica G packs each run of batches into one AppendGroup entry,
replica S applies each batch as its own AppendBatch entry. Results, LSNs, lease and dedupe
table (order included) must be equal (only raft-index bookkeeping differs), and every
retained LSN must read back the same record on both through the read path
(`locate` + `decode_entry_records`); G's snapshot must round-trip and a replica restored
from it at a random point must converge. (2) Tables: dedupe inside and across groups,
refused batches consume no LSN, eviction in batch order, `lsn_to_raft_index` / `locate` on
group entries (also after truncation inside a group), and which snapshot version a state
needs. The golden vectors are in test_format_golden.py.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Appended,
    AppendGroup,
    Command,
    DuplicateUnknown,
    GroupAppended,
    LeaseGranted,
    NotLeaseHolder,
    Result,
    StaleEpoch,
    Truncate,
    decode_command,
    decode_entry_records,
    encode_command,
)
from logsvc.shard.errors import LsnNotAssigned, LsnTruncated
from logsvc.shard.limits import ShardLimits
from logsvc.shard.state_machine import (
    SNAPSHOT_VERSION_1,
    SNAPSHOT_VERSION_2,
    EntrySlice,
    ShardStateMachine,
)

SMALL = ShardLimits(
    dedupe_clients_max=3, dedupe_seqs_per_client=3, snapshot_points_max=2
).validate()


def read_all(
    machine: ShardStateMachine,
    entries: dict[int, bytes],
    lsn: int,
    limits: ShardLimits,
    max_records: int = 2**63,
) -> list[bytes]:
    """The read path as the replica should run it: `locate`, then the slice of the entry's
    flat record sequence; each entry decoded once even when it holds several runs."""
    records: list[bytes] = []
    cached_index = -1
    cached: tuple[bytes, ...] = ()
    while len(records) < max_records:
        try:
            where = machine.locate(lsn)
        except LsnNotAssigned:
            return records
        if where.raft_index != cached_index:
            cached_index = where.raft_index
            cached = decode_entry_records(entries[cached_index], limits)
        run = cached[where.offset : where.stop]
        assert len(run) == where.count
        records.extend(run)
        lsn += where.count
    return records[:max_records]


class Replica:
    """A state machine with its journal (raft index -> command bytes), like a replica."""

    def __init__(self, limits: ShardLimits = SMALL) -> None:
        self.machine = ShardStateMachine(limits)
        self.entries: dict[int, bytes] = {}
        self.raft_index = 0
        self.limits = limits

    def apply(self, command: Command, gap: int = 1) -> Result:
        self.raft_index += gap
        data = encode_command(command, self.limits)
        self.entries[self.raft_index] = data
        return self.machine.apply(self.raft_index, decode_command(data, self.limits))

    def read(self, lsn: int | None = None, max_records: int = 2**63) -> list[bytes]:
        start = self.machine.first_lsn if lsn is None else lsn
        return read_all(self.machine, self.entries, start, self.limits, max_records)


def observable(machine: ShardStateMachine) -> tuple[object, ...]:
    """The state except raft-index bookkeeping: the snapshot body without the last applied
    index, client activities and entry rows."""
    body = msgpack.unpackb(machine.snapshot()[12:], raw=False)
    clients = [(client_id, floor, seqs) for client_id, _active, floor, seqs in body[7]]
    return (*body[1:7], clients)


batches = st.builds(
    AppendBatch,
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.integers(0, 8),
    st.sampled_from([0, 0, 1, 1, 1, 2]),
    st.lists(st.binary(min_size=1, max_size=3), max_size=3).map(tuple),
)
Step = tuple[AppendBatch, ...] | Truncate | AcquireLease
steps: st.SearchStrategy[Step] = st.one_of(
    st.lists(batches, min_size=1, max_size=6).map(tuple),
    st.lists(batches, min_size=1, max_size=6).map(tuple),
    st.lists(batches, min_size=1, max_size=6).map(tuple),
    st.builds(Truncate, st.integers(0, 60), st.sampled_from([0, 1, 1, 2])),
    st.builds(AcquireLease, st.sampled_from(["h1", "h2"]), st.sampled_from([1, 1, 2])),
)


@settings(max_examples=300, deadline=None)
@given(
    st.booleans(),
    st.lists(st.tuples(steps, st.integers(1, 3)), min_size=1, max_size=25),
    st.data(),
)
def test_a_group_behaves_as_its_batches_in_separate_entries(
    lease_first: bool, script: list[tuple[Step, int]], data: st.DataObject
) -> None:
    if lease_first:  # most batches (epoch 1) are then accepted
        script = [(AcquireLease("h1", 1), 1), *script]
    grouped, separate = Replica(), Replica()
    expected: dict[int, bytes] = {}  # LSN -> record, from the separate entries' results
    split = data.draw(st.integers(0, len(script)), label="split")
    snapshot_at_split = grouped.machine.snapshot()
    for position, (step, gap) in enumerate(script):
        if isinstance(step, tuple):
            result = grouped.apply(AppendGroup(step), gap)
            assert isinstance(result, GroupAppended)
            one_by_one = [separate.apply(batch, gap) for batch in step]
            assert list(result.results) == one_by_one
            for batch, got in zip(step, one_by_one, strict=True):
                if isinstance(got, Appended) and not got.duplicate:
                    expected.update(zip(got.lsns, batch.records, strict=True))
        else:
            assert grouped.apply(step, gap) == separate.apply(step, gap)
        if position + 1 == split:
            snapshot_at_split = grouped.machine.snapshot()

    g, s = grouped.machine, separate.machine
    event(f"snapshot version {g.snapshot()[3]}")
    event(f"{g.entries_retained_count - s.entries_retained_count:+d} rows vs separate")
    assert observable(g) == observable(s)
    assert (g.next_lsn, g.first_lsn, g.lease) == (s.next_lsn, s.first_lsn, s.lease)
    assert g.dedupe_clients() == s.dedupe_clients()
    for client in "abcde":
        assert g.remembered_seqs(client) == s.remembered_seqs(client)
    # LSNs are dense: every accepted record got one, refused ones none.
    assert sorted(expected) == list(range(1, g.next_lsn))
    want = [expected[lsn] for lsn in range(g.first_lsn, g.next_lsn)]
    assert grouped.read() == want
    assert separate.read() == want
    for lsn in range(g.first_lsn, g.next_lsn):
        raft_index, offset = g.lsn_to_raft_index(lsn)
        assert decode_entry_records(grouped.entries[raft_index])[offset] == expected[lsn]
        assert grouped.read(lsn, max_records=2) == want[lsn - g.first_lsn :][:2]

    # Snapshots with group entries retained round-trip, and a replica restored at a random
    # point converges on the same state.
    final = g.snapshot()
    assert ShardStateMachine.restore(final, SMALL).snapshot() == final
    restored = ShardStateMachine.restore(snapshot_at_split, SMALL)
    assert restored.snapshot() == snapshot_at_split
    for raft_index in sorted(grouped.entries):
        if raft_index > restored.last_applied_raft_index:
            restored.apply(raft_index, decode_command(grouped.entries[raft_index], SMALL))
    assert restored.snapshot() == final
    assert read_all(restored, grouped.entries, restored.first_lsn, SMALL) == want


def run(commands: list[Command], limits: ShardLimits = SMALL) -> tuple[Replica, list[Result]]:
    replica = Replica(limits)
    results = [replica.apply(command) for command in commands]
    return replica, results


def batch(client: str, seq: int, count: int = 1, epoch: int = 0, tag: str = "") -> AppendBatch:
    return AppendBatch(
        client, seq, epoch, tuple(f"{client}{seq}{tag}.{i}".encode() for i in range(count))
    )


def group(*batches: AppendBatch) -> AppendGroup:
    return AppendGroup(batches)


def test_a_retry_inside_a_group_returns_the_original_lsns() -> None:
    replica, results = run([group(batch("a", 1, 2), batch("a", 1, 3, tag="retry"), batch("b", 1))])
    assert results == [
        GroupAppended((Appended(1, 2, False), Appended(1, 2, True), Appended(3, 1, False)))
    ]
    assert replica.machine.next_lsn == 4
    # The retry's records sit in the entry but hold no LSN: LSN 3 is b's, at offset 5.
    assert replica.machine.lsn_to_raft_index(3) == (1, 5)
    assert replica.read() == [b"a1.0", b"a1.1", b"b1.0"]


def test_dedupe_across_groups_and_plain_entries() -> None:
    replica, results = run(
        [
            group(batch("a", 1), batch("b", 1, 2)),
            batch("b", 1, tag="retry"),
            group(batch("b", 1), batch("a", 2), batch("a", 1), batch("c", 7)),
            group(batch("c", 7), batch("a", 2, 5)),
        ]
    )
    assert results == [
        GroupAppended((Appended(1, 1, False), Appended(2, 2, False))),
        Appended(2, 2, True),
        GroupAppended(
            (
                Appended(2, 2, True),
                Appended(4, 1, False),
                Appended(1, 1, True),
                Appended(5, 1, False),
            )
        ),
        GroupAppended((Appended(5, 1, True), Appended(4, 1, True))),
    ]
    assert replica.machine.next_lsn == 6
    assert replica.read() == [b"a1.0", b"b1.0", b"b1.1", b"a2.0", b"c7.0"]


def test_forgotten_seqs_inside_a_group_are_unknown() -> None:
    _, results = run([group(*(batch("a", seq) for seq in (1, 2, 3, 4)), batch("a", 1))])
    assert results == [
        GroupAppended(
            (
                Appended(1, 1, False),
                Appended(2, 1, False),
                Appended(3, 1, False),
                Appended(4, 1, False),  # forgets seq 1 (3 remembered)
                DuplicateUnknown("a", 1, 2),
            )
        )
    ]


def test_refused_batches_consume_no_lsn() -> None:
    replica, results = run(
        [
            AcquireLease("h", 1),
            group(
                batch("a", 1, 2, epoch=1),  # flat offsets 0-1: LSNs 1-2
                batch("b", 1, 3, epoch=0),  # offsets 2-4: stale
                batch("c", 1, 1, epoch=2),  # offset 5: not the lease holder
                batch("d", 1, 0, epoch=1),  # empty: accepted at LSN 3, count 0
                batch("d", 2, 1, epoch=1),  # offset 6: LSN 3
                batch("a", 2, 2, epoch=1),  # offsets 7-8: LSNs 4-5 (same run as d's)
            ),
            batch("e", 1, 1, epoch=1),
        ]
    )
    assert results == [
        LeaseGranted("h", 1),
        GroupAppended(
            (
                Appended(1, 2, False),
                StaleEpoch("h", 1),
                NotLeaseHolder("h", 1),
                Appended(3, 0, False),
                Appended(3, 1, False),
                Appended(4, 2, False),
            )
        ),
        Appended(6, 1, False),
    ]
    machine = replica.machine
    assert machine.remembered_seqs("b") == {}
    assert machine.remembered_seqs("c") == {}
    assert machine.entries_retained_count == 3  # raft 2 offsets 0-1, raft 2 offsets 6-8, raft 3
    assert [machine.locate(lsn) for lsn in range(1, 7)] == [
        EntrySlice(2, 0, 2),
        EntrySlice(2, 1, 1),
        EntrySlice(2, 6, 3),
        EntrySlice(2, 7, 2),
        EntrySlice(2, 8, 1),
        EntrySlice(3, 0, 1),
    ]
    assert replica.read() == [b"a1.0", b"a1.1", b"d2.0", b"a2.0", b"a2.1", b"e1.0"]
    assert replica.read(4) == [b"a2.0", b"a2.1", b"e1.0"]


def test_clients_of_a_group_are_evicted_in_batch_order() -> None:
    limits = ShardLimits(dedupe_clients_max=2, dedupe_seqs_per_client=3).validate()
    # "b" applied before "a" in the group: "b" is the least recently active, whatever the ids.
    replica, _ = run([group(batch("b", 1), batch("a", 1)), batch("c", 1)], limits)
    assert replica.machine.dedupe_clients() == ("a", "c")
    # The order survives a snapshot taken between the two entries (both active at raft 1).
    replica, _ = run([group(batch("b", 1), batch("a", 1))], limits)
    restored = ShardStateMachine.restore(replica.machine.snapshot(), limits)
    assert restored.dedupe_clients() == ("b", "a")
    restored.apply(2, batch("c", 1))
    assert restored.dedupe_clients() == ("a", "c")
    # A group with more clients than the table evicts inside the group, in batch order.
    replica, results = run(
        [group(batch("a", 1), batch("b", 1), batch("c", 1), batch("a", 1))], limits
    )
    assert results[0] == GroupAppended(
        (Appended(1, 1, False), Appended(2, 1, False), Appended(3, 1, False), Appended(4, 1, False))
    )
    assert replica.machine.dedupe_clients() == ("c", "a")


def group_entries() -> Replica:
    """raft 1: AppendBatch a1 (LSNs 1-2); raft 2: the lease; raft 3: a group [retry of a1
    (flat 0-1), a2 (flat 2-4: LSNs 3-5), empty a3, stale b1 (flat 5), a4 (flat 6: LSN 6)];
    raft 4: a group [a5] (LSNs 7-8); raft 5: a group [a6, a7] (LSNs 9-10, one run)."""
    replica, _ = run(
        [
            batch("a", 1, 2),
            AcquireLease("h", 1),
            group(
                batch("a", 1, 2, epoch=1),
                batch("a", 2, 3, epoch=1),
                batch("a", 3, 0, epoch=1),
                batch("b", 1, 1, epoch=0),
                batch("a", 4, 1, epoch=1),
            ),
            group(batch("a", 5, 2, epoch=1)),
            group(batch("a", 6, 1, epoch=1), batch("a", 7, 1, epoch=1)),
        ]
    )
    return replica


LOCATE_TABLE: list[tuple[int, tuple[int, int] | type[Exception]]] = [
    (0, LsnTruncated),
    (1, (1, 0)),
    (2, (1, 1)),
    (3, (3, 2)),
    (4, (3, 3)),
    (5, (3, 4)),
    (6, (3, 6)),
    (7, (4, 0)),
    (8, (4, 1)),
    (9, (5, 0)),
    (10, (5, 1)),
    (11, LsnNotAssigned),
]


@pytest.mark.parametrize(("lsn", "where"), LOCATE_TABLE)
def test_lsn_to_raft_index_on_groups(lsn: int, where: tuple[int, int] | type[Exception]) -> None:
    replica = group_entries()
    if isinstance(where, tuple):
        assert replica.machine.lsn_to_raft_index(lsn) == where
        raft_index, offset = where
        assert decode_entry_records(replica.entries[raft_index])[offset] == replica.read()[lsn - 1]
    else:
        with pytest.raises(where):
            replica.machine.lsn_to_raft_index(lsn)


def test_rows_of_group_entries() -> None:
    machine = group_entries().machine
    # raft 1; raft 3 twice (a refused batch between); raft 4; raft 5 (one run for two batches)
    assert machine.entries_retained_count == 5
    assert machine.locate(3) == EntrySlice(3, 2, 3)
    assert machine.locate(6) == EntrySlice(3, 6, 1)
    assert machine.locate(9) == EntrySlice(5, 0, 2)


def test_truncation_inside_a_group_and_the_snapshot_version() -> None:
    replica = group_entries()
    machine = replica.machine
    raft_index = replica.raft_index
    assert machine.snapshot()[3] == SNAPSHOT_VERSION_2  # raft 3's second run is at offset 6
    machine.apply(raft_index + 1, Truncate(4, 1))
    assert machine.entries_retained_count == 4
    assert machine.locate(4) == EntrySlice(3, 3, 2)
    assert replica.read() == [b"a2.1", b"a2.2", b"a4.0", b"a5.0", b"a5.1", b"a6.0", b"a7.0"]
    machine.apply(raft_index + 2, Truncate(6, 1))
    assert machine.entries_retained_count == 3
    assert machine.lsn_to_raft_index(6) == (3, 6)
    assert machine.snapshot()[3] == SNAPSHOT_VERSION_2  # the only row of raft 3 is at 6
    restored = ShardStateMachine.restore(machine.snapshot(), SMALL)
    assert read_all(restored, replica.entries, 6, SMALL) == [
        b"a4.0",
        b"a5.0",
        b"a5.1",
        b"a6.0",
        b"a7.0",
    ]
    machine.apply(raft_index + 3, Truncate(7, 1))
    # One client, every row at offset 0: version 1 again (older builds can read it).
    assert machine.snapshot()[3] == SNAPSHOT_VERSION_1
    assert ShardStateMachine.restore(machine.snapshot(), SMALL).snapshot() == machine.snapshot()


def test_snapshot_version_needed_by_a_state() -> None:
    # Nothing refused between accepted batches, one client: version 1 holds it.
    replica, _ = run([group(batch("a", 1, 2), batch("a", 2, 1))])
    assert replica.machine.snapshot()[3] == SNAPSHOT_VERSION_1
    # A refused batch with records first: the only run starts at offset 1: version 2.
    replica, _ = run([group(batch("a", 1, 2, epoch=5), batch("a", 2, 1))])
    assert replica.machine.locate(1) == EntrySlice(1, 2, 1)
    assert replica.machine.snapshot()[3] == SNAPSHOT_VERSION_2
    # A refused empty batch does not split the run.
    replica, _ = run([group(batch("a", 1, 0, epoch=5), batch("a", 2, 1))])
    assert replica.machine.snapshot()[3] == SNAPSHOT_VERSION_1
    # Two clients active at the same raft index: version 2.
    replica, _ = run([group(batch("a", 1), batch("b", 1))])
    assert replica.machine.entries_retained_count == 1
    assert replica.machine.snapshot()[3] == SNAPSHOT_VERSION_2
    data = replica.machine.snapshot()
    assert ShardStateMachine.restore(data, SMALL).snapshot() == data


def test_a_group_of_one_batch_is_that_batch() -> None:
    grouped, _ = run([group(batch("a", 1, 3))])
    plain, _ = run([batch("a", 1, 3)])
    assert grouped.machine.snapshot() == plain.machine.snapshot()
    assert grouped.read() == plain.read()
