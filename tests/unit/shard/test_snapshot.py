"""State machine snapshots: restore is the exact inverse of snapshot, replicas converge, and
bad snapshot bytes are reported as typed errors.

How: (1) a hypothesis test drives replica A with a random sequence of commands (through the
command codec, at increasing raft indexes with gaps, small dedupe limits so eviction
happens; AppendGroups among them, so version 2 snapshots are exercised too); replica B
restores A's snapshot taken at a random point and applies the rest; B must produce the same
results and end with byte-identical snapshot bytes and the same LSN -> raft index map. A
replica restored from each snapshot point converges too.
(2) Corruption: every truncation and byte flip of a real snapshot (version 1 and 2), a wrong
version, other dedupe limits (`SnapshotIncompatible`), and bodies of either version with a
valid checksum that break one invariant each, or are not in canonical form (among them a
version 2 body of a state that version 1 can hold) (`SnapshotCorrupt`, naming the reason).
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsvc.shard.commands import (
    FRAME_HEADER,
    AcquireLease,
    AppendBatch,
    AppendGroup,
    Barrier,
    Command,
    Result,
    Truncate,
    decode_command,
    encode_command,
    xxh3,
)
from logsvc.shard.errors import LsnUnavailable, SnapshotCorrupt, SnapshotIncompatible
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits
from logsvc.shard.state_machine import (
    SNAPSHOT_MAGIC,
    SNAPSHOT_VERSION_1,
    SNAPSHOT_VERSION_2,
    EntrySlice,
    ShardStateMachine,
    SnapshotPoint,
)

SMALL = ShardLimits(
    dedupe_clients_max=3, dedupe_seqs_per_client=3, snapshot_points_max=2
).validate()

# Weighted so that most appends are accepted (epochs 0 and 1 are the common ones, leases are
# rare), seqs repeat (duplicates and forgotten seqs) and 5 clients overflow a table of 3.
appends = st.builds(
    AppendBatch,
    st.sampled_from(["a", "b", "c", "d", "e"]),
    st.integers(0, 8),
    st.sampled_from([0, 0, 1, 1, 1, 2]),
    st.lists(st.binary(max_size=3), max_size=3).map(tuple),
)
others: list[st.SearchStrategy[Command]] = [
    st.builds(Truncate, st.integers(0, 40), st.sampled_from([0, 0, 1, 1, 2])),
    st.builds(AcquireLease, st.sampled_from(["h1", "h2"]), st.sampled_from([1, 1, 2])),
    st.builds(Barrier, st.integers(0, 5)),
]
groups: st.SearchStrategy[Command] = st.builds(
    AppendGroup, st.lists(appends, min_size=1, max_size=4).map(tuple)
)
command_strategy: st.SearchStrategy[Command] = st.integers(0, 11).flatmap(
    lambda kind: appends if kind < 7 else groups if kind < 9 else others[kind - 9]
)


def lsn_map(machine: ShardStateMachine) -> list[tuple[int, int]]:
    return [machine.lsn_to_raft_index(lsn) for lsn in range(machine.first_lsn, machine.next_lsn)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(command_strategy, st.integers(1, 3)), min_size=10, max_size=80),
    st.data(),
)
def test_a_restored_replica_converges(
    script: list[tuple[Command, int]], data: st.DataObject
) -> None:
    indexed: list[tuple[int, Command]] = []
    raft_index = 0
    for command, gap in script:
        raft_index += gap
        indexed.append((raft_index, decode_command(encode_command(command))))
    split = data.draw(st.integers(0, len(indexed)), label="split")

    replica_a = ShardStateMachine(SMALL)
    results_a: list[Result] = []
    snapshot_at_split = replica_a.snapshot()
    points_seen: list[SnapshotPoint] = []
    for position, (index, command) in enumerate(indexed):
        results_a.append(replica_a.apply(index, command))
        if position + 1 == split:
            snapshot_at_split = replica_a.snapshot()
        points_seen.extend(replica_a.snapshot_points)
        # Every accepted record got the next dense LSN.
        assert replica_a.first_lsn <= replica_a.next_lsn

    replica_b = ShardStateMachine.restore(snapshot_at_split, SMALL)
    assert replica_b.snapshot() == snapshot_at_split
    results_b = [replica_b.apply(index, command) for index, command in indexed[split:]]
    assert results_b == results_a[split:]
    assert replica_b.snapshot() == replica_a.snapshot()
    assert replica_b.state_digest() == replica_a.state_digest()
    assert lsn_map(replica_b) == lsn_map(replica_a)

    for point in {point.raft_index: point for point in points_seen}.values():
        replica_c = ShardStateMachine.restore(point.data, SMALL)
        assert replica_c.last_applied_raft_index == point.raft_index
        assert (replica_c.next_lsn, replica_c.first_lsn) == (point.next_lsn, point.first_lsn)
        for index, command in indexed:
            if index > point.raft_index:
                replica_c.apply(index, command)
        assert replica_c.snapshot() == replica_a.snapshot()


def test_dense_lsns_match_the_accepted_appends() -> None:
    machine = ShardStateMachine(SMALL)
    accepted = 0
    for index, command in enumerate(
        [AppendBatch(c, s, 0, (b"x",) * (s % 3)) for s in range(8) for c in "abcde"], start=1
    ):
        result = machine.apply(index, command)
        if getattr(result, "duplicate", True) is False:
            accepted += len(command.records)
    assert machine.next_lsn == 1 + accepted


def build_machine() -> ShardStateMachine:
    machine = ShardStateMachine(SMALL)
    machine.apply(1, AcquireLease("h1", 1))
    for index in range(2, 14):
        machine.apply(index, AppendBatch("abcd"[index % 4], index, 1, (b"r",) * (index % 3)))
    machine.apply(20, Truncate(6, 1))
    machine.apply(21, AppendBatch("a", 99, 1, (b"x", b"y")))
    return machine


GOOD = build_machine().snapshot()


def build_grouped_machine() -> ShardStateMachine:
    """A state only version 2 holds: a group with a refused batch between accepted ones."""
    machine = build_machine()
    machine.apply(
        30,
        AppendGroup(
            (
                AppendBatch("b", 50, 1, (b"1", b"2")),
                AppendBatch("c", 51, 0, (b"stale",)),
                AppendBatch("d", 52, 1, (b"3",)),
            )
        ),
    )
    return machine


GOOD_V2 = build_grouped_machine().snapshot()


def test_round_trip_keeps_every_observable() -> None:
    machine = build_machine()
    restored = ShardStateMachine.restore(GOOD, SMALL)
    assert restored.snapshot() == GOOD
    assert restored.last_applied_raft_index == 21
    assert (restored.next_lsn, restored.first_lsn) == (machine.next_lsn, machine.first_lsn)
    assert restored.lease == machine.lease
    assert restored.dedupe_clients() == machine.dedupe_clients()
    for client in machine.dedupe_clients():
        assert restored.remembered_seqs(client) == machine.remembered_seqs(client)
    assert lsn_map(restored) == lsn_map(machine)
    assert restored.snapshot_points == ()
    assert restored.compaction_point() is None


@pytest.mark.parametrize("good", [GOOD, GOOD_V2], ids=["v1", "v2"])
def test_every_truncation_is_corrupt(good: bytes) -> None:
    for length in range(len(good)):
        with pytest.raises(SnapshotCorrupt):
            ShardStateMachine.restore(good[:length], SMALL)


@pytest.mark.parametrize("good", [GOOD, GOOD_V2], ids=["v1", "v2"])
def test_a_flip_of_any_byte_is_corrupt(good: bytes) -> None:
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 0x10
        with pytest.raises(SnapshotCorrupt):
            ShardStateMachine.restore(bytes(damaged), SMALL)


def test_the_good_snapshots_have_versions_1_and_2() -> None:
    assert GOOD[3] == SNAPSHOT_VERSION_1
    assert GOOD_V2[3] == SNAPSHOT_VERSION_2
    restored = ShardStateMachine.restore(GOOD_V2, SMALL)
    assert restored.snapshot() == GOOD_V2
    assert lsn_map(restored) == lsn_map(build_grouped_machine())


def test_wrong_version_and_magic() -> None:
    with pytest.raises(SnapshotCorrupt, match=r"unknown format version 3 \(this build reads 1, 2"):
        ShardStateMachine.restore(GOOD[:3] + b"\x03" + GOOD[4:], SMALL)
    with pytest.raises(SnapshotCorrupt, match="10 fields, expected 11"):
        ShardStateMachine.restore(GOOD[:3] + b"\x02" + GOOD[4:], SMALL)
    with pytest.raises(SnapshotCorrupt, match="11 fields, expected 10"):
        ShardStateMachine.restore(GOOD_V2[:3] + b"\x01" + GOOD_V2[4:], SMALL)
    with pytest.raises(SnapshotCorrupt, match="bad magic"):
        ShardStateMachine.restore(b"LSC" + GOOD[3:], SMALL)
    with pytest.raises(SnapshotCorrupt, match="bad magic"):
        ShardStateMachine.restore(encode_command(Barrier(1)), SMALL)


def test_other_dedupe_limits_are_incompatible() -> None:
    with pytest.raises(SnapshotIncompatible, match="dedupe_clients_max=3"):
        ShardStateMachine.restore(GOOD, DEFAULT_SHARD_LIMITS)
    with pytest.raises(SnapshotIncompatible):
        ShardStateMachine.restore(ShardStateMachine().snapshot(), SMALL)


def body_of(data: bytes) -> list[object]:
    body = msgpack.unpackb(data[12:], raw=False)
    assert isinstance(body, list)
    return body


def reframe(body: object, packed: bytes | None = None, version: int = SNAPSHOT_VERSION_1) -> bytes:
    if packed is None:
        packed = msgpack.packb(body, use_bin_type=True)
    assert isinstance(packed, bytes)
    return FRAME_HEADER.pack(SNAPSHOT_MAGIC, version, xxh3(packed)) + packed


def u64s(*values: int) -> bytes:
    return b"".join(value.to_bytes(8, "little") for value in values)


# Base: last_applied 10, next_lsn 6, first_lsn 2, lease ("h", 1), one client "a" active at 4
# with seqs 1 -> (1, 3) and 2 -> (4, 2), entries raft 3 (3 records) and raft 4 (2 records).
BASE: list[object] = [
    10,
    6,
    2,
    "h",
    1,
    3,
    3,
    [["a", 4, 0, [[1, 1, 3], [2, 4, 2]]]],
    u64s(3, 4),
    u64s(3, 2),
]


def with_field(position: int, value: object) -> list[object]:
    body = list(BASE)
    body[position] = value
    return body


INVALID: list[tuple[str, object, str]] = [
    ("9 fields", BASE[:9], "9 fields"),
    ("not an array", {"a": 1}, "bad msgpack body|not an array"),
    ("first > next", with_field(2, 7), "first_lsn 7 is not in"),
    ("first 0", with_field(2, 0), "first_lsn 0"),
    ("negative next", with_field(1, -1), "not an integer"),
    ("holder without epoch", with_field(4, 0), "no holder iff epoch 0"),
    ("epoch without holder", with_field(3, None), "no holder iff epoch 0"),
    ("empty holder", with_field(3, ""), "neither nil nor a non-empty str"),
    ("bin holder", with_field(3, b"h"), "neither nil nor a non-empty str"),
    ("clients not array", with_field(7, 5), "dedupe table is not an array"),
    ("4 clients", with_field(7, [["a", 1, 0, [[1, 1, 0]]]] * 4), "over the limit"),
    ("short client", with_field(7, [["a", 4, 0]]), "not a 4-element array"),
    (
        "duplicate client",
        with_field(7, [["a", 1, 0, [[1, 1, 0]]], ["a", 2, 0, [[2, 1, 0]]]]),
        "duplicate",
    ),
    (
        "activity out of order",
        with_field(7, [["b", 5, 0, [[1, 1, 0]]], ["a", 4, 0, [[2, 1, 0]]]]),
        "out of order",
    ),
    ("activity past applied", with_field(7, [["a", 11, 0, [[1, 1, 0]]]]), "out of order or range"),
    ("no seqs", with_field(7, [["a", 4, 0, []]]), "1..3 entries"),
    ("seqs out of order", with_field(7, [["a", 4, 0, [[2, 4, 2], [1, 1, 3]]]]), "out of order"),
    ("seq below floor", with_field(7, [["a", 4, 2, [[1, 1, 0]] * 3]]), "below seq_floor"),
    ("floor, table not full", with_field(7, [["a", 4, 1, [[1, 1, 3]]]]), "not full"),
    ("seq lsns unassigned", with_field(7, [["a", 4, 0, [[1, 5, 2]]]]), "not yet assigned"),
    ("bad seq entry", with_field(7, [["a", 4, 0, [[1, 1]]]]), "not \\[seq, first_lsn, count\\]"),
    ("entries not bin", with_field(8, [3, 4]), "not bin"),
    ("entries differ", with_field(9, u64s(3)), "differ in length"),
    ("entries not u64s", with_field(8, u64s(3, 4)[:-1]), "differ in length|whole u64s"),
    ("raft indexes descend", with_field(8, u64s(4, 3)), "out of order"),
    ("raft index past applied", with_field(8, u64s(3, 11)), "out of order or range"),
    ("count 0", with_field(9, u64s(5, 0)), "count 0"),
    ("more lsns than assigned", with_field(9, u64s(3, 3)), "more LSNs than were assigned"),
    ("first_lsn not held", with_field(2, 5), "does not hold first_lsn"),
    ("retained lsns, no entries", [*BASE[:8], b"", b""], "retained LSNs but no entries"),
    ("dedupe limits not ints", with_field(5, "3"), "dedupe limits are not integers"),
]


# Version 2 base: as BASE, but raft 4 is an AppendGroup: client "a" (3 records, offsets 0-2),
# a refused batch of 1 record (offset 3), client "b" (2 records, offsets 4-5), so two rows of
# raft index 4 and two clients active at 4 ("a" first: batch order).
BASE_V2: list[object] = [
    10,
    6,
    2,
    "h",
    1,
    3,
    3,
    [["a", 4, 0, [[1, 1, 3]]], ["b", 4, 0, [[1, 4, 2]]]],
    u64s(4, 4),
    u64s(3, 2),
    u64s(0, 4),
]


def with_v2_field(position: int, value: object) -> list[object]:
    body = list(BASE_V2)
    body[position] = value
    return body


INVALID_V2: list[tuple[str, object, str]] = [
    ("10 fields", BASE_V2[:10], "10 fields, expected 11"),
    ("offsets not bin", with_v2_field(10, [0, 4]), "not bin"),
    ("offsets differ", with_v2_field(10, u64s(0)), "differ in length"),
    ("runs overlap", with_v2_field(10, u64s(0, 2)), "overlap"),
    ("runs not maximal", with_v2_field(10, u64s(0, 3)), "overlap"),
    ("runs out of order", with_v2_field(10, u64s(4, 0)), "overlap"),
    ("offset past the end", with_v2_field(10, u64s(0, 65_535)), "past the entry's end"),
    ("raft index 0", [*BASE_V2[:8], u64s(0, 4), u64s(3, 2), u64s(5, 0)], "out of order"),
    (
        "activity descends",
        with_v2_field(7, [["a", 4, 0, [[1, 1, 3]]], ["b", 3, 0, [[1, 4, 2]]]]),
        "activity 3 out of order",
    ),
    ("activity 0", with_v2_field(7, [["a", 0, 0, [[1, 1, 3]]]]), "activity 0 out of order"),
    (
        "fits version 1",
        [*BASE[:10], u64s(0, 0)],
        "not in canonical form",
    ),
]


@pytest.mark.parametrize(("name", "body", "reason"), INVALID_V2, ids=[row[0] for row in INVALID_V2])
def test_invalid_version_2_bodies(name: str, body: object, reason: str) -> None:
    with pytest.raises(SnapshotCorrupt, match=reason):
        ShardStateMachine.restore(reframe(body, version=SNAPSHOT_VERSION_2), SMALL)


def test_the_version_2_base_body_is_valid() -> None:
    data = reframe(BASE_V2, version=SNAPSHOT_VERSION_2)
    machine = ShardStateMachine.restore(data, SMALL)
    assert machine.snapshot() == data
    assert machine.dedupe_clients() == ("a", "b")  # the array order: batch order in raft 4
    assert machine.lsn_to_raft_index(2) == (4, 1)
    assert machine.locate(2) == EntrySlice(4, 1, 2)
    assert machine.locate(4) == EntrySlice(4, 4, 2)
    assert machine.locate(5) == EntrySlice(4, 5, 1)
    # The same order with the ids swapped is also a reachable state (batch "b" first).
    swapped = [["b", 4, 0, [[1, 1, 3]]], ["a", 4, 0, [[1, 4, 2]]]]
    other = ShardStateMachine.restore(reframe(with_v2_field(7, swapped), version=2), SMALL)
    assert other.dedupe_clients() == ("b", "a")


def test_version_1_refuses_tied_activities_and_shared_entries() -> None:
    tied = with_field(7, [["a", 4, 0, [[1, 1, 3]]], ["b", 4, 0, [[1, 4, 2]]]])
    with pytest.raises(SnapshotCorrupt, match="activity 4 out of order"):
        ShardStateMachine.restore(reframe(tied), SMALL)
    shared = with_field(8, u64s(4, 4))
    with pytest.raises(SnapshotCorrupt, match="overlap"):
        ShardStateMachine.restore(reframe(shared), SMALL)


def test_the_base_body_is_valid() -> None:
    machine = ShardStateMachine.restore(reframe(BASE), SMALL)
    assert machine.lsn_to_raft_index(2) == (3, 1)
    assert machine.lsn_to_raft_index(5) == (4, 1)
    with pytest.raises(LsnUnavailable):
        machine.lsn_to_raft_index(1)


@pytest.mark.parametrize(("name", "body", "reason"), INVALID, ids=[row[0] for row in INVALID])
def test_invalid_bodies_with_a_valid_checksum(name: str, body: object, reason: str) -> None:
    with pytest.raises(SnapshotCorrupt, match=reason):
        ShardStateMachine.restore(reframe(body), SMALL)


def test_a_body_not_in_canonical_form_is_refused() -> None:
    packed = msgpack.packb(BASE, use_bin_type=True)
    assert packed[1] == 10  # last_applied as a positive fixint
    wide = packed[:1] + bytes([0xCF]) + (10).to_bytes(8, "big") + packed[2:]  # as a uint64
    with pytest.raises(SnapshotCorrupt, match="canonical"):
        ShardStateMachine.restore(reframe(None, wide), SMALL)


def test_extra_bytes_after_the_body_are_refused() -> None:
    packed = msgpack.packb(BASE, use_bin_type=True) + b"\x00"
    with pytest.raises(SnapshotCorrupt, match="bad msgpack body"):
        ShardStateMachine.restore(reframe(None, packed), SMALL)


def test_body_of_good_snapshot_matches_base_layout() -> None:
    body = body_of(GOOD)
    assert len(body) == 10
    assert body[0] == 21
    assert body[5:7] == [3, 3]
