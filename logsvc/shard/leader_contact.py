"""What a follower last had from its leader on its own shard, for the pre-vote grant: pure,
time is an input.

A follower refuses a pre-vote while its leader is live (prevote.py): a follower cut off
from a healthy leader alone must not depose it. Raft's rule for "live" is recency (thesis
§4.2.3, §9.6): the leader is live if its AppendEntries reached this follower within the
shortest election timeout. Node liveness (liveness.py) must not stand in for that while
the leader heartbeats: it is one table per node, fed by every shard's messages, so a leader
cut off on one shard while its node talks through another (chaos scenario C10, session 10)
counted as live to both its followers; each refused the other's pre-vote until their
connection to it dropped (the connection timeout), and the shard stayed leaderless that
long: ~4.5-6 s, against an election timeout for a dead node.

Node liveness stands in only while the leader is *quiet* as far as this follower knows:
from the quiesce request it agreed to until the leader's next AppendEntries. That includes
a follower that woke alone (by an event of its own, a peer's connection coming up) while
its leader stayed quiet: the leader sends nothing by design, so silence tells nothing, and
two followers woken together would otherwise grant each other a pre-vote against a healthy
quiet leader (the woken follower's refused pre-vote is what wakes that leader,
message_fixes.py). A leader cut off on one shard while its shard is quiet is therefore
still found only by TCP or by its node lapsing (docs/decisions/0005, risks).
"""

from __future__ import annotations

import math


class LeaderContact:
    """When this replica last heard from its shard's leader, and whether that leader is
    quiet as far as it knows. Reset by nothing: a new leader's first AppendEntries (or
    quiesce request) overwrites both."""

    def __init__(self) -> None:
        self.heard_s = -math.inf
        self.leader_quiet = False

    def on_append_entries(self, now_s: float) -> None:
        """An AppendEntries (or a snapshot chunk) of our term or above: its sender leads."""
        self.heard_s = now_s
        self.leader_quiet = False

    def on_quiesce_request(self, now_s: float, agreed: bool) -> None:
        """Our leader's quiesce request in our term (it stands for a heartbeat); `agreed`:
        we went quiet with it (a refusal sends the leader back to heartbeating)."""
        self.heard_s = now_s
        self.leader_quiet = agreed

    def live(self, now_s: float, recency_s: float) -> bool:
        """Whether the leader counts live by its own traffic: heard within `recency_s` (the
        shortest election timeout), or quiet (node liveness, checked by the caller, stands
        in for its silence)."""
        return self.leader_quiet or now_s - self.heard_s < recency_s
