"""Node liveness: when this node last heard from each other node, and last sent to it.

A quiet (quiesced) shard sends no heartbeats, so its followers cannot tell a dead leader
from an idle one by the shard's own traffic. They ask this table instead: one per node
process, fed by every Raft message received from any replica on a node (any shard), and by
one small `alive` message per peer node and heartbeat interval when nothing else was sent
(docs/decisions/0005-scheduler-quiescence.md). A node is *lapsed* once nothing was heard
from it for `lapse_s` (the election timeout's minimum): a quiet follower then behaves as
an active one whose leader stopped heartbeating.

Dials are coalesced per node too: once a dial to a node failed and nothing was heard from
it since, its replicas here dial it at most once per reconnect interval *in all* (the first
to ask), not each on its own. When a node dies, every replica that dials it would
otherwise try every second (a thousand failed connects a second per survivor, on the CPU
the survivors' elections need); the first dial that gets through brings messages, and
with them every replica's own dials back.

Pure bookkeeping under one lock (any thread may report a message); time is an input.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Transitions:
    """Nodes whose state changed since the previous `check`."""

    lapsed: tuple[str, ...] = ()
    revived: tuple[str, ...] = ()


class NodeLiveness:
    def __init__(self, self_node: str, interval_s: float, lapse_s: float, now_s: float) -> None:
        """`interval_s`: how often each peer node must get something from us (the heartbeat
        period); `lapse_s`: silence after which a node is lapsed (> a few intervals)."""
        assert interval_s > 0
        assert lapse_s >= 3 * interval_s
        self.self_node = self_node
        self.interval_s = interval_s
        self.lapse_s = lapse_s
        self._lock = threading.Lock()
        self._heard: dict[str, float] = {}
        self._sent: dict[str, float] = {}
        self._lapsed: set[str] = set()
        self._dial_failed: dict[str, float] = {}  # node -> when a dial to it last failed
        self._dialled: dict[str, float] = {}  # node -> the last dial let through while failed
        # Nodes are not lapsed before anything could be heard from them: a node that just
        # started counts every peer as heard at its start.
        self._started_s = now_s
        self._checked_s = now_s

    # ------------------------------------------------------------------ reports

    def heard(self, node: str, now_s: float) -> None:
        """Something arrived from `node` (any message of any shard)."""
        if node == self.self_node:
            return
        self._heard[node] = now_s  # one dict store: atomic under the GIL, no lock needed

    def sent(self, node: str, now_s: float) -> None:
        """Something was sent to `node`."""
        self._sent[node] = now_s

    def dial_failed(self, node: str, now_s: float) -> None:
        """A connection attempt to `node` failed (refused, timed out, reset)."""
        self._dial_failed[node] = now_s

    # ------------------------------------------------------------------ questions

    def last_heard(self, node: str) -> float:
        """When `node` was last heard from (this node's start if never)."""
        return self._heard.get(node, self._started_s)

    def lapsed(self, node: str, now_s: float) -> bool:
        """Nothing heard from `node` for `lapse_s`."""
        if node == self.self_node:
            return False
        return now_s - self.last_heard(node) > self.lapse_s

    def unreachable(self, node: str) -> bool:
        """A dial to `node` failed and nothing was heard from it since."""
        failed = self._dial_failed.get(node)
        return failed is not None and self._heard.get(node, float("-inf")) <= failed

    def may_dial(self, node: str, now_s: float, retry_s: float) -> bool:
        """Whether a replica may dial `node` now: always while it is not `unreachable`;
        otherwise for the first to ask per `retry_s` (that one dial stands for all)."""
        if not self.unreachable(node):
            return True
        with self._lock:
            if now_s - self._dialled.get(node, float("-inf")) < retry_s:
                return False
            self._dialled[node] = now_s
            return True

    def send_due(self, node: str, now_s: float) -> bool:
        """Nothing sent to `node` for an interval: an `alive` message is due."""
        return now_s - self._sent.get(node, float("-inf")) >= self.interval_s

    def check(self, nodes: Iterable[str], now_s: float) -> Transitions:
        """Compare `nodes` against the previous check: which lapsed, which came back.

        A check that itself ran late (this process paused, or starved of CPU, for more
        than `lapse_s / 2`) declares no new lapse: the messages that arrived meanwhile may
        not have been read yet, and a node is never declared dead for our own stall."""
        with self._lock:
            stalled = now_s - self._checked_s > self.lapse_s / 2
            self._checked_s = now_s
            lapsed: list[str] = []
            revived: list[str] = []
            for node in nodes:
                is_lapsed = self.lapsed(node, now_s)
                if is_lapsed and node not in self._lapsed and not stalled:
                    self._lapsed.add(node)
                    lapsed.append(node)
                elif not is_lapsed and node in self._lapsed:
                    self._lapsed.discard(node)
                    revived.append(node)
            return Transitions(tuple(lapsed), tuple(revived))
