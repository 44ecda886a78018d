"""White-box observation of every replica after each of its ticks: the Raft events of the
run (`history.RaftEvent`) and the invariants checked online, at every step (chaos-plan
§4.10): S12 and "committed prefixes agree".

S12 (from the durable term and vote, which is what must survive a crash):
* at most one leader per term;
* a node's term never decreases, including across restarts and power losses;
* a node never votes for two different candidates in one term, including across restarts.

Committed prefixes agree: every (raft index -> term, entry) any replica reports as
committed (at or below its commit index) is the same on every replica and at every time.
A global map remembers the first committed entry seen at each index; each replica's newly
committed entries are compared with it once per incarnation (Raft's Log Matching and
Leader Completeness, observed).

Events are sampled after each node's tick (and at its start): `start` (the term recovered),
`term` (the durable term changed), `vote` (the durable vote changed), `leader` (the node
leads in a new term). A term that went up twice within one tick shows as one event.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from tests.chaos.dst.clock import VirtualClock
from tests.chaos.dst.node import SHARD, SimNode
from tests.chaos.history import RaftEvent, RaftEventKind

READ_BYTES_MAX = 1 << 30
VIOLATIONS_KEPT_MAX = 20  # the first ones tell the story; the rest are only counted


@dataclass(slots=True)
class _Seen:
    term: int
    voted_for: str | None
    leading: bool
    checked_upto: int  # committed entries up to here were compared with the global map


class Observer:
    def __init__(self, clock: VirtualClock, names_by_address: dict[str, str]) -> None:
        self._clock = clock
        self._name_of = names_by_address
        self.events: list[RaftEvent] = []
        self.violations: list[str] = []
        self._seen: dict[str, _Seen] = {}
        self._term_max: dict[str, int] = {}  # highest durable term each node ever had
        self._votes: dict[tuple[str, int], str] = {}
        self._leaders: dict[int, str] = {}
        self._committed: dict[int, tuple[int, int, int]] = {}  # index -> term, crc, length
        self.leader_elections = 0
        self.committed_index_max = 0
        self.violations_dropped = 0

    def on_start(self, node: SimNode) -> None:
        replica = node.replica
        assert replica is not None
        store = replica.store
        term, voted = store.term, self._voter(store.voted_for)
        self._event(node.name, "start", term, detail=f"incarnation {node.incarnation}")
        before = self._term_max.get(node.name, 0)
        if term < before:
            self._violation(f"S12 {node.name} restarted with term {term} < {before}")
        self._note_vote(node.name, term, voted, event=False)
        self._term_max[node.name] = max(before, term)
        self._seen[node.name] = _Seen(term, voted, False, store.first_index - 1)

    def after_tick(self, node: SimNode) -> None:
        replica = node.replica
        assert replica is not None
        seen = self._seen[node.name]
        store = replica.store
        term, voted = store.term, self._voter(store.voted_for)
        if term != seen.term:
            if term < seen.term:
                self._violation(f"S12 {node.name} term went back from {seen.term} to {term}")
            self._event(node.name, "term", term)
        if voted is not None and (voted != seen.voted_for or term != seen.term):
            self._note_vote(node.name, term, voted, event=True)
        self._term_max[node.name] = max(self._term_max.get(node.name, 0), term)
        leading = node.fatal is None and replica.is_leader
        raft_term = replica.node.term
        if leading and not (seen.leading and raft_term == seen.term):
            self.leader_elections += 1
            self._event(node.name, "leader", raft_term)
            other = self._leaders.setdefault(raft_term, node.name)
            if other != node.name:
                self._violation(f"S12 two leaders in term {raft_term}: {other} and {node.name}")
        seen.term, seen.voted_for, seen.leading = term, voted, leading
        self._check_committed(node, seen)

    def _check_committed(self, node: SimNode, seen: _Seen) -> None:
        replica = node.replica
        assert replica is not None
        store = replica.store
        lo = max(seen.checked_upto + 1, store.first_index)
        hi = min(replica.node.commit_index, store.last_index)
        if hi < lo:
            return
        for entry in store.read(lo, hi + 1, READ_BYTES_MAX):
            mine = (entry.term, zlib.crc32(entry.payload), len(entry.payload))
            first = self._committed.setdefault(entry.index, mine)
            if first != mine:
                self._violation(
                    f"committed prefixes disagree at raft index {entry.index}: {node.name} "
                    f"has term {entry.term} (crc {mine[1]:08x}), first seen term {first[0]} "
                    f"(crc {first[1]:08x})"
                )
        seen.checked_upto = hi
        self.committed_index_max = max(self.committed_index_max, hi)

    def _note_vote(self, name: str, term: int, voted: str | None, *, event: bool) -> None:
        if voted is None:
            return
        if event:
            self._event(name, "vote", term, voted_for=voted)
        before = self._votes.setdefault((name, term), voted)
        if before != voted:
            self._violation(f"S12 {name} voted twice in term {term}: {before} and {voted}")

    def _voter(self, address: str | None) -> str | None:
        return None if address is None else self._name_of.get(address, address)

    def _event(
        self,
        name: str,
        kind: RaftEventKind,
        term: int,
        *,
        voted_for: str | None = None,
        detail: str = "",
    ) -> None:
        self.events.append(
            RaftEvent(name, SHARD, self._clock.now_ns, kind, term, voted_for, detail)
        )

    def _violation(self, message: str) -> None:
        if len(self.violations) == VIOLATIONS_KEPT_MAX:
            self.violations.append("(further observer violations are only counted)")
        if len(self.violations) > VIOLATIONS_KEPT_MAX:
            self.violations_dropped += 1
            return
        self.violations.append(f"t={self._clock.now_ns / 1e9:.2f}s {message}")
