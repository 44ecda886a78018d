"""Tests the tester (plan §4.8 "Checker self-tests", lesson L8).

What it proves:
  * a clean hand-made history (2 shards, 3 processes, 3 replicas; appends ok/fail/info,
    stale and fresh reads, tails, a truncate, status, Raft events of two terms, a kill and
    a detected bitflip) yields no violation, even with every opt-in check on;
  * each single anomaly injected into a copy of it is reported under exactly the expected
    check ids (one id where the anomaly shows only one way; where it necessarily shows two
    ways, e.g. a lost last ack is also a replica behind the highest ack, both ids);
  * every vacuity rule fires when its minimum is not met;
  * random valid histories of a sequential log model (concurrent windows, stale reads,
    info/fail appends, truncates, lagging status) never produce a violation (hypothesis);
  * a history of 50k operations and three dumps of 50k records is checked in seconds;
  * the report names each violation and shows the operations around its examples.

How: the clean history is built from small helpers over a table LSN -> payload id per
shard; each anomaly is a function that edits a fresh copy (frozen records are replaced).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chaos.checker import (
    CheckOptions,
    Violation,
    check_all,
    check_liveness,
    check_safety,
    check_vacuity,
    report,
)
from tests.chaos.history import (
    Evidence,
    NemesisEvent,
    Op,
    Outcome,
    RaftEvent,
    ReplicaDump,
    make_payload,
)

MS = 1_000_000  # ns per ms: the hand-made history is written in milliseconds
NODES = ("n1", "n2", "n3")

_PAYLOADS: dict[tuple[str, int], bytes] = {}


def payload(payload_id: str, shard: int = 0) -> bytes:
    """Deterministic payload bytes (seeded by the id: str seeds do not depend on hashing)."""
    key = (payload_id, shard)
    if key not in _PAYLOADS:
        _PAYLOADS[key] = make_payload(payload_id, shard, random.Random(payload_id))
    return _PAYLOADS[key]


# The clean committed logs: LSN -> payload id. Shard 0 is truncated to first_lsn 3.
LOG = {
    0: {1: "a1", 2: "a2", 3: "b1", 4: "a3", 5: "c2", 6: "a4", 7: "a5", 8: "c3", 9: "c4"},
    1: {1: "a6", 2: "c5"},
}


def records(shard: int, lsns: Sequence[int]) -> tuple[tuple[int, bytes], ...]:
    return tuple((lsn, payload(LOG[shard][lsn], shard)) for lsn in lsns)


def append(
    op_id: str,
    process: str,
    shard: int,
    t0: int,
    t1: int | None,
    ids: Sequence[str],
    lsns: Sequence[int] = (),
    outcome: Outcome = "ok",
) -> Op:
    return Op(
        op_id,
        process,
        "append",
        shard,
        t0 * MS,
        None if t1 is None else t1 * MS,
        outcome,
        payloads=tuple(payload(i, shard) for i in ids),
        lsns=tuple(lsns),
    )


def read(
    op_id: str, process: str, shard: int, t0: int, t1: int, from_lsn: int, upto: int, kind: Any
) -> Op:
    """An ok read or tail of [from_lsn, upto)."""
    return Op(
        op_id,
        process,
        kind,
        shard,
        t0 * MS,
        t1 * MS,
        "ok",
        from_lsn=from_lsn,
        records=records(shard, range(from_lsn, upto)),
        next_lsn=upto,
    )


def clean_evidence() -> Evidence:
    ops = [
        append("o1", "p1", 0, 0, 10, ["a1", "a2"], [1, 2]),
        append("o2", "p2", 0, 5, 15, ["b1"], [3]),
        append("o3", "p3", 0, 20, 22, ["c1"], outcome="fail"),
        append("o4", "p1", 0, 20, 30, ["a3"], [4]),
        read("o5", "p2", 0, 35, 40, 1, 5, "read"),
        append("o6", "p3", 0, 40, 60, ["c2"], outcome="info"),  # applied at LSN 5
        read("o7", "p1", 0, 45, 50, 5, 6, "tail"),
        Op("o8", "p2", "status", 0, 55 * MS, 56 * MS, "ok", first_lsn=1, last_lsn=5),
        append("o9", "p1", 0, 60, 70, ["a4", "a5"], [6, 7]),
        Op("o10", "p3", "truncate", 0, 75 * MS, 80 * MS, "ok", lsn=3, first_lsn=3),
        Op("o11", "p2", "read", 0, 85 * MS, 86 * MS, "fail", from_lsn=1, truncated_first_lsn=3),
        read("o12", "p2", 0, 90, 92, 3, 8, "read"),
        read("o13", "p1", 0, 95, 100, 8, 8, "tail"),  # nothing new yet
        append("o14", "p3", 0, 100, 110, ["c3"], [8]),
        Op("o15", "p2", "status", 0, 112 * MS, 113 * MS, "ok", first_lsn=3, last_lsn=8),
        read("o16", "p1", 0, 115, 117, 6, 7, "read"),  # a stale replica: shorter prefix
        append("o17", "p3", 0, 120, 130, ["c4"], [9]),
        read("o18", "p2", 0, 135, 140, 9, 10, "tail"),
        append("o19", "p1", 1, 10, 20, ["a6"], [1]),
        append("o20", "p3", 1, 25, 35, ["c5"], [2]),
        read("o21", "p2", 1, 40, 45, 1, 3, "tail"),
        append("o22", "p1", 1, 50, None, ["a7"], outcome="info"),  # never applied
        append("o23", "p1", 0, 118, None, ["a8"], outcome="info"),  # never applied
        append("o24", "p2", 0, 30, None, ["b2"], outcome="info"),  # never applied
    ]
    dumps = [
        ReplicaDump(node, 0, 3, 9, records(0, range(1 if node == "n1" else 3, 10)))
        for node in NODES  # n1 still holds LSNs 1-2 below its first_lsn: allowed
    ] + [ReplicaDump(node, 1, 1, 2, records(1, [1, 2])) for node in NODES]
    events = [
        *(RaftEvent(n, 0, 0, "start", 0) for n in NODES),
        RaftEvent("n1", 0, 1 * MS, "term", 1),
        *(RaftEvent(n, 0, 1 * MS + i, "vote", 1, "n1") for i, n in enumerate(NODES)),
        RaftEvent("n1", 0, 2 * MS, "leader", 1),
        RaftEvent("n2", 0, 2 * MS, "follower", 1),
        RaftEvent("n3", 0, 2 * MS, "follower", 1),
        RaftEvent("n2", 0, 54 * MS, "term", 2),
        RaftEvent("n2", 0, 54 * MS, "vote", 2, "n2"),
        RaftEvent("n3", 0, 55 * MS, "vote", 2, "n2"),
        RaftEvent("n2", 0, 56 * MS, "leader", 2),
        RaftEvent("n1", 0, 65 * MS, "start", 1),  # restarted: it kept its term
        RaftEvent("n1", 0, 66 * MS, "recovery", detail="torn tail truncated"),
        RaftEvent("n1", 0, 70 * MS, "follower", 2),
        *(RaftEvent(n, 1, 1 * MS, "vote", 1, "n2") for n in NODES),
        RaftEvent("n2", 1, 2 * MS, "leader", 1),
    ]
    nemesis = [
        NemesisEvent(50 * MS, "start", "kill", ("n1",)),
        NemesisEvent(52 * MS, "info", "bitflip", ("n1",), detail="sealed segment"),
        NemesisEvent(65 * MS, "end", "kill", ("n1",)),
        NemesisEvent(150 * MS, "info", "converged"),
    ]
    return Evidence(ops, dumps, events, nemesis)


# Opt-in checks all on, every vacuity minimum exactly met by the clean history.
STRICT = CheckOptions(
    recover_window_ns=40 * MS,
    converge_window_ns=100 * MS,
    availability_window_ns=100 * MS,
    acked_appends_min=8,
    reads_min=7,
    leader_changes_min=1,
    faults_min={"kill": 1, "bitflip": 1},
    recoveries_min=1,
    info_ops_min=4,
    dumps_per_shard_min=3,
    faults_must_apply=True,
    corruption_detection_required=True,
)


# ------------------------------------------------------------------------------ edits


def set_op(evidence: Evidence, op_id: str, **changes: Any) -> None:
    [i] = [i for i, op in enumerate(evidence.ops) if op.op_id == op_id]
    evidence.ops[i] = dataclasses.replace(evidence.ops[i], **changes)


def set_dumps(
    evidence: Evidence,
    shard: int,
    edit: Callable[[ReplicaDump], ReplicaDump],
    nodes: Sequence[str] = NODES,
) -> None:
    evidence.dumps = [
        edit(d) if d.shard == shard and d.node_id in nodes else d for d in evidence.dumps
    ]


def set_record(lsn: int, data: bytes | None) -> Callable[[ReplicaDump], ReplicaDump]:
    """Replace (or with None drop) the record at `lsn`, keeping first/last_lsn."""

    def edit(dump: ReplicaDump) -> ReplicaDump:
        kept = [(n, d) for n, d in dump.records if n != lsn]
        if data is not None:
            kept.append((lsn, data))
        return dataclasses.replace(dump, records=tuple(sorted(kept)))

    return edit


def add_record(data: bytes) -> Callable[[ReplicaDump], ReplicaDump]:
    """Append one record at last_lsn + 1."""

    def edit(dump: ReplicaDump) -> ReplicaDump:
        lsn = dump.last_lsn + 1
        return dataclasses.replace(dump, last_lsn=lsn, records=(*dump.records, (lsn, data)))

    return edit


def drop_last(dump: ReplicaDump) -> ReplicaDump:
    return dataclasses.replace(dump, last_lsn=dump.last_lsn - 1, records=dump.records[:-1])


def flip(data: bytes, position: int = 10) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


def lost_ack(e: Evidence) -> None:
    set_dumps(e, 0, drop_last)  # c4, acked at LSN 9, gone from every replica


def duplicate_info(e: Evidence) -> None:
    set_dumps(e, 0, add_record(payload("c2")))  # the info append applied twice


def two_acks(e: Evidence) -> None:
    e.ops.append(append("o25", "p3", 0, 121, 133, ["c6"], [9]))


def ack_vs_replica(e: Evidence) -> None:
    set_dumps(e, 0, set_record(9, payload("a8")))  # the log holds a8 where c4 was acked


def replica_vs_replica(e: Evidence) -> None:
    set_dumps(e, 0, set_record(9, payload("a8")), nodes=["n3"])


def read_gap(e: Evidence) -> None:
    set_op(e, "o12", records=records(0, [3, 4, 6, 7]))


def read_offset(e: Evidence) -> None:
    set_op(e, "o12", records=records(0, [4, 5, 6, 7]))


def real_time_inversion(e: Evidence) -> None:
    # c3 (done at 110) and c4 (invoked at 120) swapped: c4 got the lower LSN.
    set_op(e, "o14", lsns=(9,))
    set_op(e, "o17", lsns=(8,))
    set_op(e, "o18", records=((9, payload("c3")),))
    set_dumps(e, 0, set_record(8, payload("c4")))
    set_dumps(e, 0, set_record(9, payload("c3")))


def first_lsn_backwards(e: Evidence) -> None:
    # p2 saw first_lsn 3 (o11, o15) but then its tail is served from LSN 2. The truncate
    # is left indeterminate so that no acked truncation point is involved (that is S10).
    set_op(e, "o10", outcome="info", complete_ns=None, first_lsn=None)
    set_op(e, "o18", from_lsn=2, records=records(0, range(2, 10)))


def corrupt_dump_reported(e: Evidence) -> None:
    set_dumps(e, 0, lambda d: dataclasses.replace(d, corruptions=("seg 3: crc",)), ["n2"])


def term_backwards(e: Evidence) -> None:
    e.events = [
        dataclasses.replace(ev, term=0)
        if (ev.node_id, ev.kind, ev.time_ns) == ("n1", "start", 65 * MS)
        else ev
        for ev in e.events
    ]


def undetected_damage(e: Evidence) -> None:
    e.events = [ev for ev in e.events if ev.kind != "recovery"]


def unacked_append(e: Evidence) -> None:
    set_op(e, "o9", outcome="info", complete_ns=None, lsns=())


ANOMALIES: list[Any] = [
    pytest.param(lost_ack, CheckOptions(), {"S1", "L2"}, id="lost-ack"),
    pytest.param(lost_ack, CheckOptions(power_loss=True), {"S13", "L2"}, id="lost-ack-power-loss"),
    pytest.param(
        lambda e: set_dumps(e, 0, add_record(payload("b1"))), CheckOptions(), {"S3"}, id="duplicate"
    ),
    pytest.param(duplicate_info, CheckOptions(), {"S3"}, id="duplicate-info-append"),
    pytest.param(two_acks, CheckOptions(), {"S1", "S2"}, id="two-acks-one-lsn"),
    pytest.param(ack_vs_replica, CheckOptions(), {"S1", "S2"}, id="ack-vs-replica"),
    pytest.param(replica_vs_replica, CheckOptions(), {"S2", "S11"}, id="replica-vs-replica"),
    pytest.param(
        lambda e: set_op(
            e, "o12", records=(*records(0, [3, 4]), (5, payload("b2")), *records(0, [6, 7]))
        ),
        CheckOptions(),
        {"S2"},
        id="read-vs-replica",
    ),
    pytest.param(
        lambda e: set_dumps(e, 0, add_record(payload("zz"))), CheckOptions(), {"S4"}, id="phantom"
    ),
    pytest.param(
        lambda e: set_dumps(e, 0, add_record(payload("c1"))),
        CheckOptions(),
        {"S4"},
        id="aborted-read",
    ),
    pytest.param(
        lambda e: set_dumps(e, 1, add_record(payload("a8", 0))),
        CheckOptions(),
        {"S4"},
        id="cross-shard-leakage",
    ),
    pytest.param(
        lambda e: set_op(
            e, "o12", records=(*records(0, [3, 4]), (5, flip(payload("c2"))), *records(0, [6, 7]))
        ),
        CheckOptions(),
        {"S14"},
        id="corrupt-payload-read",
    ),
    pytest.param(
        lambda e: set_dumps(e, 0, set_record(5, flip(payload("c2"))), ["n2"]),
        CheckOptions(),
        {"S14", "S11"},
        id="corrupt-payload-dump",
    ),
    pytest.param(corrupt_dump_reported, CheckOptions(), {"S14"}, id="dump-reader-refused-data"),
    pytest.param(
        lambda e: set_dumps(e, 0, set_record(5, None)),
        CheckOptions(),
        {"S5", "S7"},
        id="gap-in-dumps",
    ),
    pytest.param(read_gap, CheckOptions(), {"S5"}, id="gap-in-read"),
    pytest.param(read_offset, CheckOptions(), {"S5"}, id="read-offset"),
    pytest.param(
        lambda e: set_op(e, "o11", truncated_first_lsn=1),
        CheckOptions(),
        {"S5"},
        id="truncated-answer-above-first-lsn",
    ),
    pytest.param(
        lambda e: set_op(e, "o18", records=(*records(0, [9]), (10, payload("a8")))),
        CheckOptions(),
        {"S5", "S7"},
        id="read-sees-uncommitted",
    ),
    pytest.param(
        lambda e: set_op(e, "o15", first_lsn=3, last_lsn=1),
        CheckOptions(),
        {"S5"},
        id="status-bounds-impossible",
    ),
    pytest.param(real_time_inversion, CheckOptions(), {"S6"}, id="real-time-inversion"),
    pytest.param(
        lambda e: set_op(e, "o18", records=(), next_lsn=9), CheckOptions(), {"S8"}, id="stale-tail"
    ),
    pytest.param(
        lambda e: set_op(e, "o13", from_lsn=7, next_lsn=7),
        CheckOptions(),
        {"S8", "S9"},
        id="high-water-backwards",
    ),
    pytest.param(first_lsn_backwards, CheckOptions(), {"S9"}, id="first-lsn-backwards"),
    pytest.param(
        lambda e: set_op(
            e, "o16", kind="tail", from_lsn=2, records=records(0, range(2, 9)), next_lsn=9
        ),
        CheckOptions(),
        {"S10"},
        id="tail-below-truncation",
    ),
    pytest.param(
        lambda e: set_op(
            e,
            "o16",
            kind="tail",
            outcome="fail",
            from_lsn=1,
            records=(),
            next_lsn=None,
            truncated_first_lsn=2,
        ),
        CheckOptions(),
        {"S10"},
        id="first-lsn-below-truncation",
    ),
    pytest.param(
        lambda e: set_dumps(
            e, 0, lambda d: dataclasses.replace(d, first_lsn=2, records=records(0, range(2, 10)))
        ),
        CheckOptions(),
        {"S10"},
        id="truncate-not-durable",
    ),
    pytest.param(
        lambda e: set_dumps(
            e, 0, lambda d: dataclasses.replace(d, first_lsn=4, records=records(0, range(4, 10)))
        ),
        CheckOptions(),
        {"S10"},
        id="truncated-unasked",
    ),
    pytest.param(
        lambda e: set_dumps(e, 0, add_record(payload("a8")), ["n3"]),
        CheckOptions(),
        {"S11"},
        id="replicas-diverge",
    ),
    pytest.param(
        lambda e: e.events.append(RaftEvent("n3", 0, 57 * MS, "leader", 2)),
        CheckOptions(),
        {"S12"},
        id="two-leaders-one-term",
    ),
    pytest.param(term_backwards, CheckOptions(), {"S12"}, id="term-backwards-after-restart"),
    pytest.param(
        lambda e: e.events.append(RaftEvent("n3", 0, 58 * MS, "vote", 2, "n3")),
        CheckOptions(),
        {"S12"},
        id="double-vote",
    ),
    pytest.param(
        undetected_damage,
        CheckOptions(corruption_detection_required=True),
        {"S14"},
        id="damage-undetected",
    ),
    pytest.param(unacked_append, CheckOptions(recover_window_ns=40 * MS), {"L1"}, id="no-recovery"),
    pytest.param(
        lambda e: set_dumps(e, 0, drop_last, ["n3"]),
        CheckOptions(),
        {"S11", "L2"},
        id="replica-behind",
    ),
    pytest.param(
        lambda e: e.nemesis.pop(),
        CheckOptions(converge_window_ns=100 * MS),
        {"L2"},
        id="not-converged",
    ),
    pytest.param(
        lambda e: None, CheckOptions(availability_window_ns=50 * MS), {"L3"}, id="unavailable"
    ),
]


def unacked_append_then_pause(e: Evidence) -> None:
    unacked_append(e)
    e.nemesis.append(NemesisEvent(80 * MS, "start", "pause", ("n2",)))


# Legitimate behaviours that a careless checker would flag.
LEGITIMATE: list[Any] = [
    pytest.param(
        lambda e: set_op(
            e, "o16", process="p2", from_lsn=2, records=records(0, range(2, 7)), next_lsn=7
        ),
        CheckOptions(),
        id="stale-read-below-truncation-point",
    ),
    pytest.param(
        lambda e: set_op(e, "o15", first_lsn=1, last_lsn=5),
        CheckOptions(),
        id="stale-status-after-truncate",
    ),
    pytest.param(
        lambda e: set_op(e, "o18", from_lsn=11, records=(), next_lsn=11),
        CheckOptions(),
        id="tail-beyond-the-end",
    ),
    pytest.param(
        lambda e: e.ops.append(
            Op("o25", "p1", "truncate", 0, 136 * MS, 137 * MS, "ok", lsn=2, first_lsn=3)
        ),
        CheckOptions(),
        id="truncate-below-first-lsn-is-a-no-op",
    ),
    pytest.param(
        unacked_append,
        CheckOptions(recover_window_ns=100 * MS),
        id="recovery-window-cut-by-the-end-of-the-run",
    ),
    pytest.param(
        unacked_append_then_pause,
        CheckOptions(recover_window_ns=40 * MS),
        id="recovery-window-cut-by-the-next-fault",
    ),
]


def ids_of(violations: list[Violation]) -> set[str]:
    return {v.check for v in violations}


def test_clean_history_has_no_violation() -> None:
    assert check_all(clean_evidence()) == []


def test_clean_history_passes_every_opt_in_check() -> None:
    evidence = clean_evidence()
    assert check_all(evidence, STRICT) == [], report(check_all(evidence, STRICT), evidence)


@pytest.mark.parametrize(("inject", "options", "expected"), ANOMALIES)
def test_each_anomaly_is_reported_under_its_check(
    inject: Callable[[Evidence], object], options: CheckOptions, expected: set[str]
) -> None:
    evidence = clean_evidence()
    inject(evidence)
    found = check_all(evidence, options)
    assert ids_of(found) == expected, report(found, evidence)
    for violation in found:
        assert violation.examples, violation


@pytest.mark.parametrize(("edit", "options"), LEGITIMATE)
def test_legitimate_behaviour_is_not_flagged(
    edit: Callable[[Evidence], object], options: CheckOptions
) -> None:
    evidence = clean_evidence()
    edit(evidence)
    found = check_all(evidence, options)
    assert found == [], report(found, evidence)


# ------------------------------------------------------------------------------ vacuity

VACUOUS: list[Any] = [
    pytest.param(dataclasses.replace(STRICT, acked_appends_min=9), id="acked-appends"),
    pytest.param(dataclasses.replace(STRICT, reads_min=8), id="reads"),
    pytest.param(dataclasses.replace(STRICT, leader_changes_min=2), id="leader-changes"),
    pytest.param(dataclasses.replace(STRICT, faults_min={"kill": 2}), id="fault-count"),
    pytest.param(dataclasses.replace(STRICT, faults_min={"partition": 1}), id="fault-missing"),
    pytest.param(dataclasses.replace(STRICT, recoveries_min=2), id="recoveries"),
    pytest.param(dataclasses.replace(STRICT, info_ops_min=5), id="info-ops"),
    pytest.param(dataclasses.replace(STRICT, dumps_per_shard_min=4), id="dumps"),
]


@pytest.mark.parametrize("options", VACUOUS)
def test_each_vacuity_minimum_is_enforced(options: CheckOptions) -> None:
    evidence = clean_evidence()
    assert check_safety(evidence, options) == []
    assert check_liveness(evidence, options) == []
    assert ids_of(check_vacuity(evidence, options)) == {"V"}


def test_a_fault_that_was_not_applied_is_vacuous() -> None:
    evidence = clean_evidence()
    evidence.nemesis.append(NemesisEvent(90 * MS, "start", "pause", ("n2",), applied=False))
    assert ids_of(check_all(evidence, STRICT)) == {"V"}
    assert check_all(evidence) == []  # only when the scenario demands it


# ------------------------------------------------------------------------------ report


def test_report_names_violations_and_shows_context() -> None:
    evidence = clean_evidence()
    set_op(evidence, "o18", records=(), next_lsn=9)
    text = report(check_all(evidence), evidence)
    assert "[S8] shard 0: stale tail" in text
    assert ">>" in text and "o18" in text and "o17" in text
    assert report([], evidence).startswith("chaos check: 0 violation(s)")


def test_report_is_bounded() -> None:
    evidence = clean_evidence()
    for i in range(500):  # 500 phantoms: one violation, ten examples
        set_dumps(evidence, 0, add_record(payload(f"zz{i}")))
    found = check_all(evidence)
    assert [(v.check, v.message) for v in found] == [
        ("S4", "phantom payload (no append ever carried it) (500 cases)")
    ]
    assert len(found[0].examples) == 10
    assert len(report(found, evidence).splitlines()) < 30


# ------------------------------------------------------------------------------ model


class _LogModel:
    """A sequential model of one shard: a dense log with a truncation point. Every
    operation takes effect at its linearization point `at_ns`; its invoke and completion
    straddle it, so windows of different operations overlap (concurrency)."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.log: list[bytes] = []  # LSN i + 1
        self.first_lsn = 1
        self.states: list[tuple[int, int]] = [(1, 0)]  # (first_lsn, last_lsn) history

    @property
    def last_lsn(self) -> int:
        return len(self.log)

    def remember(self) -> None:
        self.states.append((self.first_lsn, self.last_lsn))

    def slice(self, lo: int, hi: int) -> tuple[tuple[int, bytes], ...]:
        return tuple((lsn, self.log[lsn - 1]) for lsn in range(lo, hi))


@st.composite
def valid_histories(draw: st.DrawFn) -> Evidence:
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(
                    ["append", "append", "append", "read", "tail", "truncate", "status"]
                ),
                st.integers(0, 2),  # shard (2 = shard 0 again: it gets more traffic)
                st.integers(0, 3),  # process
                st.integers(0, 1000),  # a free choice (outcome, range, staleness)
                st.integers(0, 150),  # invoke jitter, ms: windows overlap
                st.integers(0, 150),  # completion jitter, ms
            ),
            min_size=10,
            max_size=80,
        )
    )
    models = {0: _LogModel(0), 1: _LogModel(1)}
    ops: list[Op] = []
    seq = 0
    busy_until: dict[str, int] = {}
    for n, (kind, shard_pick, process_pick, choice, jitter_in, jitter_out) in enumerate(steps):
        model = models[shard_pick % 2]
        shard = model.shard
        process = f"p{process_pick}"
        at = (n + 1) * 100 * MS
        invoke = max(at - jitter_in * MS, busy_until.get(process, 0) + 1)
        invoke = min(invoke, at)
        complete = at + jitter_out * MS
        busy_until[process] = complete
        op_id = f"o{n}"
        if kind == "append":
            count = 1 + choice % 3
            outcome: Outcome = ("ok", "ok", "ok", "fail", "info")[choice % 5]
            ids = []
            for _ in range(count):
                seq += 1
                ids.append(f"{process}-{seq:08d}")
            payloads = tuple(payload(i, shard) for i in ids)
            applied = outcome == "ok" or (outcome == "info" and choice % 2 == 0)
            lsns: tuple[int, ...] = ()
            if applied:
                lsns = tuple(range(model.last_lsn + 1, model.last_lsn + 1 + count))
                model.log.extend(payloads)
                model.remember()
            ops.append(
                Op(
                    op_id,
                    process,
                    "append",
                    shard,
                    invoke,
                    complete if outcome != "info" or choice % 3 else None,
                    outcome,
                    payloads=payloads,
                    lsns=lsns if outcome == "ok" else (),
                )
            )
        elif kind in ("read", "tail"):
            # a read may be served by a stale replica (an earlier state); a tail may not
            first, last = (
                model.states[choice % len(model.states)]
                if kind == "read"
                else (model.first_lsn, model.last_lsn)
            )
            from_lsn = max(1, first - 1 + choice % (last - first + 3))  # [first-1, last+1]
            if from_lsn < first:
                ops.append(
                    Op(
                        op_id,
                        process,
                        kind,
                        shard,
                        invoke,
                        complete,
                        "fail",
                        from_lsn=from_lsn,
                        truncated_first_lsn=first,
                    )
                )
            else:
                upto = max(from_lsn, min(last + 1, from_lsn + choice % 5))  # budget-limited
                if kind == "tail" and last >= from_lsn:
                    upto = max(upto, from_lsn + 1)  # a tail returns at least one if any
                ops.append(
                    Op(
                        op_id,
                        process,
                        kind,
                        shard,
                        invoke,
                        complete,
                        "ok",
                        from_lsn=from_lsn,
                        records=model.slice(from_lsn, upto),
                        next_lsn=upto,
                    )
                )
        elif kind == "truncate":
            lsn = 1 + choice % (model.last_lsn + 1)  # never past last_lsn + 1
            outcome = ("ok", "ok", "info", "fail")[choice % 4]
            if outcome == "ok" or (outcome == "info" and choice % 8 < 4):
                model.first_lsn = max(model.first_lsn, lsn)
                model.remember()
            ops.append(
                Op(
                    op_id,
                    process,
                    "truncate",
                    shard,
                    invoke,
                    None if outcome == "info" else complete,
                    outcome,
                    lsn=lsn,
                    first_lsn=model.first_lsn if outcome == "ok" else None,
                )
            )
        else:
            first, last = model.states[choice % len(model.states)]  # any replica: stale
            ops.append(
                Op(
                    op_id,
                    process,
                    "status",
                    shard,
                    invoke,
                    complete,
                    "ok",
                    first_lsn=first,
                    last_lsn=last,
                )
            )
    dumps = [
        ReplicaDump(
            node,
            model.shard,
            model.first_lsn,
            model.last_lsn,
            model.slice(1 if node == "n1" else model.first_lsn, model.last_lsn + 1),
        )
        for model in models.values()
        for node in NODES
    ]
    return Evidence(ops, dumps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_histories())
def test_valid_histories_of_a_sequential_log_pass(evidence: Evidence) -> None:
    found = check_all(evidence)
    assert found == [], report(found, evidence)


# ------------------------------------------------------------------------------ size


class _FastRandom(random.Random):
    """Short constant filler: builds 50k payloads quickly (content is irrelevant here)."""

    def randint(self, a: int, b: int) -> int:
        return a

    def choice(self, seq: Any) -> Any:
        return seq[0]


def test_fifty_thousand_operations_are_checked_in_seconds() -> None:
    rng = _FastRandom()
    ops: list[Op] = []
    log: list[bytes] = []
    for i in range(50_000):
        t = i * 10 * MS
        if i % 4 == 3:
            lo = max(1, len(log) - 20)
            ops.append(
                Op(
                    f"o{i}",
                    f"p{i % 8}",
                    "read",
                    0,
                    t,
                    t + 5 * MS,
                    "ok",
                    from_lsn=lo,
                    records=tuple((n, log[n - 1]) for n in range(lo, len(log) + 1)),
                    next_lsn=len(log) + 1,
                )
            )
            continue
        data = make_payload(f"p{i % 8}-{i:08d}", 0, rng)
        log.append(data)
        ops.append(
            Op(
                f"o{i}",
                f"p{i % 8}",
                "append",
                0,
                t,
                t + 5 * MS,
                "ok",
                payloads=(data,),
                lsns=(len(log),),
            )
        )
    records_all = tuple((n + 1, data) for n, data in enumerate(log))
    dumps = [ReplicaDump(node, 0, 1, len(log), records_all) for node in NODES]
    started = time.perf_counter()
    found = check_all(Evidence(ops, dumps))
    elapsed_s = time.perf_counter() - started
    assert found == []
    assert elapsed_s < 15, f"check_all took {elapsed_s:.1f} s"  # a few s on an idle box
