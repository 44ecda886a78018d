"""`SyncEngine`: the engine for scripts and notebooks, without asyncio in sight.

    from engine import SyncEngine, Schema, Column
    with SyncEngine.open("DIR") as eng:
        with eng.transaction() as txn:
            txn.create_database("shop")
        with eng.transaction() as txn:
            txn.table("shop", "orders").insert(rows)

Why a thread: the engine is an asyncio program (one loop owns its state); this wrapper runs
that loop on a private daemon thread and hands every call to it, so the engine's state is
still touched by one thread only. Every call waits at most `call_timeout_s` (bounded waits).
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from engine.engine import Engine, EngineStats
from engine.errors import EngineClosed
from engine.schema import Schema
from engine.txn import TableHandle, Transaction, TxnState

T = TypeVar("T")

CALL_TIMEOUT_S_DEFAULT = 300.0
"""Longest wait for one call. A commit over logsvc waits for a majority's fsync and, during a
leader failover, for an election: seconds, not minutes."""


class _Loop:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="engine-loop", daemon=True
        )
        self.thread.start()
        self.closed = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.closed:
            # Closed, not run: no "coroutine was never awaited" warning, and the typed error
            # every engine call gives after close (issue 20: this was "Event loop is closed").
            coro.close()
            raise EngineClosed("engine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout_s)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def invoke() -> T:
            return fn(*args)

        return self.run(invoke())

    def stop(self) -> None:
        """Stop and close the loop; later calls are no-ops."""
        if self.closed:
            return
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.timeout_s)
        self.loop.close()


class SyncTable:
    def __init__(self, loop: _Loop, handle: TableHandle) -> None:
        self._loop = loop
        self._handle = handle

    def insert(self, rows: object) -> int:
        return self._loop.run(self._handle.insert(rows))

    def delete(self, keys: Iterable[object]) -> int:
        return self._loop.run(self._handle.delete(keys))

    def update(self, keys: Iterable[object], values: dict[str, object]) -> int:
        return self._loop.run(self._handle.update(keys, values))

    def get(self, key: object) -> dict[str, Any] | None:
        return self._loop.run(self._handle.get(key))

    def scan(
        self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None
    ) -> pa.Table:
        return self._loop.run(self._handle.scan(columns, filter))


class SyncTransaction:
    def __init__(self, loop: _Loop, txn: Transaction) -> None:
        self._loop = loop
        self._txn = txn

    @property
    def start_ts(self) -> int:
        return self._txn.start_ts

    @property
    def commit_ts(self) -> int | None:
        return self._txn.commit_ts

    @property
    def state(self) -> TxnState:
        return self._txn.state

    def create_database(self, name: str) -> None:
        self._loop.run(self._txn.create_database(name))

    def drop_database(self, name: str) -> None:
        self._loop.run(self._txn.drop_database(name))

    def create_table(self, db: str, name: str, schema: Schema) -> None:
        self._loop.run(self._txn.create_table(db, name, schema))

    def drop_table(self, db: str, name: str) -> None:
        self._loop.run(self._txn.drop_table(db, name))

    def databases(self) -> list[str]:
        return self._loop.call(self._txn.databases)

    def tables(self, db: str) -> list[str]:
        return self._loop.call(self._txn.tables, db)

    def table(self, db: str, name: str) -> SyncTable:
        return SyncTable(self._loop, self._loop.call(self._txn.table, db, name))

    def commit(self) -> None:
        self._loop.run(self._txn.commit())

    def rollback(self) -> None:
        self._loop.run(self._txn.rollback())


class SyncEngine:
    """Open with `SyncEngine.open(path, **options)`; the options are `Engine.open`'s."""

    def __init__(self, loop: _Loop, engine: Engine) -> None:
        self._loop = loop
        self._engine = engine

    @classmethod
    def open(
        cls, path: str, *, call_timeout_s: float = CALL_TIMEOUT_S_DEFAULT, **options: Any
    ) -> SyncEngine:
        loop = _Loop(call_timeout_s)
        try:
            engine = loop.run(Engine.open(path, **options))
        except BaseException:
            loop.stop()
            raise
        return cls(loop, engine)

    @property
    def engine(self) -> Engine:
        """The asyncio engine underneath (use it only from its loop's thread)."""
        return self._engine

    @property
    def visible_ts(self) -> int:
        return self._engine.visible_ts

    def digest(self, ts: int | None = None) -> str:
        return self._loop.call(self._engine.digest, ts)

    def stats(self) -> EngineStats:
        return self._loop.call(self._engine.stats)

    def begin(self) -> SyncTransaction:
        return SyncTransaction(self._loop, self._loop.run(self._engine.begin()))

    @contextmanager
    def transaction(self) -> Iterator[SyncTransaction]:
        txn = self.begin()
        try:
            yield txn
        except BaseException:
            txn.rollback()
            raise
        if txn.state is TxnState.OPEN:
            txn.commit()

    @contextmanager
    def snapshot(
        self,
        ts: int | datetime.datetime | None = None,
        *,
        at: int | datetime.datetime | None = None,
    ) -> Iterator[SyncTransaction]:
        """The committed state at a commit timestamp or an aware wall time (`Engine.snapshot`)."""
        manager = self._engine.snapshot(ts, at=at)
        txn = self._loop.run(manager.__aenter__())
        try:
            yield SyncTransaction(self._loop, txn)
        finally:
            self._loop.run(manager.__aexit__(None, None, None))

    def sql(self, query: str, at: int | datetime.datetime | None = None) -> pa.Table:
        """`Engine.sql`: one SELECT over the snapshot at `at` (None: the newest)."""
        return self._loop.run(self._engine.sql(query, at))

    def close(self) -> None:
        """Close the engine and stop its thread. A second call does nothing; any other call
        after it raises `EngineClosed`."""
        if self._loop.closed:
            return
        try:
            self._loop.run(self._engine.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
