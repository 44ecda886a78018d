"""The scan behind a GROUP BY the engine answers itself (engine/sql_groups.py says which and
how; engine/sql_direct.py takes the query and finds DuckDB's answer schema).

The snapshot's rows come from `scan_stream` (the same code and MVCC visibility as
`TableHandle.scan`: old snapshots across merges, a transaction's own writes, deletes), a
part (up to a group of persisted blocks, `limits.SCAN_GROUP_ROWS`) at a time. Each part is
folded into the group state on a query thread while the loop scans the next one, so the
loop never runs numpy over millions of rows and two cores stay busy; memory holds the state
and two parts of the columns read, never the table. The parts are folded one after another
in scan order (a DOUBLE sum's additions are in row order, as DuckDB's). The query holds
its direct-path database (engine/sql_direct.py) until it is answered, so grouped queries
count against `limits.SQL_QUERIES_MAX` like every other query (past it: `Overloaded`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from engine import sql_databases as databases
from engine.scan import ScanCounts, scan_stream
from engine.sql_groups import BoundGrouping, GroupTable

if TYPE_CHECKING:
    from engine.txn import TableHandle


async def answer(
    handle: TableHandle,
    bound: BoundGrouping,
    key_filter: pc.Expression | None,
    schema: pa.Schema,
    scans: list[databases.ScanReport] | None,
    *,
    nothing: bool = False,
) -> pa.Table | None:
    """The GROUP BY's answer in DuckDB's answer `schema` over the rows of `handle` that
    `key_filter` keeps (None: all; `nothing`: the key bounds keep no row, no scan); None
    when its groups or rows outgrew what engine/sql_groups.py keeps (DuckDB then runs it)."""
    table = GroupTable(bound)
    if nothing:
        return table.result(schema)
    counts = ScanCounts()
    read = bound.read
    stream = scan_stream(handle, read, key_filter, counts)
    folding: asyncio.Future[bool] | None = None
    try:
        async for part in stream:
            if folding is not None and not await folding:
                return None
            folding = asyncio.wrap_future(databases.QUERY_THREADS.submit(table.add, part))
        if folding is not None and not await folding:
            return None
    finally:
        await stream.aclose()
        if folding is not None and not folding.done():
            # Cancelled while a part is folded: that thread ends by itself (the state is
            # this call's alone); its outcome is nobody's to read.
            folding.cancel()
    if scans is not None:
        scans.append(
            databases.ScanReport(
                handle.qualified,
                read,
                str(key_filter) if key_filter is not None else None,
                counts.blocks_visible,
                counts.blocks_read,
                counts.rows_out,
            )
        )
    return table.result(schema)
