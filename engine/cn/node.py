"""A compute node: its own copy of the engine's state, caught up from the TN's logtail, blocks
read from the object store itself, transactions sent to the TN (issue 15, decision 0007).

    cn = ComputeNode(port, objects)           # port: a TNPort (LocalTN, engine.cn.client)
    async with cn.snapshot(ts) as view:       # pulls logtail up to ts first
        rows = await view.table("shop", "orders").scan()
    async with cn.transaction() as txn:       # reads here, commits on the TN
        await txn.table("shop", "orders").insert(rows)

Why this shape: the state is an `EngineState` fed the very `TxnEntry` values the TN applied
(the logtail), and reads go through the engine's own `Transaction` code over it, so a read
at `ts` is the TN's read at `ts`. A transaction runs locally against the CN's snapshot (its
checks, its own reads) and records what it did; its commit sends those operations to the TN
(`WriteSet`), which runs them again at the same snapshot with its incremental conflict
checks, and remembers the CN's `(client_id, seq)` so a retry finds the first outcome.

A CN starts at [0, 0]: the first pull brings a checkpoint (read from the object store) plus
the entries after it, or every entry from the start while the TN still has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterable

import pyarrow as pa

from engine import as_of, limits
from engine.blockstore import ObjectBlockStore
from engine.catalog import Catalog
from engine.checkpoint import files
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import Manifest
from engine.clock import TS_MAX
from engine.cn.port import TNPort
from engine.errors import BadInput, EngineClosed, Overloaded, SnapshotUnavailable
from engine.load_scope import LoadsBlocks
from engine.logtail import LogtailUnavailable, TailEntry
from engine.objects.errors import ObjectNotFound
from engine.objects.store import ObjectStore
from engine.schema import Schema
from engine.state import ApplyError, EngineState
from engine.tn import limits as tn_limits
from engine.txn import TableHandle, Transaction, TransactionScope, TxnState
from engine.wal.codec import decode_entry
from engine.wal.entry import TxnEntry
from engine.writeset import Op, WriteSet

PULL_ATTEMPTS_MAX = 20
"""Pulls tried while the TN answers `LogtailUnavailable` (it is taking a checkpoint)."""

PULL_RETRY_S = 0.1
"""Wait between those pulls."""

FOLLOW_QUEUE_MAX = 4096
"""Entries pushed by a subscription and not yet applied; past it the CN stops following
and pulls instead (bounded memory whatever the TN's pace)."""


class CNTransaction(Transaction):
    """A transaction on a compute node: the engine's workspace and checks over the CN's
    snapshot, plus the list of operations the TN replays at commit."""

    def __init__(self, node: ComputeNode, start_ts: int) -> None:
        super().__init__(node, start_ts)
        self.ops: list[Op] = []
        self._muted = False
        """While an update runs the base class's delete and insert: the TN replays the
        update itself, so they are not recorded."""

    async def create_database(self, name: str) -> None:
        await super().create_database(name)
        self.ops.append(Op("create_database", name))

    async def drop_database(self, name: str) -> None:
        await super().drop_database(name)
        self.ops.append(Op("drop_database", name))

    async def create_table(self, db: str, name: str, schema: Schema) -> None:
        await super().create_table(db, name, schema)
        self.ops.append(Op("create_table", db, name, schema=schema))

    async def drop_table(self, db: str, name: str) -> None:
        await super().drop_table(db, name)
        self.ops.append(Op("drop_table", db, name))

    async def _insert(self, handle: TableHandle, rows: object) -> int:
        count = await super()._insert(handle, rows)
        if count and not self._muted:
            # The rows as the workspace took them, checked and converted once (a compute
            # node's transaction never spills: the last batch is this insert's).
            writes = self.table_writes(handle.entry.table_id)
            assert writes is not None
            added = writes.batches[-1]
            batch = added if isinstance(added, pa.RecordBatch) else added.batch()
            assert batch.num_rows == count
            self.ops.append(
                Op("insert", handle.db, handle.name, rows=pa.Table.from_batches([batch]))
            )
        return count

    async def _delete(self, handle: TableHandle, keys: Iterable[object]) -> int:
        keys = self._normalized_keys(handle, keys)
        count = await super()._delete(handle, keys)
        if count and not self._muted:
            self.ops.append(Op("delete", handle.db, handle.name, keys=tuple(keys)))
        return count

    async def _update(
        self, handle: TableHandle, keys: Iterable[object], values: dict[str, object]
    ) -> int:
        keys = self._normalized_keys(handle, keys)
        self._muted = True
        try:
            count = await super()._update(handle, keys, values)
        finally:
            self._muted = False
        if count:
            self.ops.append(
                Op("update", handle.db, handle.name, keys=tuple(keys), values=dict(values))
            )
        return count


class CheckpointRetired(Exception):
    """The checkpoint a logtail answer named is gone from the object store: its TN retired it
    (a newer one exists). The pull asks again; never leaves `_pull_to`."""


class ComputeNode(LoadsBlocks):
    def __init__(
        self,
        port: TNPort,
        objects: ObjectStore | None,
        *,
        cache_bytes: int = limits.CACHE_BYTES,
        client_id: str | None = None,
    ) -> None:
        self._port = port
        name = client_id or "cn"
        if not 1 <= len(name.encode()) <= tn_limits.CN_NAME_BYTES_MAX:
            bound = tn_limits.CN_NAME_BYTES_MAX
            raise BadInput(f"a compute node's name must be 1 to {bound} bytes")
        self.client_id = f"{name}-{uuid.uuid4().hex[: tn_limits.INCARNATION_HEX_CHARS]}"
        """The id in this node's commit origins: its name and this incarnation (a node
        restarted, or another given the same name, never repeats a `(client_id, seq)`)."""
        self._seq = 0
        self._state = EngineState()
        self._store = ObjectBlockStore(objects, cache_bytes) if objects is not None else None
        self._loader = self._store
        self._block_store = None
        self.txn_limits = limits.TxnLimits(deletes_max=limits.CN_OP_KEYS_MAX)
        """A compute node's transactions never spill, and a delete travels in one request."""
        """Transactions here never spill: the TN replays their operations (engine/txn.py
        looks for this attribute)."""
        self._hook_state()
        self.applied_ts = 0
        self.read_only = False
        self._history_floor_ts = 0
        self._open_txns: weakref.WeakSet[Transaction] = weakref.WeakSet()
        self._pull_lock = asyncio.Lock()
        self._newest_pull: asyncio.Future[int] | None = None
        """A pull to the TN's newest timestamp that has not asked the TN yet (callers join)."""
        self._pulls: set[asyncio.Task[None]] = set()
        self._closed = False
        self._follow_queue: asyncio.Queue[TailEntry | None] | None = None
        self._follow_task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.entries_applied = 0
        self.checkpoints_loaded = 0

    def _hook_state(self) -> None:
        if self._store is not None:
            self._state.object_meta = self._store.meta

    # --- what engine/txn.py needs of its host (txn.TxnHost) -------------------------------------

    @property
    def visible_ts(self) -> int:
        return self.applied_ts

    @property
    def catalog(self) -> Catalog:
        return self._state.catalog

    @property
    def spill_writer(self) -> None:
        return None  # never spills: the TN replays the operations

    def check_not_closed(self) -> None:
        if self._closed:
            raise EngineClosed("compute node is closed")

    def txn_ended(self, txn: Transaction) -> None:
        self._open_txns.discard(txn)

    def discard_objects(self, names: list[str]) -> None:
        return None  # never spills

    async def commit_txn(self, txn: Transaction) -> None:
        assert isinstance(txn, CNTransaction)
        if not txn.ops:
            txn.commit_ts = txn.start_ts
            txn.end(TxnState.COMMITTED)
            return
        self._seq += 1
        write_set = WriteSet(txn.start_ts, tuple(txn.ops), self.client_id, self._seq)
        txn.state = TxnState.COMMITTING
        try:
            commit_ts = await self._port.commit(write_set)
        except BaseException:
            txn.state = TxnState.OPEN
            txn.end(TxnState.ROLLED_BACK)
            raise
        txn.commit_ts = commit_ts
        txn.end(TxnState.COMMITTED)

    # --- catching up ---------------------------------------------------------------------------

    async def catch_up(self, ts: int | None = None) -> int:
        """Pull logtail until the state is at `ts` (default: the TN's visible timestamp, as
        of now). Returns the timestamp reached (at most the TN's visible one)."""
        self.check_not_closed()
        if ts is not None:
            async with self._pull_lock:
                return await self._pull_to(ts)
        # Callers that want the TN's newest share one pull that starts after they asked: its
        # status question is sent after each of them called, so its answer is as new as each
        # needs. (One pull per caller, one at a time, made 16 writers wait 16 round trips.)
        shared = self._newest_pull
        if shared is None:
            shared = self._newest_pull = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._pull_newest(shared))
            self._pulls.add(task)
            task.add_done_callback(self._pulls.discard)
        return await asyncio.shield(shared)

    async def _pull_newest(self, shared: asyncio.Future[int]) -> None:
        try:
            async with self._pull_lock:
                if self._newest_pull is shared:
                    self._newest_pull = None  # who asks from now on needs a newer answer
                # One request: the TN clamps the range to what it has made visible.
                reached = await self._pull_to(TS_MAX)
        except asyncio.CancelledError:  # closing
            self._forget_pull(shared)
            shared.cancel()
            raise
        except Exception as exc:
            self._forget_pull(shared)
            shared.set_exception(exc)
            shared.exception()  # retrieved: every caller may have gone
        else:
            shared.set_result(reached)

    def _forget_pull(self, shared: asyncio.Future[int]) -> None:
        if self._newest_pull is shared:
            self._newest_pull = None

    async def _pull_to(self, ts: int) -> int:
        """`catch_up(ts)` with `_pull_lock` held (TS_MAX: as far as the TN can answer)."""
        if ts <= self.applied_ts:
            return self.applied_ts
        for _ in range(PULL_ATTEMPTS_MAX):
            try:
                tail = await self._port.logtail(self.applied_ts, ts)
                loaded = await self._load_checkpoint(tail.checkpoint)
                break
            except LogtailUnavailable:
                await asyncio.sleep(PULL_RETRY_S)
            except CheckpointRetired:
                # The TN took newer checkpoints and retired the one it named while this node
                # read it (a cold start slower than two checkpoint intervals): ask again.
                continue
        else:
            raise SnapshotUnavailable(
                f"the TN cannot bring this compute node from {self.applied_ts} to {ts} yet"
            )
        if loaded is not None:
            manifest, state = loaded
            self._state = state
            self._hook_state()
            self.applied_ts = manifest.ckp_ts
            self._history_floor_ts = manifest.ckp_ts
            self.checkpoints_loaded += 1
        for got in tail.entries:
            self._apply_entry(got)
        self.applied_ts = max(self.applied_ts, tail.upto_ts)
        return self.applied_ts

    async def _load_checkpoint(self, name: str | None) -> tuple[Manifest, EngineState] | None:
        """The checkpoint a logtail answer names, read (nothing of this node changes), or
        None when it names none. `CheckpointRetired` when it was deleted meanwhile; any
        other failure to read it is the checkpoint's damage, raised."""
        if name is None:
            return None
        if self._store is None:
            raise SnapshotUnavailable("the TN answered with a checkpoint: needs objects")
        store = self._store

        def read() -> tuple[Manifest, EngineState]:
            try:
                manifest = files.read_manifest(store.store, name)
                return manifest, files.read(store.store, manifest, store.meta)
            except (ObjectNotFound, CheckpointCorrupt):
                try:
                    store.store.size(name)
                except ObjectNotFound:
                    raise CheckpointRetired(name) from None
                raise

        return await asyncio.to_thread(read)

    def _apply_entry(self, got: TailEntry) -> None:
        if got.commit_ts <= self._state.applied_ts:
            return  # a copy of one applied already (a push after a pull, say)
        entry = decode_entry(got.payload, got.dsn)
        assert isinstance(entry, TxnEntry)
        try:
            self._state.apply(entry)  # blocking footer reads for a CreateBlock (rare)
        except ApplyError as exc:
            raise SnapshotUnavailable(f"logtail entry {got.dsn} does not apply: {exc}") from exc
        self.applied_ts = max(self.applied_ts, got.commit_ts)
        self.entries_applied += 1

    async def follow(self) -> None:
        """Keep up with the TN as it commits: subscribe, then pull what came before. Pushed
        entries are applied in order; a gap or an overflow falls back to a pull."""
        self.check_not_closed()
        if self._follow_task is not None:
            return
        # None in the queue wakes the drain for a pull: the subscription skipped entries.
        queue: asyncio.Queue[TailEntry | None] = asyncio.Queue(FOLLOW_QUEUE_MAX)
        overflow = asyncio.Event()

        def on_entry(entry: TailEntry | None) -> None:
            try:
                queue.put_nowait(entry)
            except asyncio.QueueFull:
                overflow.set()

        def on_gap() -> None:
            overflow.set()
            on_entry(None)

        self._unsubscribe = await self._port.subscribe(on_entry, on_gap=on_gap)
        await self.catch_up()
        self._follow_queue = queue
        self._follow_task = asyncio.get_running_loop().create_task(self._drain(queue, overflow))

    async def _drain(self, queue: asyncio.Queue[TailEntry | None], overflow: asyncio.Event) -> None:
        while True:
            entry = await queue.get()
            async with self._pull_lock:
                if (
                    entry is not None
                    and entry.commit_ts > self.applied_ts
                    and not overflow.is_set()
                ):
                    self._apply_entry(entry)
            if overflow.is_set():
                while not queue.empty():
                    queue.get_nowait()
                overflow.clear()
                await self.catch_up()

    # --- reads and transactions --------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def snapshot(self, ts: int | None = None) -> AsyncIterator[Transaction]:
        """A read-only view at `ts` (default: the TN's newest), pulled first if needed."""
        reached = await self.catch_up(ts)
        at = reached if ts is None else ts
        if not self._history_floor_ts <= at <= self.applied_ts:
            raise SnapshotUnavailable(
                f"snapshot at {at}: this compute node holds [{self._history_floor_ts}, "
                f"{self.applied_ts}]"
            )
        view = Transaction(self, at, read_only=True, registered=False)
        try:
            yield view
        finally:
            view.state = TxnState.ROLLED_BACK

    async def sql(self, query: str, at: int | datetime.datetime | None = None) -> pa.Table:
        """`Engine.sql` on this node: one SELECT over its snapshot at `at` (None: the TN's
        newest; a datetime: the snapshot of that wall time, pulled first), engine/sql.py."""
        if isinstance(at, datetime.datetime):
            at = as_of.snapshot_ts(at, await self.catch_up())
        async with self.snapshot(at) as view:
            # engine/sql.py pulls in pyarrow.dataset and pandas (~0.3 s): imported by the
            # first query, not by every process that opens an engine.
            from engine import sql

            return await sql.run(view, query)

    async def begin(self) -> CNTransaction:
        """A transaction at the TN's newest visible timestamp."""
        await self.catch_up()
        if len(self._open_txns) >= limits.TXNS_OPEN_MAX:
            raise Overloaded("open transactions", limits.TXNS_OPEN_MAX)
        txn = CNTransaction(self, self.applied_ts)
        self._open_txns.add(txn)
        return txn

    def transaction(self) -> TransactionScope[CNTransaction]:
        return TransactionScope(self.begin)

    async def close(self) -> None:
        self._closed = True
        for pull in tuple(self._pulls):
            pull.cancel()
        if self._unsubscribe is not None:
            self._unsubscribe()
        task, self._follow_task = self._follow_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
