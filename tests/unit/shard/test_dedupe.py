"""Exactly-once appends: the dedupe table of the state machine (decision 0001).

How: small limits (3 seqs per client, 2 clients) and tables of (command, expected result)
applied in order. Proves that a retry returns the original LSNs and appends nothing (also
after other appends, a truncation, or the writer being fenced), that forgotten seqs give
`DuplicateUnknown` and consume no LSN, that a seq never accepted is accepted even when it
arrives after higher ones, that clients are evicted least recently active first, and the
documented limit: an evicted client's retry is appended again.
"""

from __future__ import annotations

import pytest

from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Appended,
    Command,
    DuplicateUnknown,
    LeaseGranted,
    Result,
    StaleEpoch,
    Truncate,
    Truncated,
)
from logsvc.shard.limits import ShardLimits
from logsvc.shard.state_machine import ShardStateMachine

LIMITS = ShardLimits(dedupe_clients_max=2, dedupe_seqs_per_client=3).validate()


def append(client: str, seq: int, count: int = 1, epoch: int = 0) -> AppendBatch:
    return AppendBatch(client, seq, epoch, (b"r",) * count)


def run(steps: list[tuple[Command, Result]]) -> ShardStateMachine:
    machine = ShardStateMachine(LIMITS)
    for raft_index, (command, expected) in enumerate(steps, start=1):
        next_lsn = machine.next_lsn
        result = machine.apply(raft_index, command)
        assert result == expected, (raft_index, command)
        retried = isinstance(result, Appended) and result.duplicate
        if retried or isinstance(result, DuplicateUnknown):
            assert machine.next_lsn == next_lsn, "a retry or refusal consumed an LSN"
    return machine


TABLES: dict[str, list[tuple[Command, Result]]] = {
    "a retry returns the original LSNs": [
        (append("a", 1, count=3), Appended(1, 3, False)),
        (append("a", 1, count=3), Appended(1, 3, True)),
        (append("b", 1, count=2), Appended(4, 2, False)),
        (append("a", 1, count=3), Appended(1, 3, True)),
        (append("a", 2), Appended(6, 1, False)),
    ],
    "the retry's records are not compared: (client, seq) names the batch": [
        (append("a", 1, count=3), Appended(1, 3, False)),
        (append("a", 1, count=1), Appended(1, 3, True)),
    ],
    "an empty batch is accepted, at next_lsn, and remembered": [
        (append("a", 1), Appended(1, 1, False)),
        (append("a", 2, count=0), Appended(2, 0, False)),
        (append("a", 3), Appended(2, 1, False)),
        (append("a", 2, count=0), Appended(2, 0, True)),
    ],
    "a retry after truncation still gets its (truncated) LSNs": [
        (append("a", 1, count=2), Appended(1, 2, False)),
        (Truncate(3), Truncated(3)),
        (append("a", 1, count=2), Appended(1, 2, True)),
    ],
    "a fenced writer's retry of an accepted batch learns the truth": [
        (AcquireLease("a", 1), LeaseGranted("a", 1)),
        (append("a", 1, epoch=1), Appended(1, 1, False)),
        (AcquireLease("b", 2), LeaseGranted("b", 2)),
        (append("a", 1, epoch=1), Appended(1, 1, True)),
        (append("a", 2, epoch=1), StaleEpoch("b", 2)),
    ],
    "3 seqs remembered: the lowest is forgotten, then unknown": [
        (append("a", 1), Appended(1, 1, False)),
        (append("a", 2), Appended(2, 1, False)),
        (append("a", 3), Appended(3, 1, False)),
        (append("a", 4), Appended(4, 1, False)),  # forgets 1: seq_floor 2
        (append("a", 1), DuplicateUnknown("a", 1, 2)),
        (append("a", 0), DuplicateUnknown("a", 0, 2)),
        (append("a", 2), Appended(2, 1, True)),
        (append("a", 4), Appended(4, 1, True)),
        (append("a", 5), Appended(5, 1, False)),  # forgets 2
        (append("a", 2), DuplicateUnknown("a", 2, 3)),
    ],
    "a seq never accepted is accepted even after higher ones (pipelined retry)": [
        (append("a", 5), Appended(1, 1, False)),
        (append("a", 6), Appended(2, 1, False)),
        (append("a", 3), Appended(3, 1, False)),  # floor is 0: 3 was never applied
        (append("a", 3), Appended(3, 1, True)),
        (append("a", 7), Appended(4, 1, False)),  # forgets 3 (lowest): floor 4
        (append("a", 3), DuplicateUnknown("a", 3, 5)),
        (append("a", 4), Appended(5, 1, False)),  # >= floor, never applied; forgets 4 itself
        (append("a", 4), DuplicateUnknown("a", 4, 5)),
    ],
    "seqs need not start at 0 or be dense": [
        (append("a", 1000), Appended(1, 1, False)),
        (append("a", 2000), Appended(2, 1, False)),
        (append("a", 1000), Appended(1, 1, True)),
    ],
}


@pytest.mark.parametrize("name", list(TABLES))
def test_dedupe_table(name: str) -> None:
    run(TABLES[name])


def test_refused_appends_are_not_remembered() -> None:
    machine = run(
        [
            (AcquireLease("h", 2), LeaseGranted("h", 2)),
            (append("a", 1, epoch=1), StaleEpoch("h", 2)),
        ]
    )
    assert machine.remembered_seqs("a") == {}
    assert machine.dedupe_clients() == ()
    assert machine.apply(10, append("a", 1, epoch=2)) == Appended(1, 1, False)


EVICTION_TABLE: list[tuple[str, list[str], tuple[str, ...]]] = [
    # (name, clients appending in order, remembered clients afterwards, least recent first)
    ("two fit", ["a", "b"], ("a", "b")),
    ("third evicts the least recent", ["a", "b", "c"], ("b", "c")),
    ("activity refreshes", ["a", "b", "a", "c"], ("a", "c")),
    ("order is by last activity, not id", ["b", "a", "b", "c"], ("b", "c")),
    ("a returning client is new again", ["a", "b", "c", "a"], ("c", "a")),
]


@pytest.mark.parametrize(
    ("name", "clients", "remembered"), EVICTION_TABLE, ids=[row[0] for row in EVICTION_TABLE]
)
def test_clients_are_evicted_least_recently_active_first(
    name: str, clients: list[str], remembered: tuple[str, ...]
) -> None:
    machine = ShardStateMachine(LIMITS)
    for raft_index, client in enumerate(clients, start=1):
        result = machine.apply(raft_index, append(client, raft_index))
        assert isinstance(result, Appended)
        assert not result.duplicate
    assert machine.dedupe_clients() == remembered
    assert machine.dedupe_clients_count <= LIMITS.dedupe_clients_max


def test_duplicates_do_not_count_as_activity() -> None:
    machine = run(
        [
            (append("a", 1), Appended(1, 1, False)),
            (append("b", 1), Appended(2, 1, False)),
            (append("a", 1), Appended(1, 1, True)),  # a retry: "a" stays least recent
            (append("c", 1), Appended(3, 1, False)),
        ]
    )
    assert machine.dedupe_clients() == ("b", "c")


def test_known_limit_an_evicted_clients_retry_is_appended_again() -> None:
    """Documented in state_machine.py: eviction forgets a client entirely."""
    run(
        [
            (append("a", 1), Appended(1, 1, False)),
            (append("b", 1), Appended(2, 1, False)),
            (append("c", 1), Appended(3, 1, False)),  # evicts "a"
            (append("a", 1), Appended(4, 1, False)),  # not recognised as a retry
        ]
    )


def test_the_default_table_holds_10000_clients_of_16_seqs() -> None:
    machine = ShardStateMachine()
    raft_index = 0
    for client in range(10_001):
        raft_index += 1
        machine.apply(raft_index, append(f"c{client}", 1))
    assert machine.dedupe_clients_count == 10_000
    assert machine.dedupe_clients()[0] == "c1"
    for seq in range(2, 20):
        raft_index += 1
        machine.apply(raft_index, append("c5", seq))
    assert sorted(machine.remembered_seqs("c5")) == list(range(4, 20))
