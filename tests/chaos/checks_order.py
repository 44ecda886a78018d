"""Real-time checks: S6 (LSN order agrees with real time), S8 (fresh tails), S9 (each
process's positions never go backwards) and S10 (truncate-prefix), plan §4.8.

All four are sweeps: "the largest X known by some operation that completed before this
one was invoked" (`sweep_max_before`), O(n log n) over the history.

Freshness and staleness, precisely. "read" and "status" may be answered by any replica, so
they may be stale: a shorter prefix, an older first_lsn, an older last_lsn. They are
therefore never *judged* by S8, S9 or S10 (only their content is judged, by S2-S7). But
what they return is committed state, so it is sound *evidence*: a replica never reports
an LSN or a truncation point that is not committed. "tail" and "truncate" go through the
leader after a quorum check, so they are fresh, and they are judged.

Evidence an operation gives once it completed:
  committed last LSN >= hw:  ok append -> max(lsns); ok read/tail with records -> their
      last LSN; ok status -> last_lsn; ok truncate -> first_lsn - 1 (the service keeps
      next_lsn >= first_lsn); read/tail failing "truncated" -> truncated_first_lsn - 1.
  committed first_lsn >= fl: ok truncate -> its first_lsn (the lsn asked when absent);
      read/tail failing "truncated" -> truncated_first_lsn; ok status -> first_lsn.

S6  For ok appends A, B on one shard: A completed before B was invoked => max(lsns(A)) <
    min(lsns(B)). An info append B whose payload shows up in the log (dumps or reads) is
    judged the same way with its observed LSNs.
S8  An ok tail from `a` that returned nothing, invoked after some operation (any process)
    showed a committed LSN >= a, is stale (the paused or partitioned old leader of plan
    C3). Because a read may stop early (max_bytes), a non-empty tail proves nothing more
    than S2 already checks. Left to S10: the tails that an ok truncate past `a` preceded.
S9  Per (process, shard), judged only on that process's tails and truncates against the
    evidence of its own earlier completed operations: an empty tail at `a` after it saw
    an LSN >= a (high-water mark backwards); a tail from `a`, a "truncated" answer
    with first_lsn X, or a truncate answering X, below a first_lsn it already saw
    (first_lsn backwards).
S10 (i) after an ok truncate completed with first_lsn T: no later-invoked tail from
    a < T succeeds, no later "truncated" answer of a tail or truncate says X < T, and no
    final dump has first_lsn < T (the truncate survived crashes and power loss).
    (ii) no observation of first_lsn (truncate answers, "truncated" answers of reads and
    tails, status, dumps) exceeds max(1, the largest lsn asked by any ok or info truncate
    invoked before that observation completed): nothing is discarded unasked.
    (iii) an ok truncate never answers a first_lsn beyond the final log's last_lsn + 1.
    (iv) an ok truncate(T) answers first_lsn >= T when T <= (a committed LSN shown before
    it was invoked) + 1: the service clamps only targets beyond its log's end.
"""

from __future__ import annotations

from collections import defaultdict

from tests.chaos.checks_base import CheckOptions, Findings, sweep_max_before
from tests.chaos.checks_log import LogFacts, op_label
from tests.chaos.history import Evidence, Op, ReplicaDump

_NEVER_NS = 2**63  # "after every operation": dumps are taken once the run is over


def _hw_evidence(op: Op) -> int | None:
    """The committed last LSN this completed operation proves (see module docstring)."""
    if op.outcome == "ok":
        if op.kind == "append" and op.lsns:
            return max(op.lsns)
        if op.kind in ("read", "tail") and op.records:
            return op.records[-1][0]
        if op.kind == "status":
            return op.last_lsn
        if op.kind == "truncate" and op.first_lsn is not None:
            return op.first_lsn - 1
    elif op.outcome == "fail" and op.truncated_first_lsn is not None:
        return op.truncated_first_lsn - 1
    return None


def _fl_evidence(op: Op) -> int | None:
    """The committed first_lsn this completed operation proves."""
    if op.outcome == "ok":
        if op.kind == "truncate":
            return _truncate_point(op)
        if op.kind == "status":
            return op.first_lsn
    elif op.outcome == "fail" and op.kind in ("read", "tail"):
        return op.truncated_first_lsn
    return None


def _truncate_point(op: Op) -> int | None:
    return op.first_lsn if op.first_lsn is not None else op.lsn


def _is_empty_ok_tail(op: Op) -> bool:
    return op.kind == "tail" and op.outcome == "ok" and not op.records


def _by_shard(ops: list[Op]) -> dict[int, list[Op]]:
    shards: dict[int, list[Op]] = defaultdict(list)
    for op in ops:
        shards[op.shard].append(op)
    return shards


def _completed(op: Op) -> bool:
    return op.complete_ns is not None and op.outcome != "info"


# ------------------------------------------------------------------------------- S6


def _check_real_time(shard: int, ops: list[Op], facts: LogFacts, findings: Findings) -> None:
    done: list[tuple[int, int, str]] = []  # (complete_ns, max lsn, op_id)
    later: list[tuple[int, tuple[Op, int]]] = []  # (invoke_ns, (op, min lsn))
    for op in ops:
        if op.kind != "append":
            continue
        if op.outcome == "ok" and op.lsns:
            if op.complete_ns is not None:
                done.append((op.complete_ns, max(op.lsns), op.op_id))
            later.append((op.invoke_ns, (op, min(op.lsns))))
        elif op.outcome == "info" or op.complete_ns is None:
            seen = [
                place[1]
                for place in (facts.placed.get(_payload_id(data)) for data in op.payloads)
                if place is not None and place[0] == shard
            ]
            if seen:
                later.append((op.invoke_ns, (op, min(seen))))
    for (op, lsn_min), lsn_max_before, op_id_before in sweep_max_before(done, later):
        if lsn_max_before is not None and lsn_max_before >= lsn_min:
            findings.add(
                "S6",
                shard,
                "LSN order contradicts real time",
                f"{op_label(op)} invoked after {op_id_before} completed with LSN "
                f"{lsn_max_before}, yet got LSN {lsn_min}",
                (op_id_before, op.op_id),
            )


def _payload_id(data: bytes) -> str:
    """The id field without a CRC check (S14 judges damage; here only the place matters)."""
    parts = data.split(b"|", 2)
    return parts[1].decode(errors="replace") if len(parts) > 2 else ""


# ------------------------------------------------------------------------------- S8, S9


def _check_fresh_tails(shard: int, ops: list[Op], findings: Findings) -> None:
    evidence: list[tuple[int, int, str]] = []
    truncated: list[tuple[int, int, str]] = []
    for op in ops:
        if not _completed(op):
            continue
        assert op.complete_ns is not None
        hw = _hw_evidence(op)
        if hw is not None:
            evidence.append((op.complete_ns, hw, op.op_id))
        if op.kind == "truncate" and op.outcome == "ok":
            point = _truncate_point(op)
            if point is not None:
                truncated.append((op.complete_ns, point, op.op_id))
    tails = [(op.invoke_ns, op) for op in ops if _is_empty_ok_tail(op)]
    truncated_before = {
        op.op_id: point for op, point, _ in sweep_max_before(truncated, list(tails))
    }
    for op, hw, hw_op in sweep_max_before(evidence, tails):
        start = op.from_lsn if op.from_lsn is not None else 1
        point = truncated_before.get(op.op_id)
        if point is not None and point > start:
            continue  # reading below an acked truncation point: S10's
        if hw is not None and hw >= start:
            findings.add(
                "S8",
                shard,
                "stale tail (missed an LSN committed before it was invoked)",
                f"{op_label(op)} from {start} returned nothing, but {hw_op} had shown "
                f"LSN {hw} committed",
                (hw_op, op.op_id),
            )


def _check_process_positions(shard: int, ops: list[Op], findings: Findings) -> None:
    by_process: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_process[op.process].append(op)
    for process, own in by_process.items():
        hw_points: list[tuple[int, int, str]] = []
        fl_points: list[tuple[int, int, str]] = []
        for op in own:
            if not _completed(op):
                continue
            assert op.complete_ns is not None
            hw = _hw_evidence(op)
            if hw is not None:
                hw_points.append((op.complete_ns, hw, op.op_id))
            fl = _fl_evidence(op)
            if fl is not None:
                fl_points.append((op.complete_ns, fl, op.op_id))
        tails = [(op.invoke_ns, op) for op in own if _is_empty_ok_tail(op)]
        for op, hw, hw_op in sweep_max_before(hw_points, tails):
            start = op.from_lsn if op.from_lsn is not None else 1
            if hw is not None and hw >= start:
                findings.add(
                    "S9",
                    shard,
                    "a process's high-water mark went backwards",
                    f"{process}: {op_label(op)} from {start} returned nothing after its "
                    f"own {hw_op} showed LSN {hw}",
                    (hw_op, op.op_id),
                )
        judged = [(op.invoke_ns, op) for op in own if _fresh_first_lsn(op) is not None]
        for op, fl, fl_op in sweep_max_before(fl_points, judged):
            seen = _fresh_first_lsn(op)
            assert seen is not None
            if fl is not None and seen < fl:
                findings.add(
                    "S9",
                    shard,
                    "a process's first_lsn went backwards",
                    f"{process}: {op_label(op)} implies first_lsn <= {seen} after its own "
                    f"{fl_op} showed first_lsn {fl}",
                    (fl_op, op.op_id),
                )


def _fresh_first_lsn(op: Op) -> int | None:
    """The first_lsn a fresh (leader, quorum-checked) operation implies: an ok tail from a
    means first_lsn <= a; a "truncated" tail answer or a truncate answer states it."""
    if op.kind == "tail":
        if op.outcome == "ok":
            return op.from_lsn if op.from_lsn is not None else 1
        if op.outcome == "fail":
            return op.truncated_first_lsn
    if op.kind == "truncate" and op.outcome == "ok":
        return op.first_lsn
    return None


# ------------------------------------------------------------------------------- S10


def _check_truncation(shard: int, ops: list[Op], facts: LogFacts, findings: Findings) -> None:
    acked_points: list[tuple[int, int, str]] = []
    asked_points: list[tuple[int, int, str]] = []
    for op in ops:
        if op.kind != "truncate":
            continue
        if op.outcome == "ok" and op.complete_ns is not None:
            point = _truncate_point(op)
            if point is not None:
                acked_points.append((op.complete_ns, point, op.op_id))
        if op.outcome != "fail" and op.lsn is not None:
            asked_points.append((op.invoke_ns, op.lsn, op.op_id))
    dumps = facts.dumps_by_shard.get(shard, [])
    _check_nothing_below_acked(shard, ops, acked_points, dumps, findings)
    _check_nothing_unasked(shard, ops, asked_points, dumps, findings)
    _check_truncate_answers(shard, ops, acked_points, dumps, findings)


def _check_nothing_below_acked(
    shard: int,
    ops: list[Op],
    acked_points: list[tuple[int, int, str]],
    dumps: list[ReplicaDump],
    findings: Findings,
) -> None:
    """(i) nothing fresh, and no final dump, below an acked truncation point."""
    judged = [(op.invoke_ns, op) for op in ops if _fresh_first_lsn(op) is not None]
    for op, point, truncate_op in sweep_max_before(acked_points, judged):
        seen = _fresh_first_lsn(op)
        assert seen is not None
        if point is not None and seen < point:
            what = (
                f"served from LSN {seen}"
                if op.kind == "tail" and op.outcome == "ok"
                else f"answered first_lsn {seen}"
            )
            findings.add(
                "S10",
                shard,
                "truncation violated (first_lsn below an acked truncate)",
                f"{op_label(op)} {what} after {truncate_op} completed with first_lsn {point}",
                (truncate_op, op.op_id),
            )
    if not acked_points:
        return
    _, point, truncate_op = max(acked_points, key=lambda p: p[1])
    for dump in dumps:
        if dump.first_lsn < point:
            findings.add(
                "S10",
                shard,
                "acked truncate lost (dump first_lsn below it)",
                f"replica {dump.node_id} first_lsn {dump.first_lsn} < {point} of {truncate_op}",
                (truncate_op,),
            )


def _check_nothing_unasked(
    shard: int,
    ops: list[Op],
    asked_points: list[tuple[int, int, str]],
    dumps: list[ReplicaDump],
    findings: Findings,
) -> None:
    """(ii) no first_lsn beyond what some truncate invoked before had asked. An operation's
    own request counts even when it completed in the nanosecond it was invoked (+1)."""
    observed: list[tuple[int, tuple[str | None, int, str]]] = []
    for op in ops:
        if op.complete_ns is None or op.outcome == "info":
            continue
        seen = _fl_evidence(op) if op.kind != "truncate" else op.first_lsn
        if seen is not None:
            observed.append((op.complete_ns + 1, (op.op_id, seen, op_label(op))))
    for dump in dumps:
        observed.append((_NEVER_NS, (None, dump.first_lsn, f"replica {dump.node_id}")))
    for (seen_op, seen, label), asked, asked_op in sweep_max_before(asked_points, observed):
        if seen > max(1, asked if asked is not None else 1):
            findings.add(
                "S10",
                shard,
                "records discarded that no truncate asked for",
                f"{label} shows first_lsn {seen}, but the largest truncate asked before "
                f"was {asked if asked is not None else 'none'}"
                + (f" ({asked_op})" if asked_op else ""),
                (seen_op, asked_op or None),
            )


def _check_truncate_answers(
    shard: int,
    ops: list[Op],
    acked_points: list[tuple[int, int, str]],
    dumps: list[ReplicaDump],
    findings: Findings,
) -> None:
    """(iii) never past the end; (iv) never short of a target that was within the log."""
    if dumps:
        last_lsn_max = max(dump.last_lsn for dump in dumps)
        for _, point, op_id in acked_points:
            if point > last_lsn_max + 1:
                findings.add(
                    "S10",
                    shard,
                    "truncate went past the end of the log",
                    f"{op_id} answered first_lsn {point}, final last_lsn {last_lsn_max}",
                    (op_id,),
                )
    evidence: list[tuple[int, int, str]] = []
    for op in ops:
        hw = _hw_evidence(op) if _completed(op) else None
        if hw is not None:
            assert op.complete_ns is not None
            evidence.append((op.complete_ns, hw, op.op_id))
    truncates = [
        (op.invoke_ns, op)
        for op in ops
        if op.kind == "truncate" and op.outcome == "ok" and op.first_lsn is not None
    ]
    for op, hw, hw_op in sweep_max_before(evidence, truncates):
        assert op.first_lsn is not None
        if op.lsn is not None and hw is not None and op.first_lsn < op.lsn <= hw + 1:
            findings.add(
                "S10",
                shard,
                "truncate answered a first_lsn short of its target",
                f"{op_label(op)} asked {op.lsn}, answered {op.first_lsn}, though {hw_op} "
                f"had shown LSN {hw} committed before",
                (hw_op, op.op_id),
            )


def check_order(
    evidence: Evidence, facts: LogFacts, options: CheckOptions, findings: Findings
) -> None:
    """S6, S8, S9, S10 into `findings`."""
    del options  # no knobs yet; kept for symmetry with the other checks
    shards = _by_shard(evidence.ops)
    for shard in sorted(set(shards) | set(facts.dumps_by_shard)):
        ops = shards.get(shard, [])
        _check_real_time(shard, ops, facts, findings)
        _check_fresh_tails(shard, ops, findings)
        _check_process_positions(shard, ops, findings)
        _check_truncation(shard, ops, facts, findings)
