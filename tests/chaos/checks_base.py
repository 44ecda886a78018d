"""What every checker module shares: the verdict type (`Violation`), the knobs
(`CheckOptions`), a bounded collector of findings (`Findings`) and one generic sweep.

A check never stops at the first anomaly: it reports every case, grouped as one
`Violation` per (check id, shard, kind of anomaly), with a total count in the message and at
most `CheckOptions.examples_max` examples. So a run with 10,000 duplicates still yields a
short report, and the count says how bad it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

EXAMPLES_MAX_DEFAULT = 10  # examples kept per violation (the report stays readable)
OP_IDS_PER_EXAMPLE_MAX = 3  # op ids remembered per example, to show context around them


@dataclass(frozen=True, slots=True)
class Violation:
    """One kind of anomaly on one shard (None: not shard-specific, e.g. vacuity).

    `check` is "S1".."S14", "L1".."L3" or "V" (vacuity). `message` says what went wrong and
    how many times; `examples` are the first few cases, each a self-contained line.
    `op_ids` (not in the brief's minimum; added with a default) are the operations the
    examples mention, so `report` can show the history around them."""

    check: str
    shard: int | None
    message: str
    examples: tuple[str, ...]
    op_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What a scenario promises and demands. Every default disables a demand, so a unit
    test can check a tiny history; scenarios set the minimums of plan §4.8.

    Times are in the history's clock (`time.monotonic_ns()` or simulated ns)."""

    # S13 is S1 evaluated after coordinated power loss: S1 findings are labelled "S13".
    power_loss: bool = False
    # L1: after a heal that leaves no fault active, an append must succeed within this.
    recover_window_ns: int = 0
    # L2: if > 0, the harness must record NemesisEvent(phase="info", fault="converged",
    # applied=True) no later than this after the last heal (its convergence poll succeeded).
    converge_window_ns: int = 0
    # L3 (soak): while at most a minority of a shard's replicas is faulted, and once
    # `availability_settle_ns` has passed since the fault set last changed, every interval of
    # this length holds an ok append completion. 0 disables L3.
    availability_window_ns: int = 0
    availability_settle_ns: int = 0
    # Vacuity (plan §4.8): the run must have exercised something.
    acked_appends_min: int = 0  # ok append operations, all shards together
    reads_min: int = 0  # ok read + tail operations
    leader_changes_min: int = 0  # elections after each shard's first, from RaftEvents
    faults_min: Mapping[str, int] = field(default_factory=dict)  # fault -> applied count
    recoveries_min: int = 0  # RaftEvents "recovery" or "corruption" (disk scenarios)
    info_ops_min: int = 0  # operations with an indeterminate outcome (soak)
    dumps_per_shard_min: int = 0  # replica dumps per shard that has operations
    faults_must_apply: bool = False  # any NemesisEvent start/info with applied=False fails
    # S14: every injected bitflip / truncate_file / torn_tail must be followed by a
    # "corruption" or "recovery" event of the target node. Opt-in: damage injected into an
    # already-truncated region may legitimately never be read, hence never reported.
    corruption_detection_required: bool = False
    # S14: a final dump whose offline reader refused damaged data is a violation unless
    # this is set (the node should have repaired or discarded it before the dump).
    dump_corruptions_allowed: bool = False
    examples_max: int = EXAMPLES_MAX_DEFAULT


DEFAULT_OPTIONS = CheckOptions()


@dataclass(slots=True)
class _Group:
    count: int = 0
    examples: list[str] = field(default_factory=list)
    op_ids: list[str] = field(default_factory=list)


class Findings:
    """Collects anomalies, grouped by (check, shard, title); bounded examples per group."""

    def __init__(self, examples_max: int) -> None:
        assert examples_max >= 1
        self._examples_max = examples_max
        self._groups: dict[tuple[str, int | None, str], _Group] = {}

    def add(
        self,
        check: str,
        shard: int | None,
        title: str,
        example: str,
        op_ids: Iterable[str | None] = (),
    ) -> None:
        group = self._groups.setdefault((check, shard, title), _Group())
        group.count += 1
        if len(group.examples) < self._examples_max:
            group.examples.append(example)
            kept = [op_id for op_id in op_ids if op_id is not None]
            for op_id in kept[:OP_IDS_PER_EXAMPLE_MAX]:
                if op_id not in group.op_ids:
                    group.op_ids.append(op_id)

    def violations(self) -> list[Violation]:
        out: list[Violation] = []
        for (check, shard, title), group in self._groups.items():
            message = f"{title} ({group.count} case{'s' if group.count != 1 else ''})"
            out.append(Violation(check, shard, message, tuple(group.examples), tuple(group.op_ids)))
        return out


Q = TypeVar("Q")


def sweep_max_before(
    points: list[tuple[int, int, str]], queries: list[tuple[int, Q]]
) -> Iterator[tuple[Q, int | None, str]]:
    """For each query `(time_ns, item)`, the largest value among `points` `(time_ns, value,
    op_id)` whose time is strictly before the query's, and the op that holds it (None and
    "" when no point precedes). O((n + m) log(n + m)): both lists are sorted, then merged.
    """
    points_sorted = sorted(points, key=lambda p: p[0])
    queries_sorted = sorted(queries, key=lambda q: q[0])
    best: int | None = None
    best_op = ""
    i = 0
    for time_ns, item in queries_sorted:
        while i < len(points_sorted) and points_sorted[i][0] < time_ns:
            _, value, op_id = points_sorted[i]
            if best is None or value > best:
                best, best_op = value, op_id
            i += 1
        yield item, best, best_op
