"""The `logsvc` streaming source's offsets and micro-batch planning: pure (no client, no
Spark), so every rule is tested without a cluster (tests/unit/spark_jobs/test_stream_offsets.py).

An offset is JSON, as Spark checkpoints it (one line of the query's `offsets/` log):

    {"shards": {"1": 57, "2": 80}}
    {"shards": {"1": 57}, "lost": {"1": {"lsns": 10, "last": [38, 47]}}}

* `shards`: per shard, the last LSN consumed. A micro-batch from offset `start` to `end`
  reads LSNs (start, end] of each shard, so the same two offsets always name the same records
  (logsvc's committed LSNs are immutable): Spark replays a batch after a crash from its
  checkpointed offsets and a sink with exactly-once commits (Parquet's file sink) holds every
  record once.
* `lost` (only with `failOnDataLoss=false`): per shard, how many LSNs were skipped because
  they were truncated before the query read them, in total, and the last range skipped
  `[lo, hi]`. It rides in the offset so that the query's progress (`sources[].endOffset`)
  says so for the batch that skipped, and every later one keeps the count.

Planning (`plan_end`): for each shard, the retained range `[first_lsn, next_lsn)` as its
leader reports it. If `start + 1 < first_lsn`, LSNs `[start + 1, first_lsn - 1]` are gone:
`DataLost` by default, else skipped (recorded in `lost`). The end is then the log's end,
capped by the trigger's target (`availableNow`) and by a record budget (`maxRecordsPerTrigger`,
handed out shard by shard in id order).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from spark_jobs.errors import BadInput, DataLost


@dataclass(frozen=True, slots=True)
class Lost:
    lsns: int
    """LSNs skipped on this shard so far (all batches)."""
    last: tuple[int, int]
    """The last range skipped, `[lo, hi]`."""


@dataclass(frozen=True, slots=True)
class Offsets:
    lsns: Mapping[int, int]
    """Per shard: the last LSN consumed (reads continue at this + 1)."""
    lost: Mapping[int, Lost] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"shards": {str(s): lsn for s, lsn in sorted(self.lsns.items())}}
        if self.lost:
            out["lost"] = {
                str(s): {"lsns": lost.lsns, "last": list(lost.last)}
                for s, lost in sorted(self.lost.items())
            }
        return out

    @staticmethod
    def from_json(raw: object) -> Offsets:
        """An offset as Spark hands it back (a dict), or as a user writes `startingOffsets`
        (a JSON string). `BadInput` naming what is wrong."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise BadInput(f"offsets {raw!r}: not JSON ({exc})") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("shards"), dict):
            raise BadInput(f'offsets {raw!r}: expected {{"shards": {{"<shard>": <lsn>, ...}}}}')
        lsns = {_shard(s): _lsn(s, v) for s, v in raw["shards"].items()}
        lost: dict[int, Lost] = {}
        found = raw.get("lost", {})
        if not isinstance(found, dict):
            raise BadInput(f"offsets: 'lost' must be an object, not {found!r}")
        for s, item in found.items():
            try:
                lo, hi = item["last"]
                lost[_shard(s)] = Lost(int(item["lsns"]), (int(lo), int(hi)))
            except (KeyError, TypeError, ValueError):
                raise BadInput(f"offsets: lost[{s!r}] = {item!r} is not {{lsns, last}}") from None
        return Offsets(lsns, lost)


def _shard(text: str) -> int:
    try:
        shard = int(text)
    except ValueError:
        raise BadInput(f"offsets: shard {text!r} is not a number") from None
    if shard < 1:
        raise BadInput(f"offsets: shard {shard} must be at least 1")
    return shard


def _lsn(shard: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadInput(f"offsets: shard {shard}'s LSN {value!r} is not a whole number >= 0")
    return value


@dataclass(frozen=True, slots=True)
class Retained:
    """A shard's retained LSNs `[first_lsn, next_lsn)`, as its leader reports them."""

    first_lsn: int
    next_lsn: int


@dataclass(frozen=True, slots=True)
class Skip:
    """What planning skipped on one shard (failOnDataLoss=false): LSNs [lo, hi]."""

    shard: int
    lo: int
    hi: int


def plan_end(
    start: Offsets,
    retained: Mapping[int, Retained],
    *,
    fail_on_data_loss: bool,
    target: Mapping[int, int] | None = None,
    records_max: int | None = None,
) -> tuple[Offsets, list[Skip]]:
    """The end offset of the micro-batch starting at `start`, and what it skipped.
    `target`: per shard, the last LSN this query may read (availableNow's); `records_max`:
    at most this many LSNs in all (skipped ones not counted)."""
    assert set(retained) == set(start.lsns), (sorted(retained), sorted(start.lsns))
    assert records_max is None or records_max >= 1
    budget = records_max
    lsns: dict[int, int] = {}
    lost = dict(start.lost)
    skips: list[Skip] = []
    for shard in sorted(start.lsns):
        at = start.lsns[shard]
        span = retained[shard]
        if at + 1 < span.first_lsn:
            lo, hi = at + 1, span.first_lsn - 1
            if fail_on_data_loss:
                raise DataLost(
                    shard,
                    lo,
                    hi,
                    f"the log now starts at LSN {span.first_lsn} (truncated); "
                    "option failOnDataLoss=false skips them",
                )
            before = lost.get(shard)
            lost[shard] = Lost((before.lsns if before else 0) + hi - lo + 1, (lo, hi))
            skips.append(Skip(shard, lo, hi))
            at = hi
        end = max(at, span.next_lsn - 1)
        if target is not None and shard in target:
            end = max(at, min(end, target[shard]))
        if budget is not None:
            end = at + min(end - at, budget)
            budget -= end - at
        lsns[shard] = end
    return Offsets(lsns, lost), skips


def ranges(start: Offsets, end: Offsets, lsns_max: int) -> list[tuple[int, int, int]]:
    """(shard, lo, hi): the LSNs [lo, hi] a micro-batch reads, cut into pieces of at most
    `lsns_max` LSNs, in shard then LSN order."""
    assert lsns_max >= 1
    out: list[tuple[int, int, int]] = []
    for shard in sorted(end.lsns):
        lo = start.lsns.get(shard, end.lsns[shard]) + 1
        hi = end.lsns[shard]
        skipped = end.lost.get(shard)
        if skipped is not None and skipped != start.lost.get(shard):
            lo = max(lo, skipped.last[1] + 1)  # the batch skipped these: not read
        while lo <= hi:
            top = min(hi, lo + lsns_max - 1)
            out.append((shard, lo, top))
            lo = top + 1
    return out
