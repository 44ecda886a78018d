"""Level rows: the appended rows of one table, typed, with their row ids: (lsn, dsn, commit_ts,
block_id, offset) then the table's columns cast to the level's schema (schemas.rows_schema).

Read many entries at a time (spark_jobs/entries.py): the rows of one-append transactions come
out of `engine.wal.batch` as one Arrow batch per chunk and table, never one per entry; other
appends (Arrow IPC, several commands) are taken from their decoded entries. A chunk's rows are
handed out in entry order, in batches of at most BATCH_ROWS_MAX rows (plus one chunk's worth).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.wal.batch import KIND_ONE
from engine.wal.entry import Append, TxnEntry
from spark_jobs import schemas
from spark_jobs.entries import EntryChunk, entry_chunks
from spark_jobs.errors import InputCorrupt
from spark_jobs.filters import Bounds
from spark_jobs.inputs import Unit

BATCH_ROWS_MAX = 4096
"""Rows per Arrow batch handed out (the rows of one chunk are cut into batches this long)."""


def rows_level(
    unit: Unit, verify: str, bounds: Bounds, table_id: int, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The rows of table `table_id` in `unit` passing `bounds`."""
    ts_range = bounds.range("commit_ts")
    lo = ts_range.lo if ts_range.lo is not None else 0
    hi = ts_range.hi if ts_range.hi is not None else (1 << 64) - 1
    value_fields = list(schema)[len(schemas.ROWS_PREFIX) :]
    names = [f.name for f in value_fields]
    for chunk in entry_chunks(unit, verify, bounds.range("lsn"), bounds.range("dsn")):
        decoded = chunk.decoded
        wanted = decoded.is_txn
        if lo > 0:
            wanted = wanted & (decoded.commit_ts >= lo)
        if hi < (1 << 64) - 1:
            wanted = wanted & (decoded.commit_ts <= hi)
        parts: list[tuple[npt.NDArray[np.int64], pa.RecordBatch]] = []
        for rows in decoded.tables:
            if rows.table_id != table_id:
                continue
            keep = wanted[rows.entries]
            if not keep.any():
                continue
            if rows.columns.schema.names != names:
                dsn = int(decoded.dsns[rows.entries[0]])
                raise InputCorrupt("", 0, f"DSN {dsn}: the batch's columns are not the table's")
            entries = rows.entries[keep]
            columns = rows.columns if keep.all() else rows.columns.filter(pa.array(keep))
            parts.append(
                (
                    entries,
                    _with_prefix(
                        chunk,
                        entries,
                        rows.block_ids[keep].astype(np.int64),
                        rows.offsets[keep].astype(np.int64),
                        columns,
                        schema,
                        value_fields,
                    ),
                )
            )
        for index in np.flatnonzero(wanted & (decoded.kinds == KIND_ONE)).tolist():
            entry = decoded.entries[index]
            assert isinstance(entry, TxnEntry)
            for cmd in entry.commands:
                if isinstance(cmd, Append) and cmd.table_id == table_id:
                    parts.append(_exploded(chunk, index, cmd, schema, value_fields))
        if parts:
            yield from _in_entry_order(parts, schema)


def _with_prefix(
    chunk: EntryChunk,
    entries: npt.NDArray[np.int64],
    block_ids: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
    columns: pa.RecordBatch,
    schema: pa.Schema,
    value_fields: list[pa.Field],
) -> pa.RecordBatch:
    decoded = chunk.decoded
    prefix = [
        pa.array(chunk.lsns[entries], pa.int64()),
        pa.array(decoded.dsns[entries], pa.int64()),
        pa.array(decoded.commit_ts[entries].astype(np.int64), pa.int64()),
        pa.array(block_ids, pa.int64()),
        pa.array(offsets, pa.int64()),
    ]
    values = [
        column.cast(field.type) for column, field in zip(columns.columns, value_fields, strict=True)
    ]
    return pa.RecordBatch.from_arrays([*prefix, *values], schema=schema)


def _exploded(
    chunk: EntryChunk, index: int, cmd: Append, schema: pa.Schema, value_fields: list[pa.Field]
) -> tuple[npt.NDArray[np.int64], pa.RecordBatch]:
    block_ids: list[int] = []
    offsets: list[int] = []
    for info in cmd.infos:
        block_ids.extend([info.block_id] * info.rows)
        offsets.extend(range(info.offset, info.offset + info.rows))
    if [f.name for f in value_fields] != cmd.batch.schema.names:
        dsn = int(chunk.decoded.dsns[index])
        raise InputCorrupt("", 0, f"DSN {dsn}: the batch's columns are not the table's")
    entries = np.full(cmd.batch.num_rows, index, dtype=np.int64)
    batch = _with_prefix(
        chunk,
        entries,
        np.asarray(block_ids, dtype=np.int64),
        np.asarray(offsets, dtype=np.int64),
        cmd.batch,
        schema,
        value_fields,
    )
    return entries, batch


def _in_entry_order(
    parts: list[tuple[npt.NDArray[np.int64], pa.RecordBatch]], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    if len(parts) == 1:
        table = pa.Table.from_batches([parts[0][1]], schema=schema)
    else:
        order = np.argsort(np.concatenate([entries for entries, _ in parts]), kind="stable")
        table = pa.Table.from_batches([b for _, b in parts], schema=schema).take(pa.array(order))
    yield from table.combine_chunks().to_batches(max_chunksize=BATCH_ROWS_MAX)
