"""Many shards on nodes that share one journal and one scheduler each (issue 22): replicas of
one worker round defer their journal sync and held acknowledgements to the round's end
(scheduler.defer_to_round_end, one fdatasync for the round), and nothing is acknowledged
before it is durable. The other tests of that path run each replica on a private scheduler,
where a round never holds two replicas.

Proves, with three "nodes" (a `RaftScheduler` with one worker and a `NodeJournal` each)
hosting six shards on loopback: proposals spread over every shard all commit, with
round-end flushes (counted); and a follower's acknowledgement never leaves before the
journal fdatasync that covers the entries it acknowledges returned (every send of a
`next_node_idx` is checked against the follower's store: its durable index covers the
acknowledged index at that moment; the check fails with the transport's sync removed).
Real replicas; every wait is bounded.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.transport import TCPTransport

from logsvc.shard.raft.config import FailReason
from logsvc.shard.raft.node import RaftNode
from logsvc.store import ShardStore
from tests.unit.shard.raft_harness import shard_grid, wait_until

NODES = ("n1", "n2", "n3")
SHARDS = 6
PROPOSALS_PER_SHARD = 30


def test_many_shards_on_one_scheduler_and_journal_acknowledge_only_what_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deferred = [0]
    flush_at_round_end = RaftNode._flush_at_round_end

    def counting(self: RaftNode) -> None:
        deferred[0] += 1
        flush_at_round_end(self)

    monkeypatch.setattr(RaftNode, "_flush_at_round_end", counting)

    # Every acknowledgement as it goes to the socket (the durable transport's flush sends
    # through TCPTransport.send): the follower's store must hold the acknowledged entries
    # durably at that moment.
    early: list[str] = []
    acks = [0]
    tcp_send = TCPTransport.send

    def checked_send(transport: Any, node: Any, message: dict[str, Any]) -> Any:
        if message.get("type") == "next_node_idx" and message.get("success"):
            store = transport._syncObj._logsvc_journal.store
            acked = int(message["next_node_idx"]) - 1
            acks[0] += 1
            if store.durable_index < acked:
                early.append(f"ack of {acked} with {store.durable_index} durable")
        return tcp_send(transport, node, message)

    monkeypatch.setattr(TCPTransport, "send", checked_send)

    config = dict(
        election_timeout_ms_min=1000,
        election_timeout_ms_max=2500,
        heartbeat_ms=100,
        leader_fallback_ms=5000,
        connection_timeout_ms=3500,
    )
    with shard_grid(tmp_path, NODES, SHARDS, node_journals=True, **config) as grid:
        wait_until(lambda: len(grid.leaders()) == SHARDS, "a leader in every shard", seconds=30.0)
        done = threading.Semaphore(0)
        outcomes: list[int] = []
        lock = threading.Lock()

        def callback(_result: object, reason: int) -> None:
            with lock:
                outcomes.append(reason)
            done.release()

        for number in range(PROPOSALS_PER_SHARD):
            for leader in grid.leaders().values():
                leader.propose(b"entry %d" % number, callback)
        total = PROPOSALS_PER_SHARD * SHARDS
        for _ in range(total):
            assert done.acquire(timeout=30.0), "a proposal got no outcome"
        assert outcomes == [FailReason.SUCCESS] * total
        assert deferred[0] > 0, "no replica deferred its sync to its round's end"
        assert acks[0] > 0
        assert early == []


def test_the_votes_of_one_round_share_one_journal_sync_and_leave_only_once_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n3's worker is held while every shard elects a new leader among n1 and n2 (the
    leaders hand over; n3's own shards lose theirs), so n3 finds all their vote requests in
    one round: it grants them with fewer journal fdatasyncs than votes (each vote its own
    fdatasync before), and each vote request or reply leaves only once the term and vote
    it carries are durable (checked as it goes to the socket)."""
    votes = {"n3": 0}
    n3_stores: set[int] = set()
    journal_vote, save_vote = ShardStore.journal_vote, ShardStore.save_vote

    def on_n3(store: ShardStore) -> bool:
        return id(store) in n3_stores

    def counting_journal_vote(store: ShardStore, term: int, voted_for: str | None) -> int:
        votes["n3"] += on_n3(store) and voted_for is not None
        return journal_vote(store, term, voted_for)

    def counting_save_vote(store: ShardStore, term: int, voted_for: str | None) -> None:
        votes["n3"] += on_n3(store) and voted_for is not None
        save_vote(store, term, voted_for)

    monkeypatch.setattr(ShardStore, "journal_vote", counting_journal_vote)
    monkeypatch.setattr(ShardStore, "save_vote", counting_save_vote)
    early: list[str] = []
    tcp_send = TCPTransport.send

    def checked_send(transport: Any, node: Any, message: dict[str, Any]) -> Any:
        if message.get("type") in ("request_vote", "response_vote"):
            journal = transport._syncObj._logsvc_journal
            if journal.vote_pending:
                early.append(f"{message['type']} of term {message['term']} before durable")
        return tcp_send(transport, node, message)

    monkeypatch.setattr(TCPTransport, "send", checked_send)
    config = dict(
        election_timeout_ms_min=1000,
        election_timeout_ms_max=2500,
        heartbeat_ms=100,
        leader_fallback_ms=5000,
        connection_timeout_ms=3500,
    )
    with shard_grid(tmp_path, NODES, SHARDS, node_journals=True, **config) as grid:
        wait_until(lambda: len(grid.leaders()) == SHARDS, "a leader in every shard", seconds=30.0)
        n3 = [grid.replicas[("n3", s)] for s in range(SHARDS)]
        n3_stores.update(id(r._journal.store) for r in n3)
        terms = {s: max(grid.replicas[(n, s)].term for n in NODES) for s in range(SHARDS)}
        held, release = threading.Event(), threading.Event()

        def hold_the_worker() -> None:
            held.set()
            release.wait(30.0)

        n3[0]._on_tick(hold_the_worker)
        assert held.wait(10.0), "n3's worker never ran the held call"
        try:
            for shard, leader in grid.leaders().items():
                if grid.node_of[leader.self_address] != "n3":
                    other = "n2" if grid.node_of[leader.self_address] == "n1" else "n1"
                    leader.transfer_leadership(grid.address[(other, shard)], lambda *_: None)

            def led_elsewhere() -> dict[int, RaftNode]:
                return {
                    s: r
                    for (n, s), r in grid.replicas.items()
                    if n != "n3" and r.is_leader and r.term > terms[s]
                }

            def all_new_elsewhere() -> bool:
                return len(led_elsewhere()) == SHARDS

            wait_until(all_new_elsewhere, "every shard led anew by n1 or n2", seconds=30.0)
            journal = n3[0]._journal.store._link.journal  # type: ignore[union-attr]
            fdatasyncs_before = journal.stats().fdatasyncs
            votes_before = votes["n3"]
        finally:
            release.set()
        wait_until(
            lambda: all(r.term == led_elsewhere()[s].term for s, r in enumerate(n3)),
            "n3 in every shard's new term",
            seconds=30.0,
        )
        granted = votes["n3"] - votes_before
        fdatasyncs = journal.stats().fdatasyncs - fdatasyncs_before
    assert granted >= 2, "n3 found fewer than two vote requests after its pause"
    assert fdatasyncs < granted, f"{granted} votes took {fdatasyncs} journal fdatasyncs"
    assert early == []
