"""Whether a follower counts its leader live for the pre-vote grant
(logsvc/shard/leader_contact.py), driven through its inputs with no sockets.

Proves Raft's recency rule: a heartbeating leader is live only within the shortest election
timeout of its last AppendEntries (or quiesce request) on this shard; a leader this
follower agreed to go quiet with is live (node liveness, the caller's check, stands in)
until its next AppendEntries says it is heartbeating again, including after the follower's
own wake-up; a refused quiesce request leaves the leader heartbeating. Its use in the
grant is proved with real replicas: tests/chaos/test_one_shard_leader_cut.py (a leader cut
off on one shard is replaced) and tests/unit/shard/test_quiet_leader_prevote.py (followers
woken under a quiet leader do not depose it).
"""

from __future__ import annotations

import pytest

from logsvc.shard.leader_contact import LeaderContact

RECENCY_S = 1.0  # the shortest election timeout


def test_a_follower_that_never_heard_a_leader_counts_none_live() -> None:
    assert not LeaderContact().live(now_s=0.0, recency_s=RECENCY_S)


@pytest.mark.parametrize(
    ("silent_s", "live"),
    [(0.0, True), (0.1, True), (RECENCY_S - 0.001, True), (RECENCY_S, False), (60.0, False)],
)
def test_a_heartbeating_leader_is_live_within_the_recency_of_its_append_entries(
    silent_s: float, live: bool
) -> None:
    contact = LeaderContact()
    contact.on_append_entries(now_s=100.0)
    assert contact.live(now_s=100.0 + silent_s, recency_s=RECENCY_S) is live


def test_a_quiet_leader_is_live_however_long_it_says_nothing() -> None:
    contact = LeaderContact()
    contact.on_append_entries(now_s=100.0)
    contact.on_quiesce_request(now_s=101.0, agreed=True)
    assert contact.live(now_s=101.0 + 3600.0, recency_s=RECENCY_S)


def test_a_refused_quiesce_request_stands_for_a_heartbeat_only() -> None:
    contact = LeaderContact()
    contact.on_quiesce_request(now_s=100.0, agreed=False)
    assert contact.live(now_s=100.5, recency_s=RECENCY_S)
    assert not contact.live(now_s=100.0 + RECENCY_S, recency_s=RECENCY_S)


def test_a_quiet_leader_that_heartbeats_again_is_held_to_recency_again() -> None:
    """C10's case once the shard had been quiet: the leader woke (a write) and heartbeats,
    then stops reaching this follower on this shard."""
    contact = LeaderContact()
    contact.on_quiesce_request(now_s=100.0, agreed=True)
    contact.on_append_entries(now_s=200.0)
    assert contact.live(now_s=200.5, recency_s=RECENCY_S)
    assert not contact.live(now_s=200.0 + RECENCY_S, recency_s=RECENCY_S)
