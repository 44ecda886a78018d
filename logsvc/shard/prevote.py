"""Pre-vote (Raft thesis §9.6): a replica asks before it stands, pure.

Standing raises the term, and a higher term deposes a live leader wherever it arrives: a
follower cut off from its leader alone (one link down, the others up) would otherwise stand
again and again, each time forcing a healthy shard through an election it did not need. So
a replica whose election timer fires first asks its peers `would you vote for me in term T
+ 1?`, changing nothing durable; it stands (pysyncobj's election, unchanged) only once a
majority, itself included, said yes. A peer says yes only if the candidate's log is at
least as up to date as its own, T + 1 is above its term, and it has no live leader itself
(it is not leading, and the leader it follows is disconnected, on a lapsed node, lost,
silent on this shard for the shortest election timeout while not quiet (Raft's recency
rule, leader_contact.py), or is the candidate itself: a leader that stepped down).

Answers change nothing durable but one thing: an answer carries the voter's term, and a
candidate whose term is below it takes it (`term_to_adopt`), as Raft has every replica do
with a higher term it sees, and as etcd's Raft does with a pre-vote refusal. Without that,
pre-votes (which raise no term) can leave a shard leaderless for good: seen on a loaded
start-up of 1,000 shards, replicas at terms 1, 2 and 3 whose logs were longest at term 1
and shortest at term 3 (the higher terms came from rounds nobody answered, below); each
one's pre-vote was refused by the others, for its term or for its log, every round.
Raft's safety is untouched (terms and votes are pysyncobj's, and adopting a higher term
is what Raft does with any message of one); only who gets to start an election is
filtered. A peer that never answers (an older build without pre-vote) must not keep the
shard leaderless: after `SILENT_ROUNDS_MAX` rounds in which nobody answered, the replica
stands as plain Raft does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Rounds in a row without a single answer after which a replica stands without pre-vote.
SILENT_ROUNDS_MAX = 2


def grants(
    *,
    proposed_term: int,
    candidate: str,
    candidate_last: tuple[int, int],
    own_term: int,
    own_last: tuple[int, int],
    leading: bool,
    live_leader: str | None,
) -> bool:
    """Would this replica vote for `candidate` in `proposed_term`? `*_last`: (term, index)
    of the last log entry; `live_leader`: the leader this replica follows while it is live,
    else None. A leader that asks is no longer leading (it stepped down: a leader without
    a majority for leader_fallback_ms does, keeping its term, and tells nobody): its own
    followers, which still count it live, must not refuse it for being live, or a shard
    whose other voter is behind or a term ahead stays leaderless for good (issue 22)."""
    leader_in_the_way = live_leader is not None and live_leader != candidate
    return (
        proposed_term > own_term
        and candidate_last >= own_last
        and not (leading or leader_in_the_way)
    )


def term_to_adopt(own_term: int, voter_term: int | None) -> int | None:
    """The term a candidate takes from an answer whose voter is at `voter_term` (None: an
    older build's answer, which does not say): the voter's, when above its own."""
    if voter_term is None or voter_term <= own_term:
        return None
    return voter_term


@dataclass(slots=True)
class PreVoteRound:
    """One round of asking, for standing in `term`; `voters` counts the candidate."""

    term: int
    voters: int
    granted: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)

    @property
    def won(self) -> bool:
        return 2 * (len(self.granted) + 1) > self.voters

    def on_answer(self, sender: str, term: int, granted: bool) -> bool:
        """An answer; True the first time the round is won by it."""
        if term != self.term:
            return False  # an answer to an older round
        was = self.won
        self.answered.add(sender)
        if granted:
            self.granted.add(sender)
        return self.won and not was
