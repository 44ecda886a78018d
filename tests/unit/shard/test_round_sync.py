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

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.transport import TCPTransport

from logsvc.shard import scheduler
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.raft.config import FailReason, RaftConfig
from logsvc.shard.raft.node import RaftNode
from logsvc.shard.raft.patches import monotonic_s
from logsvc.store import ShardStore
from logsvc.store.journal import JOURNAL_DIR_NAME, NodeJournal
from tests.unit.shard.raft_harness import LIMITS, SECRET, RecordingHandler, free_ports, wait_until

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

    ports = free_ports(len(NODES) * SHARDS)
    address = {
        (n, s): f"127.0.0.1:{ports[i * SHARDS + s]}"
        for i, n in enumerate(NODES)
        for s in range(SHARDS)
    }
    node_of_address = {a: n for (n, _), a in address.items()}
    now = monotonic_s()
    scheds = {
        n: scheduler.RaftScheduler(
            NodeLiveness(n, interval_s=0.1, lapse_s=2.0, now_s=now),
            lambda a: node_of_address.get(a, a),
            workers=1,
            reconnect_s=1.0,
            clock=monotonic_s,
        )
        for n in NODES
    }
    journals: dict[str, NodeJournal] = {}
    replicas: dict[tuple[str, int], RaftNode] = {}
    stores: list[ShardStore] = []
    try:
        for n in NODES:
            base = tmp_path / n
            os.makedirs(base)
            journals[n] = NodeJournal.open(
                str(base / JOURNAL_DIR_NAME), base_dir=str(base), store_limits=LIMITS
            )
            scheds[n].start()
        for (n, s), own in address.items():
            path = tmp_path / n / str(s)
            os.makedirs(path)
            store = ShardStore.open(str(path / "journal"), limits=LIMITS, journal=journals[n])
            stores.append(store)
            config = RaftConfig(
                self_address=own,
                peers=tuple(address[(m, s)] for m in NODES if m != n),
                secret=SECRET,
                snapshot_path=str(path / "snapshot"),
                election_timeout_ms_min=1000,
                election_timeout_ms_max=2500,
                heartbeat_ms=100,
                leader_fallback_ms=5000,
                connection_timeout_ms=3500,
            )
            replicas[(n, s)] = RaftNode(config, store, RecordingHandler(), raft_scheduler=scheds[n])
            replicas[(n, s)].start()

        def leaders() -> dict[int, RaftNode]:
            return {s: r for (_, s), r in replicas.items() if r.is_leader}

        wait_until(lambda: len(leaders()) == SHARDS, "a leader in every shard", seconds=30.0)
        done = threading.Semaphore(0)
        outcomes: list[int] = []
        lock = threading.Lock()

        def callback(_result: object, reason: int) -> None:
            with lock:
                outcomes.append(reason)
            done.release()

        for number in range(PROPOSALS_PER_SHARD):
            for leader in leaders().values():
                leader.propose(b"entry %d" % number, callback)
        total = PROPOSALS_PER_SHARD * SHARDS
        for _ in range(total):
            assert done.acquire(timeout=30.0), "a proposal got no outcome"
        assert outcomes == [FailReason.SUCCESS] * total
        assert deferred[0] > 0, "no replica deferred its sync to its round's end"
        assert acks[0] > 0
        assert early == []
    finally:
        for replica in replicas.values():
            replica.stop()
        for sched in scheds.values():
            sched.close()
        for store in stores:
            store.close()
        for journal in journals.values():
            journal.close()
