"""The chaos suite's checkers: evidence in (`history.Evidence`: client operations, final
replica dumps, node events, nemesis log), violations out (plan §4.8). Pure functions, no
I/O; `report` only builds a string.

    check_safety(evidence, options)    S1-S12, S14 (S13 = S1 labelled under power loss)
    check_liveness(evidence, options)  L1, L2, L3
    check_vacuity(evidence, options)   "V": the run exercised what it meant to
    check_all(evidence, options)       all three
    report(violations, evidence)       human-readable, with the operations around each

Where each invariant lives and how it reads our API (read: any replica, may be stale;
tail/truncate: through the leader, fresh; status: any replica) is documented in the
module that implements it:

    checks_log.py       S1 S2 S3 S4 S5 S7 S11, S14 (damaged payloads served or dumped)
    checks_order.py     S6 S8 S9 S10 (real-time sweeps, staleness rules)
    checks_raft.py      S12, S14 (injected damage detected; opt-in)
    checks_liveness.py  L1 L2 L3, vacuity

Every function here handles about 50k operations and 3 dumps of 50k records in a few
seconds: one pass builds dictionaries, the order checks are sorted sweeps.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.chaos.checks_base import DEFAULT_OPTIONS, CheckOptions, Findings, Violation
from tests.chaos.checks_liveness import check_liveness_into, check_vacuity_into
from tests.chaos.checks_log import check_log
from tests.chaos.checks_order import check_order
from tests.chaos.checks_raft import check_raft
from tests.chaos.history import Evidence, Op, PayloadCorrupt, parse_payload

__all__ = [
    "DEFAULT_OPTIONS",
    "CheckOptions",
    "Violation",
    "check_all",
    "check_liveness",
    "check_safety",
    "check_vacuity",
    "report",
]

REPORT_VIOLATIONS_MAX = 50  # violations shown in full; the rest are listed by title
REPORT_CONTEXT_OPS = 20  # operations shown on each side of an example's operation
REPORT_ANCHORS_MAX = 3  # example operations per violation that get a context window


def check_safety(evidence: Evidence, options: CheckOptions = DEFAULT_OPTIONS) -> list[Violation]:
    """S1-S12 and S14; S1 findings are reported as "S13" when `options.power_loss`."""
    findings = Findings(options.examples_max)
    facts = check_log(evidence, options, findings)
    check_order(evidence, facts, options, findings)
    check_raft(evidence, options, findings)
    return findings.violations()


def check_liveness(evidence: Evidence, options: CheckOptions = DEFAULT_OPTIONS) -> list[Violation]:
    """L1 (recovery after heals), L2 (convergence), L3 (availability, opt-in)."""
    findings = Findings(options.examples_max)
    check_liveness_into(evidence, options, findings)
    return findings.violations()


def check_vacuity(evidence: Evidence, options: CheckOptions = DEFAULT_OPTIONS) -> list[Violation]:
    """Plan §4.8's vacuity minimums ("V")."""
    findings = Findings(options.examples_max)
    check_vacuity_into(evidence, options, findings)
    return findings.violations()


def check_all(evidence: Evidence, options: CheckOptions = DEFAULT_OPTIONS) -> list[Violation]:
    return [
        *check_safety(evidence, options),
        *check_liveness(evidence, options),
        *check_vacuity(evidence, options),
    ]


# ------------------------------------------------------------------------------ report


def _payload_name(data: bytes) -> str:
    try:
        return parse_payload(data).payload_id
    except PayloadCorrupt:
        return "<corrupt>"


def _short_list(items: Iterable[object], limit: int = 4) -> str:
    items = list(items)
    shown = ",".join(str(item) for item in items[:limit])
    return f"[{shown}{',...' if len(items) > limit else ''}]"


def format_op(op: Op, origin_ns: int) -> str:
    """One line: invoke time relative to `origin_ns`, duration, and the values."""
    start_s = (op.invoke_ns - origin_ns) / 1e9
    took = f"{(op.complete_ns - op.invoke_ns) / 1e6:.1f}ms" if op.complete_ns is not None else "-"
    when = f"+{start_s:.6f}s"
    head = f"{when:>12} {took:>9} {op.op_id} {op.process} s{op.shard} {op.kind} {op.outcome}"
    if op.kind == "append":
        body = f"ids={_short_list(_payload_name(p) for p in op.payloads)}"
        if op.lsns:
            body += f" lsns={_short_list(op.lsns)}"
    elif op.kind in ("read", "tail"):
        lsns = [lsn for lsn, _ in op.records]
        body = f"from={op.from_lsn} next={op.next_lsn} got={len(lsns)}"
        if lsns:
            body += f" [{lsns[0]}..{lsns[-1]}]"
        if op.truncated_first_lsn is not None:
            body += f" truncated_first_lsn={op.truncated_first_lsn}"
    elif op.kind == "truncate":
        body = f"lsn={op.lsn} -> first_lsn={op.first_lsn}"
    else:
        body = f"first_lsn={op.first_lsn} last_lsn={op.last_lsn}"
    if op.error:
        body += f" error={op.error}"
    return f"{head} {body}"


def _report_order(violation: Violation) -> tuple[int, int, int]:
    """Safety first, then liveness, then vacuity; by number; by shard."""
    family = {"S": 0, "L": 1}.get(violation.check[:1], 2)
    number = int(violation.check[1:]) if violation.check[1:].isdigit() else 0
    return family, number, -1 if violation.shard is None else violation.shard


def report(
    violations: list[Violation],
    evidence: Evidence,
    *,
    context_ops: int = REPORT_CONTEXT_OPS,
    violations_max: int = REPORT_VIOLATIONS_MAX,
) -> str:
    """A bounded, human-readable report: a summary line, then for each violation its
    message, its examples, and the operations within ±`context_ops` (by invoke time) of
    the operations its first examples name."""
    ops = sorted(evidence.ops, key=lambda op: (op.invoke_ns, op.op_id))
    position = {op.op_id: i for i, op in enumerate(ops)}
    origin_ns = ops[0].invoke_ns if ops else 0
    lines = [
        f"chaos check: {len(violations)} violation(s); {len(evidence.ops)} ops, "
        f"{len(evidence.dumps)} dumps, {len(evidence.events)} node events, "
        f"{len(evidence.nemesis)} nemesis events; times relative to {origin_ns} ns",
    ]
    ordered = sorted(violations, key=_report_order)
    for violation in ordered[:violations_max]:
        where = "" if violation.shard is None else f" shard {violation.shard}"
        lines.append("")
        lines.append(f"[{violation.check}]{where}: {violation.message}")
        lines.extend(f"  - {example}" for example in violation.examples)
        anchors = sorted(
            {
                position[op_id]
                for op_id in violation.op_ids[:REPORT_ANCHORS_MAX]
                if op_id in position
            }
        )
        if not anchors:
            continue
        anchor_set = set(anchors)
        lines.append(f"  operations around {', '.join(ops[i].op_id for i in anchors)}:")
        shown_until = -1
        for anchor in anchors:
            lo = max(anchor - context_ops, shown_until + 1)
            hi = min(anchor + context_ops, len(ops) - 1)
            if lo > shown_until + 1 and shown_until >= 0:
                lines.append("    ...")
            for i in range(lo, hi + 1):
                mark = ">>" if i in anchor_set else "  "
                lines.append(f"  {mark}{format_op(ops[i], origin_ns)}")
            shown_until = max(shown_until, hi)
    hidden = ordered[violations_max:]
    if hidden:
        lines.append("")
        lines.append(f"... {len(hidden)} more violation(s):")
        lines.extend(f"  [{v.check}] shard {v.shard}: {v.message}" for v in hidden)
    return "\n".join(lines)
