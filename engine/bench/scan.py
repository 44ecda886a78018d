"""`python -m engine.bench scan`: reads over checkpointed column blocks against DuckDB, in one
run on the same data (issue 14 "Benchmarks").

One table `orders(id int64 primary key in insert order, customer int32, amount float64, note
string)` is loaded through the engine (transactions of `--batch-rows` rows), flushed to
objects, merged and checkpointed; the same rows go into a native DuckDB table in the same
process. Then, on both, with the engine applying MVCC visibility and delete masks:

* point lookup by key, the mean over `--lookups` random keys;
* sum(amount) over a range of 10,000 consecutive keys;
* sum(amount) where customer = 42;
* sum(amount) group by customer.

The same four also as SQL through `eng.sql` (system "engine_sql": DuckDB over the engine's
snapshot with columns and filters pushed into the engine's scan, engine/sql.py); the summary's
`engine_sql_over_duckdb` divides those by DuckDB's native times (issue 24: at most 2x).
DuckDB's point lookups are a prepared statement fetching a tuple; the same lookups as SQL
text with an Arrow table out, as `eng.sql` answers, are reported too (system
"duckdb_arrow"), outside the ratios.

Each query runs `--repeat` times after one warm-up and reports min and median. Also: ingest
rows/s, flush + merge time, checkpoint duration and bytes, restart time (from the checkpoint,
plus a WAL tail of `--tail-mb`), and the engine's RSS. One JSON line per figure, then a
summary line. DuckDB is a benchmark peer only (a dev dependency); without it the engine's
figures are still printed.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from engine.engine import Engine
from engine.schema import Column, Schema
from logsvc.bench.measure import percentile

SCHEMA = Schema(
    [
        Column("id", "int64"),
        Column("customer", "int32"),
        Column("amount", "float64"),
        Column("note", "string", nullable=True),
    ],
    primary_key=["id"],
)
CUSTOMERS = 1000
RANGE_KEYS = 10_000


def batch(first: int, rows: int) -> pa.RecordBatch:
    ids = pa.array(range(first, first + rows), type=pa.int64())
    customer = pc.cast(pc.multiply(pc.bit_wise_and(ids, 0xFFFF), 7919), pa.int32())
    customer = pc.cast(pc.remainder(customer, CUSTOMERS), pa.int32())
    amount = pc.divide(pc.cast(pc.remainder(ids, 1000), pa.float64()), 10.0)
    note = pa.array([None if i % 3 else f"note {i}" for i in range(first, first + rows)])
    return pa.RecordBatch.from_arrays([ids, customer, amount, note], schema=SCHEMA.to_arrow())


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    fn()  # warm-up
    times = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
    return times, result


async def atimed(
    fn: Callable[[], Coroutine[Any, Any, Any]], repeat: int
) -> tuple[list[float], Any]:
    await fn()
    times = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = await fn()
        times.append((time.perf_counter() - started) * 1000)
    return times, result


def figure(name: str, system: str, times_ms: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "bench": "scan",
        "query": name,
        "system": system,
        "ms_min": round(min(times_ms), 3),
        "ms_median": percentile(sorted(times_ms), 0.5),
        "runs": len(times_ms),
        **extra,
    }


async def measure(
    rows: int,
    *,
    batch_rows: int,
    lookups: int,
    repeat: int,
    tail_mb: float,
    cache_mb: int,
    duckdb_too: bool,
    dir_path: str | None,
    sql_too: bool = True,
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="engine-scan-", dir=dir_path)
    out: dict[str, Any] = {"rows": rows}
    try:
        path = os.path.join(base, "engine")
        # Maintenance runs while loading, as it would in service: L0 blocks are flushed as
        # they fill, so memory holds a few blocks, not the table.
        eng = await Engine.open(path, cache_bytes=cache_mb << 20)
        async with eng.transaction() as txn:
            await txn.create_database("shop")
            await txn.create_table("shop", "orders", SCHEMA)
        started = time.perf_counter()
        for first in range(0, rows, batch_rows):
            async with eng.transaction() as txn:
                await txn.table("shop", "orders").insert(
                    batch(first, min(batch_rows, rows - first))
                )
        ingest_s = time.perf_counter() - started
        emit(
            {
                "bench": "scan",
                "figure": "ingest",
                "rows": rows,
                "seconds": round(ingest_s, 2),
                "rows_per_s": round(rows / ingest_s),
            }
        )
        maintenance = eng.maintenance
        assert maintenance is not None
        started = time.perf_counter()
        await maintenance.settle(freeze_all=True, rounds_max=100_000)
        flush_s = time.perf_counter() - started
        emit(
            {
                "bench": "scan",
                "figure": "flush_and_merge",
                "seconds": round(flush_s, 2),
                "rewrites": dict(maintenance.rewrites_done),
            }
        )
        started = time.perf_counter()
        manifest = await eng.checkpoint(global_=True)
        ckp_s = time.perf_counter() - started
        assert manifest is not None
        checkpointer = eng.checkpointer
        assert checkpointer is not None
        objects_bytes = sum(i.size_bytes for i in checkpointer.store.list(""))
        emit(
            {
                "bench": "scan",
                "figure": "checkpoint",
                "seconds": round(ckp_s, 3),
                "objects_bytes": objects_bytes,
                "blocks": manifest.block_count,
            }
        )
        gc.collect()

        async def point() -> None:
            rng = random.Random(7)
            async with eng.snapshot(eng.visible_ts) as view:
                table = view.table("shop", "orders")
                for _ in range(lookups):
                    key = rng.randrange(rows)
                    row = await table.get(key)
                    assert row is not None and row["id"] == key

        async def key_range() -> float:
            lo = rows // 2
            async with eng.snapshot(eng.visible_ts) as view:
                got = await view.table("shop", "orders").scan(
                    columns=["amount"],
                    filter=(pc.field("id") >= lo) & (pc.field("id") < lo + RANGE_KEYS),
                )
            return float(pc.sum(got.column("amount")).as_py() or 0.0)

        async def filtered() -> float:
            async with eng.snapshot(eng.visible_ts) as view:
                got = await view.table("shop", "orders").scan(
                    columns=["amount"], filter=pc.field("customer") == 42
                )
            return float(pc.sum(got.column("amount")).as_py() or 0.0)

        async def grouped() -> int:
            async with eng.snapshot(eng.visible_ts) as view:
                got = await view.table("shop", "orders").scan(columns=["customer", "amount"])
            return int(got.group_by("customer").aggregate([("amount", "sum")]).num_rows)

        times, _ = await atimed(point, repeat)
        emit(figure("point_lookup", "engine", [t / lookups for t in times], lookups=lookups))
        out["engine_point_ms"] = min(times) / lookups
        engine_answers = {}
        for name, query in (
            ("range_sum", key_range),
            ("filter_sum", filtered),
            ("group_by_sum", grouped),
        ):
            times, answer = await atimed(query, repeat)
            engine_answers[name] = answer
            emit(figure(name, "engine", times))
            out[f"engine_{name}_ms"] = min(times)
        if sql_too:
            out.update(await _engine_sql(eng, rows, lookups, repeat, engine_answers, emit))
        emit(
            {
                "bench": "scan",
                "figure": "rss",
                "system": "engine",
                "rss_mb": rss_mb(),
                "cache": _cache(eng),
            }
        )

        if duckdb_too:
            out.update(_duckdb(rows, batch_rows, lookups, repeat, engine_answers, emit))

        if tail_mb > 0:  # a WAL tail after the checkpoint, then a restart
            tail_rows = int(tail_mb * 2**20 / 40)
            first = rows
            while first < rows + tail_rows:
                count = min(batch_rows, rows + tail_rows - first)
                async with eng.transaction() as txn:
                    await txn.table("shop", "orders").insert(batch(first, count))
                first += count
        wal_bytes = _dir_bytes(os.path.join(path, "wal"))
        await eng.close()
        started = time.perf_counter()
        again = await Engine.open(path, cache_bytes=cache_mb << 20, maintenance=False)
        restart_s = time.perf_counter() - started
        stats = again.stats()
        await again.close()
        emit(
            {
                "bench": "scan",
                "figure": "restart",
                "seconds": round(restart_s, 2),
                "wal_bytes": wal_bytes,
                "tail_mb": tail_mb,
                "entries_replayed": stats.replay.entries_applied if stats.replay else None,
            }
        )
        out["restart_s"] = restart_s
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


async def _engine_sql(
    eng: Engine,
    rows: int,
    lookups: int,
    repeat: int,
    engine_answers: dict[str, Any],
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """The four queries as SQL through `eng.sql` (system "engine_sql"): DuckDB over the
    engine's snapshot, columns and filters pushed into the engine's scan (engine/sql.py)."""
    from engine.errors import SqlUnavailable

    lo = rows // 2

    async def point() -> None:
        rng = random.Random(7)
        for _ in range(lookups):
            key = rng.randrange(rows)
            got = await eng.sql(f"select * from shop.orders where id = {key}")
            assert got.num_rows == 1 and got.column("id")[0].as_py() == key

    async def one(query: str) -> Any:
        return (await eng.sql(query)).column(0)[0].as_py()

    async def group_count() -> int:
        got = await eng.sql("select customer, sum(amount) from orders group by customer")
        return int(got.num_rows)

    queries: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
        "range_sum": lambda: one(
            f"select sum(amount) from shop.orders where id >= {lo} and id < {lo + RANGE_KEYS}"
        ),
        "filter_sum": lambda: one("select sum(amount) from shop.orders where customer = 42"),
        "group_by_sum": group_count,
    }
    out: dict[str, Any] = {}
    try:
        times, _ = await atimed(point, repeat)
    except SqlUnavailable as exc:
        emit({"bench": "scan", "system": "engine_sql", "skipped": str(exc)})
        return out
    emit(figure("point_lookup", "engine_sql", [t / lookups for t in times], lookups=lookups))
    out["engine_sql_point_ms"] = min(times) / lookups
    for name, query in queries.items():
        times, answer = await atimed(query, repeat)
        mine = engine_answers.get(name)
        agrees = (
            abs(float(answer) - float(mine)) <= 1e-6 * max(1.0, abs(float(mine)))
            if mine is not None and answer is not None
            else None
        )
        emit(figure(name, "engine_sql", times, same_answer=agrees))
        out[f"engine_sql_{name}_ms"] = min(times)
    return out


def _cache(eng: Engine) -> dict[str, Any]:
    store = eng.block_store
    stats = getattr(store, "cache_stats", None)
    if stats is None:
        return {}
    found = stats()
    return {"used_mb": round(found.used_bytes / 2**20, 1), "hit_ratio": round(found.hit_ratio, 3)}


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def _duckdb(
    rows: int,
    batch_rows: int,
    lookups: int,
    repeat: int,
    engine_answers: dict[str, Any],
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    try:
        import duckdb
    except ImportError:
        emit({"bench": "scan", "system": "duckdb", "skipped": "duckdb is not installed"})
        return {}
    out: dict[str, Any] = {}
    con = duckdb.connect()
    con.execute(
        "create table orders (id bigint primary key, customer integer, amount double, note varchar)"
    )
    for first in range(0, rows, batch_rows * 8):
        chunk = pa.Table.from_batches(
            [
                batch(f, min(batch_rows, rows - f))
                for f in range(first, min(rows, first + batch_rows * 8), batch_rows)
            ]
        )
        con.register("chunk", chunk)
        con.execute("insert into orders select * from chunk")
        con.unregister("chunk")

    def point() -> None:
        rng = random.Random(7)
        for _ in range(lookups):
            key = rng.randrange(rows)
            row = con.execute("select * from orders where id = ?", [key]).fetchone()
            assert row is not None and row[0] == key

    lo = rows // 2

    def one(sql: str, params: list[Any] | None = None) -> Any:
        found = con.execute(sql, params or []).fetchone()
        assert found is not None
        return found[0]

    queries: dict[str, Callable[[], Any]] = {
        "range_sum": lambda: one(
            "select sum(amount) from orders where id >= ? and id < ?", [lo, lo + RANGE_KEYS]
        ),
        "filter_sum": lambda: one("select sum(amount) from orders where customer = 42"),
        "group_by_sum": lambda: len(
            con.execute("select customer, sum(amount) from orders group by customer").fetchall()
        ),
    }
    times, _ = timed(point, repeat)
    emit(figure("point_lookup", "duckdb", [t / lookups for t in times], lookups=lookups))
    out["duckdb_point_ms"] = min(times) / lookups

    as_arrow = con.cursor()  # (`point` leaves its last result open on `con`)

    def point_as_arrow() -> None:
        # The same lookups answered as `eng.sql` answers: SQL text in, an Arrow table out.
        # DuckDB's Arrow result costs ~0.3 ms more than a fetched tuple (not in the ratio).
        rng = random.Random(7)
        for _ in range(lookups):
            key = rng.randrange(rows)
            got = as_arrow.sql(f"select * from orders where id = {key}").to_arrow_table()
            assert got.num_rows == 1

    times, _ = timed(point_as_arrow, repeat)
    emit(figure("point_lookup", "duckdb_arrow", [t / lookups for t in times], lookups=lookups))
    for name, query in queries.items():
        times, answer = timed(query, repeat)
        mine = engine_answers.get(name)
        agrees = (
            abs(float(answer) - float(mine)) <= 1e-6 * max(1.0, abs(float(mine)))
            if mine is not None
            else None
        )
        emit(figure(name, "duckdb", times, same_answer=agrees))
        out[f"duckdb_{name}_ms"] = min(times)
    con.close()
    return out


def run(args: Any, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    found = asyncio.run(
        measure(
            args.rows,
            batch_rows=args.batch_rows,
            lookups=args.lookups,
            repeat=args.repeat,
            tail_mb=args.tail_mb,
            cache_mb=args.cache_mb,
            duckdb_too=not args.no_duckdb,
            dir_path=args.dir,
            sql_too=not args.no_sql,
            emit=emit,
        )
    )
    ratios = {}
    sql_ratios = {}
    for name in ("point", "range_sum", "filter_sum", "group_by_sum"):
        mine, peer = found.get(f"engine_{name}_ms"), found.get(f"duckdb_{name}_ms")
        if mine and peer:
            ratios[name] = round(mine / peer, 2)
        mine = found.get(f"engine_sql_{name}_ms")
        if mine and peer:
            sql_ratios[name] = round(mine / peer, 2)
    return {
        "bench": "scan",
        "summary": True,
        "rows": args.rows,
        "engine_over_duckdb": ratios,
        "engine_sql_over_duckdb": sql_ratios,
        "peak_rss_mb": round(
            max(peak_before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024, 1
        ),
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in found.items()},
    }
