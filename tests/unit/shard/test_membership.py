"""A replica's configuration follows its own log, exactly, and survives restarts and
power loss (logsvc/shard/membership.py).

How: `MembershipLog` is driven through its inputs (membership entries logged, suffixes
truncated, prefixes compacted, a snapshot installed) and checked against what Raft says
the configuration is: the latest one in the log. The toggling bug of stock pysyncobj
(re-applying an old entry on top of a newer configuration) cannot happen because nothing
is ever applied twice. `validated()` is checked against logs that lost entries or hold
other terms; `ReplicaMembership` against a `FaultFS` that loses power between writing the
file and the entry reaching the log.
"""

from __future__ import annotations

import random

import pytest

from logsvc.shard import membership, small_file
from logsvc.shard.membership import (
    Change,
    ConfigRecord,
    MembershipLog,
    MembershipLost,
    ReplicaMembership,
)
from logsvc.shard.small_file import SmallFileCorrupt
from tests.support.faultfs import FaultFS

A, B, C, D, E = (f"127.0.0.1:{7000 + i}" for i in range(5))


def members(log: MembershipLog) -> tuple[str, ...]:
    """The latest configuration (a call: mypy does not narrow it from one check to the
    next, as the log changes in between)."""
    return log.members


NO_ENTRIES: dict[int, int] = {}


def log_of(*members: str, self_address: str = A, joining: bool = False) -> MembershipLog:
    return MembershipLog.initial(self_address, members, joining)


def test_initial_includes_itself() -> None:
    log = log_of(B, C)
    assert members(log) == (A, B, C)
    assert log.peers == (B, C)
    assert log.is_member and not log.joining
    assert log.records == (ConfigRecord(0, 0, (A, B, C), False),)


def test_entries_change_the_configuration_in_log_order() -> None:
    log = log_of(B, C)
    assert log.on_entry(10, 2, Change("add", D))
    assert members(log) == (A, B, C, D)
    assert log.on_entry(20, 2, Change("rem", C))
    assert members(log) == (A, B, D)
    assert log.members_at(5) == (A, B, C)
    assert log.members_at(10) == (A, B, C, D)
    assert log.members_at(19) == (A, B, C, D)
    assert log.members_at(25) == (A, B, D)
    assert log.version == 2


def test_nothing_is_applied_twice_so_nothing_toggles() -> None:
    """Stock pysyncobj re-applies `rem C` (index 10) on top of a configuration that has C
    back (index 20): C vanishes until index 20 is re-applied. Here the configuration is a
    function of the log: the same entries always give the same members."""
    log = log_of(B, C)
    log.on_entry(10, 1, Change("rem", C))
    log.on_entry(20, 1, Change("add", C))
    assert members(log) == (A, B, C)
    assert log.members_at(15) == (A, B)


def test_a_removed_replica_knows_it_is_no_member() -> None:
    log = log_of(B, C, D)
    log.on_entry(5, 1, Change("rem", A))
    assert not log.is_member
    assert log.peers == (B, C, D)


def test_joining_ignores_older_entries_until_its_own_add() -> None:
    """Joined with the members as the leader knew them just before proposing the add: any
    membership entry before that `add` is already reflected in them."""
    log = log_of(B, C, D, self_address=E, joining=True)
    assert log.joining and members(log) == (B, C, D, E)
    assert not log.on_entry(3, 1, Change("rem", B))  # history: B was removed, then...
    assert not log.on_entry(4, 1, Change("add", B))  # ...added back; both already in
    assert members(log) == (B, C, D, E)
    assert log.on_entry(9, 2, Change("add", E))
    assert not log.joining
    assert log.on_entry(12, 2, Change("rem", C))  # after our add: applied as usual
    assert members(log) == (B, D, E)


def test_truncating_a_suffix_undoes_its_changes() -> None:
    log = log_of(B, C)
    log.on_entry(10, 1, Change("add", D))
    log.on_entry(20, 2, Change("rem", B))
    assert log.on_truncate_suffix(20)
    assert members(log) == (A, B, C, D)
    assert not log.on_truncate_suffix(21)  # nothing there
    assert log.on_truncate_suffix(5)
    assert members(log) == (A, B, C)


def test_joining_is_undone_with_the_entry_that_ended_it() -> None:
    log = log_of(B, C, self_address=D, joining=True)
    log.on_entry(9, 2, Change("add", D))
    log.on_truncate_suffix(9)
    assert log.joining


def test_compaction_keeps_the_configuration_at_the_new_log_start() -> None:
    log = log_of(B, C)
    log.on_entry(10, 1, Change("add", D))
    log.on_entry(20, 1, Change("rem", B))
    log.on_entry(30, 1, Change("add", E))
    assert log.on_truncate_prefix(25)
    assert [r.index for r in log.records] == [20, 30]
    assert log.members_at(25) == (A, C, D)
    assert not log.on_truncate_prefix(26)  # only one record older than 26


def test_records_are_bounded() -> None:
    log = log_of(B, C)
    for i in range(1, 3 * membership.RECORDS_MAX):
        log.on_entry(i, 1, Change("add" if i % 2 else "rem", D))
    assert len(log.records) == membership.RECORDS_MAX
    assert log.records[-1].index == 3 * membership.RECORDS_MAX - 1


def test_truncating_every_record_is_a_typed_error() -> None:
    log = MembershipLog(A, [ConfigRecord(10, 1, (A, B, C), False)])
    with pytest.raises(MembershipLost):
        log.on_truncate_suffix(10)


def test_a_snapshot_replaces_the_log_and_its_configurations() -> None:
    log = log_of(B, C)
    log.on_entry(10, 1, Change("add", D))
    log.on_reset(50, 3, (A, B, D))
    assert log.records == (ConfigRecord(50, 3, (A, B, D), False),)


def test_a_joiner_keeps_its_members_over_a_snapshot_from_before_its_add() -> None:
    log = log_of(B, C, self_address=D, joining=True)
    log.on_reset(50, 3, (A, B, C))  # taken before D was added: D's members are newer
    assert log.joining and members(log) == (B, C, D)
    log.on_reset(60, 3, (B, C, D))  # taken after: D is a member, no longer joining
    assert not log.joining and members(log) == (B, C, D)


# ------------------------------------------------------------------------ validation


def test_validation_drops_what_the_log_lost_or_replaced() -> None:
    log = log_of(B, C)
    log.on_entry(10, 1, Change("add", D))
    log.on_entry(20, 2, Change("rem", B))
    terms = {10: 1, 20: 2}
    assert log.validated(1, terms.get) == 0
    assert log.validated(1, {10: 1}.get) == 1  # entry 20 lost (a crash before its sync)
    assert members(log) == (A, B, C, D)
    log.on_entry(20, 3, Change("rem", C))
    assert log.validated(1, {10: 1, 20: 2}.get) == 1  # index 20 holds another term
    assert members(log) == (A, B, C, D)
    # By Log Matching, once one record's entry is off, later ones are too.
    log.on_entry(30, 3, Change("add", E))
    assert log.validated(1, {10: 9, 30: 3}.get) == 2  # 10 differs: 30 goes too
    assert members(log) == (A, B, C)


def test_validation_trusts_compacted_records_and_needs_one() -> None:
    log = MembershipLog(A, [ConfigRecord(10, 1, (A, B, C), False)])
    assert log.validated(100, lambda _index: None) == 0  # below the log start: committed
    with pytest.raises(MembershipLost):
        log.validated(5, lambda _index: None)


# ------------------------------------------------------------------------ the file


def test_file_round_trip() -> None:
    log = log_of(B, C, joining=True)
    log.on_entry(7, 2, Change("add", A))
    decoded = membership.decode("m", membership.encode(log), A)
    assert decoded.records == log.records


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ({"self": A}, "keys"),
        ({"self": B, "records": []}, "written by replica"),
        ({"self": A, "records": []}, "a list of 1"),
        ({"self": A, "records": [{"index": 0}]}, "index, term, members, joining"),
        (
            {"self": A, "records": [{"index": -1, "term": 0, "members": [A], "joining": False}]},
            "ill-typed",
        ),
        (
            {"self": A, "records": [{"index": 0, "term": 0, "members": [B, A], "joining": False}]},
            "sorted distinct",
        ),
        (
            {"self": A, "records": [{"index": 0, "term": 0, "members": [A], "joining": 1}]},
            "ill-typed",
        ),
        (
            {
                "self": A,
                "records": [
                    {"index": 5, "term": 0, "members": [A], "joining": False},
                    {"index": 5, "term": 0, "members": [A], "joining": False},
                ],
            },
            "not increasing",
        ),
    ],
)
def test_bad_files_are_typed_errors(document: dict[str, object], reason: str) -> None:
    data = small_file.encode(membership.MAGIC, membership.VERSION, document)
    with pytest.raises(SmallFileCorrupt, match=reason):
        membership.decode("m", data, A)


def test_open_creates_then_follows_the_log() -> None:
    fs = FaultFS()
    fs.makedirs("/r")
    log_terms: dict[int, int] = {}
    opened = ReplicaMembership.open(fs, "/r/members", A, (A, B, C), False, 1, log_terms.get)
    assert opened.members == (A, B, C)
    opened.on_entry(10, 1, Change("add", D))
    log_terms[10] = 1
    fs.power_loss("trunc", random.Random(3))
    # Restarted with the configured peers only: the file's configuration wins.
    again = ReplicaMembership.open(fs, "/r/members", A, (A, B, C), False, 1, log_terms.get)
    assert again.members == (A, B, C, D)
    assert again.config_index == 10


def test_an_entry_lost_with_the_power_is_dropped_from_the_file_at_open() -> None:
    """The file is written before the entry reaches the log: after a power loss that took
    the (unsynced) entry, the file is one configuration ahead, and open() drops it."""
    fs = FaultFS()
    fs.makedirs("/r")
    opened = ReplicaMembership.open(fs, "/r/members", A, (A, B, C), False, 1, NO_ENTRIES.get)
    opened.on_entry(10, 1, Change("add", D))  # durable in the file, never in the log
    fs.power_loss("trunc", random.Random(3))
    again = ReplicaMembership.open(fs, "/r/members", A, (A, B, C), False, 1, NO_ENTRIES.get)
    assert again.members == (A, B, C)
    third = ReplicaMembership.open(fs, "/r/members", A, (A, E), False, 1, NO_ENTRIES.get)
    assert third.members == (A, B, C)  # the rewritten file, not the configured peers


def test_a_damaged_file_is_a_typed_error_not_a_default() -> None:
    fs = FaultFS()
    fs.makedirs("/r")
    ReplicaMembership.open(fs, "/r/members", A, (A, B, C), False, 1, NO_ENTRIES.get)
    fs.flip_bit("/r/members", 8 * 30)
    with pytest.raises(SmallFileCorrupt):
        ReplicaMembership.open(fs, "/r/members", A, (A, B, C), False, 1, NO_ENTRIES.get)
