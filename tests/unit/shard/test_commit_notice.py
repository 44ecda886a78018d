"""A lone writer's append round costs one AppendEntries per follower, not two, and the
followers still learn the commit index (raft/adapter.py `_SyncObj__applyLogEntries`,
RaftConfig.commit_notice_ms).

How: a real 3-replica cluster (raft_harness) with a 200 ms heartbeat; appends proposed one
at a time, each acknowledged before the next. Every AppendEntries a follower receives is
counted, split into those carrying entries and commit-index-only ones. Stock pysyncobj
(commit_notice_ms=0, run beside it) usually sends a commit-only one to each follower for
every append (not counted on: under load the next append may carry it); with the notice
due within 150 ms, the next append's AppendEntries carries the commit index instead, so
commit-only messages are a handful (heartbeats, the last notice).
Either way every follower's commit index reaches the leader's (awaited, never slept for).
"""

from __future__ import annotations

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
        # Each append was acknowledged before the next was proposed, so each reached a
        # follower in an AppendEntries of its own: the count works. Not each follower:
        # on a loaded machine one follower may lag and get the last appends in one.
        assert sum(received[(f.address, "entries")] for f in followers) >= APPENDS, received
        for follower in followers:
            commit_only = received[(follower.address, "commit-only")]
            if commit_notice_ms:
                assert commit_only < APPENDS // 2, received
            # Stock (0) sends a commit-only AppendEntries per append when its tick runs
            # before the next append's: usually all 20, but on a loaded machine as few as
            # one (the next append carried the commit index), so its count is no control.
    finally:
        cluster.close()
