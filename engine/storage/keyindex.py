"""A table's key index over its persisted blocks: which blocks can hold key K.

Why (issue 21, target 4): an insert must prove its key is not live. Asking every persisted
block whose key range holds K (and then its bloom filter) costs one probe per block, and with
random keys every block's range holds every key: 1,000 blocks, 1,000 probes per inserted key,
a commit rate that falls as the table grows. This index answers with the few blocks that
hold a key of the same fingerprint, in a cost that does not depend on the number of blocks
(a handful of binary searches, one per run, see below), never one probe per block.

Shape: an LSM of sorted numpy runs of `uint64` entries `(fingerprint << 32) | block_id`,
where the fingerprint is the high 32 bits of the key's hash (`engine.objects.bloom.key_hash`,
the hash the blocks' bloom filters use). Sorted by entry, one fingerprint's entries are
contiguous: a lookup is one `searchsorted` per run for [fp << 32, fp << 32 | 0xFFFFFFFF).

* `add(block_id, hashes)` makes a run of one block; runs are merged geometrically (a run is
  merged into the one before it while that one is less than `KEY_INDEX_RUN_RATIO` times
  larger), so runs number at most log_ratio(entries / smallest run) + 1 (5 for 10M keys in
  8,192-row blocks) and each entry is rewritten O(log) times in all. A merge is a stable
  sort of two sorted runs (timsort: a linear merge).
* Large merges leave the event loop (issue 21: merging 10M keys paused every commit for
  0.17 s): a merge of more than `merge_on_loop_max` entries is not done in place but offered
  as a `RunMerge` (`take_merge`), which the engine's maintenance runs in a worker thread (it
  reads two arrays no one changes: runs are replaced, never written) and hands back on the
  loop (`merged`), where it replaces its two runs if they are still there side by side (a
  purge or an inline merge meanwhile makes it stale: dropped). One merge is offered at a
  time. While it runs, lookups search both runs as before (correct, one more binary
  search), and merges that would touch them wait; past `KEY_INDEX_RUNS_MAX` runs a merge
  runs in place anyway, so an index whose merges nobody takes stays bounded.
* `remove(block_id)` only marks the block dead (lookups skip it); once dead entries pass
  `KEY_INDEX_DEAD_FRACTION` of the live ones every run is rewritten without them, so the
  index holds at most (1 + fraction) entries per live key.

Exact after verification: the answer is every block holding a key whose hash has K's
fingerprint, a superset of the blocks holding K (a false block with probability about
live keys / 2**32 per lookup: 0.2 % at 10M keys); the caller verifies with the block's sorted
keys (or first with its bloom filter). No block holding K is ever left out.

Memory: 8 bytes per key (10M keys: 80 MB; 100 MB at most with dead entries), plus a dict
entry per block. Block ids at or above 2**32 do not fit an entry: `fits(block_id)` says so
and the caller keeps such a block out of the index (its key range and bloom answer for it).

A pure class: no I/O, not thread-safe (the event loop owns it, as it owns TableData; only a
`RunMerge` runs in another thread).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine import limits
from engine.objects.bloom import key_hash

U64Array = npt.NDArray[np.uint64]

_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)
BLOCK_ID_END = (1 << 32) - 1
"""Block ids below this fit an entry (the low 32 bits; all ones is kept free so that the
probe `fp << 32 | 0xFFFFFFFF` lies above every entry of fingerprint fp)."""


def fingerprints(hashes: U64Array) -> U64Array:
    """The fingerprint of each key hash: its high 32 bits."""
    return hashes >> _SHIFT


def merge_runs(older: U64Array, newer: U64Array) -> U64Array:
    """One sorted run of two sorted runs (a new array; neither input is changed)."""
    merged = np.concatenate((older, newer))
    merged.sort(kind="stable")  # timsort: two sorted runs merge in linear time
    return merged


class RunMerge:
    """A merge of two adjacent runs that the index leaves to a worker thread (`KeyIndex.
    take_merge`): `run()` there, then `KeyIndex.merged(job, result)` on the loop."""

    __slots__ = ("newer", "older")

    def __init__(self, older: U64Array, newer: U64Array) -> None:
        self.older = older
        self.newer = newer

    @property
    def entries(self) -> int:
        return len(self.older) + len(self.newer)

    def run(self) -> U64Array:
        """The merged run (any thread: reads the two runs, which nothing writes)."""
        return merge_runs(self.older, self.newer)


class KeyIndex:
    """Which persisted blocks of one table may hold a key (see the module docstring)."""

    __slots__ = (
        "_dead",
        "_dead_entries",
        "_job",
        "_job_taken",
        "_live",
        "_live_entries",
        "_runs",
        "merge_on_loop_max",
        "merges_in_place",
        "merges_offloaded",
    )

    def __init__(self, *, merge_on_loop_max: int | None = None) -> None:
        self.merge_on_loop_max = (
            limits.KEY_INDEX_MERGE_ON_LOOP_ENTRIES_MAX
            if merge_on_loop_max is None
            else merge_on_loop_max
        )
        """Merges of at most this many entries run in place; larger ones in a thread."""
        self._job: RunMerge | None = None
        """The large merge offered (or running in a thread), if any: one at a time."""
        self._job_taken = False
        self.merges_in_place = 0
        self.merges_offloaded = 0
        """Merges swapped in from a worker thread (`merged`)."""
        self._runs: list[U64Array] = []
        """Sorted entry arrays, largest (oldest) first."""
        self._live: dict[int, int] = {}
        """block id -> its entries, for every block in the index."""
        self._dead: dict[int, int] = {}
        """block id -> its entries, for removed blocks whose entries are still in runs."""
        self._live_entries = 0
        self._dead_entries = 0

    # --- what it holds -----------------------------------------------------------------------

    @staticmethod
    def fits(block_id: int) -> bool:
        return 0 <= block_id < BLOCK_ID_END

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._live

    def __len__(self) -> int:
        """Blocks in the index."""
        return len(self._live)

    @property
    def entries(self) -> int:
        """Entries in the runs, dead ones included."""
        return self._live_entries + self._dead_entries

    @property
    def run_count(self) -> int:
        return len(self._runs)

    def size_bytes(self) -> int:
        """Bytes of the runs (the per-block dicts add about 100 bytes a block)."""
        return sum(int(run.nbytes) for run in self._runs)

    # --- changes -----------------------------------------------------------------------------

    def add(self, block_id: int, hashes: U64Array) -> None:
        """Index a block by the hashes of its keys (`engine.objects.bloom.key_hashes`)."""
        assert self.fits(block_id)
        assert block_id not in self._live
        assert block_id not in self._dead
        assert hashes.dtype == np.uint64
        self._live[block_id] = len(hashes)
        if not len(hashes):
            return
        run = (hashes & ~_LOW32) | np.uint64(block_id)
        run.sort()
        self._live_entries += len(run)
        self._runs.append(run)
        self._merge()

    def remove(self, block_id: int) -> None:
        """Forget a block (collected, or its table released). Unknown ids are ignored: a
        block that never fit, or was never indexed, has nothing here."""
        count = self._live.pop(block_id, None)
        if count is None:
            return
        self._live_entries -= count
        if not count:
            return
        self._dead[block_id] = count
        self._dead_entries += count
        if self._dead_entries > limits.KEY_INDEX_DEAD_FRACTION * max(self._live_entries, 1):
            self._purge()

    def clear(self) -> None:
        self._runs.clear()
        self._live.clear()
        self._dead.clear()
        self._live_entries = self._dead_entries = 0
        self._job = None
        self._job_taken = False

    def take_merge(self) -> RunMerge | None:
        """The large merge this index wants run off the loop, once (None: none is wanted,
        or it is taken already). Give it back with `merged` or `merge_abandoned`."""
        if self._job is None or self._job_taken:
            return None
        self._job_taken = True
        return self._job

    def merged(self, job: RunMerge, run: U64Array) -> bool:
        """`job` ran (`run` is its result): its two runs are replaced by `run` if they are
        still side by side here; False when the job went stale (dropped). Either way the
        next merge may be offered."""
        if self._job is job:
            self._job = None
            self._job_taken = False
        runs = self._runs
        swapped = False
        for at in range(len(runs) - 1):
            if runs[at] is job.older and runs[at + 1] is job.newer:
                assert len(run) == job.entries
                runs[at : at + 2] = [run]
                self.merges_offloaded += 1
                swapped = True
                break
        self._merge()
        return swapped

    def merge_abandoned(self, job: RunMerge) -> None:
        """`job` will not be run (its task was cancelled or failed): offer it again."""
        if self._job is job:
            self._job_taken = False

    def _merge(self, *, in_place: bool = False) -> None:
        """Merge while a run is less than `KEY_INDEX_RUN_RATIO` times larger than the next
        (the newest such pair first): in place when small (or `in_place`, or past
        `KEY_INDEX_RUNS_MAX` runs), else offered as the one `RunMerge`, and then stop."""
        runs = self._runs
        ratio = limits.KEY_INDEX_RUN_RATIO
        while True:
            at = len(runs) - 2
            while at >= 0 and len(runs[at]) >= ratio * len(runs[at + 1]):
                at -= 1
            if at < 0:
                return
            older, newer = runs[at], runs[at + 1]
            job = self._job
            small = len(older) + len(newer) <= self.merge_on_loop_max
            busy = job is not None and any(
                run is job.older or run is job.newer for run in (older, newer)
            )
            if in_place or len(runs) > limits.KEY_INDEX_RUNS_MAX or (small and not busy):
                runs[at : at + 2] = [merge_runs(older, newer)]
                self.merges_in_place += 1
                continue
            if job is None:
                self._job = RunMerge(older, newer)
            return

    def _purge(self) -> None:
        """Rewrite every run without the dead blocks' entries."""
        dead = np.fromiter(self._dead, dtype=np.uint64, count=len(self._dead))
        kept = []
        for run in self._runs:
            keep = run[~np.isin(run & _LOW32, dead)]
            if len(keep):
                kept.append(keep)
        # Purging shrinks runs unevenly: merge back into the geometric shape from the left
        # (in place: the purge itself read every run here). A merge offered before is stale.
        self._job = None
        self._job_taken = False
        self._runs = []
        for run in kept:
            self._runs.append(run)
            self._merge(in_place=True)
        self._dead.clear()
        self._dead_entries = 0

    # --- lookups -----------------------------------------------------------------------------

    def blocks_for_key(self, key: object) -> list[int]:
        """The ids of the blocks that may hold `key` (a key as engine.schema gives it)."""
        return self.blocks_for_hash(key_hash(key))

    def blocks_for_hash(self, hashed: int) -> list[int]:
        """The ids of the blocks that may hold a key whose `key_hash` is `hashed`."""
        if not self._runs:
            return []
        low = (hashed >> 32) << 32
        probe = np.array((low, low | 0xFFFFFFFF), dtype=np.uint64)
        out: list[int] = []
        dead = self._dead
        for run in self._runs:
            start, end = run.searchsorted(probe).tolist()  # Python ints: cheaper compares
            if end > start:
                for entry in run[start:end].tolist():
                    block_id = entry & 0xFFFFFFFF
                    # Two keys of a block may share a fingerprint: name the block once.
                    if block_id not in dead and block_id not in out:
                        out.append(block_id)
        return out

    def blocks_for_hashes(self, hashes: U64Array) -> list[list[int]]:
        """`blocks_for_hash` of each hash, one binary search per run for all of them."""
        out: list[list[int]] = [[] for _ in range(len(hashes))]
        if not self._runs or not len(hashes):
            return out
        lows = hashes & ~_LOW32
        highs = lows | _LOW32
        dead = self._dead
        for run in self._runs:
            starts = run.searchsorted(lows)
            ends = run.searchsorted(highs)
            for at in np.flatnonzero(ends > starts).tolist():
                for entry in run[starts[at] : ends[at]].tolist():
                    block_id = entry & 0xFFFFFFFF
                    if block_id not in dead and block_id not in out[at]:
                        out[at].append(block_id)
        return out
