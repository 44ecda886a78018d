"""Which leaderships a node hands to other nodes so that each leads its share: pure.

Who leads a shard is whoever won its election, and that is not spread evenly: at start-up the
nodes open their replicas seconds apart, and the first ones up win most elections (issue 22
measured one node of three leading 89 to 591 of 1,000 shards after start-up), and a node that
restarts after a failover leads nothing until others fail. A node that leads more than its
peers does more work per append, and when it dies every one of its shards fails over at once
on the survivors: the failover's tail grows with how many shards it led.

So each node, from what its own replicas know (the leader of every shard it hosts), moves
leaderships it holds to the least-loaded live voter of the same shard (Raft's leadership
transfer, TimeoutNow: the target is caught up, stands at once and wins; Raft thesis §3.10)
while, among the shards of that group (the shards with the same voters), it leads at least
two more than that voter. Every member of a group hosts all its shards, so all count
alike; each move lowers the sum of the group's squared counts and touches no other group,
so the moves end. With every shard on the same three nodes, each ends within one of a
third; shards spread over overlapping groups are balanced group by group. The
counts the plan works on include the moves already asked and not yet seen done, so two
rounds do not ask the same move twice. Kafka's preferred-
leader election and TiKV's balance-leader scheduler do the same job with a central view; this
one needs none, at the cost of seeing only the shards this node hosts.

Never while any shard this node hosts has no leader: an election is running (a node died,
say) and moves would add elections to it; the balance waits until every shard is led.
Safety is Raft's: a transfer is an ordinary election in a new term.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ShardLeadership:
    """One shard this node hosts, as its replica here knows it."""

    shard_id: int
    leader: str | None  # the node leading it; None: no leader known (an election is due)
    voters: tuple[str, ...]  # the nodes of its voting members, this one included


@dataclass(frozen=True, slots=True)
class Move:
    shard_id: int
    target: str  # the node to hand the leadership to


def plan_moves(
    self_node: str,
    shards: Iterable[ShardLeadership],
    live: Callable[[str], bool],
    pending: Mapping[int, str],
    moves_max: int,
) -> list[Move]:
    """The leaderships `self_node` hands over now, at most `moves_max`. `live(node)`: the
    node is up (a lapsed node is never a target, and its count is not compared). `pending`:
    shard -> target of moves asked earlier and not yet seen done (counted as done, and not
    asked again)."""
    assert moves_max >= 0
    known = list(shards)
    if not moves_max or any(shard.leader is None for shard in known):
        return []
    # Counted per group (the shards with the same voters): every member of a group hosts
    # all of its shards, so all count alike, and a move inside a group changes no other
    # group's counts. (Counting over all the shards a node hosts made peers it shares few
    # shards with look idle; with overlapping groups, leaderships went round in circles.)
    counts: dict[tuple[str, ...], Counter[str]] = {}
    group_of: dict[int, tuple[str, ...]] = {}
    for shard in known:
        group = tuple(sorted(shard.voters))
        group_of[shard.shard_id] = group
        counts.setdefault(group, Counter())[str(shard.leader)] += 1
    for shard in known:
        target = pending.get(shard.shard_id)
        if target is not None and shard.leader == self_node:
            led = counts[group_of[shard.shard_id]]
            led[self_node] -= 1
            led[target] += 1
    moves: list[Move] = []
    for shard in sorted(known, key=lambda s: s.shard_id):
        if len(moves) >= moves_max:
            break
        if shard.leader != self_node or shard.shard_id in pending:
            continue
        led = counts[group_of[shard.shard_id]]
        targets = [node for node in shard.voters if node != self_node and live(node)]
        if not targets:
            continue
        target = min(targets, key=lambda node: (led[node], node))
        if led[self_node] - led[target] < 2:
            continue  # a move would only turn which of the two leads one more
        led[self_node] -= 1
        led[target] += 1
        moves.append(Move(shard.shard_id, target))
    return moves
