"""A quiet shard whose follower woke alone goes quiet again, under the same leader and term,
after at most a few pre-vote rounds (logsvc/shard/raft/message_fixes.py: a leader asked for
a pre-vote wakes and heartbeats); so does one whose followers woke together (as a
connection between them coming back wakes both) while the leader stayed quiet.

Why: issue 22's busy-shards runs counted up to 60 pre-vote rounds a second over a 3-node
cluster of 1,000 shards, from idle ones: a follower woken by itself while its leader stayed
quiet ran its election timer, stood, and was refused by the quiet leader and by the other
follower (which sees the leader alive); nothing told the leader, so the follower asked
again every few hundred milliseconds, for good, and the shard never went quiet again.

How: a real 3-replica cluster (raft_harness) with quiescence; once every replica is quiet,
one follower's quiescence is woken on its own tick thread (as an event of its own would).
Its pre-vote rounds are counted (`PreVoteRound` made by the gate); the test awaits every
replica quiet again with the leader and term unchanged, and at most a few rounds. On the
old code the leader stays quiet and the follower never does: the wait runs out.

Both followers woken: neither has heard the quiet leader for longer than an election
timeout, yet neither may grant the other a pre-vote. Raft's recency rule in the grant
(leader_contact.py) counts a leader live by its AppendEntries, and node liveness only while
it is quiet as far as the follower knows, which a follower's own wake-up does not change;
counting silence from the wake-up instead let the first to stand depose the quiet leader
(checked: the term moved, with `LeaderContact.leader_quiet` cleared on the wake-up).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from logsvc.shard import prevote
from logsvc.shard.raft.node import RaftNode
from tests.unit.shard.raft_harness import Cluster, Replica, wait_until

QUIET_CONFIG = {
    "quiesce_after_ms": 200,
    "connection_timeout_ms": 1000,  # pysyncobj: at least the election timeout max
}
# Rounds the lone follower may ask before its leader's heartbeat stops it: the first (which
# wakes the leader) and one more that may leave before the heartbeat arrives, with room for
# a loaded machine's stalls (a round every 0.1-0.2 s here); the old code never stops, and
# its follower never goes quiet again (the wait below runs out).
ROUNDS_MAX = 20
# Long enough for the old code's follower to stand many times (a round every 0.1-0.2 s
# with these timeouts), bounded for the new one.
QUIET_AGAIN_WAIT_S = 15.0


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The term of every pre-vote round any replica starts (`PreVoteRound` made by the gate)."""
    started: list[int] = []
    original = prevote.PreVoteRound

    def counted(term: int, voters: int) -> prevote.PreVoteRound:
        started.append(term)
        return original(term, voters)

    monkeypatch.setattr(prevote, "PreVoteRound", counted)  # elections.py looks it up per round
    return started


def quiet_cluster(
    tmp_path: Path, rounds: list[int]
) -> tuple[Cluster, Replica, RaftNode, tuple[str, int], list[RaftNode]]:
    """A started cluster with quiescence, once every replica is quiet: it, its leader, the
    leader's node with its (address, term), and every replica's node; `rounds` cleared."""
    cluster = Cluster(str(tmp_path), raft_overrides=dict(QUIET_CONFIG))
    try:
        cluster.start_all()
        assert cluster.propose([b"first"])
        leader = cluster.leader()
        nodes = [r.node for r in cluster.replicas if r.node is not None]
        wait_until(lambda: all(n.quiet for n in nodes), "every replica quiet", seconds=30.0)
        assert leader.node is not None
    except BaseException:
        cluster.close()
        raise
    rounds.clear()
    return cluster, leader, leader.node, (leader.node.self_address, leader.node.term), nodes


def assert_quiet_again_under(
    leader: RaftNode, before: tuple[str, int], nodes: list[RaftNode], rounds: list[int]
) -> None:
    """At least one pre-vote round was asked, every replica is quiet again, and the leader
    and term are `before`, after at most ROUNDS_MAX rounds."""
    wait_until(lambda: len(rounds) >= 1, "a woken follower to ask for a pre-vote")
    wait_until(
        lambda: all(n.quiet for n in nodes),
        "every replica quiet again",
        seconds=QUIET_AGAIN_WAIT_S,
    )
    assert (leader.self_address, leader.term) == before
    assert leader.is_leader
    assert len(rounds) <= ROUNDS_MAX, rounds


def test_a_quiet_leader_asked_for_a_pre_vote_wakes_and_its_shard_goes_quiet_again(
    tmp_path: Path, rounds: list[int]
) -> None:
    cluster, leader, leader_node, before, nodes = quiet_cluster(tmp_path, rounds)
    try:
        follower = next(r.node for r in cluster.replicas if r is not leader and r.node)
        woken = threading.Event()

        def wake_alone() -> None:
            follower._raft._logsvc_follower_q.wake()
            woken.set()

        follower._on_tick(wake_alone)
        assert woken.wait(10.0), "the follower's tick did not run"
        assert not follower.quiet
        # It stands once its election timer runs out (at most election_timeout_ms_max).
        assert_quiet_again_under(leader_node, before, nodes, rounds)
    finally:
        cluster.close()


def test_followers_woken_together_under_a_quiet_leader_do_not_depose_it(
    tmp_path: Path, rounds: list[int]
) -> None:
    cluster, leader, leader_node, before, nodes = quiet_cluster(tmp_path, rounds)
    try:
        followers = [r.node for r in cluster.replicas if r is not leader and r.node]
        woken = [threading.Event() for _ in followers]
        for follower, done in zip(followers, woken, strict=True):

            def wake_alone(follower: RaftNode = follower, done: threading.Event = done) -> None:
                follower._raft._logsvc_follower_q.wake()
                done.set()

            follower._on_tick(wake_alone)
        assert all(done.wait(10.0) for done in woken), "a follower's tick did not run"
        assert_quiet_again_under(leader_node, before, nodes, rounds)
    finally:
        cluster.close()
