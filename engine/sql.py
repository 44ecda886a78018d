"""SQL over one snapshot of the engine (issue 24 item 1): DuckDB runs the query, and every
table it names is a stream out of the engine's own scan at that snapshot, with the query's
columns and filters pushed into the scan. The one module that imports DuckDB (an optional
extra: `pip install 'logsvc[sql]'`; without it `sql()` raises `SqlUnavailable`).

How the pushdown works. DuckDB's Python client scans a pyarrow `Dataset` by calling
`type(dataset).scanner(dataset, columns=[...], filter=<pyarrow Expression>)` with the columns
the query reads and the predicates it can hand over exactly (comparisons, IN, IS [NOT] NULL,
and AND/OR/NOT of those, of a column with constants; not those a NaN could change), and
drops those predicates from its own plan (duckdb/_sources/pyarrow.py, `PyArrowDatasetSource`
and `DatasetSource.stream`). `EngineTable` is such a dataset: an `InMemoryDataset` of the
table's empty schema whose `scanner` is the engine's `scan_stream(columns, filter)` on the
query's snapshot. So zonemaps prune persisted blocks by the very filter the engine's scan
then applies exactly (the same code and MVCC visibility as `TableHandle.scan`), only the
named columns are loaded, and rows stream a group of objects at a time
(`limits.SCAN_GROUP_ROWS`), with one group read ahead: a query that reads one column of 10M
rows holds two groups of that column, never the table. (DuckDB's own EXPLAIN over such a
dataset lists them as `Filters:` and `Projections:` under "Python Arrow Scan"; here
`ScanReport` says what reached each scan and how many blocks it read.) Other routes were
weaker: a RecordBatchReader or an object exporting `__arrow_c_stream__` is offered neither
columns nor filters; parsing DuckDB's plan ourselves would re-derive what its binder hands
the Dataset. A key filter (`id = 5`, `id >= a and id < b`) takes the scan's key path
(engine/scan.py): the blocks whose key ranges meet it, each sliced by binary search.

The direct path. A query over one table whose WHERE bounds the integer key is answered
before any of this (engine/sql_direct.py, engine/sql_keys.py): the engine reads the key rows
and DuckDB runs over just them, or, for a list of columns or plain aggregates, does not run
at all; a GROUP BY of one integer, BOOLEAN or VARCHAR column with plain integer or DOUBLE
aggregates and no WHERE or one of key bounds is grouped by the engine over its scan
(engine/sql_groups.py).
`python -m engine.bench scan` times the four queries through `sql` against DuckDB's
native table in the same run (README, "The engine's reads against DuckDB").

Threads. DuckDB runs each query on one thread (`limits.SQL_THREADS_MAX` says what two
threads, and two streams per table, measured) and pulls the stream from it.
Each step of the async scan (up to a group's rows) runs on the engine's event loop
(`run_coroutine_threadsafe`), the next one started before DuckDB consumes this one, and a
pull waits for it at most `SQL_PULL_WAIT_S_MAX`: the engine's state is still touched only on
its loop. The query itself runs on a thread of its own, not the loop's default executor: the
engine's object reads run there, and a query holding an executor thread while waiting for a
read queued behind it would deadlock.

One snapshot. The caller opens one read-only snapshot and holds it until DuckDB is done;
every table of the query (twice, for a self-join) is read at it.

Read-only and contained. Exactly one SELECT statement is run (DDL, DML, COPY, ATTACH, SET,
PRAGMA, EXPLAIN... are refused with `SqlError`). DuckDB is opened with file system access and
extension loading off and its configuration locked, so a query reads the snapshot's tables
and nothing else (`read_csv('/etc/passwd')` is a `SqlError`).

Names. A table is `db.table` (a DuckDB schema per database, a view per table) and also its
bare name when no other database has a table of that name (compared case-insensitively, as
DuckDB compares names). Only the tables whose names the query mentions are set up.

The pooled DuckDB databases, their views and results: engine/sql_databases.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine import limits, sql_direct
from engine import sql_databases as databases
from engine.errors import SqlError, SqlUnavailable
from engine.scan import ScanCounts, scan_stream
from engine.sql_databases import ScanReport

if TYPE_CHECKING:
    from engine.txn import TableHandle, Transaction

T = TypeVar("T")


async def run(view: Transaction, query: str, *, scans: list[ScanReport] | None = None) -> pa.Table:
    """`query` (one SELECT) over the snapshot `view`, as one Arrow table. `scans`, when given,
    receives a `ScanReport` per table stream the query read."""
    if not isinstance(query, str):
        raise SqlError(f"a query is a string, not {type(query).__name__}")
    if len(query) > limits.SQL_QUERY_CHARS_MAX:
        raise SqlError(f"a query is at most {limits.SQL_QUERY_CHARS_MAX} characters")
    duckdb = databases.duckdb_module()
    direct = await sql_direct.answer(duckdb, view, query, scans)
    if direct is not None:
        return direct
    loop = asyncio.get_running_loop()
    conn = _POOL.take(duckdb)
    state = _Query(loop, scans)
    running: concurrent.futures.Future[pa.Table] | None = None
    try:
        # On the loop: DuckDB's parser (tens of microseconds) and the snapshot's catalog.
        mentioned = _parse(duckdb, conn.parser, query)
        tables = databases.tables_named(view, mentioned)
        running = databases.QUERY_THREADS.submit(
            _execute, duckdb, conn, state, tables, mentioned, query
        )
        answer = asyncio.wrap_future(running)
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            # Stop DuckDB and wait (bounded) for its thread: the snapshot it reads closes next.
            answer.cancel()  # its outcome (DuckDB's "Interrupted") is nobody's to read
            conn.con.interrupt()
            await asyncio.to_thread(concurrent.futures.wait, [running], limits.SQL_PULL_WAIT_S_MAX)
            raise
    finally:
        _POOL.give(conn, healthy=running is None or running.done())


def _parse(duckdb: Any, con: Any, text: str) -> set[str]:
    """The bare names (lower case) of the tables `text` mentions, after checking it is one
    SELECT."""
    try:
        statements = con.extract_statements(text)
        if len(statements) != 1:
            raise SqlError(f"one SELECT statement at a time, not {len(statements)}")
        kind = statements[0].type
        if kind != duckdb.StatementType.SELECT:
            raise SqlError(f"SQL here is read-only: a single SELECT, not {kind.name}")
        return {name.lower() for name in con.get_table_names(text)}
    except duckdb.Error as exc:
        raise SqlError(databases.one_line(str(exc))) from None


class _Query:
    """What a query's DuckDB threads share with the loop side: the loop to run scan steps
    on, the first engine error a stream met (re-raised instead of DuckDB's rendering of
    it), and the scan reports."""

    def __init__(self, loop: asyncio.AbstractEventLoop, scans: list[ScanReport] | None) -> None:
        self.loop = loop
        self.scans = scans
        self.failure: BaseException | None = None
        self.lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the engine's loop (from a DuckDB thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(self, future: concurrent.futures.Future[T]) -> T:
        """What a submitted step returned, waiting at most `SQL_PULL_WAIT_S_MAX`."""
        try:
            return future.result(limits.SQL_PULL_WAIT_S_MAX)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise SqlError(
                f"the engine gave no rows for {limits.SQL_PULL_WAIT_S_MAX} s (is it closed?)"
            ) from None

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = error


class EngineTable(ds.InMemoryDataset):  # type: ignore[misc]  # (pyarrow has no stubs)
    """A table as DuckDB sees it: a pyarrow Dataset of the table's schema whose
    `scanner(columns=, filter=)` is the engine's scan (module docstring), of the snapshot
    it is bound to for the query running."""

    def __init__(self, source_name: str, qualified: str, schema: pa.Schema) -> None:
        super().__init__(schema.empty_table())
        self.source_name = source_name
        self.qualified = qualified
        self.declared = schema
        self._handle: TableHandle | None = None
        self._query: _Query | None = None

    def bind(self, handle: TableHandle | None, query: _Query | None) -> None:
        self._handle = handle
        self._query = query

    def unbind(self) -> None:
        self.bind(None, None)

    def scanner(
        self,
        columns: Sequence[str] | None = None,
        filter: pc.Expression | None = None,
        **_options: Any,
    ) -> _EngineScanner:
        handle, query = self._handle, self._query
        if handle is None or query is None:
            raise SqlError(f"{self.qualified} is not in this query's snapshot")
        return _EngineScanner(handle, self.declared, query, columns, filter)


class _EngineScanner:
    """What DuckDB asks of a scanner: `to_reader()`, a stream of the scan's rows."""

    def __init__(
        self,
        handle: TableHandle,
        schema: pa.Schema,
        query: _Query,
        columns: Sequence[str] | None,
        filter: pc.Expression | None,
    ) -> None:
        self._handle = handle
        self._query = query
        self._columns = list(columns) if columns is not None else None
        if self._columns == []:
            self._columns = schema.names[:1]  # a table of no columns cannot count its rows
        self._filter = filter
        names = self._columns if self._columns is not None else schema.names
        self.projected_schema = pa.schema([schema.field(n) for n in names])

    def to_reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.projected_schema, self._batches())

    def _batches(self) -> Iterator[pa.RecordBatch]:
        query, handle, schema = self._query, self._handle, self.projected_schema
        counts = ScanCounts()
        stream = scan_stream(handle, self._columns, self._filter, counts)

        async def step() -> tuple[list[pa.Table], bool]:
            """The next parts, up to about a group's rows (one hand-over to the loop for a
            pruned scan, not one per part), and whether the scan ended."""
            parts: list[pa.Table] = []
            rows = 0
            while rows < limits.SCAN_GROUP_ROWS:
                part = await anext(stream, None)
                if part is None:
                    return parts, True
                parts.append(part)
                rows += part.num_rows
            return parts, False

        # One step read ahead: the loop scans the next group while DuckDB consumes this one
        # (two cores busy, not one after the other); memory holds two groups at most.
        pending: concurrent.futures.Future[tuple[list[pa.Table], bool]] | None
        pending = query.submit(step())
        exhausted = False
        try:
            while pending is not None:
                parts, exhausted = query.wait(pending)
                pending = None if exhausted else query.submit(step())
                for part in parts:
                    yield from (
                        part if part.schema.equals(schema) else part.cast(schema)
                    ).to_batches()
        except GeneratorExit:
            raise
        except BaseException as exc:
            query.fail(exc)
            raise
        finally:
            if pending is not None:
                pending.cancel()  # a LIMIT stopped reading: the read-ahead is not needed
            if query.scans is not None:
                query.scans.append(
                    ScanReport(
                        handle.qualified,
                        self._columns,
                        str(self._filter) if self._filter is not None else None,
                        counts.blocks_visible,
                        counts.blocks_read,
                        counts.rows_out,
                    )
                )
            # Not awaited: the generator may be finalized on any thread, and the loop's
            # async-generator hooks close a stream left open anyway. A stream read to its
            # end is closed already: no wake-up of the loop for it.
            if not exhausted:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to close
                    query.loop.call_soon_threadsafe(_close_soon, stream)


_CLOSING: set[asyncio.Future[None]] = set()
"""Streams being closed on their loop (kept referenced until done)."""


async def _close(stream: Any) -> None:
    with contextlib.suppress(RuntimeError):  # still running a cancelled step: it ends itself
        await stream.aclose()


def _close_soon(stream: Any) -> None:
    closing = asyncio.ensure_future(_close(stream))
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)


def _execute(
    duckdb: Any,
    conn: databases.Connection,
    query: _Query,
    tables: list[tuple[str, str, TableHandle]],
    mentioned: set[str],
    text: str,
) -> pa.Table:
    """On the query's thread: the views its names need, then the query, collected."""
    try:
        sources = conn.prepare(tables, mentioned)
        for db, name, handle in tables:
            source = sources[(db, name)]
            assert isinstance(source, EngineTable)
            source.bind(handle, query)
        return databases.collect(databases.select(conn.con, text))
    except duckdb.Error as exc:
        if query.failure is not None:
            raise query.failure from None
        if isinstance(exc, duckdb.OutOfMemoryException):
            raise SqlError(
                f"the query needs more than {limits.SQL_MEMORY_BYTES_MAX} bytes "
                f"(limits.SQL_MEMORY_BYTES_MAX): {databases.one_line(str(exc))}"
            ) from None
        raise SqlError(databases.one_line(str(exc))) from None
    finally:
        conn.release()


_POOL = databases.Pool(limits.SQL_QUERIES_MAX, EngineTable, threads=limits.SQL_THREADS_MAX)


__all__ = ["ScanReport", "SqlError", "SqlUnavailable", "run"]
