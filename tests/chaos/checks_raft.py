"""White-box checks over the nodes' event logs: S12 (Raft election safety and durable
term/vote) and S14's "every injected damage is detected" (plan §4.8).

S12, from `RaftEvent`s, per shard (each shard is its own Raft group):
  * at most one node becomes leader in a term (Raft §5.2, Election Safety);
  * a node's term never decreases, in time order of its events, *including* across "start"
    events: a restarted node must recover at least the term it had (PySyncObj #84 forgets
    currentTerm on restart). "recovery" and "corruption" events carry no term and are
    skipped;
  * a node never votes for two different candidates in one term, across restarts too
    (votedFor must be durable before the vote is sent, Raft Figure 2).

S14 (opt-in, `corruption_detection_required`): every applied NemesisEvent of fault
"bitflip", "truncate_file" or "torn_tail" (phase start or info) is followed, on each
target node, by a "corruption" or "recovery" event at or after the injection. Opt-in
because damage that lands in an already-truncated region may never be read.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from tests.chaos.checks_base import CheckOptions, Findings
from tests.chaos.history import Evidence, RaftEvent

DAMAGE_FAULTS = frozenset({"bitflip", "truncate_file", "torn_tail"})
DETECTION_KINDS = frozenset({"corruption", "recovery"})
_TERMLESS_KINDS = DETECTION_KINDS  # their `term` field is not meaningful


def _describe(event: RaftEvent) -> str:
    extra = f" for {event.voted_for}" if event.kind == "vote" else ""
    return f"{event.node_id} {event.kind}{extra} term {event.term} at {event.time_ns}"


def _check_leaders(events: list[RaftEvent], findings: Findings) -> None:
    leaders: dict[tuple[int, int], dict[str, RaftEvent]] = defaultdict(dict)
    for event in events:
        if event.kind == "leader":
            leaders[(event.shard, event.term)].setdefault(event.node_id, event)
    for (shard, term), by_node in sorted(leaders.items()):
        if len(by_node) > 1:
            findings.add(
                "S12",
                shard,
                "two leaders in one term",
                f"term {term}: " + "; ".join(_describe(e) for e in by_node.values()),
            )


def _check_terms(events: list[RaftEvent], findings: Findings) -> None:
    by_node: dict[tuple[int, str], list[RaftEvent]] = defaultdict(list)
    for event in events:
        if event.kind not in _TERMLESS_KINDS:
            by_node[(event.shard, event.node_id)].append(event)
    for (shard, _), node_events in sorted(by_node.items()):
        highest: RaftEvent | None = None
        for event in sorted(node_events, key=lambda e: e.time_ns):  # stable: log order on ties
            if highest is not None and event.term < highest.term:
                restart = " after a restart" if event.kind == "start" else ""
                findings.add(
                    "S12",
                    shard,
                    "a node's term went backwards",
                    f"{_describe(event)}{restart}, after {_describe(highest)}",
                )
            if highest is None or event.term > highest.term:
                highest = event


def _check_votes(events: list[RaftEvent], findings: Findings) -> None:
    first_vote: dict[tuple[int, str, int], RaftEvent] = {}
    reported: set[tuple[int, str, int, str]] = set()
    for event in sorted(events, key=lambda e: e.time_ns):
        if event.kind != "vote" or event.voted_for is None:
            continue
        key = (event.shard, event.node_id, event.term)
        earlier = first_vote.setdefault(key, event)
        if earlier.voted_for != event.voted_for and (*key, event.voted_for) not in reported:
            reported.add((*key, event.voted_for))
            findings.add(
                "S12",
                event.shard,
                "a node voted twice in one term",
                f"{_describe(earlier)}; then {_describe(event)}",
            )


def _check_damage_detected(evidence: Evidence, findings: Findings) -> None:
    detected_ns: dict[str, list[int]] = defaultdict(list)
    shard_of: dict[str, int] = {}
    for event in evidence.events:
        shard_of.setdefault(event.node_id, event.shard)
        if event.kind in DETECTION_KINDS:
            detected_ns[event.node_id].append(event.time_ns)
    for times in detected_ns.values():
        times.sort()
    for fault in evidence.nemesis:
        if fault.fault not in DAMAGE_FAULTS or fault.phase == "end" or not fault.applied:
            continue
        for node_id in fault.targets:
            times = detected_ns.get(node_id, [])
            if bisect.bisect_left(times, fault.time_ns) == len(times):
                findings.add(
                    "S14",
                    shard_of.get(node_id),
                    "injected damage never detected",
                    f"{fault.fault} on {node_id} at {fault.time_ns} ({fault.detail or '-'}): "
                    "no later corruption/recovery event from that node",
                )


def check_raft(evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
    """S12 always; S14's detection rule when `options.corruption_detection_required`."""
    _check_leaders(evidence.events, findings)
    _check_terms(evidence.events, findings)
    _check_votes(evidence.events, findings)
    if options.corruption_detection_required:
        _check_damage_detected(evidence, findings)
