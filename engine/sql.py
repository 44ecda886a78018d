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

The direct path. Planning and scanning a Python dataset costs DuckDB ~1 ms even for one row
(three times its own point lookup), and a streamed query makes four hand-overs between the
loop and the query's thread, each waiting for a core on a loaded machine. So a query over
one table whose WHERE bounds the integer key (engine/sql_keys.py says exactly which) is
answered before any of that (`_direct`): its template's plan is kept (DuckDB's parse tree,
read once per template), the engine reads the key rows at the snapshot (a point through the
key index as `get` does, a range through the scan's key path, at most
`SQL_DIRECT_ROWS_MAX` rows of blocks), and DuckDB runs the query over them as a plain Arrow
stream (`RowsTable`: nothing to plan, nothing pushed down, DuckDB applies the whole WHERE
itself), on the loop when the query is sums and comparisons over at most
`SQL_INLINE_ROWS_MAX` rows, on the query's thread otherwise. A query that only lists
columns with a WHERE of key bounds alone is answered with the rows, in DuckDB's answer
schema (found once by running the query over no rows; any type DuckDB would change keeps
DuckDB running). Anything else, and any DuckDB error on the direct path, is streamed as
above, so errors read as they always did. `python -m engine.bench scan` times the four
queries through `sql` against DuckDB's native table in the same run (README, "The engine's
reads against DuckDB"). A large scan streams at about the engine's scan speed.

Threads. DuckDB runs each query on one thread (`limits.SQL_THREADS_MAX`: an engine table is
one Arrow stream, which DuckDB scans on one thread anyway) and pulls the stream from it.
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

Connections. Opening a DuckDB database costs ~15 ms, more than a range query, so a pool
keeps up to `SQL_QUERIES_MAX` in-memory databases for the process, one per running query
(so two queries at different snapshots never share a catalog), and as many for the direct
path, whose views read `RowsTable`s. A database keeps its views between queries and makes
them again only when the tables a query names changed (`_Connection`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from engine import limits, sql_keys
from engine.errors import Overloaded, SqlError, SqlUnavailable
from engine.scan import ScanCounts, integer_key, key_point, key_rows_bound, scan_stream

if TYPE_CHECKING:
    from engine.schema import Schema
    from engine.txn import TableHandle, Transaction

T = TypeVar("T")

RESULT_BATCH_ROWS = 65_536
"""Rows per Arrow batch of a result as DuckDB hands it over (the byte limit is checked
after each)."""


@dataclass(frozen=True, slots=True)
class ScanReport:
    """One table scan a query made: what DuckDB pushed into it and what it read."""

    table: str
    columns: list[str] | None
    filter: str | None
    blocks_visible: int
    blocks_read: int
    rows_out: int


async def run(view: Transaction, query: str, *, scans: list[ScanReport] | None = None) -> pa.Table:
    """`query` (one SELECT) over the snapshot `view`, as one Arrow table. `scans`, when given,
    receives a `ScanReport` per table stream the query read."""
    if not isinstance(query, str):
        raise SqlError(f"a query is a string, not {type(query).__name__}")
    if len(query) > limits.SQL_QUERY_CHARS_MAX:
        raise SqlError(f"a query is at most {limits.SQL_QUERY_CHARS_MAX} characters")
    duckdb = _duckdb()
    direct = await _direct(duckdb, view, query, scans)
    if direct is not None:
        return direct
    loop = asyncio.get_running_loop()
    conn = _POOL.take(duckdb)
    state = _Query(loop, scans)
    running: concurrent.futures.Future[pa.Table] | None = None
    try:
        # On the loop: DuckDB's parser (tens of microseconds) and the snapshot's catalog.
        mentioned = _parse(duckdb, conn.parser, query)
        tables = _tables_named(view, mentioned)
        running = _THREADS.submit(_execute, duckdb, conn, state, tables, mentioned, query)
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


_THREADS = concurrent.futures.ThreadPoolExecutor(
    limits.SQL_QUERIES_MAX * 2, thread_name_prefix="engine-sql"
)
"""The threads queries run on: not the loop's default executor, where the engine's object
reads run (a query waiting for a read queued behind itself would deadlock). Twice the pool:
an interrupted query that has not stopped yet still holds its thread."""


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
        raise SqlError(_one_line(str(exc))) from None


def _tables_named(view: Transaction, mentioned: set[str]) -> list[tuple[str, str, TableHandle]]:
    """The snapshot's tables whose bare names the query mentions (case-insensitively, as
    DuckDB compares names); two that only case tells apart are refused."""
    found = []
    seen: dict[tuple[str, str], str] = {}
    for db in view.databases():
        for name in view.tables(db):
            if name.lower() not in mentioned:
                continue
            folded = (db.lower(), name.lower())
            if folded in seen:
                raise SqlError(
                    f"tables {seen[folded]} and {db}.{name} differ only in case: SQL names "
                    "ignore case, so it cannot tell them apart"
                )
            seen[folded] = f"{db}.{name}"
            found.append((db, name, view.table(db, name)))
    return found


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
    conn: _Connection,
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
        return _collect(_select(conn.con, text))
    except duckdb.Error as exc:
        if query.failure is not None:
            raise query.failure from None
        if isinstance(exc, duckdb.OutOfMemoryException):
            raise SqlError(
                f"the query needs more than {limits.SQL_MEMORY_BYTES_MAX} bytes "
                f"(limits.SQL_MEMORY_BYTES_MAX): {_one_line(str(exc))}"
            ) from None
        raise SqlError(_one_line(str(exc))) from None
    finally:
        conn.release()


class _Connection:
    """One pooled DuckDB database and the views it keeps between queries: `"db"."t"` (and
    `main."t"` for a bare name) over a source registered once per table and schema (an
    `EngineTable`, or for the direct path a `RowsTable`), bound to each query's snapshot or
    rows while it runs. DDL runs only when the tables a query
    names changed (a new table, a new schema, a dropped table, a bare name that became
    ambiguous): creating views costs milliseconds, more than a range query."""

    def __init__(self, con: Any, parser: Any, kind: type[EngineTable | RowsTable]) -> None:
        self.con = con
        self.kind = kind
        # An empty database to read a query's table names: on `con` they would come out
        # through its views, as the names of the sources they read.
        self.parser = parser
        self.sources: dict[tuple[str, str], EngineTable | RowsTable] = {}
        self.bare: dict[str, tuple[str, str]] = {}  # lower-case name -> table of main."name"
        self.registered = 0

    def prepare(
        self, tables: list[tuple[str, str, TableHandle]], mentioned: set[str]
    ) -> dict[tuple[str, str], EngineTable | RowsTable]:
        """The views the query's names need, made or dropped; the sources by table."""
        current = {(db, name): handle for db, name, handle in tables}
        # Views of a mentioned name the snapshot does not hold go, so the binder says so.
        for key in [k for k in self.sources if k[1].lower() in mentioned and k not in current]:
            self._drop(key)
        for (db, name), handle in current.items():
            schema = _arrow_schema(handle.schema)
            source = self.sources.get((db, name))
            if source is None or not source.declared.equals(schema):
                if source is not None:
                    self._drop((db, name))
                source = self._create(db, name, schema)
        for lower in mentioned:
            owners = [key for key in current if key[1].lower() == lower]
            want = owners[0] if len(owners) == 1 and owners[0][0].lower() != "main" else None
            had = self.bare.get(lower)
            if had == want:
                continue
            if had is not None:
                self.con.execute(f"drop view if exists main.{_quote(had[1])}")
                del self.bare[lower]
            if want is not None:
                self.con.execute(
                    f"create or replace view main.{_quote(want[1])} as select * from "
                    f"{self.sources[want].source_name}"
                )
                self.bare[lower] = want
        return self.sources

    def release(self) -> None:
        """Unbind every table: nothing keeps the query's snapshot alive."""
        for source in self.sources.values():
            source.unbind()

    def _create(self, db: str, name: str, schema: pa.Schema) -> EngineTable | RowsTable:
        self.registered += 1
        source = self.kind(f"_engine_table_{self.registered}", f"{db}.{name}", schema)
        self.con.register(source.source_name, source)
        self.con.execute(f"create schema if not exists {_quote(db)}")
        self.con.execute(
            f"create or replace view {_quote(db)}.{_quote(name)} as select * from "
            f"{source.source_name}"
        )
        self.sources[(db, name)] = source
        return source

    def _drop(self, key: tuple[str, str]) -> None:
        source = self.sources.pop(key)
        self.con.execute(f"drop view if exists {_quote(key[0])}.{_quote(key[1])}")
        if self.bare.get(key[1].lower()) == key:
            self.con.execute(f"drop view if exists main.{_quote(key[1])}")
            del self.bare[key[1].lower()]
        self.con.unregister(source.source_name)


def _select(con: Any, text: str) -> pa.RecordBatchReader:
    """The rows of the one SELECT `text` (checked by `_parse`), streamed as Arrow.

    DuckDB 2.0.1's public route, `con.sql(text).to_arrow_reader()`, binds the statement to
    build a lazy relation (its names and types) and parses it as a script, then submits the
    same text, which binds it again: ~0.4 ms of a ~1.1 ms point query (measured on a
    one-row Python dataset, threads=1). The relation's `to_arrow_reader` is a thin call to the
    connection's `_submit(text, values, "stream", batch_rows)`; calling that directly skips
    the extra bind. It is private, so it is used only where it exists (the pinned 2.0.1:
    tests/unit/engine/test_sql.py checks it answers as the public route does) and the
    public route is the fallback."""
    submit = getattr(con, "_submit", None)
    if submit is None:
        return con.sql(text).to_arrow_reader(RESULT_BATCH_ROWS)
    return submit(text, None, "stream", RESULT_BATCH_ROWS).arrow_reader()


def _collect(reader: pa.RecordBatchReader) -> pa.Table:
    batches = []
    size_bytes = 0
    with reader:
        for batch in reader:
            size_bytes += batch.nbytes
            if size_bytes > limits.SQL_RESULT_BYTES_MAX:
                raise SqlError(
                    f"the result passes {limits.SQL_RESULT_BYTES_MAX} bytes "
                    "(limits.SQL_RESULT_BYTES_MAX): add a LIMIT, aggregate, or page by key"
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _one_line(message: str) -> str:
    """DuckDB's message on one line: its position marker line (`^^^`) dropped."""
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and set(line) != {"^"})


class _Pool:
    """Up to `SQL_QUERIES_MAX` DuckDB databases, one per running query (module docstring);
    a query past that is `Overloaded`, not queued."""

    def __init__(self, size_max: int, kind: type[EngineTable | RowsTable] = EngineTable) -> None:
        self._size_max = size_max
        self._kind = kind
        self._lock = threading.Lock()
        self._idle: list[_Connection] = []
        self._busy = 0

    def take(self, duckdb: Any) -> _Connection:
        with self._lock:
            if self._busy >= self._size_max:
                raise Overloaded("SQL queries running", self._size_max)
            self._busy += 1
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            return conn
        try:
            return _Connection(_connect(duckdb), _connect(duckdb), self._kind)
        except BaseException:
            with self._lock:
                self._busy -= 1
            raise

    def give(self, conn: _Connection, *, healthy: bool) -> None:
        """Back in the pool; one whose query did not stop, or that holds more views than
        `SQL_VIEWS_KEPT_MAX`, is closed instead."""
        with self._lock:
            self._busy -= 1
            if healthy and len(conn.sources) <= limits.SQL_VIEWS_KEPT_MAX:
                self._idle.append(conn)
                return
        conn.con.close()
        conn.parser.close()


_POOL = _Pool(limits.SQL_QUERIES_MAX)


# --- The direct path (engine/sql_keys.py) -------------------------------------------------------


class RowsTable:
    """A table as the direct path hands it to DuckDB: rows the engine's scan has read, as an
    Arrow stream DuckDB reads whole (no dataset to plan, nothing pushed down: DuckDB applies
    the query's WHERE itself). Registered once per pooled database, like `EngineTable`; each
    query binds the rows it read. A query's view is bound to the rows' own schema, so a
    column left out of them is a binder error, never a null."""

    def __init__(self, source_name: str, qualified: str, schema: pa.Schema) -> None:
        self.source_name = source_name
        self.qualified = qualified
        self.declared = schema
        self._rows: pa.Table | None = None

    def bind(self, rows: pa.Table | None) -> None:
        self._rows = rows

    def unbind(self) -> None:
        self._rows = None

    def __arrow_c_schema__(self) -> object:
        rows = self._rows
        return (self.declared if rows is None else rows.schema).__arrow_c_schema__()

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        rows = self._rows
        if rows is None:
            raise SqlError(f"{self.qualified} is not in this query's snapshot")
        return rows.__arrow_c_stream__(requested_schema)


_ROWS_POOL = _Pool(limits.SQL_QUERIES_MAX, RowsTable)
"""Databases whose views read `RowsTable`s: up to `SQL_QUERIES_MAX` direct queries at once,
beside as many streamed ones."""


class _Template:
    """A template's plan (None: the direct path does not take it), and for a plan that only
    projects columns, DuckDB's answer schema per table schema (None: DuckDB's types differ
    from the table's, so DuckDB must run)."""

    __slots__ = ("answers", "plan")

    def __init__(self, plan: sql_keys.KeyPlan | None) -> None:
        self.plan = plan
        # By the id of the table's `Schema` (kept in the value: an id is only unique while
        # its object lives); hashing a pyarrow schema per query costs more than the lookup.
        self.answers: dict[int, tuple[Schema, pa.Schema | None]] = {}


_TEMPLATES: OrderedDict[str, _Template] = OrderedDict()
_TEMPLATES_LOCK = threading.Lock()


async def _direct(
    duckdb: Any, view: Transaction, query: str, scans: list[ScanReport] | None
) -> pa.Table | None:
    """The answer by the direct path (engine/sql_keys.py), or None when it does not apply:
    one table whose integer key the WHERE bounds to at most `SQL_DIRECT_ROWS_MAX` rows of
    persisted blocks. The engine reads those rows at the snapshot (a point through the key
    index as `get`, a range through `scan`'s key path, or `scan` for a transaction's own
    writes: `scan`'s visibility), then DuckDB runs the query over them, on the loop when the
    query is cheap and the rows few (`SQL_INLINE_ROWS_MAX`: no hand-over to a thread), or a
    query that only lists columns is answered with the rows themselves. Any DuckDB error
    sends the query down the streamed path, which reports it as always."""
    if len(query) > limits.SQL_DIRECT_QUERY_CHARS_MAX:
        return None
    numeric = duckdb.token_type.numeric_const
    try:
        tokens = duckdb.tokenize(query)
    except duckdb.Error:
        return None
    found = sql_keys.template(query, [p for p, kind in tokens if kind == numeric])
    if found is None:
        return None
    text, values = found
    conn = _ROWS_POOL.take(duckdb)
    running: concurrent.futures.Future[pa.Table] | None = None
    try:
        entry = _template(duckdb, conn, text, len(values))
        plan = entry.plan
        if plan is None:
            return None
        tables = _tables_named(view, {plan.table})
        target = _target(tables, plan)
        if target is None:
            return None
        db, name, handle = target
        key = integer_key(handle)
        if key is None:
            return None
        schema = _arrow_schema(handle.schema)
        bounds = sql_keys.key_bounds(plan, key, schema.names, values)
        if bounds is None:
            return None
        key_type = schema.field(key).type
        low, high = _type_min(key_type), _type_max(key_type)
        lo, hi = max(bounds.lo, low), min(bounds.hi, high)
        field = pc.field(key)
        if lo >= hi:  # a point, or nothing (lo > hi): the bloom filter answers a point
            key_filter = field == pa.scalar(max(low, min(lo, high)), key_type)
        elif lo > low and hi < high:
            key_filter = (field >= pa.scalar(lo, key_type)) & (field <= pa.scalar(hi, key_type))
        elif lo > low:  # (the type's own end is not written: the key path reads it whole)
            key_filter = field >= pa.scalar(lo, key_type)
        elif hi < high:
            key_filter = field <= pa.scalar(hi, key_type)
        else:
            return None
        point = lo == hi and bounds.points is None
        if not point:
            rows_max = key_rows_bound(handle, key_filter)
            if rows_max is None or rows_max > limits.SQL_DIRECT_ROWS_MAX:
                return None
        answer_columns = sql_keys.projected(plan, schema.names) if bounds.exact else None
        answer_schema = None
        if answer_columns is not None:
            answer_schema = _answer_schema(
                duckdb, conn, entry, tables, db, name, handle.schema, schema, query
            )
        read = list(dict.fromkeys(answer_columns)) if answer_columns and answer_schema else None
        if read is None:
            read = sql_keys.columns_read(plan, schema.names)
        if bounds.points is not None and read is not None and key not in read:
            read = [c for c in schema.names if c in read or c == key]
        counts = ScanCounts()  # (a point read through the key index counts no blocks)
        names = read if read is not None else schema.names
        rows = schema.empty_table().select(names) if lo > hi else None
        if rows is None and point:  # through the key index, as `get` reads a row
            rows = await key_point(handle, lo, names)
        if rows is None:
            parts = [p async for p in scan_stream(handle, read, key_filter, counts)]
            rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if bounds.points is not None:
            points = pa.array(sorted(bounds.points), type=key_type)
            rows = rows.filter(pc.is_in(rows.column(key), value_set=points))
        if scans is not None:
            scans.append(
                ScanReport(
                    handle.qualified,
                    read,
                    str(key_filter),
                    counts.blocks_visible,
                    counts.blocks_read,
                    rows.num_rows,
                )
            )
        if answer_schema is not None and answer_columns is not None:
            return pa.Table.from_arrays(
                [rows.column(c) for c in answer_columns], schema=answer_schema
            )
        _rows_source(conn, tables, plan, db, name).bind(rows)
        if plan.cheap and rows.num_rows <= limits.SQL_INLINE_ROWS_MAX:
            return _rows_answer(duckdb, conn, query)
        running = _THREADS.submit(_rows_answer, duckdb, conn, query)
        answer = asyncio.wrap_future(running)
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            answer.cancel()
            conn.con.interrupt()
            await asyncio.to_thread(concurrent.futures.wait, [running], limits.SQL_PULL_WAIT_S_MAX)
            raise
    finally:
        conn.release()
        _ROWS_POOL.give(conn, healthy=running is None or running.done())


def _rows_answer(duckdb: Any, conn: _Connection, query: str) -> pa.Table | None:
    """DuckDB's answer over the bound rows; None (take the streamed path) for its errors."""
    try:
        return _collect(_select(conn.con, query))
    except duckdb.Error:
        return None


def _template(duckdb: Any, conn: _Connection, text: str, values_count: int) -> _Template:
    """The kept plan of a template, read from DuckDB's parse tree the first time."""
    with _TEMPLATES_LOCK:
        entry = _TEMPLATES.get(text)
        if entry is not None:
            _TEMPLATES.move_to_end(text)
            return entry
    try:
        [(serialized,)] = conn.parser.execute("select json_serialize_sql(?)", [text]).fetchall()
        plan = sql_keys.analyse(json.loads(serialized), values_count)
    except (duckdb.Error, ValueError):
        plan = None
    entry = _Template(plan)
    with _TEMPLATES_LOCK:
        _TEMPLATES[text] = entry
        while len(_TEMPLATES) > limits.SQL_TEMPLATES_KEPT_MAX:
            _TEMPLATES.popitem(last=False)
    return entry


def _target(
    tables: list[tuple[str, str, TableHandle]], plan: sql_keys.KeyPlan
) -> tuple[str, str, TableHandle] | None:
    """Of the snapshot's tables named as the plan's FROM, the one it means, resolved as the
    views resolve it (`db.t`, or a bare `t` / `main.t` when one database has a `t`); None
    when none or several."""
    if plan.schema and plan.schema != "main":
        found = [t for t in tables if t[0].lower() == plan.schema]
    else:
        found = [t for t in tables if t[0].lower() == "main"] if plan.schema else []
        found = found or (tables if len(tables) == 1 else [])
    return found[0] if len(found) == 1 else None


def _answer_schema(
    duckdb: Any,
    conn: _Connection,
    entry: _Template,
    tables: list[tuple[str, str, TableHandle]],
    db: str,
    name: str,
    declared: Schema,
    schema: pa.Schema,
    query: str,
) -> pa.Schema | None:
    """DuckDB's answer schema for a query that only lists columns (its names, its types),
    from running it once over no rows; None when a type differs from the column's, so the
    rows cannot stand for DuckDB's answer."""
    kept = entry.answers.get(id(declared))
    if kept is not None and kept[0] is declared:
        return kept[1]
    plan = entry.plan
    assert plan is not None
    columns = sql_keys.projected(plan, schema.names)
    assert columns is not None
    source = _rows_source(conn, tables, plan, db, name)
    source.bind(schema.empty_table())
    try:
        empty = _rows_answer(duckdb, conn, query)
    finally:
        source.unbind()
    found: pa.Schema | None = None
    if (
        empty is not None
        and len(empty.schema) == len(columns)
        and all(f.type == schema.field(c).type for f, c in zip(empty.schema, columns, strict=True))
    ):
        found = empty.schema
    if len(entry.answers) < limits.SQL_TEMPLATE_SCHEMAS_MAX:
        entry.answers[id(declared)] = (declared, found)
    return found


_ARROW_SCHEMAS: dict[int, tuple[Schema, pa.Schema]] = {}
"""Tables' Arrow schemas by the id of their `Schema` (`Schema.to_arrow` builds a new one
per call); cleared past `SQL_TEMPLATES_KEPT_MAX` entries."""


def _arrow_schema(declared: Schema) -> pa.Schema:
    kept = _ARROW_SCHEMAS.get(id(declared))
    if kept is not None and kept[0] is declared:
        return kept[1]
    schema = declared.to_arrow()
    if len(_ARROW_SCHEMAS) >= limits.SQL_TEMPLATES_KEPT_MAX:
        _ARROW_SCHEMAS.clear()
    _ARROW_SCHEMAS[id(declared)] = (declared, schema)
    return schema


def _rows_source(
    conn: _Connection,
    tables: list[tuple[str, str, TableHandle]],
    plan: sql_keys.KeyPlan,
    db: str,
    name: str,
) -> RowsTable:
    """The direct query's table as its database's views read it (made if new)."""
    source = conn.prepare(tables, {plan.table})[(db, name)]
    assert isinstance(source, RowsTable)  # (a `_ROWS_POOL` database)
    return cast(RowsTable, source)  # (mypy: EngineTable derives from an untyped class)


def _type_min(type_: pa.DataType) -> int:
    bits: int = type_.bit_width
    return 0 if pa.types.is_unsigned_integer(type_) else -(1 << (bits - 1))


def _type_max(type_: pa.DataType) -> int:
    bits: int = type_.bit_width
    return (1 << (bits if pa.types.is_unsigned_integer(type_) else bits - 1)) - 1


def _connect(duckdb: Any) -> Any:
    con = duckdb.connect(
        ":memory:",
        config={
            "threads": min(limits.SQL_THREADS_MAX, os.cpu_count() or 1),
            "memory_limit": f"{limits.SQL_MEMORY_BYTES_MAX // 2**20}MB",
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        },
    )
    # Off after connecting (the registered tables are Python objects, not files), then
    # locked: a query cannot turn file access back on.
    con.execute("set enable_external_access = false")
    con.execute("set lock_configuration = true")
    return con


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise SqlUnavailable() from None
    return duckdb


__all__ = ["ScanReport", "SqlError", "SqlUnavailable", "run"]
