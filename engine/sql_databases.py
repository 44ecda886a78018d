"""The DuckDB side of SQL over a snapshot (engine/sql.py, engine/sql_direct.py): the pooled
in-memory databases queries run in, the views they keep, and how a result is read back.

Connections. Opening a DuckDB database costs ~15 ms, more than a range query, so a pool
keeps up to `SQL_QUERIES_MAX` in-memory databases for the process, one per running query
(so two queries at different snapshots never share a catalog), and as many for the direct
path, whose views read `RowsTable`s. A database keeps its views between queries and makes
them again only when the tables a query names changed (`Connection`).

Read-only and contained. DuckDB is opened with file system access and extension loading
off and its configuration locked, so a query reads the snapshot's tables and nothing else
(`read_csv('/etc/passwd')` is a `SqlError`).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from engine import limits
from engine.errors import Overloaded, SqlError, SqlUnavailable

if TYPE_CHECKING:
    from engine.schema import Schema
    from engine.txn import TableHandle, Transaction


class Source(Protocol):
    """What a database registers per table (engine/sql.py `EngineTable`, engine/sql_direct.py
    `RowsTable`): an object DuckDB scans, bound to each query's snapshot or rows."""

    source_name: str
    qualified: str
    declared: pa.Schema

    def unbind(self) -> None: ...


SourceMaker = Callable[[str, str, pa.Schema], Source]
"""A source's class: `(source_name, qualified, schema)`."""


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


QUERY_THREADS = concurrent.futures.ThreadPoolExecutor(
    limits.SQL_QUERIES_MAX * 2, thread_name_prefix="engine-sql"
)
"""The threads queries run on: not the loop's default executor, where the engine's object
reads run (a query waiting for a read queued behind itself would deadlock). Twice the pool:
an interrupted query that has not stopped yet still holds its thread."""


def tables_named(view: Transaction, mentioned: set[str]) -> list[tuple[str, str, TableHandle]]:
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


class Connection:
    """One pooled DuckDB database and the views it keeps between queries: `"db"."t"` (and
    `main."t"` for a bare name) over a source registered once per table and schema (an
    `EngineTable`, or for the direct path a `RowsTable`), bound to each query's snapshot or
    rows while it runs. DDL runs only when the tables a query
    names changed (a new table, a new schema, a dropped table, a bare name that became
    ambiguous): creating views costs milliseconds, more than a range query."""

    def __init__(self, con: Any, parser: Any, kind: SourceMaker) -> None:
        self.con = con
        self.kind = kind
        # An empty database to read a query's table names: on `con` they would come out
        # through its views, as the names of the sources they read.
        self.parser = parser
        self.sources: dict[tuple[str, str], Source] = {}
        self.bare: dict[str, tuple[str, str]] = {}  # lower-case name -> table of main."name"
        self.registered = 0

    def prepare(
        self, tables: list[tuple[str, str, TableHandle]], mentioned: set[str]
    ) -> dict[tuple[str, str], Source]:
        """The views the query's names need, made or dropped; the sources by table."""
        current = {(db, name): handle for db, name, handle in tables}
        # Views of a mentioned name the snapshot does not hold go, so the binder says so.
        for key in [k for k in self.sources if k[1].lower() in mentioned and k not in current]:
            self._drop(key)
        for (db, name), handle in current.items():
            schema = arrow_schema(handle.schema)
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
                self.con.execute(f"drop view if exists main.{quote(had[1])}")
                del self.bare[lower]
            if want is not None:
                self.con.execute(
                    f"create or replace view main.{quote(want[1])} as select * from "
                    f"{self.sources[want].source_name}"
                )
                self.bare[lower] = want
        return self.sources

    def release(self) -> None:
        """Unbind every table: nothing keeps the query's snapshot alive."""
        for source in self.sources.values():
            source.unbind()

    def _create(self, db: str, name: str, schema: pa.Schema) -> Source:
        self.registered += 1
        source = self.kind(f"_engine_table_{self.registered}", f"{db}.{name}", schema)
        self.con.register(source.source_name, source)
        self.con.execute(f"create schema if not exists {quote(db)}")
        self.con.execute(
            f"create or replace view {quote(db)}.{quote(name)} as select * from "
            f"{source.source_name}"
        )
        self.sources[(db, name)] = source
        return source

    def _drop(self, key: tuple[str, str]) -> None:
        source = self.sources.pop(key)
        self.con.execute(f"drop view if exists {quote(key[0])}.{quote(key[1])}")
        if self.bare.get(key[1].lower()) == key:
            self.con.execute(f"drop view if exists main.{quote(key[1])}")
            del self.bare[key[1].lower()]
        self.con.unregister(source.source_name)


def select(con: Any, text: str) -> pa.RecordBatchReader:
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


def collect(reader: pa.RecordBatchReader) -> pa.Table:
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


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def one_line(message: str) -> str:
    """DuckDB's message on one line: its position marker line (`^^^`) dropped."""
    lines = [line.strip() for line in message.splitlines()]
    return " ".join(line for line in lines if line and set(line) != {"^"})


class Pool:
    """Up to `SQL_QUERIES_MAX` DuckDB databases, one per running query (module docstring);
    a query past that is `Overloaded`, not queued."""

    def __init__(self, size_max: int, kind: SourceMaker, *, threads: int = 1) -> None:
        self._size_max = size_max
        self._kind = kind
        self._threads = threads
        self._lock = threading.Lock()
        self._idle: list[Connection] = []
        self._busy = 0

    def take(self, duckdb: Any) -> Connection:
        with self._lock:
            if self._busy >= self._size_max:
                raise Overloaded("SQL queries running", self._size_max)
            self._busy += 1
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            return conn
        try:
            return Connection(connect(duckdb, self._threads), connect(duckdb, 1), self._kind)
        except BaseException:
            with self._lock:
                self._busy -= 1
            raise

    def give(self, conn: Connection, *, healthy: bool) -> None:
        """Back in the pool; one whose query did not stop, or that holds more views than
        `SQL_VIEWS_KEPT_MAX`, is closed instead."""
        with self._lock:
            self._busy -= 1
            if healthy and len(conn.sources) <= limits.SQL_VIEWS_KEPT_MAX:
                self._idle.append(conn)
                return
        conn.con.close()
        conn.parser.close()


_ARROW_SCHEMAS: dict[int, tuple[Schema, pa.Schema]] = {}
"""Tables' Arrow schemas by the id of their `Schema` (`Schema.to_arrow` builds a new one
per call); cleared past `SQL_TEMPLATES_KEPT_MAX` entries."""


def arrow_schema(declared: Schema) -> pa.Schema:
    kept = _ARROW_SCHEMAS.get(id(declared))
    if kept is not None and kept[0] is declared:
        return kept[1]
    schema = declared.to_arrow()
    if len(_ARROW_SCHEMAS) >= limits.SQL_TEMPLATES_KEPT_MAX:
        _ARROW_SCHEMAS.clear()
    _ARROW_SCHEMAS[id(declared)] = (declared, schema)
    return schema


def connect(duckdb: Any, threads: int) -> Any:
    """An in-memory database running queries on up to `threads` threads (at most the cores)."""
    con = duckdb.connect(
        ":memory:",
        config={
            "threads": max(1, min(threads, os.cpu_count() or 1)),
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


def duckdb_module() -> Any:
    try:
        import duckdb
    except ImportError:
        raise SqlUnavailable() from None
    return duckdb
