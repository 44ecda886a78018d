"""Elections and follower lag in seconds, as one replica sees them: a pure tracker.

pysyncobj reports a follower's match index (on the leader) but no times. The tick loop
feeds `RaftProgress.observe` once per tick with what it already has at hand (the leader it
knows, the term, whether it leads, its last log index, the match index of each peer): a
few comparisons and at most one dict entry per peer, so it costs nothing next to a tick.

* `last_election_at`: the wall-clock time (seconds since the epoch) at which this replica
  last saw a new leader: another (leader, term) than before, itself included. None until it
  has known one.
* `lag_s(peer)`, leader only: how long since the peer's match index was last equal to this
  leader's last log index (a follower that keeps up is at most a tick or two behind). A
  peer never caught up since this replica became leader, or since the peer was added,
  counts from then. None on a follower, and for a peer the leader does not track.

Time is an input: `now_s` (monotonic, for durations) and `wall_s` (for the timestamp).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProgressView:
    last_election_at_s: float | None  # wall clock, seconds since the epoch
    lag_s: tuple[tuple[str, float], ...]  # (peer address, seconds), leader only

    def lag_of(self, peer: str) -> float | None:
        for address, seconds in self.lag_s:
            if address == peer:
                return seconds
        return None


class RaftProgress:
    """Fed by the tick thread (`observe`), read from any thread (`view`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: tuple[str, int] | None = None  # (leader, term) last seen
        self._last_election_at_s: float | None = None
        self._leading = False
        self._caught_up_at_s: dict[str, float] = {}  # peer -> last time match == last

    def observe(
        self,
        now_s: float,
        wall_s: float,
        leader: str | None,
        term: int,
        leading: bool,
        last_index: int,
        match_index: Mapping[str, int],
    ) -> None:
        with self._lock:
            if leader is not None and (leader, term) != self._known:
                self._known = (leader, term)
                self._last_election_at_s = wall_s
            if leading != self._leading:
                self._leading = leading
                self._caught_up_at_s = {}
            if not leading:
                return
            for peer, matched in match_index.items():
                if matched >= last_index or peer not in self._caught_up_at_s:
                    # New peers (and all, on becoming leader) count from now.
                    self._caught_up_at_s[peer] = now_s
            if len(self._caught_up_at_s) > len(match_index):
                for peer in [p for p in self._caught_up_at_s if p not in match_index]:
                    del self._caught_up_at_s[peer]  # removed from the shard

    def view(self, now_s: float) -> ProgressView:
        with self._lock:
            lags = tuple(
                (peer, max(0.0, now_s - at)) for peer, at in sorted(self._caught_up_at_s.items())
            )
            return ProgressView(self._last_election_at_s, lags if self._leading else ())
