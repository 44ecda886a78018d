"""The engine's public surface, its typed errors, and its crash and failure rules, driven
in-process (issue 13).

Proves: the issue's example works as written (DDL, insert/delete/update/get/scan with a filter
and columns, commit_ts, snapshots at past timestamps) and every column type survives a
restart; bad input gets the documented typed error before anything is logged and the engine
keeps serving; a WAL failure fails the commits in flight and turns the engine read-only
(`Fenced` when the backend was fenced) without acknowledging anything; a crash at each step of
the pipeline (logged but not told, logged after a successor, not logged) leaves each
transaction wholly there or wholly absent and never loses an acknowledged one; replay
reproduces the state digest and keeps commit timestamps above every replayed one even when
the wall clock goes back; a corrupt WAL entry stops the open with `WalCorruption` naming its
DSN; bounded queues answer `Overloaded`; the synchronous wrapper and the CLI work.

Crashes use tae_driver's `MemoryBackend` with held appends, so a test decides, append by
append, what reached the log before `Engine.abort()`.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import (
    AlreadyExists,
    BadInput,
    Column,
    DuplicateKey,
    Engine,
    EngineClosed,
    Fenced,
    NotFound,
    Overloaded,
    Schema,
    SchemaError,
    SnapshotUnavailable,
    SyncEngine,
    TxnClosed,
    TxnState,
    TxnTooLarge,
    WalCorruption,
    WalFailed,
    cli,
    limits,
)
from tae_driver import ReplayDecision, ReplayMode, open_driver
from tae_driver.backends.memory import MemoryBackend
from tae_driver.errors import BackendFenced
from tests.unit.engine.golden_entries import ALL_TYPES, ALL_TYPES_ROWS

ORDERS = Schema(
    [
        Column("id", "int64"),
        Column("customer", "int32"),
        Column("amount", "float64"),
        Column("note", "string", nullable=True),
    ],
    primary_key=["id"],
)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(_as_coro(coro))


async def _as_coro(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def shop(eng: Engine) -> None:
    async with eng.transaction() as txn:
        await txn.create_database("shop")
        await txn.create_table("shop", "orders", ORDERS)


def order(i: int, customer: int = 0) -> dict[str, Any]:
    return {"id": i, "customer": customer, "amount": i * 1.5, "note": None}


async def ids(eng: Engine) -> list[int]:
    async with eng.transaction() as txn:
        table = await txn.table("shop", "orders").scan(columns=["id"])
    return sorted(table.column("id").to_pylist())


def test_the_issue_example_works_as_written(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory")
        await shop(eng)
        async with eng.transaction() as txn:
            orders = txn.table("shop", "orders")
            assert await orders.insert([order(i, customer=40 + i % 3) for i in range(1, 8)]) == 7
        before = eng.visible_ts
        async with eng.transaction() as txn:
            orders = txn.table("shop", "orders")
            assert await orders.delete([3, 4, 99]) == 2
            assert await orders.update([5], {"amount": 9.5}) == 1
            assert await orders.get(5) == {"id": 5, "customer": 42, "amount": 9.5, "note": None}
            assert await orders.get(3) is None
            tbl = await orders.scan(columns=["id", "amount"], filter=pc.field("customer") == 42)
            assert tbl.column_names == ["id", "amount"]
            assert sorted(tbl.to_pylist(), key=lambda r: r["id"]) == [
                {"id": 2, "amount": 3.0},
                {"id": 5, "amount": 9.5},
            ]
        assert txn.commit_ts is not None and txn.commit_ts > txn.start_ts >= before
        assert eng.visible_ts == txn.commit_ts
        async with eng.snapshot(before) as ro:
            assert await ro.table("shop", "orders").get(3) == order(3, customer=40)
            with pytest.raises(BadInput):
                await ro.table("shop", "orders").insert([order(100)])
        with pytest.raises(SnapshotUnavailable):
            async with eng.snapshot(eng.visible_ts + 1):
                pass
        assert await ids(eng) == [1, 2, 5, 6, 7]
        await eng.close()

    run(main())


def test_every_column_type_and_compound_keys_survive_a_restart(tmp_path: Path) -> None:
    row, nulls = (
        ALL_TYPES_ROWS[0],
        {name: None for name in ALL_TYPES_ROWS[0]}
        | {
            "k": 2,
            "ks": "b",
        },
    )

    async def main() -> None:
        eng = await Engine.open(str(tmp_path))
        async with eng.transaction() as txn:
            await txn.create_database("db")
            await txn.create_table("db", "all", ALL_TYPES)
            await txn.table("db", "all").insert([row, nulls])
        digest = eng.digest()
        await eng.close()
        eng = await Engine.open(str(tmp_path))
        assert eng.digest() == digest
        async with eng.transaction() as txn:
            table = txn.table("db", "all")
            assert await table.get((1, "a")) == row
            assert await table.get((2, "b")) == nulls
            assert await table.delete([(1, "a")]) == 1
        await eng.close()
        eng = await Engine.open(str(tmp_path))
        async with eng.transaction() as txn:
            assert (await txn.table("db", "all").scan()).num_rows == 1
        await eng.close()

    run(main())


@pytest.mark.parametrize(
    ("operation", "error"),
    [
        (lambda t: t.table("nope", "orders"), NotFound),
        (lambda t: t.table("shop", "nope"), NotFound),
        (lambda t: t.create_database("shop"), AlreadyExists),
        (lambda t: t.create_table("shop", "orders", ORDERS), AlreadyExists),
        (lambda t: t.table("shop", "orders").insert([{**order(50), "colour": 1}]), SchemaError),
        (lambda t: t.table("shop", "orders").insert([{**order(50), "customer": "x"}]), SchemaError),
        (lambda t: t.table("shop", "orders").insert([{**order(50), "id": None}]), SchemaError),
        (lambda t: t.table("shop", "orders").insert([{**order(50), "amount": None}]), SchemaError),
        (lambda t: t.table("shop", "orders").insert([order(50), order(50)]), DuplicateKey),
        (lambda t: t.table("shop", "orders").insert([order(1)]), DuplicateKey),
        (lambda t: t.table("shop", "orders").insert("id=1"), SchemaError),
        (lambda t: t.table("shop", "orders").delete(["x"]), SchemaError),
        (lambda t: t.table("shop", "orders").get(None), SchemaError),
        (lambda t: t.table("shop", "orders").update([1], {"id": 2}), SchemaError),
        (lambda t: t.table("shop", "orders").update([1], {"nope": 2}), SchemaError),
        (lambda t: t.table("shop", "orders").scan(columns=["nope"]), SchemaError),
        (lambda t: t.table("shop", "orders").scan(filter=pc.field("nope") == 1), SchemaError),
        (lambda t: t.create_table("shop", "bad", "not a schema"), SchemaError),
        (lambda t: t.create_database(""), SchemaError),
    ],
)
def test_bad_input_gets_a_typed_error_and_the_txn_and_engine_go_on(
    tmp_path: Path, operation: Callable[[Any], Any], error: type[Exception]
) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory")
        await shop(eng)
        async with eng.transaction() as txn:
            await txn.table("shop", "orders").insert([order(1)])
        dsn = eng.driver_stats().dsn
        async with eng.transaction() as txn:
            with pytest.raises(error):
                result = operation(txn)
                if asyncio.iscoroutine(result):
                    await result
            await txn.table("shop", "orders").insert([order(2)])  # the txn goes on
        assert eng.driver_stats().dsn == dsn + 1  # only the good commit was logged
        assert await ids(eng) == [1, 2]
        await eng.close()

    run(main())


def test_schema_errors_at_definition() -> None:
    with pytest.raises(SchemaError, match="unknown type"):
        Column("x", "decimal")
    with pytest.raises(SchemaError, match="cannot be nullable"):
        Schema([Column("id", "int64", nullable=True)], primary_key=["id"])
    with pytest.raises(SchemaError, match="cannot be a key"):
        Schema([Column("id", "float64")], primary_key=["id"])
    with pytest.raises(SchemaError, match="not a column"):
        Schema([Column("id", "int64")], primary_key=["other"])
    with pytest.raises(SchemaError, match="duplicate column"):
        Schema([Column("id", "int64"), Column("id", "int32")], primary_key=["id"])


def test_oversized_transactions_are_refused_naming_the_limit(tmp_path: Path) -> None:
    """Without an object store (objects="none"), a transaction's rows must fit its WAL entry;
    with one, they spill to objects instead (tests/unit/engine/test_large_txns.py)."""

    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory", objects="none")
        await shop(eng)
        big = "x" * (limits.TXN_WORKSPACE_BYTES_MAX // 4)
        async with eng.transaction() as txn:
            orders = txn.table("shop", "orders")
            for i in range(3):
                await orders.insert([{**order(i), "note": big}])
            with pytest.raises(TxnTooLarge) as caught:
                await orders.insert([{**order(9), "note": big}])
            assert caught.value.limit == "txn_workspace_bytes_max"
        assert await ids(eng) == [0, 1, 2]
        await eng.close()

    run(main())


def test_use_after_commit_and_after_close(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory")
        await shop(eng)
        txn = await eng.begin()
        await txn.commit()
        with pytest.raises(TxnClosed):
            txn.table("shop", "orders")
        with pytest.raises(TxnClosed):
            await txn.commit()
        open_txn = await eng.begin()
        await eng.close()
        with pytest.raises(EngineClosed):
            await eng.begin()
        with pytest.raises(EngineClosed):
            open_txn.table("shop", "orders")

    run(main())


def test_open_transactions_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "TXNS_OPEN_MAX", 3)

    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory")
        txns = [await eng.begin() for _ in range(3)]
        with pytest.raises(Overloaded):
            await eng.begin()
        await txns[0].rollback()
        kept = await eng.begin()
        with pytest.raises(Overloaded):
            await eng.begin()
        # A transaction dropped without commit or rollback gives its slot back once it is
        # garbage (and stops pinning the conflict index's oldest snapshot).
        del txns
        gc.collect()
        assert eng.stats().txns_open == 1
        await eng.begin()
        assert kept.state is TxnState.OPEN
        await eng.close()

    run(main())


async def held_engine(tmp_path: Path, backend: MemoryBackend) -> Engine:
    backend.hold_appends = False
    eng = await Engine.open(str(tmp_path), wal=backend)
    await shop(eng)
    backend.hold_appends = True
    return eng


async def insert_task(eng: Engine, i: int) -> asyncio.Task[None]:
    async def commit() -> None:
        async with eng.transaction() as txn:
            await txn.table("shop", "orders").insert([order(i), order(i + 1000)])

    task = asyncio.ensure_future(commit())
    await asyncio.sleep(0)
    return task


def test_a_wal_failure_fails_commits_in_flight_and_turns_the_engine_read_only(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        backend = MemoryBackend()
        eng = await held_engine(tmp_path, backend)
        task = await insert_task(eng, 1)
        await backend.wait_held(1)
        await backend.fail(backend.held()[0])
        with pytest.raises(WalFailed) as caught:
            await task
        assert not isinstance(caught.value, Fenced)
        assert eng.failed is not None
        async with eng.transaction() as txn:  # reads go on
            assert await txn.table("shop", "orders").scan() is not None
        txn = await eng.begin()
        await txn.table("shop", "orders").insert([order(5)])
        with pytest.raises(WalFailed):
            await txn.commit()
        assert txn.state is TxnState.ROLLED_BACK
        assert await ids(eng) == []
        await eng.abort()

    run(main())


def test_a_fenced_backend_makes_commits_fail_with_fenced(tmp_path: Path) -> None:
    async def main() -> None:
        backend = MemoryBackend()
        eng = await held_engine(tmp_path, backend)
        task = await insert_task(eng, 1)
        await backend.wait_held(1)
        fenced = BackendFenced("append", holder="a", epoch=1, current_holder="b", current_epoch=2)
        await backend.fail(backend.held()[0], fenced)
        with pytest.raises(Fenced):
            await task
        with pytest.raises(Fenced):
            async with eng.transaction() as txn:
                await txn.table("shop", "orders").insert([order(7)])
        await eng.abort()

    run(main())


@pytest.mark.parametrize(
    "step",
    ["not-logged", "logged-not-told", "successor-logged-first", "both-logged"],
)
def test_a_crash_at_each_pipeline_step_keeps_each_txn_whole(tmp_path: Path, step: str) -> None:
    """Two commits in flight in separate driver records (each held by the backend); the
    crash comes after the backend did `step`. Nothing acknowledged is lost; each
    transaction is there with both its rows, or absent."""

    async def main() -> None:
        backend = MemoryBackend()
        eng = await held_engine(tmp_path, backend)
        first = await insert_task(eng, 1)
        await backend.wait_held(1)
        second = await insert_task(eng, 2)
        await backend.wait_held(2)
        a, b = backend.held()
        if step == "logged-not-told":
            backend.commit(a)
        elif step == "successor-logged-first":
            backend.commit(b)
        elif step == "both-logged":
            backend.commit(a)
            backend.commit(b)
        assert not first.done() and not second.done()  # nothing was acknowledged
        await eng.abort()
        for task in (first, second):
            with pytest.raises(WalFailed):
                await task
        backend.hold_appends = False
        eng = await Engine.open(str(tmp_path), wal=backend)
        expected = {
            "not-logged": [],
            "logged-not-told": [1, 1001],
            # The second is durable but the first is not: a hole before it, so replay
            # discards it (it was never acknowledged: visibility waits for the first).
            "successor-logged-first": [],
            "both-logged": [1, 2, 1001, 1002],
        }[step]
        assert await ids(eng) == expected
        async with eng.transaction() as txn:  # the engine takes new commits
            await txn.table("shop", "orders").insert([order(3)])
        assert 3 in await ids(eng)
        await eng.close()

    run(main())


def test_replay_rebuilds_the_digest_and_the_clock_never_goes_back(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), now_ms=lambda: 5_000_000)
        await shop(eng)
        for i in range(20):
            async with eng.transaction() as txn:
                orders = txn.table("shop", "orders")
                await orders.insert([order(i)])
                if i % 3 == 0:
                    await orders.delete([i // 2])
        old_ts, digest = eng.visible_ts, eng.digest()
        await eng.close()
        eng = await Engine.open(str(tmp_path), now_ms=lambda: 1_000)  # the clock went back
        assert eng.visible_ts == old_ts
        assert eng.digest() == digest
        assert eng.digest(old_ts) == digest
        async with eng.transaction() as txn:
            await txn.table("shop", "orders").insert([order(100)])
        assert txn.commit_ts is not None and txn.commit_ts > old_ts
        await eng.close()

    run(main())


def test_a_corrupt_entry_stops_the_open_naming_its_dsn(tmp_path: Path) -> None:
    async def main() -> None:
        backend = MemoryBackend()
        eng = await Engine.open(str(tmp_path), wal=backend)
        await shop(eng)
        await eng.close()
        driver = open_driver(backend)
        await driver.replay(lambda dsn, entry: ReplayDecision.APPLY, ReplayMode.FOR_WRITE)
        bad_dsn = await driver.append(b"\x00" * 64)
        await driver.close()
        with pytest.raises(WalCorruption) as caught:
            await Engine.open(str(tmp_path), wal=backend)
        assert caught.value.dsn == bad_dsn == 2

    run(main())


def test_sync_engine(tmp_path: Path) -> None:
    with SyncEngine.open(str(tmp_path)) as eng:
        with eng.transaction() as txn:
            txn.create_database("shop")
            txn.create_table("shop", "orders", ORDERS)
        with eng.transaction() as txn:
            orders = txn.table("shop", "orders")
            orders.insert(pa.Table.from_pylist([order(1), order(2)], schema=ORDERS.to_arrow()))
            assert orders.get(2) == order(2)
        ts = eng.visible_ts
        with eng.transaction() as txn:
            assert txn.table("shop", "orders").delete([1]) == 1
        with eng.snapshot(ts) as ro:
            assert ro.table("shop", "orders").scan().num_rows == 2
        with pytest.raises(DuplicateKey), eng.transaction() as txn:
            txn.table("shop", "orders").insert([order(2)])
        assert eng.stats().live_rows == 1


def test_a_closed_sync_engine_raises_engine_closed_without_warnings(tmp_path: Path) -> None:
    """Issue 20: use after close raised RuntimeError("Event loop is closed") and left
    "coroutine was never awaited" warnings; a second close raised."""
    import warnings

    eng = SyncEngine.open(str(tmp_path))
    with eng.transaction() as txn:
        txn.create_database("shop")
        txn.create_table("shop", "orders", ORDERS)
    txn = eng.begin()
    orders = txn.table("shop", "orders")
    eng.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in (
            eng.begin,
            eng.stats,
            eng.digest,
            lambda: orders.insert([order(1)]),
            lambda: orders.get(1),
            txn.commit,
            txn.databases,
        ):
            with pytest.raises(EngineClosed):
                call()
        with pytest.raises(EngineClosed), eng.snapshot(eng.visible_ts):
            pass
        eng.close()  # again: nothing happens
        gc.collect()
    assert [str(w.message) for w in caught] == []

    async def twice() -> None:
        engine = await Engine.open(str(tmp_path))
        left_open = await engine.begin()
        await left_open.table("shop", "orders").insert([order(1)])
        await engine.close()
        await engine.close()
        with pytest.raises(EngineClosed):
            await engine.begin()
        with pytest.raises(EngineClosed):
            await left_open.commit()

    run(twice())


def test_cli_tables_scan_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def fill() -> None:
        eng = await Engine.open(str(tmp_path))
        await shop(eng)
        async with eng.transaction() as txn:
            await txn.table("shop", "orders").insert([order(i) for i in range(30)])
        await eng.close()

    run(fill())
    assert cli.main(["tables", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "shop.orders  rows=30  key=(id)" in out
    assert cli.main(["scan", str(tmp_path), "shop.orders", "--limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "customer", "amount", "note"]
    assert [line.split()[0] for line in lines[1:4]] == ["0", "1", "2"]
    assert lines[4].startswith("(3 of 30 rows")
    assert cli.main(["stats", str(tmp_path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["live_rows"] == 30 and stats["tables"] == 1
    assert stats["replay"]["entries_applied"] == 2
    assert cli.main(["scan", str(tmp_path), "shop.nope"]) == 1
    assert "no table shop.nope" in capsys.readouterr().err
    assert cli.main(["scan", str(tmp_path), "nodot"]) == 2
    missing = tmp_path / "nothing-here"
    assert cli.main(["stats", str(missing)]) == 1
    assert "no engine here" in capsys.readouterr().err
    assert not missing.exists()  # looking created nothing


def test_cli_reads_a_dir_held_by_a_running_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path))
        try:
            await shop(eng)
            assert await asyncio.to_thread(cli.main, ["stats", str(tmp_path), "--json"]) == 0
        finally:
            await eng.close()

    run(main())
    assert json.loads(capsys.readouterr().out)["tables"] == 1  # no lock taken (issue 20)


def test_a_handle_follows_ddl_in_its_own_transaction(tmp_path: Path) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory")
        await shop(eng)
        async with eng.transaction() as txn:
            old = txn.table("shop", "orders")
            await old.insert([order(1)])
            await txn.drop_table("shop", "orders")
            with pytest.raises(NotFound):
                await old.insert([order(2)])
            await txn.create_table("shop", "orders", ORDERS)
            with pytest.raises(NotFound):
                await old.get(1)  # the name now holds another table
            new = txn.table("shop", "orders")
            assert await new.get(1) is None
            await new.insert([order(3)])
        assert await ids(eng) == [3]
        await eng.close()

    run(main())


def test_a_log_that_is_not_an_engine_wal_is_wal_corruption(tmp_path: Path) -> None:
    async def main() -> None:
        backend = MemoryBackend()
        backend.put(1, b"a raw record, not a driver record")
        with pytest.raises(WalCorruption, match="undecodable log record"):
            await Engine.open(str(tmp_path), wal=backend)

    run(main())
