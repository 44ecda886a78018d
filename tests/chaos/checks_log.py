"""Content checks over acks, reads and final dumps: S1-S5, S7, S11 and S14's "no corrupt
payload is ever served" (plan §4.8).

One pass builds, per shard, the map M: LSN -> payload id from three kinds of observation
(ok append acks, ok read/tail records, every replica's dump) and, per payload id, where it
was seen. Every check is then a dictionary lookup, so a run of 50k operations and dumps of
50k records per replica takes well under a second (plus one CRC per distinct payload).

Which observation each check trusts, and why:

* S1 (lost ack) uses dumps only: they are taken after heal and convergence. An acked
  (L, p) is accounted for when some replica holds p at L, or when L is below some
  replica's first_lsn (truncated: S10 checks that a truncate asked for that). One replica
  lacking it while another holds it is not a loss but a convergence failure (S11, L2); a
  replica holding something else at L is S2; a hole in a replica's range is S5.
* S2 compares payload ids, not bytes: damaged bytes are S14's, and the same id with other
  intact bytes is S4's, so one anomaly is reported under one id.
* S3 counts distinct (shard, LSN) places of a payload id over acks, reads and dumps,
  including info appends (idempotent retries must never land twice).
* S4: each payload seen in a read or a dump came from an invoked append on that shard
  (a shard tag naming another shard is cross-shard leakage, scenario C10) that did not
  definitely fail, with the invoked bytes, and was not read before its append was invoked.
* S5: a dump holds exactly [first_lsn, last_lsn] (records below first_lsn may still be
  physically present and are ignored here); an ok read/tail from `a` returns exactly
  LSNs a, a+1, ..., next_lsn-1 (our service never starts a read elsewhere: below
  first_lsn it fails with truncated_first_lsn, which must then be > a); an ok append gets
  one consecutive LSN per payload; status reports last_lsn >= first_lsn - 1.
* S7: every intact (L, p) returned by an ok read or tail has some record at L in the final
  dumps, or L is below some replica's first_lsn (truncated later). A read that saw p at L
  where the final log holds another payload is S2's; an acked (L, p) is S1's.
* S11: after convergence all replicas of a shard have equal first_lsn and last_lsn and
  byte-identical records in [first_lsn, last_lsn].
* S14 (part): no damaged payload (`parse_payload` raises) in a read, a tail or a dump, and
  no damage refused by the offline dump reader unless `dump_corruptions_allowed`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tests.chaos.checks_base import CheckOptions, Findings
from tests.chaos.history import (
    Evidence,
    Op,
    PayloadCorrupt,
    PayloadInfo,
    ReplicaDump,
    parse_payload,
)

# Where an observation came from: ("ack", op_id), ("read", op_id) or ("dump", node_id).
Source = tuple[str, str]


@dataclass(slots=True)
class LogFacts:
    """What the content pass learned that the ordering and liveness checks reuse."""

    # payload id -> its first observed place (shard, lsn), from acks, dumps and reads
    placed: dict[str, tuple[int, int]] = field(default_factory=dict)
    # payload id -> the append operations that carried it (normally exactly one)
    invoked: dict[str, list[Op]] = field(default_factory=dict)
    dumps_by_shard: dict[int, list[ReplicaDump]] = field(default_factory=dict)


def op_label(op: Op) -> str:
    return f"{op.op_id} ({op.process} {op.kind} {op.outcome})"


def _source_label(source: Source) -> str:
    kind, name = source
    return f"replica {name}" if kind == "dump" else f"{kind} {name}"


def _source_op(source: Source) -> str | None:
    return None if source[0] == "dump" else source[1]


class _PayloadCache:
    """parse_payload once per distinct byte string (a payload is seen by the ack, three
    dumps and many reads)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, PayloadInfo | None] = {}

    def info(self, data: bytes) -> PayloadInfo | None:
        try:
            return self._cache[data]
        except KeyError:
            pass
        try:
            parsed: PayloadInfo | None = parse_payload(data)
        except PayloadCorrupt:
            parsed = None
        self._cache[data] = parsed
        return parsed


class _LogPass:
    def __init__(self, evidence: Evidence, options: CheckOptions, findings: Findings) -> None:
        self.evidence = evidence
        self.options = options
        self.findings = findings
        self.payloads = _PayloadCache()
        self.dump_lookup = _DumpLookup(self.payloads)
        self.facts = LogFacts()
        # shard -> lsn -> (payload id, first source that showed it there)
        self.by_lsn: dict[int, dict[int, tuple[str, Source]]] = defaultdict(dict)
        self.conflicts_seen: set[tuple[int, int, str]] = set()
        self.duplicates_seen: set[tuple[str, int, int]] = set()
        self.origins_checked: set[tuple[str, int]] = set()  # (payload id, shard)
        self.invoke_ns_min: dict[str, int] = {}
        # shard -> lsn -> payload id, acks only (S7 leaves acked records to S1)
        self.acked: dict[int, dict[int, str]] = defaultdict(dict)

    # ---------------------------------------------------------------- observations

    def observe(self, shard: int, lsn: int, payload_id: str, source: Source) -> None:
        """Enter one observation into M (S2) and into the payload's places (S3)."""
        at_lsn = self.by_lsn[shard]
        previous = at_lsn.get(lsn)
        if previous is None:
            at_lsn[lsn] = (payload_id, source)
        elif previous[0] != payload_id and (shard, lsn, payload_id) not in self.conflicts_seen:
            self.conflicts_seen.add((shard, lsn, payload_id))
            self.findings.add(
                "S2",
                shard,
                "two payloads at one LSN",
                f"LSN {lsn}: {previous[0]} ({_source_label(previous[1])}) vs "
                f"{payload_id} ({_source_label(source)})",
                (_source_op(previous[1]), _source_op(source)),
            )
        place = self.facts.placed.get(payload_id)
        if place is None:
            self.facts.placed[payload_id] = (shard, lsn)
        elif place != (shard, lsn) and (payload_id, shard, lsn) not in self.duplicates_seen:
            self.duplicates_seen.add((payload_id, shard, lsn))
            first_shard, first_lsn = place
            self.findings.add(
                "S3",
                shard,
                "payload at more than one LSN",
                f"{payload_id} at shard {first_shard} LSN {first_lsn} and at shard {shard} "
                f"LSN {lsn} ({_source_label(source)})",
                (_source_op(source), *self._invoking_ops(payload_id)),
            )

    def _invoking_ops(self, payload_id: str) -> list[str]:
        return [op.op_id for op in self.facts.invoked.get(payload_id, [])]

    def check_origin(self, shard: int, data: bytes, info: PayloadInfo, source: Source) -> None:
        """S4 for one intact payload seen in a read or a dump (once per payload and shard)."""
        key = (info.payload_id, shard)
        if key in self.origins_checked:
            return
        self.origins_checked.add(key)
        where = _source_label(source)
        appends = self.facts.invoked.get(info.payload_id)
        if not appends:
            self.findings.add(
                "S4",
                shard,
                "phantom payload (no append ever carried it)",
                f"{info.payload_id} seen in {where}",
                (_source_op(source),),
            )
            return
        op_ids = [_source_op(source), *(op.op_id for op in appends)]
        if info.shard != shard or all(op.shard != shard for op in appends):
            self.findings.add(
                "S4",
                shard,
                "cross-shard leakage (payload of another shard)",
                f"{info.payload_id} tagged for shard {info.shard}, invoked on shard(s) "
                f"{sorted({op.shard for op in appends})}, found on shard {shard} in {where}",
                op_ids,
            )
        if all(op.outcome == "fail" for op in appends):
            self.findings.add(
                "S4",
                shard,
                "aborted read (payload of a definitely failed append observed)",
                f"{info.payload_id} seen in {where}; its append(s) "
                f"{', '.join(op_label(op) for op in appends)} failed",
                op_ids,
            )
        if all(data not in op.payloads for op in appends):
            self.findings.add(
                "S4",
                shard,
                "payload bytes differ from the invoked bytes",
                f"{info.payload_id} in {where} ({len(data)} bytes) matches no invoked copy",
                op_ids,
            )

    # ---------------------------------------------------------------- the three sources

    def index_invocations(self) -> None:
        for op in self.evidence.ops:
            if op.kind != "append":
                continue
            for data in op.payloads:
                info = self.payloads.info(data)
                if info is None:
                    continue  # the workload made it; a damaged invoke is a harness bug
                self.facts.invoked.setdefault(info.payload_id, []).append(op)
                known = self.invoke_ns_min.get(info.payload_id)
                if known is None or op.invoke_ns < known:
                    self.invoke_ns_min[info.payload_id] = op.invoke_ns

    def pass_acks(self) -> None:
        for op in self.evidence.ops:
            if op.kind != "append" or op.outcome != "ok":
                continue
            lsns = op.lsns
            consecutive = all(lsns[i + 1] == lsns[i] + 1 for i in range(len(lsns) - 1))
            if len(lsns) != len(op.payloads) or not consecutive:
                self.findings.add(
                    "S5",
                    op.shard,
                    "ok append without one consecutive LSN per payload",
                    f"{op_label(op)}: {len(op.payloads)} payloads, LSNs {list(lsns)[:8]}",
                    (op.op_id,),
                )
            for lsn, data in zip(lsns, op.payloads, strict=False):
                info = self.payloads.info(data)
                if info is None:
                    continue
                self.acked[op.shard][lsn] = info.payload_id
                self.observe(op.shard, lsn, info.payload_id, ("ack", op.op_id))

    def pass_dumps(self) -> None:
        for dump in self.evidence.dumps:
            self.facts.dumps_by_shard.setdefault(dump.shard, []).append(dump)
            self._check_dump_shape(dump)
            if dump.corruptions and not self.options.dump_corruptions_allowed:
                self.findings.add(
                    "S14",
                    dump.shard,
                    "final dump still holds damaged data",
                    f"replica {dump.node_id}: {'; '.join(dump.corruptions[:3])}",
                )
            source: Source = ("dump", dump.node_id)
            for lsn, data in dump.records:
                info = self.payloads.info(data)
                if info is None:
                    self.findings.add(
                        "S14",
                        dump.shard,
                        "corrupt payload present in a dump",
                        f"replica {dump.node_id} LSN {lsn}: {data[:40]!r}",
                    )
                    continue
                self.check_origin(dump.shard, data, info, source)
                self.observe(dump.shard, lsn, info.payload_id, source)

    def _check_dump_shape(self, dump: ReplicaDump) -> None:
        """S5 for one replica: LSNs strictly increasing, exactly [first_lsn, last_lsn]."""
        label = f"replica {dump.node_id} [{dump.first_lsn}, {dump.last_lsn}]"
        if dump.first_lsn < 1 or dump.last_lsn < dump.first_lsn - 1:
            self.findings.add("S5", dump.shard, "dump bounds impossible", label)
            return
        previous: int | None = None
        expected = dump.first_lsn
        for lsn, _ in dump.records:
            if previous is not None and lsn <= previous:
                self.findings.add(
                    "S5",
                    dump.shard,
                    "dump LSNs out of order or repeated",
                    f"{label}: LSN {lsn} after {previous}",
                )
                return
            previous = lsn
            if lsn < dump.first_lsn:
                continue  # physically present below the truncation point: allowed
            if lsn != expected:
                self.findings.add(
                    "S5",
                    dump.shard,
                    "gap in a dump",
                    f"{label}: expected LSN {expected}, found {lsn}",
                )
                return
            expected += 1
        if expected != dump.last_lsn + 1:
            self.findings.add(
                "S5",
                dump.shard,
                "gap in a dump",
                f"{label}: records end at LSN {expected - 1}",
            )

    def pass_reads(self) -> None:
        held = self._held_lsns()
        for op in self.evidence.ops:
            if op.kind == "status" and op.outcome == "ok":
                self._check_status_shape(op)
            if op.kind not in ("read", "tail"):
                continue
            if op.outcome == "fail" and op.truncated_first_lsn is not None:
                if op.from_lsn is not None and op.truncated_first_lsn <= op.from_lsn:
                    self.findings.add(
                        "S5",
                        op.shard,
                        "'truncated' answer for an LSN at or above first_lsn",
                        f"{op_label(op)} from {op.from_lsn}: first_lsn {op.truncated_first_lsn}",
                        (op.op_id,),
                    )
                continue
            if op.outcome != "ok":
                continue
            self._check_read_shape(op)
            self._read_records(op, held.get(op.shard))

    def _check_status_shape(self, op: Op) -> None:
        first, last = op.first_lsn, op.last_lsn
        if first is not None and last is not None and (first < 1 or last < first - 1):
            self.findings.add(
                "S5",
                op.shard,
                "status bounds impossible",
                f"{op_label(op)}: first_lsn {first}, last_lsn {last}",
                (op.op_id,),
            )

    def _check_read_shape(self, op: Op) -> None:
        start = op.from_lsn if op.from_lsn is not None else 1
        lsns = [lsn for lsn, _ in op.records]
        if lsns != list(range(start, start + len(lsns))):
            self.findings.add(
                "S5",
                op.shard,
                "read not contiguous from its from_lsn",
                f"{op_label(op)} from {start}: LSNs {lsns[:8]}{'...' if len(lsns) > 8 else ''}",
                (op.op_id,),
            )
        elif op.next_lsn is not None and op.next_lsn != start + len(lsns):
            self.findings.add(
                "S5",
                op.shard,
                "read next_lsn disagrees with its records",
                f"{op_label(op)} from {start}: {len(lsns)} records, next_lsn {op.next_lsn}",
                (op.op_id,),
            )

    def _read_records(self, op: Op, held: _Held | None) -> None:
        source: Source = (op.kind, op.op_id)
        at_lsn = self.by_lsn[op.shard]
        acked = self.acked[op.shard]
        complete_ns = op.complete_ns
        for lsn, data in op.records:
            info = self.payloads.info(data)
            if info is None:
                self.findings.add(
                    "S14",
                    op.shard,
                    f"corrupt payload served by a {op.kind}",
                    f"{op_label(op)} LSN {lsn}: {data[:40]!r}",
                    (op.op_id,),
                )
                continue
            payload_id = info.payload_id
            invoked_ns = self.invoke_ns_min.get(payload_id)
            if complete_ns is not None and invoked_ns is not None and complete_ns < invoked_ns:
                self.findings.add(
                    "S4",
                    op.shard,
                    "read returned a payload before its append was invoked",
                    f"{op_label(op)} LSN {lsn}: {payload_id}",
                    (op.op_id, *self._invoking_ops(payload_id)),
                )
            self.check_origin(op.shard, data, info, source)
            previous = at_lsn.get(lsn)
            if (
                previous is None
                or previous[0] != payload_id
                or self.facts.placed.get(payload_id) != (op.shard, lsn)
            ):
                self.observe(op.shard, lsn, payload_id, source)
            if held is not None and acked.get(lsn) != payload_id and not held.accounts(lsn):
                self.findings.add(
                    "S7",
                    op.shard,
                    "read saw a record the final log does not have",
                    f"{op_label(op)} LSN {lsn}: {payload_id}; final replicas "
                    f"[first_lsn, last_lsn] {held.ranges}",
                    (op.op_id,),
                )

    def _held_lsns(self) -> dict[int, _Held]:
        return {shard: _Held(dumps) for shard, dumps in self.facts.dumps_by_shard.items() if dumps}

    # ---------------------------------------------------------------- S1, S11

    def check_lost_acks(self) -> None:
        check = "S13" if self.options.power_loss else "S1"
        title = (
            "acked append lost after coordinated power loss (S1 under S13)"
            if self.options.power_loss
            else "acked append lost (no replica holds it at its LSN)"
        )
        for op in self.evidence.ops:
            if op.kind != "append" or op.outcome != "ok":
                continue
            dumps = self.facts.dumps_by_shard.get(op.shard)
            if not dumps:
                continue  # nothing to judge by; vacuity (dumps_per_shard_min) catches it
            for lsn, data in zip(op.lsns, op.payloads, strict=False):
                if any(lsn < dump.first_lsn for dump in dumps):
                    continue  # truncated; S10 checks that a truncate asked for it
                if any(self.dump_lookup.record_at(dump, lsn) == data for dump in dumps):
                    continue
                info = self.payloads.info(data)
                name = info.payload_id if info is not None else "?"
                self.findings.add(
                    check,
                    op.shard,
                    title,
                    f"{op_label(op)}: {name} acked at LSN {lsn}; replicas hold "
                    + ", ".join(self.dump_lookup.describe(dump, lsn) for dump in dumps),
                    (op.op_id,),
                )

    def check_replicas_converge(self) -> None:
        for shard, dumps in self.facts.dumps_by_shard.items():
            reference = dumps[0]
            for other in dumps[1:]:
                if (other.first_lsn, other.last_lsn) != (reference.first_lsn, reference.last_lsn):
                    self.findings.add(
                        "S11",
                        shard,
                        "replicas differ in first_lsn/last_lsn",
                        f"replica {reference.node_id} [{reference.first_lsn}, "
                        f"{reference.last_lsn}] vs replica {other.node_id} "
                        f"[{other.first_lsn}, {other.last_lsn}]",
                    )
                lo = max(reference.first_lsn, other.first_lsn)
                hi = min(reference.last_lsn, other.last_lsn)
                mine = _records_in(reference, lo, hi)
                theirs = _records_in(other, lo, hi)
                if mine == theirs:
                    continue
                for lsn in range(lo, hi + 1):
                    if mine.get(lsn) != theirs.get(lsn):
                        self.findings.add(
                            "S11",
                            shard,
                            "replicas hold different records",
                            f"LSN {lsn}: replica {reference.node_id} has "
                            f"{self.dump_lookup.describe(reference, lsn)}, replica "
                            f"{other.node_id} has {self.dump_lookup.describe(other, lsn)}",
                        )
                        break


class _Held:
    """Which LSNs the final dumps of one shard account for: held by some replica, or below
    some replica's first_lsn (truncated)."""

    def __init__(self, dumps: list[ReplicaDump]) -> None:
        self.first_lsn_max = max(dump.first_lsn for dump in dumps)
        self.lsns: set[int] = set()
        for dump in dumps:
            self.lsns.update(lsn for lsn, _ in dump.records)
        self.ranges = [(dump.first_lsn, dump.last_lsn) for dump in dumps]

    def accounts(self, lsn: int) -> bool:
        return lsn < self.first_lsn_max or lsn in self.lsns


def _records_in(dump: ReplicaDump, lo: int, hi: int) -> dict[int, bytes]:
    return {lsn: data for lsn, data in dump.records if lo <= lsn <= hi}


class _DumpLookup:
    """The record of a dump at an LSN: O(1) by position when the dump is dense (the normal
    case), else through a dictionary built once for that dump (holes: a gap, or records
    missing below first_lsn)."""

    def __init__(self, payloads: _PayloadCache) -> None:
        self._payloads = payloads
        self._sparse: dict[str, dict[int, bytes]] = {}  # node_id:shard -> records by LSN

    def record_at(self, dump: ReplicaDump, lsn: int) -> bytes | None:
        records = dump.records
        if records:
            position = lsn - records[0][0]
            if 0 <= position < len(records) and records[position][0] == lsn:
                return records[position][1]
        key = f"{dump.node_id}:{dump.shard}"
        by_lsn = self._sparse.get(key)
        if by_lsn is None:
            by_lsn = self._sparse[key] = dict(records)
        return by_lsn.get(lsn)

    def describe(self, dump: ReplicaDump, lsn: int) -> str:
        data = self.record_at(dump, lsn)
        if data is None:
            return f"{dump.node_id}: nothing [{dump.first_lsn}, {dump.last_lsn}]"
        info = self._payloads.info(data)
        return f"{dump.node_id}: {info.payload_id if info is not None else 'corrupt bytes'}"


def check_log(evidence: Evidence, options: CheckOptions, findings: Findings) -> LogFacts:
    """S1-S5, S7, S11 and S14 (damaged payloads) into `findings`; returns what the other
    checks reuse. Order matters: acks, then dumps (S7 needs them), then reads."""
    log = _LogPass(evidence, options, findings)
    log.index_invocations()
    log.pass_acks()
    log.pass_dumps()
    log.pass_reads()
    log.check_lost_acks()
    log.check_replicas_converge()
    return log.facts
