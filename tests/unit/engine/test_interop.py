"""`scan()`'s Arrow output in pandas and DuckDB (issue 24 item 4; README "The engine").

Proves: `.to_pandas()` of a scan gives the dtypes the README promises (pandas 3: strings as
its `str` dtype with NaN for null; a nullable integer column with nulls as float64, the
pitfall; with `types_mapper=pd.ArrowDtype` every column keeps its exact type and nulls are
`pd.NA`, and the frame converts back to the same Arrow table); DuckDB queries a scan's table
in place: the query sees a value written into the scan's own Arrow buffer after the table
was registered, so DuckDB read those buffers, not a copy made when it was handed the table.

How: a memory-WAL engine whose rows are partly flushed into an object (Parquet) and partly
in memory, so the scan joins both; the buffer is written with ctypes after the engine is
closed (the scan's buffers may share memory with the engine's blocks).
"""

from __future__ import annotations

import asyncio
import ctypes
import datetime

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from engine import Column, Engine, Schema
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("customer", "int32", nullable=True),
        Column("amount", "float64", nullable=True),
        Column("note", "string", nullable=True),
        Column("day", "date32", nullable=True),
    ],
    primary_key=["id"],
)


async def scanned() -> pa.Table:
    """Rows 0..999 (a null in every fifth customer and note), 0..499 flushed into an object."""
    engine = await Engine.open(
        "unused", MemoryBackend(), objects=MemoryObjectStore(), maintenance=False
    )
    try:
        async with engine.transaction() as txn:
            await txn.create_database("shop")
            await txn.create_table("shop", "orders", SCHEMA)
        for first in (0, 500):
            rows = [
                {
                    "id": i,
                    "customer": None if i % 5 == 0 else i % 7,
                    "amount": i / 4,
                    "note": None if i % 5 == 0 else f"n{i}",
                    "day": datetime.date(2026, 1, 1 + i % 28),
                }
                for i in range(first, first + 500)
            ]
            async with engine.transaction() as txn:
                await txn.table("shop", "orders").insert(rows)
            if first == 0:
                assert engine.maintenance is not None
                await engine.maintenance.settle(freeze_all=True)
        async with engine.transaction() as txn:
            table = await txn.table("shop", "orders").scan()
        assert table.num_rows == 1000
        return table
    finally:
        await engine.close()


def test_to_pandas_gives_the_documented_dtypes_and_round_trips() -> None:
    table = asyncio.run(scanned())
    frame = table.to_pandas()
    assert frame["id"].dtype == np.int64
    assert frame["amount"].dtype == np.float64
    assert frame["customer"].dtype == np.float64  # nulls: plain pandas has no int with NaN
    assert isinstance(frame["note"].dtype, pd.StringDtype)  # pandas 3's `str`
    assert frame["note"].isna().sum() == 200
    assert frame["day"].dtype == object  # datetime.date values

    exact = table.to_pandas(types_mapper=pd.ArrowDtype)
    assert str(exact["customer"].dtype) == "int32[pyarrow]"
    assert str(exact["note"].dtype) == "string[pyarrow]"
    assert str(exact["day"].dtype) == "date32[day][pyarrow]"
    assert exact["customer"].isna().sum() == 200
    assert exact.loc[exact["id"] == 0, "customer"].iloc[0] is pd.NA
    back = pa.Table.from_pandas(exact, preserve_index=False)
    assert back.cast(table.schema).equals(table)


def test_duckdb_reads_the_scans_buffers_in_place() -> None:
    table = asyncio.run(scanned())
    connection = duckdb.connect()
    try:
        connection.register("orders", table)
        query = "select amount from orders where id = ?"
        # Find row id 1's amount in the scan's own buffers (whichever chunk holds it).
        ids = table.column("id")
        chunk_index, offset = next(
            (c, i)
            for c, chunk in enumerate(ids.chunks)
            for i, value in enumerate(chunk.to_pylist())
            if value == 1
        )
        amounts = table.column("amount").chunk(chunk_index)
        assert connection.execute(query, [1]).fetchone() == (0.25,)
        data = amounts.buffers()[1]
        assert data is not None
        address = data.address + (amounts.offset + offset) * 8
        assert np.frombuffer(ctypes.string_at(address, 8), dtype=np.float64)[0] == 0.25
        ctypes.memmove(address, np.array([12345.5], dtype=np.float64).tobytes(), 8)
        # Registered before the write, queried after it: DuckDB reads the same memory.
        assert connection.execute(query, [1]).fetchone() == (12345.5,)
        assert connection.execute("select count(*) from orders").fetchone() == (1000,)
    finally:
        connection.close()
