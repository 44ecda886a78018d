"""The soak's ledger of writes (pure: no I/O, no clock): what every acknowledged commit
left, checked against the rows read back.

A worker announces each transaction before it commits (`begin`: the keys it sets or
deletes, the key ranges, "chunks", it inserts or deletes whole) and then says how it ended:
`ack` (acknowledged: the ledger now expects its writes), `fail` (a typed refusal: nothing
was written) or `unknown` (no answer: it may have landed). A worker killed with commits
begun and not ended leaves them unknown too. Unknown transactions are "in doubt": they are
resolved at the next check by what is read back (all of their writes there: applied; none:
not applied; some: a torn transaction, counted as `partial`), never counted as lost.

Each key is written by one worker's writer at a time, one transaction after another, and
a key of a transaction in doubt is never written again (the worker quarantines it; a
restarted worker uses new keys): so a transaction's state before it (`pre`) is the
ledger's acknowledged state when it began, and in doubt it can only be `pre` or its own.

A check runs concurrently with the workers: `mark()` copies the acknowledged state, then
the caller reads (a snapshot taken after the mark), then `check(mark, ...)`. A key that a
transaction open at the mark or begun after it touches may show any of its states from the
mark on (the read may be before or after those commits); every other key must be exactly
as the mark says. Lost = keys (or chunk rows) acknowledged and missing or wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Value = int | None
"""A key's value, None: absent (deleted or never inserted)."""

IntArray = npt.NDArray[np.int64]
SAMPLES_MAX = 10
"""Examples of each anomaly kept for the report."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Rows [lo, hi) with v = value, inserted or deleted as a whole (value None)."""

    lo: int
    hi: int
    value: Value


@dataclass(slots=True)
class Op:
    op_id: str
    worker: str
    writes: dict[int, Value]
    chunks: tuple[Chunk, ...]
    pre_writes: dict[int, Value]
    pre_chunks: tuple[Chunk, ...]
    begun_no: int


@dataclass(frozen=True, slots=True)
class Mark:
    begun_no: int
    keys: dict[int, Value]
    chunks: dict[int, Chunk]
    open_ops: tuple[Op, ...]
    doubt_ops: tuple[Op, ...]


@dataclass(slots=True)
class CheckResult:
    keys_checked: int = 0
    chunks_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    resolved_applied: int = 0
    resolved_not_applied: int = 0
    partial: int = 0
    phantom: int = 0
    """Rows read back that no transaction ever announced."""
    samples: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        if len(self.samples) < SAMPLES_MAX:
            self.samples.append(what)


class Ledger:
    def __init__(self) -> None:
        self.keys: dict[int, Value] = {}
        """Every key ever announced: its acknowledged value (None: absent)."""
        self.chunks: dict[int, Chunk] = {}
        """Every chunk ever announced, by lo: its acknowledged state."""
        self.open: dict[str, Op] = {}
        self.doubt: dict[str, Op] = {}
        self._begun_no = 0
        self._since_mark: list[Op] | None = None
        self.acked = 0
        self.failed = 0
        self.in_doubt_total = 0

    # --- what the workers say ---------------------------------------------------------------

    def begin(
        self, op_id: str, worker: str, writes: Mapping[int, Value], chunks: Iterable[Chunk]
    ) -> None:
        assert op_id not in self.open
        chunks = tuple(chunks)
        for key in writes:
            self.keys.setdefault(key, None)
        pre_chunks = []
        for chunk in chunks:
            known = self.chunks.setdefault(chunk.lo, Chunk(chunk.lo, chunk.hi, None))
            assert known.hi == chunk.hi, (known, chunk)
            pre_chunks.append(known)
        self._begun_no += 1
        op = Op(
            op_id,
            worker,
            dict(writes),
            chunks,
            {key: self.keys[key] for key in writes},
            tuple(pre_chunks),
            self._begun_no,
        )
        self.open[op_id] = op
        if self._since_mark is not None:
            self._since_mark.append(op)

    def ack(self, op_id: str) -> None:
        op = self.open.pop(op_id)
        self.acked += 1
        self.keys.update(op.writes)
        for chunk in op.chunks:
            self.chunks[chunk.lo] = chunk

    def fail(self, op_id: str) -> None:
        del self.open[op_id]
        self.failed += 1

    def unknown(self, op_id: str) -> None:
        op = self.open.pop(op_id)
        self.doubt[op_id] = op
        self.in_doubt_total += 1

    def orphan(self, worker: str) -> int:
        """`worker` died: its open transactions are in doubt. How many."""
        ops = [op_id for op_id, op in self.open.items() if op.worker == worker]
        for op_id in ops:
            self.unknown(op_id)
        return len(ops)

    def live_chunks(self, lo: int, hi: int) -> list[Chunk]:
        """Chunks in keys [lo, hi) (a worker's key space) acknowledged present and in no
        open or in-doubt transaction: a restarted worker adopts them, to delete them later."""
        busy = {c.lo for op in (*self.open.values(), *self.doubt.values()) for c in op.chunks}
        return [
            c
            for c in self.chunks.values()
            if c.value is not None and c.lo not in busy and lo <= c.lo < hi
        ]

    # --- the check ----------------------------------------------------------------------------

    def mark(self) -> Mark:
        self._since_mark = []
        return Mark(
            self._begun_no,
            dict(self.keys),
            dict(self.chunks),
            tuple(self.open.values()),
            tuple(self.doubt.values()),
        )

    def unmark(self) -> None:
        """The read after `mark()` failed: no check this time."""
        self._since_mark = None

    def check(self, mark: Mark, ids: IntArray, values: IntArray) -> CheckResult:
        """The rows read back (a snapshot taken after `mark`), against the ledger."""
        volatile = [*mark.open_ops, *(self._since_mark or ())]
        self._since_mark = None
        result = CheckResult()
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        values = values[order]
        if len(ids) > 1:
            same = ids[1:] == ids[:-1]
            result.duplicated = int(np.count_nonzero(same))
            for key in ids[1:][same][:SAMPLES_MAX]:
                result.note(f"key {int(key)} read back more than once")
        reader = _Reader(ids, values)

        ok_keys: dict[int, set[Value]] = {}
        ok_chunks: dict[int, set[Value]] = {}
        for op in volatile:
            for key, value in op.writes.items():
                ok_keys.setdefault(key, {mark.keys.get(key)}).add(value)
            for chunk in op.chunks:
                before = mark.chunks.get(chunk.lo)
                ok_chunks.setdefault(chunk.lo, {before.value if before else None}).add(chunk.value)
        for op in mark.doubt_ops:
            self._resolve(op, reader, result)

        doubt_keys = {k for op in mark.doubt_ops for k in op.writes}
        doubt_chunks = {c.lo for op in mark.doubt_ops for c in op.chunks}
        for key, expected in mark.keys.items():
            if key in doubt_keys:
                continue
            got = reader.key(key)
            result.keys_checked += 1
            allowed = ok_keys.get(key, {expected})
            if got not in allowed:
                result.lost += 1
                result.note(f"key {key}: read {got}, acknowledged {sorted(allowed, key=str)}")
        for lo, chunk in mark.chunks.items():
            if lo in doubt_chunks:
                continue
            read = reader.chunk(chunk)
            result.chunks_checked += 1
            allowed = ok_chunks.get(lo, {chunk.value})
            if read not in allowed:
                result.lost += chunk.hi - chunk.lo  # every row of it is not as acknowledged
                result.note(f"chunk [{lo}, {chunk.hi}): read {read}, acknowledged {allowed}")

        known = np.fromiter(self.keys.keys(), dtype=np.int64, count=len(self.keys))
        outside = ~np.isin(ids, known)
        for chunk in self.chunks.values():
            lo, hi = np.searchsorted(ids, [chunk.lo, chunk.hi])
            outside[lo:hi] = False
        result.phantom = int(np.count_nonzero(outside))
        for key in ids[outside][:SAMPLES_MAX]:
            result.note(f"key {int(key)} read back, never written")
        return result

    def _resolve(self, op: Op, reader: _Reader, result: CheckResult) -> None:
        """An in-doubt transaction decided by what was read: the ledger follows."""
        got_keys = {key: reader.key(key) for key in op.writes}
        got_chunks = [reader.chunk(chunk) for chunk in op.chunks]
        if got_keys == op.writes and got_chunks == [c.value for c in op.chunks]:
            result.resolved_applied += 1
            self.keys.update(op.writes)
            for chunk in op.chunks:
                self.chunks[chunk.lo] = chunk
        elif got_keys == op.pre_writes and got_chunks == [c.value for c in op.pre_chunks]:
            result.resolved_not_applied += 1
        else:
            result.partial += 1
            result.note(
                f"in-doubt {op.op_id} torn: writes {op.writes} pre {op.pre_writes} read "
                f"{got_keys}; chunks {op.chunks} read {got_chunks}"
            )
            for key, value in got_keys.items():
                if isinstance(value, int) or value is None:
                    self.keys[key] = value
        del self.doubt[op.op_id]


class _Reader:
    """Lookups in the rows read back, sorted by id."""

    def __init__(self, ids: IntArray, values: IntArray) -> None:
        self.ids = ids
        self.values = values

    def key(self, key: int) -> Value:
        at = int(np.searchsorted(self.ids, key))
        if at < len(self.ids) and int(self.ids[at]) == key:
            return int(self.values[at])
        return None

    def chunk(self, chunk: Chunk) -> Value | str:
        """None (no row of it), its one value (every row, all with that value), or
        "partial"."""
        lo, hi = (int(i) for i in np.searchsorted(self.ids, [chunk.lo, chunk.hi]))
        if hi == lo:
            return None
        if hi - lo != chunk.hi - chunk.lo:
            return "partial"
        first = int(self.values[lo])
        if not bool(np.all(self.values[lo:hi] == first)):
            return "partial"
        return first
