"""Filters a reader applies itself: which units (segments, shard replicas) to skip whole, and
which rows to drop early. Pure; the Spark Data Sources translate pushed filters into this.

Spark re-applies every filter a source is given (the sources yield them back: a filter only
recorded and not yielded back was measured to give wrong results, spark.md §4.1), so what
a reader does here is an optimisation that must never keep fewer rows than the filter keeps.

Pruning whole units: `shard`, `replica`, and a lower bound on `lsn` for a file WAL segment
(its LSNs lie below the next segment's base). `dsn` and `commit_ts` are applied row by row:
a segment has no footer stating their range.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from spark_jobs.inputs import Unit

RANGE_COLUMNS = ("lsn", "dsn", "commit_ts")


@dataclass(frozen=True, slots=True)
class Range:
    """Inclusive bounds; None is unbounded."""

    lo: int | None = None
    hi: int | None = None

    def tighten(self, lo: int | None = None, hi: int | None = None) -> Range:
        new_lo = self.lo if lo is None else (lo if self.lo is None else max(lo, self.lo))
        new_hi = self.hi if hi is None else (hi if self.hi is None else min(hi, self.hi))
        return Range(new_lo, new_hi)

    def holds(self, value: int | None) -> bool:
        """Whether a row with this value passes (a null never passes a real bound)."""
        if self.lo is None and self.hi is None:
            return True
        if value is None:
            return False
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)

    @property
    def unbounded(self) -> bool:
        return self.lo is None and self.hi is None


@dataclass(frozen=True, slots=True)
class Bounds:
    shards: frozenset[int] | None = None
    replicas: frozenset[str] | None = None
    ranges: dict[str, Range] = field(default_factory=dict)

    def range(self, column: str) -> Range:
        return self.ranges.get(column, Range())

    def with_range(self, column: str, lo: int | None = None, hi: int | None = None) -> Bounds:
        assert column in RANGE_COLUMNS
        ranges = dict(self.ranges)
        ranges[column] = self.range(column).tighten(lo, hi)
        return replace(self, ranges=ranges)

    def with_shards(self, shards: frozenset[int]) -> Bounds:
        return replace(self, shards=shards if self.shards is None else self.shards & shards)

    def with_replicas(self, replicas: frozenset[str]) -> Bounds:
        kept = replicas if self.replicas is None else self.replicas & replicas
        return replace(self, replicas=kept)

    def keeps_unit(self, unit: Unit) -> bool:
        if self.shards is not None and unit.shard not in self.shards:
            return False
        if self.replicas is not None and unit.replica not in self.replicas:
            return False
        lsn = self.range("lsn")
        # Only a lower bound prunes: every row of a segment (its TRUNCATE frames included)
        # has an LSN below the next segment's base, but a TRUNCATE frame may name an LSN
        # below its own segment's base, so an upper bound cannot skip a segment.
        return not (
            unit.backend == "file"
            and lsn.lo is not None
            and unit.lsn_hi is not None
            and unit.lsn_hi <= lsn.lo
        )
