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

    config: dict[str, Any] = dict(
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
