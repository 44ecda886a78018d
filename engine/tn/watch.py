"""The standby's failure detector: when to promote itself (pure: probe outcomes and the time
in, a decision out; the daemon does the probing and the promoting).

The rule (issue 15 "when the active TN is gone"): every `probe_interval_ms` the standby asks
each peer TN for its status, each probe bounded by `probe_timeout_ms`. A round in which some
peer answers as active resets the count, and so does one in which a standby peer whose
address sorts before this one's answers (that one promotes; two standbys never race). A
round in which none does (each refused the connection, timed out, or answered as a standby
behind this one) is a failure; after `failures_to_promote`
consecutive failures, all within `failure_window_ms_max`, the standby promotes itself. A dead
process refuses connections at once, so detection takes about failures x interval (1 s with
the defaults); a hung or unreachable one about failures x (interval + timeout) (3 s).

Why the window: failures are evidence about *now*. If the probing itself stalled (the
standby's process was paused, its event loop blocked), failures spread over a long time
say little, and the count starts again rather than promoting on stale evidence.

Safety does not rest on this detector: promotion takes the WAL's lease with a new epoch, so
a TN wrongly believed dead is fenced on its next append and exits (decision 0007). The
detector only decides *when*; a false positive costs a failover, never a split brain.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from engine.tn import limits


@dataclass(frozen=True, slots=True)
class WatchPolicy:
    probe_interval_ms: int = limits.WATCH_PROBE_INTERVAL_MS
    probe_timeout_ms: int = limits.WATCH_PROBE_TIMEOUT_MS
    failures_to_promote: int = limits.WATCH_FAILURES_TO_PROMOTE
    failure_window_ms_max: int = limits.WATCH_FAILURE_WINDOW_MS_MAX

    def problem(self) -> str | None:
        """Why this policy cannot work (the field first), or None."""
        if self.probe_interval_ms < 10:
            return "probe_interval_ms: must be at least 10"
        if self.probe_timeout_ms < 10:
            return "probe_timeout_ms: must be at least 10"
        if not 1 <= self.failures_to_promote <= 100:
            return "failures_to_promote: must be in 1..100"
        needed = self.failures_to_promote * (self.probe_interval_ms + self.probe_timeout_ms)
        if self.failure_window_ms_max < needed:
            return (
                f"failure_window_ms_max: must be at least failures_to_promote x "
                f"(probe_interval_ms + probe_timeout_ms) = {needed}, or it never promotes"
            )
        return None


class Seen(Enum):
    ACTIVE = "active"
    """Some peer answered as the active TN."""
    DEFERRED = "deferred"
    """No active TN, but a standby peer ahead of this one (its address sorts first)
    answered: it is the one to promote, this one waits (two standbys never race for the
    lease; if that one dies too, its probes fail and this one's count starts)."""
    NO_ACTIVE = "no-active"
    """No peer answered as active, and none ahead of this one as a standby."""


class Decision(Enum):
    WAIT = "wait"
    PROMOTE = "promote"


class Watch:
    def __init__(self, policy: WatchPolicy) -> None:
        assert policy.problem() is None, policy.problem()
        self.policy = policy
        self._failures_ms: list[int] = []
        """When each failure of the current streak was seen (oldest first)."""
        self.active_seen = False
        """Some peer answered as active at least once (for the log)."""

    @property
    def failures(self) -> int:
        return len(self._failures_ms)

    def observe(self, now_ms: int, seen: Seen) -> Decision:
        """One round of probes, finished at `now_ms`."""
        if seen is not Seen.NO_ACTIVE:
            self._failures_ms.clear()
            self.active_seen = self.active_seen or seen is Seen.ACTIVE
            return Decision.WAIT
        assert not self._failures_ms or now_ms >= self._failures_ms[-1]
        self._failures_ms.append(now_ms)
        window_start = now_ms - self.policy.failure_window_ms_max
        while self._failures_ms and self._failures_ms[0] < window_start:
            self._failures_ms.pop(0)
        if len(self._failures_ms) >= self.policy.failures_to_promote:
            return Decision.PROMOTE
        return Decision.WAIT
