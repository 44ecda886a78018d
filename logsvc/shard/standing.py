"""Who stands first when a shard loses its leader, and when: pure, time is an input.

A node that dies takes the leadership of a third of its cluster's shards with it (a thousand
shards on three nodes: ~330), and every survivor notices all of them at once (the dead
node's connections close together, or its node lapses in liveness.py). Drawn at random
(pysyncobj's election timeout, uniform in [min, max]), two survivors of one shard stand
within a vote's round trip of each other often enough, when hundreds of elections share two
cores and their fsyncs, that split votes made the tail of a failover (each split costs
another full random timeout: issue 22 measured max 5.3 to 6.6 s against a 2.5 s timeout).

Instead the surviving voters of a shard agree on an order without a message: sorted by a
hash of (lost leader, voter), the same on every node and different per shard (each shard's
replicas have their own addresses), so the first to stand is spread evenly over the
survivors. The first stands once the election timeout's minimum has passed since the
leader's node was last heard from (as an active follower whose heartbeats stopped would),
plus a random part of a quarter of the timeout's range so that a node's hundreds of
elections do not all start in one tick; each next one a whole range later, so that it
stands only if the ones before it failed (dead too, or a log behind: a voter that refuses a
stale candidate stands at once, see raft/elections.py). Safety is Raft's (terms and votes):
this only orders the timers, and every later timeout is pysyncobj's random one again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def standing_rank(leader: str, voter: str, voters: Iterable[str]) -> int:
    """`voter`'s place among `voters` (the shard's voting members; the lost `leader` is
    left out whether listed or not) in the order every survivor computes alike."""
    survivors = sorted({v for v in voters if v != leader} | {voter}, key=lambda v: _key(leader, v))
    return survivors.index(voter)


def _key(leader: str, voter: str) -> bytes:
    return hashlib.blake2b(f"{leader}\n{voter}".encode(), digest_size=8).digest() + voter.encode()


def stand_at_s(
    rank: int,
    last_heard_s: float,
    now_s: float,
    timeout_min_s: float,
    timeout_max_s: float,
    jitter: float,
) -> float:
    """When the voter of `rank` stands (monotonic seconds): `timeout_min_s` after the
    leader's node was last heard from, a range (`timeout_max_s - timeout_min_s`) later per
    rank, never before `now_s`, plus `jitter` (in [0, 1)) of a quarter range."""
    assert rank >= 0
    assert 0.0 <= jitter < 1.0
    assert timeout_max_s > timeout_min_s > 0
    span_s = timeout_max_s - timeout_min_s
    return max(last_heard_s + timeout_min_s + rank * span_s, now_s) + jitter * span_s / 4
