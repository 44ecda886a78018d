"""SQL's direct path (engine/sql_keys.py says which queries take it): a query over one table
whose WHERE bounds the integer key is answered before DuckDB plans any dataset.

Planning and scanning a Python dataset costs DuckDB ~1 ms even for one row (three times its
own point lookup), and a streamed query makes four hand-overs between the loop and the
query's thread, each waiting for a core on a loaded machine. So such a query is answered
here (`answer`): its template's plan is kept (DuckDB's parse tree, read once per template),
the engine reads the key rows at the snapshot (a point through the key index as `get` does,
a range through the scan's key path, at most `SQL_DIRECT_ROWS_MAX` rows of blocks), and
DuckDB runs the query over them as a plain Arrow stream (`RowsTable`: nothing to plan,
nothing pushed down, DuckDB applies the whole WHERE itself), on the loop when the query is
sums and comparisons over at most `SQL_INLINE_ROWS_MAX` rows, on the query's thread
otherwise. Without DuckDB at all: a query that only lists columns with a WHERE of key
bounds alone is answered with the rows, in DuckDB's answer schema (found once by running
the query over no rows; any type DuckDB would change keeps DuckDB running); a query of
plain aggregates (count, sum, min, max) with such a WHERE is answered by
engine/sql_aggregates.py where its result is DuckDB's own, bit for bit. A GROUP BY of one
column with such aggregates, over the whole table or a WHERE of key bounds alone, is grouped
by the engine (engine/sql_groups.py, scanned by engine/sql_grouped.py: no row bound, a part
at a time), again only where the answer is DuckDB's. Anything else, and any DuckDB error
here, is streamed (engine/sql.py), so errors read as they always did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from engine import limits, sql_aggregates, sql_grouped, sql_groups, sql_keys
from engine import sql_databases as databases
from engine.errors import SqlError
from engine.scan import ScanCounts, integer_key, key_point, key_rows_bound, scan_stream

if TYPE_CHECKING:
    from engine.schema import Schema
    from engine.txn import TableHandle, Transaction


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


_ROWS_POOL = databases.Pool(limits.SQL_QUERIES_MAX, RowsTable, threads=1)
"""Databases whose views read `RowsTable`s: up to `SQL_QUERIES_MAX` direct queries at once,
beside as many streamed ones. One thread each: a few thousand rows gain nothing from more
(hand-overs), and DuckDB then adds a DOUBLE sum in row order, as engine/sql_aggregates.py
does."""


class _Template:
    """A template's plan (None: the direct path does not take it), and for a plan that only
    projects columns or aggregates them, DuckDB's answer schema per table schema (None:
    DuckDB refused the query over no rows)."""

    __slots__ = ("answers", "plan")

    def __init__(self, plan: sql_keys.KeyPlan | None) -> None:
        self.plan = plan
        # By the id of the table's `Schema` (kept in the value: an id is only unique while
        # its object lives); hashing a pyarrow schema per query costs more than the lookup.
        self.answers: dict[int, tuple[Schema, pa.Schema | None]] = {}


_TEMPLATES: OrderedDict[str, _Template] = OrderedDict()
_TEMPLATES_LOCK = threading.Lock()


async def answer(
    duckdb: Any, view: Transaction, query: str, scans: list[databases.ScanReport] | None
) -> pa.Table | None:
    """The answer by the direct path (engine/sql_keys.py), or None when it does not apply:
    one table whose integer key the WHERE bounds to at most `SQL_DIRECT_ROWS_MAX` rows of
    persisted blocks. The engine reads those rows at the snapshot (a point through the key
    index as `get`, a range through `scan`'s key path, or `scan` for a transaction's own
    writes: `scan`'s visibility), then DuckDB runs the query over them, on the loop when the
    query is cheap and the rows few (`SQL_INLINE_ROWS_MAX`: no hand-over to a thread); a
    query that only lists columns is answered with the rows themselves, one of plain
    aggregates by engine/sql_aggregates.py where that is exact. Any DuckDB error
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
        tables = databases.tables_named(view, {plan.table})
        target = _target(tables, plan)
        if target is None:
            return None
        db, name, handle = target
        schema = databases.arrow_schema(handle.schema)
        if plan.grouping is not None:
            grouped = await _grouped(
                duckdb, conn, entry, tables, target, schema, values, query, scans
            )
            if grouped is not None:
                return grouped
        key = integer_key(handle)
        if key is None:
            return None
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
        aggregated = sql_keys.aggregated(plan, schema.names) if bounds.exact else None
        answer_schema = None
        if answer_columns is not None or aggregated is not None:
            answer_schema = _empty_answer(
                duckdb, conn, entry, tables, db, name, handle.schema, schema, query
            )
        if (
            answer_schema is not None
            and answer_columns is not None
            and not _same_types(answer_schema, answer_columns, schema)
        ):
            answer_schema = None
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
                databases.ScanReport(
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
        if answer_schema is not None and aggregated is not None:
            assert plan.aggregates is not None
            computed = sql_aggregates.answer(plan.aggregates, aggregated, rows, answer_schema)
            if computed is not None:
                return computed
        _rows_source(conn, tables, plan, db, name).bind(rows)
        if plan.cheap and rows.num_rows <= limits.SQL_INLINE_ROWS_MAX:
            return _rows_answer(duckdb, conn, query)
        running = databases.QUERY_THREADS.submit(_rows_answer, duckdb, conn, query)
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


async def _grouped(
    duckdb: Any,
    conn: databases.Connection,
    entry: _Template,
    tables: list[tuple[str, str, TableHandle]],
    target: tuple[str, str, TableHandle],
    schema: pa.Schema,
    values: tuple[int, ...],
    query: str,
    scans: list[databases.ScanReport] | None,
) -> pa.Table | None:
    """A GROUP BY engine/sql_groups.py answers, over the whole table or the rows its WHERE
    of key bounds alone keeps (engine/sql_grouped.py scans them); None when it is not one."""
    plan = entry.plan
    assert plan is not None and plan.grouping is not None
    db, name, handle = target
    names = {c.lower(): c for c in schema.names}
    bound = sql_groups.bind(
        plan.grouping, lambda parts: sql_keys.column_of(parts, plan.binding, names), schema
    )
    if bound is None or not plan.exact:
        return None
    key_filter: pc.Expression | None = None
    nothing = False
    if plan.conjuncts:
        key = integer_key(handle)
        if key is None:
            return None
        bounds = sql_keys.key_bounds(plan, key, schema.names, values)
        if bounds is None or not bounds.exact:
            return None
        key_type = schema.field(key).type
        low, high = _type_min(key_type), _type_max(key_type)
        lo, hi = max(bounds.lo, low), min(bounds.hi, high)
        field = pc.field(key)
        nothing = lo > hi
        if lo > low:
            key_filter = field >= pa.scalar(lo, key_type)
        if hi < high:
            upper = field <= pa.scalar(hi, key_type)
            key_filter = upper if key_filter is None else key_filter & upper
        if bounds.points is not None and not nothing:
            listed = field.isin(pa.array(sorted(bounds.points), type=key_type))
            key_filter = listed if key_filter is None else key_filter & listed
    answer_schema = _empty_answer(
        duckdb, conn, entry, tables, db, name, handle.schema, schema, query
    )
    if answer_schema is None or not sql_groups.answers_in(bound, answer_schema):
        return None
    return await sql_grouped.answer(
        handle, bound, key_filter, answer_schema, scans, nothing=nothing
    )


def _rows_answer(duckdb: Any, conn: databases.Connection, query: str) -> pa.Table | None:
    """DuckDB's answer over the bound rows; None (take the streamed path) for its errors."""
    try:
        return databases.collect(databases.select(conn.con, query))
    except duckdb.Error:
        return None


def _template(duckdb: Any, conn: databases.Connection, text: str, values_count: int) -> _Template:
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


def _empty_answer(
    duckdb: Any,
    conn: databases.Connection,
    entry: _Template,
    tables: list[tuple[str, str, TableHandle]],
    db: str,
    name: str,
    declared: Schema,
    schema: pa.Schema,
    query: str,
) -> pa.Schema | None:
    """DuckDB's answer schema (its names, its types) for the template over a table of
    `schema`, from running the query once over no rows (kept per table schema); None when
    DuckDB refused it."""
    kept = entry.answers.get(id(declared))
    if kept is not None and kept[0] is declared:
        return kept[1]
    plan = entry.plan
    assert plan is not None
    source = _rows_source(conn, tables, plan, db, name)
    source.bind(schema.empty_table())
    try:
        empty = _rows_answer(duckdb, conn, query)
    finally:
        source.unbind()
    found = empty.schema if empty is not None else None
    if len(entry.answers) < limits.SQL_TEMPLATE_SCHEMAS_MAX:
        entry.answers[id(declared)] = (declared, found)
    return found


def _same_types(answer: pa.Schema, columns: list[str], schema: pa.Schema) -> bool:
    """Whether DuckDB answers a list of `columns` in the columns' own types (so the rows
    themselves can stand for its answer)."""
    return len(answer) == len(columns) and all(
        f.type == schema.field(c).type for f, c in zip(answer, columns, strict=True)
    )


def _rows_source(
    conn: databases.Connection,
    tables: list[tuple[str, str, TableHandle]],
    plan: sql_keys.KeyPlan,
    db: str,
    name: str,
) -> RowsTable:
    """The direct query's table as its database's views read it (made if new)."""
    source = conn.prepare(tables, {plan.table})[(db, name)]
    assert isinstance(source, RowsTable)  # (a `_ROWS_POOL` database)
    return source


def _type_min(type_: pa.DataType) -> int:
    bits: int = type_.bit_width
    return 0 if pa.types.is_unsigned_integer(type_) else -(1 << (bits - 1))


def _type_max(type_: pa.DataType) -> int:
    bits: int = type_.bit_width
    return (1 << (bits if pa.types.is_unsigned_integer(type_) else bits - 1)) - 1
