"""LogTail: the committed changes a compute node (CN) pulls or is pushed to catch up with the
TN (issue 15; seed 003_* Parts 3-5, "LogTail").

Why WAL entries (decision 0007): a CN keeps the same `EngineState` a TN keeps and applies the
same `TxnEntry` values through the same `EngineState.apply`, so it answers `scan`/`get` at a
timestamp exactly as the TN would. The changes of (t0, t1] are therefore the encoded entries
(engine/FORMAT.md) that became visible in that range, in commit order, each with its DSN.
They are whole entries (catalog changes, appends as Arrow batches, deletes by row id, block
creations and drops of rewrites), never anything uncommitted, and t1 is at most the TN's
visible timestamp.

The TN keeps the entries made visible since `base_ts` in a buffer bounded by bytes
(`LOGTAIL_BYTES_MAX`). A CN behind `base_ts` gets a checkpoint instead (its manifest name:
the CN reads its objects itself) plus the entries after it; so the buffer never drops entries
newer than the newest checkpoint while it can help it, and the TN takes a checkpoint when
the buffer fills.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.errors import EngineError


@dataclass(frozen=True, slots=True)
class TailEntry:
    commit_ts: int
    dsn: int
    payload: bytes
    """The encoded WAL entry (engine/FORMAT.md)."""


@dataclass(frozen=True, slots=True)
class Logtail:
    """The TN's answer for (t0, t1]: apply `checkpoint` first when there is one (the CN's
    state is replaced by the checkpoint's), then `entries`; the CN is then at `upto_ts`."""

    checkpoint: str | None
    checkpoint_ts: int
    entries: tuple[TailEntry, ...]
    upto_ts: int


class LogtailUnavailable(EngineError):
    """The buffer no longer holds what t0 needs and no checkpoint covers the gap yet. An
    `EngineError` like everything the engine raises (issue 20)."""


class LogtailBuffer:
    """Entries made visible since `base_ts` (every commit in (base_ts, last] is here), oldest
    first, at most `bytes_max` of payload. Pure; the engine feeds it in commit order."""

    def __init__(self, base_ts: int, bytes_max: int) -> None:
        assert bytes_max > 0
        self.base_ts = base_ts
        self.bytes_max = bytes_max
        self.bytes = 0
        # Kept as columns of ints and bytes, not a TailEntry per entry: a full buffer holds
        # a few hundred thousand one-row entries, and objects the garbage collector tracks
        # (a dataclass each) made every full collection walk them all (issue 21).
        self._stamps: deque[int] = deque()
        self._dsns: deque[int] = deque()
        self._payloads: deque[bytes] = deque()

    def __len__(self) -> int:
        return len(self._stamps)

    @property
    def last_ts(self) -> int:
        return self._stamps[-1] if self._stamps else self.base_ts

    def append(self, entry: TailEntry, keep_after_ts: int) -> None:
        """One more visible entry. Over `bytes_max`, the oldest go, but none after
        `keep_after_ts` (the newest checkpoint's ckp_ts: a CN behind the buffer needs the
        entries after it) while at most twice `bytes_max` is held."""
        assert entry.commit_ts > self.last_ts
        self._stamps.append(entry.commit_ts)
        self._dsns.append(entry.dsn)
        self._payloads.append(entry.payload)
        self.bytes += len(entry.payload)
        stamps = self._stamps
        while self.bytes > self.bytes_max and stamps:
            oldest_ts = stamps[0]
            if oldest_ts > keep_after_ts and self.bytes <= 2 * self.bytes_max:
                break
            stamps.popleft()
            self._dsns.popleft()
            self.bytes -= len(self._payloads.popleft())
            self.base_ts = oldest_ts

    def reset(self, base_ts: int) -> None:
        """Forget everything: the state now starts at `base_ts` (a restored checkpoint)."""
        self._stamps.clear()
        self._dsns.clear()
        self._payloads.clear()
        self.bytes = 0
        self.base_ts = base_ts

    def covers(self, t0: int) -> bool:
        return t0 >= self.base_ts

    def between(self, t0: int, t1: int) -> tuple[TailEntry, ...]:
        """The entries with t0 < commit_ts <= t1 (t0 >= base_ts)."""
        assert self.covers(t0)
        stamps = self._stamps
        lo = bisect.bisect_right(stamps, t0)
        hi = bisect.bisect_right(stamps, t1)
        stamps, dsns, payloads = self._stamps, self._dsns, self._payloads
        return tuple(TailEntry(stamps[i], dsns[i], payloads[i]) for i in range(lo, hi))

    def full(self) -> bool:
        return self.bytes > self.bytes_max


def answer(
    buffer: LogtailBuffer,
    t0: int,
    t1: int,
    visible_ts: int,
    checkpoints: Iterable[tuple[int, str]],
    objects_floor_ts: int = 0,
) -> Logtail:
    """What a CN at `t0` asking up to `t1` gets: entries when the buffer covers t0, else the
    newest checkpoint (ckp_ts, manifest name) the buffer continues, and the entries after it.
    Raises `LogtailUnavailable` when neither works.

    `objects_floor_ts`: the engine deleted objects whose blocks were dropped at or before it
    (a checkpoint covered their drop). Entries from below it may create such a block, and a
    CN applying them would look for an object that is gone (a fresh CN pulling from 0 found
    the soak run's ObjectNotFound): a CN below it starts from a checkpoint at or above it."""
    t1 = min(t1, visible_ts)
    if t1 <= t0:
        return Logtail(None, 0, (), t0)
    if buffer.covers(t0) and t0 >= objects_floor_ts:
        return Logtail(None, 0, buffer.between(t0, t1), t1)
    usable = [
        (ts, name) for ts, name in checkpoints if buffer.covers(ts) and objects_floor_ts <= ts <= t1
    ]
    if not usable:
        raise LogtailUnavailable(
            f"changes after {t0} are no longer in memory (kept from {buffer.base_ts}) and no "
            "checkpoint continues them yet"
        )
    ckp_ts, name = max(usable)
    return Logtail(name, ckp_ts, buffer.between(ckp_ts, t1), t1)
