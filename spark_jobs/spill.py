"""A table's rows during replay, in bounded memory (issue 23: a Python worker's RSS bounded
whatever the log's size): `SortedRuns` holds rows keyed by (block_id, offset) until they
pass a byte bound, then writes them sorted as a *run* (an Arrow IPC file in a temporary
directory on local disk) and starts again; `live_table` merges the runs in key order,
drops the deleted and dropped rows as it goes and writes the result to one more file,
returned as a `SpilledTable` that hands its rows out a batch at a time. When nothing was
spilled, everything stays in memory and the result is a plain Arrow table, as before.

Order: rows are sorted by (key, seq). The key is `block_id << 32 | offset`; `seq` is given
by the caller (local_replay: the source, checkpoint < created block < appended, then the
order of arrival), so rows with one key come out in the order the in-memory path gives them.

Memory (each bound in spark_jobs/limits.py): the rows held before a spill
(REPLAY_ROWS_HELD_BYTES_MAX, Arrow bytes plus 16 bytes a row for key and seq), the deleted
keys held before theirs (the same bound, 8 bytes a key), and while merging one batch of at
most SPILL_BATCH_BYTES_MAX from each of at most SPILL_MERGE_FAN_IN runs (more runs are
merged a group at a time first). Python objects per row: none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.wal.from_numpy import arrow_array
from spark_jobs.errors import ReplayFailed
from spark_jobs.limits import SPILL_BATCH_BYTES_MAX, SPILL_MERGE_FAN_IN

KEY = "_key"
SEQ = "_seq"
KEY_BYTES = 16  # key and seq, per row

Keys = npt.NDArray[np.uint64]
Seqs = npt.NDArray[np.int64]


class SpillDir:
    """A temporary directory, made when first needed (in a Spark worker under the first of
    the executor's local directories, SPARK_LOCAL_DIRS, as pyspark's own spills; else in
    the system's temporary directory), removed by `close` or when the object is collected
    (or the process exits)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._path: str | None = None
        self._files = 0

    def new_file(self, stem: str) -> str:
        if self._path is None:
            local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")
            self._path = tempfile.mkdtemp(prefix=self.prefix, dir=local_dirs[0] or None)
            weakref.finalize(self, shutil.rmtree, self._path, True)
        self._files += 1
        return os.path.join(self._path, f"{stem}-{self._files:06d}.arrow")

    def close(self) -> None:
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


@dataclass(slots=True)
class _Part:
    keys: Keys
    seqs: Seqs
    rows: pa.Table | None  # None: keys only (deleted keys)


class SortedRuns:
    """Rows (or bare keys) arriving in any order, held up to `bytes_max`, spilled sorted.
    `schema`: the rows' Arrow schema once known (each part is cast to it when spilled or
    merged; None until then, and for bare keys)."""

    def __init__(self, bytes_max: int, spill: SpillDir, where: str, with_rows: bool) -> None:
        assert bytes_max > 0
        self.bytes_max = bytes_max
        self.spill_dir = spill
        self.where = where
        self.with_rows = with_rows
        self.schema: pa.Schema | None = None
        self.parts: list[_Part] = []
        self.held_bytes = 0
        self.peak_held_bytes = 0
        self.runs: list[str] = []
        self.spilled = 0  # runs written by `spill`
        self.rows = 0

    def add(self, keys: Keys, seqs: Seqs, rows: pa.Table | None = None) -> None:
        assert (rows is not None) == self.with_rows
        assert len(keys) == len(seqs) and (rows is None or rows.num_rows == len(keys))
        if not len(keys):
            return
        self.parts.append(_Part(keys, seqs, rows))
        self.rows += len(keys)
        self.held_bytes += KEY_BYTES * len(keys) + (0 if rows is None else rows.nbytes)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        if self.held_bytes > self.bytes_max:
            self.spill()

    def _cast(self, rows: pa.Table) -> pa.Table:
        if self.schema is None or rows.schema.equals(self.schema):
            return rows
        try:
            return rows.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ReplayFailed(f"{self.where}: rows do not fit the table's schema: {exc}") from None

    def take_held(self) -> tuple[Keys, Seqs, pa.Table | None]:
        """The rows held, sorted, and let go."""
        keys = np.concatenate([p.keys for p in self.parts]) if self.parts else _no_keys()
        seqs = np.concatenate([p.seqs for p in self.parts]) if self.parts else _no_seqs()
        rows = None
        if self.with_rows:
            parts = [self._cast(p.rows) for p in self.parts if p.rows is not None]
            try:
                rows = pa.concat_tables(parts) if parts else None
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ReplayFailed(
                    f"{self.where}: rows do not fit the table's schema: {exc}"
                ) from None
        self.parts = []
        self.held_bytes = 0
        if bool(np.all(keys[1:] > keys[:-1])):  # in order already (the usual log): no copy
            return keys, seqs, rows
        order = np.lexsort((seqs, keys))
        if rows is not None:
            rows = rows.take(arrow_array(order))
        return keys[order], seqs[order], rows

    def spill(self) -> None:
        """The rows held, sorted, as a new run."""
        if not self.parts:
            return
        keys, seqs, rows = self.take_held()
        path = self.spill_dir.new_file("run")
        _write_run(path, [(keys, seqs, rows)])
        self.runs.append(path)
        self.spilled += 1

    def drop_runs(self) -> None:
        """The runs' files removed (once merged)."""
        for path in self.runs:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        self.runs = []

    def merged(self) -> Iterator[tuple[Keys, Seqs, pa.Table | None]]:
        """Every row in (key, seq) order, a bounded chunk at a time: the runs (the rows still
        held are spilled first), merged SPILL_MERGE_FAN_IN at a time."""
        self.spill()
        while len(self.runs) > SPILL_MERGE_FAN_IN:
            group, self.runs = self.runs[:SPILL_MERGE_FAN_IN], self.runs[SPILL_MERGE_FAN_IN:]
            path = self.spill_dir.new_file("merged")
            _write_run(path, _merge(group, self._cast))
            for done in group:
                os.remove(done)
            self.runs.append(path)
        yield from _merge(self.runs, self._cast)


def _no_keys() -> Keys:
    return np.empty(0, dtype=np.uint64)


def _no_seqs() -> Seqs:
    return np.empty(0, dtype=np.int64)


Chunk = tuple[Keys, Seqs, pa.Table | None]


def _write_run(path: str, chunks: Iterable[Chunk]) -> None:
    """Chunks in order into one Arrow IPC file, in batches of at most SPILL_BATCH_BYTES_MAX
    (about: by the chunk's average row)."""
    writer = None
    try:
        for keys, seqs, rows in chunks:
            columns = [arrow_array(keys.astype(np.uint64)), arrow_array(seqs.astype(np.int64))]
            names = [KEY, SEQ]
            if rows is not None:
                columns += rows.columns
                names += rows.schema.names
            table = pa.Table.from_arrays(columns, names=names)
            if writer is None:
                writer = pa.ipc.new_file(pa.OSFile(path, "wb"), table.schema)
            per_row = max(1, table.nbytes // max(1, table.num_rows))
            writer.write_table(table, max_chunksize=max(1, SPILL_BATCH_BYTES_MAX // per_row))
    finally:
        if writer is not None:
            writer.close()


class _RunReader:
    """One run, a batch at a time (read, not memory-mapped: a mapping's touched pages count
    in the worker's RSS)."""

    def __init__(self, path: str) -> None:
        self.file = pa.OSFile(path, "rb")
        self.reader = pa.ipc.open_file(self.file)
        self.next_batch = 0
        self.keys: Keys = _no_keys()
        self.seqs: Seqs = _no_seqs()
        self.rows: pa.Table | None = None
        self.at = 0
        self.load()

    def load(self) -> bool:
        """The next batch, when there is one."""
        if self.next_batch >= self.reader.num_record_batches:
            self.file.close()
            return False
        batch = self.reader.get_batch(self.next_batch)
        self.next_batch += 1
        self.keys = batch.column(0).to_numpy()
        self.seqs = batch.column(1).to_numpy()
        table = pa.Table.from_batches([batch])
        self.rows = table.drop_columns([KEY, SEQ]) if table.num_columns > 2 else None
        self.at = 0
        return True

    @property
    def done(self) -> bool:
        return self.at >= len(self.keys)

    def take_upto(self, bound: int) -> list[tuple[Keys, Seqs, pa.Table | None]]:
        """Every row left with key <= bound (across batches: one key's rows are never split
        between two merged chunks)."""
        taken = []
        while not self.done:
            end = int(np.searchsorted(self.keys, np.uint64(bound), side="right"))
            if end <= self.at:
                break
            rows = None if self.rows is None else self.rows.slice(self.at, end - self.at)
            taken.append((self.keys[self.at : end], self.seqs[self.at : end], rows))
            self.at = end
            if self.done:
                self.load()
        return taken


def _merge(paths: list[str], cast: Callable[[pa.Table], pa.Table]) -> Iterator[Chunk]:
    readers = [reader for reader in (_RunReader(p) for p in paths) if not reader.done]
    while readers:
        bound = min(int(r.keys[-1]) for r in readers)  # the end of some reader's batch
        pieces = [piece for r in readers for piece in r.take_upto(bound)]
        readers = [r for r in readers if not r.done]
        keys = np.concatenate([p[0] for p in pieces])
        seqs = np.concatenate([p[1] for p in pieces])
        order = np.lexsort((seqs, keys))
        tables = [p[2] for p in pieces if p[2] is not None]
        rows = None
        if tables:
            rows = pa.concat_tables([cast(t) for t in tables]).take(arrow_array(order))
        yield keys[order], seqs[order], rows


@dataclass(frozen=True, slots=True)
class SpilledTable:
    """A table's rows in an Arrow IPC file on local disk (`batches` reads them one batch at a
    time); the file goes with `close` (output.write_table calls it once written) or with
    its SpillDir (kept alive by this reference)."""

    path: str
    schema: pa.Schema
    num_rows: int
    spill_dir: SpillDir

    def batches(self) -> Iterator[pa.RecordBatch]:
        with pa.OSFile(self.path, "rb") as file:
            reader = pa.ipc.open_file(file)
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index)

    def read_all(self) -> pa.Table:
        """The whole table in memory (tests, small tables)."""
        return pa.Table.from_batches(list(self.batches()), schema=self.schema)

    def close(self) -> None:
        """Its file removed (the other tables of its log keep theirs)."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


def key_of(block_ids: npt.NDArray[Any], offsets: npt.NDArray[Any]) -> Keys:
    """(block_id, offset) as one uint64 (offsets are u32: engine/FORMAT.md Append info)."""
    return (block_ids.astype(np.uint64) << np.uint64(32)) | offsets.astype(np.uint64)


def live_table(
    rows: SortedRuns,
    dead: SortedRuns,
    dropped: set[int],
    schema: pa.Schema,
) -> pa.Table | SpilledTable:
    """The rows in key order less those whose key `dead` holds or whose block is `dropped`:
    in memory when neither spilled, else merged from their runs into a SpilledTable."""
    rows.schema = schema
    dropped_ids = np.fromiter(dropped, np.uint64, count=len(dropped))
    if not rows.runs and not dead.runs:
        keys, _, table = rows.take_held()
        dead_keys, _, _ = dead.take_held()
        if table is None:
            return schema.empty_table()
        keep = np.ones(len(keys), dtype=bool)
        if len(dropped_ids):
            keep &= ~np.isin(keys >> np.uint64(32), dropped_ids)
        if len(dead_keys):
            keep &= ~np.isin(keys, dead_keys)
        return table if keep.all() else table.filter(arrow_array(keep))
    path = rows.spill_dir.new_file("live")
    count = 0
    dead_chunks = dead.merged()
    dead_held: Keys = _no_keys()
    dead_more = True
    writer = pa.ipc.new_file(pa.OSFile(path, "wb"), schema)
    try:
        for keys, _, table in rows.merged():
            assert table is not None
            top = keys[-1]
            while dead_more and (not len(dead_held) or dead_held[-1] < top):
                found = next(dead_chunks, None)
                if found is None:
                    dead_more = False
                else:  # keys below this chunk's are of no later chunk either
                    lo = keys[0]
                    dead_held = np.concatenate([dead_held[dead_held >= lo], found[0]])
            keep = np.ones(len(keys), dtype=bool)
            if len(dropped_ids):
                keep &= ~np.isin(keys >> np.uint64(32), dropped_ids)
            if len(dead_held):
                keep &= ~np.isin(keys, dead_held)
            dead_held = dead_held[dead_held > top]
            kept = table if keep.all() else table.filter(arrow_array(keep))
            count += kept.num_rows
            writer.write_table(kept)
    finally:
        writer.close()
    rows.drop_runs()
    dead.drop_runs()
    return SpilledTable(path, schema, count, rows.spill_dir)
