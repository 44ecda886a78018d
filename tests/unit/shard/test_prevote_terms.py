"""Pre-vote answers carry the voter's term, and a candidate behind it takes it
(logsvc/shard/prevote.py `term_to_adopt`). Without that a shard could stay leaderless for
good: found on a loaded start-up of 1,000 shards (a shard's replicas at terms 1, 2 and 3,
the longest log at term 1 and the shortest at term 3, every pre-vote refused, no leader
for minutes). The state is built here on real stores and real replicas."""

from __future__ import annotations

from pathlib import Path

from logsvc.shard import prevote
from logsvc.store import ShardStore
from tests.unit.shard.raft_harness import LIMITS, Cluster, Replica, wait_until


def test_a_candidate_takes_a_higher_term_only_from_an_answer_that_says_one() -> None:
    assert prevote.term_to_adopt(own_term=1, voter_term=3) == 3
    assert prevote.term_to_adopt(own_term=3, voter_term=3) is None
    assert prevote.term_to_adopt(own_term=4, voter_term=3) is None
    assert prevote.term_to_adopt(own_term=1, voter_term=None) is None  # an older build


def test_replicas_whose_terms_and_logs_diverge_elect_a_leader(tmp_path: Path) -> None:
    """A (the old leader) holds the longest log at the lowest term; C the shortest at the
    highest; B is in between on both. Every pre-vote is refused: A's for its term (B and C
    are at or above the term it asks for), B's by C for its term and by A for its log,
    C's for its log. Once a candidate takes the higher term from a refusal, A or B wins;
    C never can (its log lacks the entry A and B committed)."""
    cluster = Cluster(str(tmp_path))
    try:
        cluster.start_all()
        assert len(cluster.propose([b"one", b"two"])) == 2
        a = cluster.leader()
        b, c = (r for r in cluster.replicas if r is not a)
        assert a.node is not None
        term = a.node.term
        cluster.stop(c)
        assert len(cluster.propose([b"on A and B"])) == 1  # committed by A and B
        _await_whole_log(b, a)
        cluster.stop(b)
        assert a.store is not None
        before = a.store.last_index
        a.node.propose(b"on A alone", lambda _result, _reason: None)  # never committed
        wait_until(lambda: a.store is not None and a.store.last_index > before, "A's own entry")
        cluster.stop(a)
    finally:
        cluster.close()

    for replica, term_now in ((b, term + 1), (c, term + 2)):
        store = ShardStore.open(str(Path(replica.dir_path) / "journal"), limits=LIMITS)
        try:
            assert store.term <= term  # (a follower may not have written term yet)
            store.save_vote(term_now, replica.address)  # stood in rounds nobody answered
        finally:
            store.close()

    try:
        cluster.start_all()
        winner = cluster.leader()  # bounded: raft_harness.WAIT_S_MAX
        assert winner is not c, "a leader without a committed entry"
        # A can win term + 2 (it takes term + 1 from B, asks for term + 2, B grants).
        assert winner.node is not None and winner.node.term >= term + 2
        assert cluster.propose([b"after"]) != {}
        wait_until(lambda: b"after" in winner.handler.commands(), "the winner applying it")
        applied = winner.handler.commands()
        assert applied[:3] == [b"one", b"two", b"on A and B"], applied
    finally:
        cluster.close()


def _await_whole_log(follower: Replica, leader: Replica) -> None:
    assert leader.store is not None
    whole = leader.store.last_index
    wait_until(
        lambda: follower.store is not None and follower.store.durable_index >= whole,
        "the follower holding the leader's whole log",
    )
