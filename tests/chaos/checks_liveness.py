"""Liveness (L1-L3) and vacuity checks (plan §4.8): the run made progress after faults
healed, the replicas converged, and the run exercised what the scenario meant to test.

Fault timeline. The nemesis log is replayed in time order: an applied "start" makes the
fault (name, targets) active; an "end" deactivates the active fault with the same name and
targets, else the active ones with the same name, else (a global "heal") all of them.
"info" events (instantaneous offline mutations, the harness's own notes) change nothing.

L1  After each "end" that leaves no fault active (a heal) at time h, with window
    [h, h + recover_window_ns): if no fault starts inside the window, the history goes on
    past its end (some operation was invoked at or after h + recover_window_ns, so the run
    did not simply stop), and some append on the shard was invoked inside the window,
    then some ok append of that shard completes inside the window. Heals that the next
    fault interrupts, or that the run's end cuts short, are not judged: keep the workload
    running for recover_window_ns after the final heal to have it judged.
L2  For every shard with dumps: every replica's last_lsn is at least the highest LSN any
    ok append got (a replica that never caught up). That the acked records themselves are
    there is S1/S2/S5's, and that replicas agree is S11's, so each anomaly is reported
    once. With `converge_window_ns`, the harness's convergence poll must also have
    succeeded in time: a NemesisEvent(phase "info" or "end", fault "converged",
    applied=True) no later than converge_window_ns after the last heal.
L3  (soak, opt-in) While the faulted nodes are a strict minority of a shard's replicas
    (members: the nodes of its dumps and events; a fault without targets counts as all
    nodes), from `availability_settle_ns` after the fault set last changed until the next
    change or the last invocation of the run, no interval longer than
    availability_window_ns passes without an ok append of that shard completing.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from tests.chaos.checks_base import CheckOptions, Findings
from tests.chaos.checks_raft import DETECTION_KINDS
from tests.chaos.history import Evidence, NemesisEvent, Op

CONVERGED_FAULT = "converged"  # the harness's record that its convergence poll succeeded
_ALL_NODES = "*"  # a fault without targets affects every node, as far as L3 can tell


@dataclass(frozen=True, slots=True)
class _Segment:
    """[start_ns, end_ns) during which the set of faulted nodes did not change."""

    start_ns: int
    end_ns: int
    faulted: frozenset[str]


def _fault_timeline(nemesis: list[NemesisEvent]) -> tuple[list[int], list[int], list[_Segment]]:
    """(heal times, applied start times, segments of constant faulted-node sets)."""
    heals: list[int] = []
    starts: list[int] = []
    segments: list[_Segment] = []
    active: list[tuple[str, tuple[str, ...]]] = []
    since_ns = -(2**63)
    for event in sorted(nemesis, key=lambda e: e.time_ns):
        if event.phase == "info" or event.fault == CONVERGED_FAULT:
            continue
        before = _faulted(active)
        if event.phase == "start":
            if not event.applied:
                continue
            starts.append(event.time_ns)
            active.append((event.fault, event.targets))
        else:
            exact = (event.fault, event.targets)
            if exact in active:
                active.remove(exact)
            elif any(fault == event.fault for fault, _ in active):
                active = [(fault, t) for fault, t in active if fault != event.fault]
            else:
                active = []
            if not active:
                heals.append(event.time_ns)
        after = _faulted(active)
        if after != before:
            segments.append(_Segment(since_ns, event.time_ns, before))
            since_ns = event.time_ns
    segments.append(_Segment(since_ns, 2**63, _faulted(active)))
    return heals, starts, segments


def _faulted(active: list[tuple[str, tuple[str, ...]]]) -> frozenset[str]:
    nodes: set[str] = set()
    for _, targets in active:
        nodes.update(targets if targets else (_ALL_NODES,))
    return frozenset(nodes)


def _appends_by_shard(ops: list[Op]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Per shard: sorted invoke times of all appends, sorted completion times of ok ones."""
    invoked: dict[int, list[int]] = defaultdict(list)
    acked: dict[int, list[int]] = defaultdict(list)
    for op in ops:
        if op.kind != "append":
            continue
        invoked[op.shard].append(op.invoke_ns)
        if op.outcome == "ok" and op.complete_ns is not None:
            acked[op.shard].append(op.complete_ns)
    for times in (*invoked.values(), *acked.values()):
        times.sort()
    return invoked, acked


def _any_in(times: list[int], lo: int, hi: int) -> bool:
    """Some time in [lo, hi) (times sorted)."""
    i = bisect.bisect_left(times, lo)
    return i < len(times) and times[i] < hi


def _check_recovery(evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
    window_ns = options.recover_window_ns
    if window_ns <= 0 or not evidence.ops:
        return
    heals, starts, _ = _fault_timeline(evidence.nemesis)
    last_invoke_ns = max(op.invoke_ns for op in evidence.ops)
    invoked, acked = _appends_by_shard(evidence.ops)
    for heal_ns in heals:
        end_ns = heal_ns + window_ns
        if last_invoke_ns < end_ns:
            continue  # the run ended inside the window: nothing to judge
        if _any_in(starts, heal_ns + 1, end_ns):
            continue  # the next fault interrupted the window
        for shard in sorted(invoked):
            if not _any_in(invoked[shard], heal_ns, end_ns):
                continue
            if not _any_in(acked.get(shard, []), heal_ns, end_ns + 1):
                findings.add(
                    "L1",
                    shard,
                    "no append succeeded within the recovery window after a heal",
                    f"heal at {heal_ns}: no ok append completed by {end_ns} "
                    f"(window {window_ns} ns)",
                )


def _check_convergence(evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
    highest: dict[int, tuple[int, str]] = {}
    for op in evidence.ops:
        if op.kind == "append" and op.outcome == "ok" and op.lsns:
            lsn = max(op.lsns)
            if op.shard not in highest or lsn > highest[op.shard][0]:
                highest[op.shard] = (lsn, op.op_id)
    for dump in evidence.dumps:
        acked = highest.get(dump.shard)
        if acked is not None and dump.last_lsn < acked[0]:
            findings.add(
                "L2",
                dump.shard,
                "replica behind the highest acked LSN after convergence",
                f"replica {dump.node_id} last_lsn {dump.last_lsn} < LSN {acked[0]} "
                f"acked to {acked[1]}",
                (acked[1],),
            )
    if options.converge_window_ns > 0:
        heals, _, _ = _fault_timeline(evidence.nemesis)
        last_heal_ns = max(heals, default=0)
        converged = [
            e.time_ns
            for e in evidence.nemesis
            if e.fault == CONVERGED_FAULT and e.applied and e.phase != "start"
        ]
        deadline_ns = last_heal_ns + options.converge_window_ns
        if not any(last_heal_ns <= t <= deadline_ns for t in converged):
            findings.add(
                "L2",
                None,
                "replicas did not converge within the window",
                f"no applied '{CONVERGED_FAULT}' event in [{last_heal_ns}, {deadline_ns}]",
            )


def _check_availability(evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
    window_ns = options.availability_window_ns
    if window_ns <= 0 or not evidence.ops:
        return
    members: dict[int, set[str]] = defaultdict(set)
    for dump in evidence.dumps:
        members[dump.shard].add(dump.node_id)
    for event in evidence.events:
        members[event.shard].add(event.node_id)
    _, _, segments = _fault_timeline(evidence.nemesis)
    run_start_ns = min(op.invoke_ns for op in evidence.ops)
    run_end_ns = max(op.invoke_ns for op in evidence.ops)
    _, acked = _appends_by_shard(evidence.ops)
    for shard, nodes in sorted(members.items()):
        times = acked.get(shard, [])
        for segment in segments:
            faulted = nodes if _ALL_NODES in segment.faulted else segment.faulted & nodes
            if 2 * len(faulted) >= len(nodes):
                continue  # a majority is faulted: no availability promised
            lo = max(segment.start_ns, run_start_ns) + options.availability_settle_ns
            hi = min(segment.end_ns, run_end_ns)
            previous_ns = lo
            i = bisect.bisect_left(times, lo)
            while previous_ns < hi:
                next_ns = times[i] if i < len(times) and times[i] < hi else hi
                if next_ns - previous_ns > window_ns:
                    findings.add(
                        "L3",
                        shard,
                        "no ok append for longer than the availability window",
                        f"nothing acked in ({previous_ns}, {next_ns}) with "
                        f"{sorted(faulted) or 'no node'} faulted",
                    )
                    break
                previous_ns = next_ns
                i += 1


def check_liveness_into(evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
    """L1, L2, L3 into `findings`."""
    _check_recovery(evidence, options, findings)
    _check_convergence(evidence, options, findings)
    _check_availability(evidence, options, findings)


# ------------------------------------------------------------------------------ vacuity


def _leader_changes(evidence: Evidence) -> int:
    terms: dict[int, set[int]] = defaultdict(set)
    for event in evidence.events:
        if event.kind == "leader":
            terms[event.shard].add(event.term)
    return sum(max(0, len(shard_terms) - 1) for shard_terms in terms.values())


def check_vacuity_into(evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
    """Plan §4.8's vacuity list: each unmet minimum is one "V" violation."""

    def demand(what: str, count: int, minimum: int) -> None:
        if count < minimum:
            findings.add("V", None, f"too few {what}", f"{count} < {minimum} required")

    ops = evidence.ops
    acked = sum(op.kind == "append" and op.outcome == "ok" for op in ops)
    reads = sum(op.kind in ("read", "tail") and op.outcome == "ok" for op in ops)
    recoveries = sum(event.kind in DETECTION_KINDS for event in evidence.events)
    infos = sum(op.outcome == "info" or op.complete_ns is None for op in ops)
    demand("ok appends", acked, options.acked_appends_min)
    demand("ok reads and tails", reads, options.reads_min)
    demand("leader changes", _leader_changes(evidence), options.leader_changes_min)
    demand("recoveries from damaged logs", recoveries, options.recoveries_min)
    demand("indeterminate (info) operations", infos, options.info_ops_min)
    applied: dict[str, int] = defaultdict(int)
    for event in evidence.nemesis:
        if event.phase == "end":
            continue
        if event.applied:
            applied[event.fault] += 1
        elif options.faults_must_apply:
            findings.add(
                "V",
                None,
                "a planned fault was not applied",
                f"{event.fault} on {list(event.targets)} at {event.time_ns}: "
                f"{event.detail or 'no detail'}",
            )
    for fault, minimum in sorted(options.faults_min.items()):
        demand(f"applied '{fault}' faults", applied.get(fault, 0), minimum)
    if options.dumps_per_shard_min > 0:
        dumps: dict[int, int] = defaultdict(int)
        for dump in evidence.dumps:
            dumps[dump.shard] += 1
        for shard in sorted({op.shard for op in ops}):
            demand(f"replica dumps of shard {shard}", dumps[shard], options.dumps_per_shard_min)
