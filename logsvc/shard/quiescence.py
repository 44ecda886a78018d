"""Quiescence of an idle shard: the leader's side and a follower's side, pure.

An idle Raft group still heartbeats ten times a second; a node hosting a thousand shards
would spend cores doing it. A shard with nothing to do goes quiet instead, as CockroachDB's
ranges quiesce (docs/decisions/0005-scheduler-quiescence.md):

1. The leader sees nothing new for `quiesce_after_s` (same term, last index, commit index
   and applied index; no command queued, waiting or in flight), everything committed and
   applied, and every follower on a live node connected and caught up (`match_index ==
   last_index`); the live voters and itself are a majority. It sends each of them
   `quiesce(term, seq, last_index, last_term, commit_index)` and stops its heartbeats.
2. A follower agrees only if it follows that leader in that term and its log ends at the
   same (index, term); it then takes the commit index (the leader vouches for its whole
   log: log matching at `last_index`), stops its election timer, and answers
   `quiesce_ack(term, seq, ok)`. A follower that cannot agree answers ok = false, and the
   leader goes back to heartbeating.
3. Once every follower it asked has agreed, the leader is quiet: it sends nothing more.

Waking: the leader on any proposal, membership change, transfer, any Raft message other
than an ack, a connection coming up (not one of an agreeing follower going down: that
follower acts on the loss itself), a follower that was not part of the agreement coming
back to life, or a refusal; it then heartbeats at once (and its followers, on that first
AppendEntries, wake too). A follower on any Raft message, on losing its connection to the
leader, or when the leader's node lapses in the node liveness table (logsvc/shard/
liveness.py): then it is an ordinary follower whose election timer started when the
leader's node was last heard from, so a quiet shard fails over within the election timeout
like an active one.

Quiescence never decides anything Raft decides: terms, votes, commits and the log are
Raft's; it only suppresses heartbeats and election timers while the node liveness table
stands in for them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Mode(enum.Enum):
    ACTIVE = "active"  # heartbeating
    QUIESCING = "quiescing"  # asked the followers; heartbeats replaced by the request
    QUIET = "quiet"  # every follower asked agreed: nothing is sent


@dataclass(frozen=True, slots=True)
class Peer:
    """A follower (or learner) as the leader sees it at the end of a tick."""

    address: str
    match_index: int
    connected: bool
    alive: bool  # its node is not lapsed in the liveness table
    voter: bool = True


@dataclass(frozen=True, slots=True)
class LeaderView:
    term: int
    last_index: int
    last_term: int
    commit_index: int
    last_applied: int
    busy: bool  # commands queued or awaiting commit, a change or transfer in flight
    peers: tuple[Peer, ...]


@dataclass(frozen=True, slots=True)
class QuiesceRequest:
    """What the leader sends to each of `targets`."""

    term: int
    seq: int
    last_index: int
    last_term: int
    commit_index: int
    targets: tuple[str, ...]


def quiescible(view: LeaderView) -> bool:
    """Everything committed and applied, nothing pending, every follower on a live node
    connected and caught up, and the live voters with the leader a majority."""
    if view.busy or not view.commit_index == view.last_index == view.last_applied:
        return False
    live_voters = 0
    voters = 0
    for peer in view.peers:
        voters += peer.voter
        if not peer.alive:
            continue
        if not peer.connected or peer.match_index != view.last_index:
            return False
        live_voters += peer.voter
    return 2 * (live_voters + 1) > voters + 1


class LeaderQuiescence:
    """The leader's side. Feed it `observe(view, now)` after every tick and the acks as they
    arrive; it says when to send a request, and whether the leader is quiet."""

    def __init__(self, quiesce_after_s: float, resend_s: float) -> None:
        assert quiesce_after_s > 0
        assert resend_s > 0
        self._after_s = quiesce_after_s
        self._resend_s = resend_s
        self.mode = Mode.ACTIVE
        self.seq = 0
        self._fingerprint: tuple[int, int, int, int] | None = None
        self._idle_since_s = 0.0
        self._sent_s = 0.0
        self._request: QuiesceRequest | None = None
        self._acked: set[str] = set()

    @property
    def quiet(self) -> bool:
        return self.mode is Mode.QUIET

    def wake(self, now_s: float) -> bool:
        """Activity: heartbeat again. True if it was quiescing or quiet."""
        self._idle_since_s = now_s
        if self.mode is Mode.ACTIVE:
            return False
        self.mode = Mode.ACTIVE
        self._request = None
        return True

    def changed(self, fingerprint: tuple[int, int, int, int], now_s: float) -> bool | None:
        """The cheap first look after a tick: `fingerprint` is (term, last, commit, applied).
        If it moved, that is activity: returns whether the leader woke (True/False), and
        `observe` need not run. None: nothing moved, `observe` decides."""
        if fingerprint == self._fingerprint:
            return None
        self._fingerprint = fingerprint
        return self.wake(now_s)

    def observe(self, view: LeaderView, now_s: float) -> tuple[bool, QuiesceRequest | None]:
        """After a tick of the leader: (woke, request to send or None). `woke` is True when
        it was quiescing or quiet and must heartbeat again."""
        fingerprint = (view.term, view.last_index, view.commit_index, view.last_applied)
        if fingerprint != self._fingerprint or view.busy:
            self._fingerprint = fingerprint
            return self.wake(now_s), None
        if self.mode is Mode.QUIET:
            agreed = self._request.targets if self._request is not None else ()
            # A follower that agreed and then lost its connection needs nothing from a quiet
            # leader (it acts on the loss itself; the connection's return wakes the
            # leader): counted as connected, or a node's death would wake every shard it
            # followed in while the survivors elect the ones it led.
            relaxed = replace(
                view,
                peers=tuple(
                    replace(peer, connected=True) if peer.address in agreed else peer
                    for peer in view.peers
                ),
            )
            if not quiescible(relaxed):
                return self.wake(now_s), None
            if any(peer.alive and peer.address not in agreed for peer in view.peers):
                return self.wake(now_s), None  # a follower back to life must catch up first
            return False, None
        if not quiescible(view):
            return self.wake(now_s), None
        if self.mode is Mode.ACTIVE:
            if now_s - self._idle_since_s < self._after_s:
                return False, None
            self.mode = Mode.QUIESCING
            self.seq += 1
            self._acked = set()
            self._request = QuiesceRequest(
                term=view.term,
                seq=self.seq,
                last_index=view.last_index,
                last_term=view.last_term,
                commit_index=view.commit_index,
                targets=tuple(sorted(p.address for p in view.peers if p.alive)),
            )
            self._sent_s = now_s
            if not self._request.targets:  # a group of one: nobody to ask
                self.mode = Mode.QUIET
                return False, None
            return False, self._request
        # QUIESCING: ask again those that did not answer yet
        assert self._request is not None
        if now_s - self._sent_s < self._resend_s:
            return False, None
        self._sent_s = now_s
        missing = tuple(a for a in self._request.targets if a not in self._acked)
        return False, QuiesceRequest(
            term=self._request.term,
            seq=self._request.seq,
            last_index=self._request.last_index,
            last_term=self._request.last_term,
            commit_index=self._request.commit_index,
            targets=missing,
        )

    def on_ack(self, address: str, term: int, seq: int, ok: bool, now_s: float) -> None:
        """A follower's answer to the request `seq`; stale answers are ignored."""
        request = self._request
        if self.mode is not Mode.QUIESCING or request is None:
            return
        if term != request.term or seq != request.seq or address not in request.targets:
            return
        if not ok:
            self.wake(now_s)  # it does not follow us at our last entry: keep replicating
            return
        self._acked.add(address)
        if self._acked.issuperset(request.targets):
            self.mode = Mode.QUIET

    def next_check_s(self, now_s: float) -> float | None:
        """When `observe` may next have something to do without any new event."""
        if self.mode is Mode.ACTIVE:
            return max(now_s, self._idle_since_s + self._after_s)
        if self.mode is Mode.QUIESCING:
            return max(now_s, self._sent_s + self._resend_s)
        return None


@dataclass(frozen=True, slots=True)
class FollowerView:
    """A follower's own state when a request arrives."""

    term: int
    is_follower: bool
    leader: str | None
    last_index: int
    last_term: int


class FollowerQuiescence:
    """A follower's side: quiet from an agreed request until any wake-up."""

    def __init__(self) -> None:
        self.quiet = False
        self.leader: str | None = None

    def on_request(self, sender: str, request: QuiesceRequest, view: FollowerView) -> bool:
        """Agree (and go quiet) iff we follow `sender` in its term and our log ends where
        its does; False (stay active) otherwise."""
        agree = (
            view.is_follower
            and view.term == request.term
            and view.leader == sender
            and view.last_index == request.last_index
            and view.last_term == request.last_term
        )
        if agree:
            self.quiet = True
            self.leader = sender
        return agree

    def wake(self) -> bool:
        """Back to an ordinary follower; True if it was quiet."""
        was = self.quiet
        self.quiet = False
        return was
