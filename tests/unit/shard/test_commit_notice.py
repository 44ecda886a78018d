"""A lone writer's append round costs one AppendEntries per follower, not two, and the
followers still learn the commit index (raft/adapter.py `_SyncObj__applyLogEntries`,
RaftConfig.commit_notice_ms).

How: a real 3-replica cluster (raft_harness) with a 200 ms heartbeat; appends proposed one
at a time, each acknowledged before the next. Every AppendEntries a follower receives is
counted, split into those carrying entries and commit-index-only ones. Stock pysyncobj
(commit_notice_ms=0, run beside it) sends a commit-only one to each follower for every
append; with the notice due within 150 ms, the next append's AppendEntries carries the
commit index instead, so commit-only messages are a handful (heartbeats, the last notice).
Either way every follower's commit index reaches the leader's (awaited, never slept for).
And a busy shard (appends ~20 ms apart, past the notice, inside the heartbeat): no commit
gets a message of its own; the old code sent one per append to each follower.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logsvc.shard.raft.adapter import ShardRaft

from .raft_harness import Cluster, wait_until

APPENDS = 20
TIMINGS = {
    "heartbeat_ms": 200,
    "election_timeout_ms_min": 1000,
    "election_timeout_ms_max": 2000,
    "leader_fallback_ms": 3000,
}


@pytest.mark.parametrize("commit_notice_ms", [0, 150])
def test_a_lone_append_sends_one_append_entries_per_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit_notice_ms: int
) -> None:
    received: Counter[tuple[str, str]] = Counter()  # (receiver, "entries" | "commit-only")
    counting = [False]
    original = ShardRaft._logsvc_on_message

    def counted(
        self: ShardRaft,
        node: Any,
        message: dict[str, Any],
        deliver: Callable[[Any, dict[str, Any]], None],
    ) -> None:
        if counting[0] and message.get("type") == "append_entries" and "prevLogIdx" in message:
            kind = "entries" if message.get("entries") else "commit-only"
            received[(self._logsvc_self_address, kind)] += 1
        original(self, node, message, deliver)

    monkeypatch.setattr(ShardRaft, "_logsvc_on_message", counted)
    cluster = Cluster(
        str(tmp_path), raft_overrides={**TIMINGS, "commit_notice_ms": commit_notice_ms}
    )
    try:
        cluster.start_all()
        assert cluster.propose([b"warm-up"])
        leader = cluster.leader()
        followers = [r for r in cluster.replicas if r is not leader]
        counting[0] = True
        for i in range(APPENDS):
            assert cluster.propose([b"append-%d" % i]), f"append {i} was not acknowledged"
        assert leader.node is not None
        target = leader.node.commit_index
        for follower in followers:
            wait_until(
                lambda f=follower: f.node is not None and f.node.commit_index >= target,  # type: ignore[misc]
                f"{follower.address} to learn the commit index",
            )
        counting[0] = False
        for follower in followers:
            assert received[(follower.address, "entries")] >= APPENDS
            commit_only = received[(follower.address, "commit-only")]
            if commit_notice_ms:
                assert commit_only < APPENDS // 2, received
            else:
                assert commit_only >= APPENDS, received  # stock: one per append
    finally:
        cluster.close()


BUSY_TIMINGS = {
    "heartbeat_ms": 400,
    "election_timeout_ms_min": 1500,
    "election_timeout_ms_max": 3000,
    "leader_fallback_ms": 4000,
    "commit_notice_ms": 1,
}
# Appends this far apart: well past the notice (1 ms), well inside the heartbeat (400 ms),
# like one busy shard's among a hundred (issue 22: ~70 ms apart).
BUSY_GAP_S = 0.02


def test_a_busy_shards_commits_ride_on_its_next_append_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends a few ms apart (each proposed 20 ms after the previous one's acknowledgement,
    the clock read, never slept on by an assertion): while they come less than a heartbeat
    apart, no commit gets an AppendEntries of its own; the next append's (or the heartbeat)
    carries it. Before, each got one per follower, and each follower answered it (the old
    code fails here: commit-only >= APPENDS). The followers still learn the commit index."""
    received: Counter[tuple[str, str]] = Counter()
    counting = [False]
    original = ShardRaft._logsvc_on_message

    def counted(
        self: ShardRaft,
        node: Any,
        message: dict[str, Any],
        deliver: Callable[[Any, dict[str, Any]], None],
    ) -> None:
        if counting[0] and message.get("type") == "append_entries" and "prevLogIdx" in message:
            kind = "entries" if message.get("entries") else "commit-only"
            received[(self._logsvc_self_address, kind)] += 1
        original(self, node, message, deliver)

    monkeypatch.setattr(ShardRaft, "_logsvc_on_message", counted)
    cluster = Cluster(str(tmp_path), raft_overrides=dict(BUSY_TIMINGS))
    try:
        cluster.start_all()
        assert cluster.propose([b"warm-up"])
        leader = cluster.leader()
        followers = [r for r in cluster.replicas if r is not leader]
        counting[0] = True
        for i in range(APPENDS):
            assert cluster.propose([b"append-%d" % i]), f"append {i} was not acknowledged"
            next_s = time.monotonic() + BUSY_GAP_S
            wait_until(lambda s=next_s: time.monotonic() >= s, "the gap between appends")  # type: ignore[misc]
        assert leader.node is not None
        target = leader.node.commit_index
        for follower in followers:
            wait_until(
                lambda f=follower: f.node is not None and f.node.commit_index >= target,  # type: ignore[misc]
                f"{follower.address} to learn the commit index",
            )
        counting[0] = False
        for follower in followers:
            assert received[(follower.address, "entries")] >= APPENDS
            assert received[(follower.address, "commit-only")] < APPENDS // 2, received
    finally:
        cluster.close()
