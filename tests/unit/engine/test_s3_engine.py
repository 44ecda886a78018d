"""The engine with its objects in S3 (`objects=S3ObjectStore(...)`), against a real
S3-protocol server: moto in server mode on loopback (tests/support/s3server.py; issue 14 "The
S3 path against the loopback S3 server, including an error answer and a restart of it").

Proves:

* the whole storage life on S3: commits, flushes, a merge, a compaction, checkpoints that
  truncate the file WAL, a restart from the checkpoint in S3 (a new client, an empty cache)
  plus the WAL tail, with the same digest; the bucket holds plain Parquet a reader opens;
* an error answer: the bucket is deleted under a running engine. Flushes and checkpoints fail
  with `ObjectStoreFailed` naming NO_SUCH_BUCKET (counted in `Maintenance.errors`), and
  commits and reads go on (the WAL does not depend on the object store); once the bucket is
  back, the next rounds flush and checkpoint, and a restart has the same digest. An engine
  opened on a missing bucket is refused with that reason, not with a misleading "no
  checkpoint" from the WAL's gap check;
* a stopped server: commits go on, reads of what is in memory or in the cache go on, storage
  work fails with `ObjectStoreUnavailable` in bounded time;
* a server SIGKILLed in the middle of a flush's upload (the test watches the server's read
  counter in /proc): the flush fails typed and is not committed, so nothing refers to a
  half-written object; after the restart the next round flushes again and a restart of the
  engine from S3 has the same digest.

What a moto restart means, honestly: moto keeps its buckets in the server process's memory, so
a restarted server is empty, as if the bucket had been wiped. Objects written before the
restart are gone; the tests say so where it matters (`audit_objects` reports them missing, a
read that needs one raises `ObjectNotFound`) and never pretend an object survived.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine import Column, Engine, Schema, metrics
from engine.checkpoint import layout
from engine.compaction import Policy
from engine.objects.errors import ObjectNotFound, ObjectStoreFailed, ObjectStoreUnavailable
from engine.objects.s3 import S3ObjectStore
from tae_driver.backends.memory import MemoryBackend
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
# No history window (decision 0010): objects are collected once a checkpoint covers them.
POLICY = Policy(merge_l1_blocks=2, compact_deleted_fraction=0.5, history_retention_ms=0)
_buckets = iter(range(1_000_000))


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with MotoServer() as running:
        yield running


def s3_store(server: MotoServer, bucket: str) -> S3ObjectStore:
    return S3ObjectStore(server.endpoint, bucket, "engine", ACCESS_KEY, SECRET_KEY, REGION)


def new_bucket(server: MotoServer) -> str:
    bucket = f"engine-{next(_buckets)}"
    server.create_bucket(bucket)
    return bucket


def delete_bucket(server: MotoServer, bucket: str) -> None:
    """S3 DeleteBucket (the bucket must be empty), as an operator would."""
    request = urllib.request.Request(f"http://{server.endpoint}/{bucket}", method="DELETE")
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status == 204, answer.status


def rows(ids: range | list[int], width: int = 8) -> list[dict[str, object]]:
    return [{"id": i, "v": f"{i:0{width}d}"} for i in ids]


async def insert(eng: Engine, ids: range | list[int]) -> None:
    async with eng.transaction() as txn:
        await txn.table("d", "t").insert(rows(ids))


async def delete(eng: Engine, ids: list[int]) -> None:
    async with eng.transaction() as txn:
        await txn.table("d", "t").delete(ids)


async def create(eng: Engine) -> None:
    async with eng.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)


async def step(eng: Engine, *, freeze_all: bool = False) -> None:
    """One maintenance round (not `settle`, which would retry a failing flush 64 times)."""
    assert eng.maintenance is not None
    await asyncio.gather(*eng.maintenance.step(freeze_all=freeze_all))


async def count(eng: Engine) -> int:
    async with eng.transaction() as txn:
        found: int = (await txn.table("d", "t").scan(columns=["id"])).num_rows
    return found


def test_flushes_merges_checkpoints_and_a_restart_from_s3(
    server: MotoServer, tmp_path: Path
) -> None:
    async def main() -> None:
        bucket = new_bucket(server)
        store = s3_store(server, bucket)
        eng = await Engine.open(str(tmp_path), objects=store, policy=POLICY, maintenance=False)
        assert eng.checkpointer is not None and eng.maintenance is not None
        eng.checkpointer.wal_reserve_entries = 0
        await create(eng)
        await insert(eng, range(0, 300))
        await eng.maintenance.settle(freeze_all=True)
        await insert(eng, range(300, 600))
        await eng.maintenance.settle(freeze_all=True)  # a second L1 block: merged into L2
        await delete(eng, list(range(0, 600, 3)))
        await eng.checkpoint()
        await delete(eng, list(range(1, 600, 3)))
        await eng.maintenance.settle()  # two thirds dead: the L2 block is compacted
        await insert(eng, range(600, 650))
        await eng.checkpoint()
        await insert(eng, range(650, 660))  # the WAL tail
        await delete(eng, [602])
        figures = metrics.storage_stats(eng)
        assert figures.rewrites_done == {"flush": 2, "merge": 1, "compact": 1}
        assert figures.blocks == {"l0": 1, "l1": 0, "l2": 1}
        assert figures.objects == f"s3://{bucket}/engine"
        digest, visible_ts = eng.digest(), eng.visible_ts
        await eng.close()

        # What is in the bucket is plain Parquet a reader opens without the engine.
        names = [info.name for info in store.list("")]
        manifests = [n for n in names if n.endswith(layout.MANIFEST_NAME)]
        assert len(manifests) == 2
        data = [n for n in names if n.startswith("data/")]
        assert data and all(pq.ParquetFile(store.open_input(n)).metadata.num_rows for n in data)

        again = await Engine.open(
            str(tmp_path), objects=s3_store(server, bucket), policy=POLICY, maintenance=False
        )
        try:
            assert again.digest() == digest and again.visible_ts == visible_ts
            replay = again.stats().replay
            assert replay is not None and replay.entries_applied == 2  # only the tail
            audit = await asyncio.to_thread(metrics.audit_objects, again)
            assert audit.missing == () and audit.unreferenced == ()
            assert await count(again) == 660 - 400 - 1
        finally:
            await again.close()

    asyncio.run(main())


def test_a_deleted_bucket_fails_storage_work_typed_and_commits_and_reads_go_on(
    server: MotoServer,
) -> None:
    async def main() -> None:
        bucket = new_bucket(server)
        wal = MemoryBackend()
        eng = await Engine.open(
            "unused", wal, objects=s3_store(server, bucket), policy=POLICY, maintenance=False
        )
        assert eng.maintenance is not None
        await create(eng)
        await insert(eng, range(0, 100))
        delete_bucket(server, bucket)  # empty: nothing was flushed yet

        await step(eng, freeze_all=True)
        assert eng.maintenance.errors == 1
        assert "ObjectStoreFailed" in str(eng.maintenance.last_error)
        assert "NO_SUCH_BUCKET" in str(eng.maintenance.last_error)
        with pytest.raises(ObjectStoreFailed, match="NO_SUCH_BUCKET"):
            await eng.checkpoint()
        await insert(eng, range(100, 150))  # commits go on: the WAL is not the object store
        await delete(eng, [7])
        assert await count(eng) == 149
        figures = metrics.storage_stats(eng)
        assert figures.blocks["l1"] == 0 and figures.maintenance_errors == 1
        assert "engine_maintenance_errors_total 1.0" in metrics.render(eng)

        server.create_bucket(bucket)  # the operator puts it back: the next rounds succeed
        await eng.maintenance.settle(freeze_all=True)
        assert await eng.checkpoint() is not None
        assert metrics.storage_stats(eng).blocks == {"l0": 0, "l1": 0, "l2": 1}  # merged
        digest = eng.digest()
        await eng.close()
        again = await Engine.open(
            "unused", wal, objects=s3_store(server, bucket), policy=POLICY, maintenance=False
        )
        try:
            assert again.digest() == digest
        finally:
            await again.close()

    asyncio.run(main())


def test_an_engine_is_not_opened_on_a_missing_bucket(server: MotoServer, tmp_path: Path) -> None:
    """The engine's checkpoint is in its bucket and its WAL was truncated below it: opened on
    a bucket name that does not exist, the engine must say that, not that the WAL has a hole
    (which is what the replay's gap check would conclude from finding no checkpoint)."""

    async def main() -> None:
        bucket = new_bucket(server)
        eng = await Engine.open(str(tmp_path), objects=s3_store(server, bucket), maintenance=False)
        assert eng.checkpointer is not None
        eng.checkpointer.wal_reserve_entries = 0
        await create(eng)
        await insert(eng, range(0, 10))
        await eng.checkpoint()
        await insert(eng, range(10, 20))
        await eng._driver.truncation_settled()
        await eng.close()
        with pytest.raises(ObjectStoreFailed, match="bucket does not exist"):
            await Engine.open(str(tmp_path), objects=s3_store(server, "no-such-bucket"))
        again = await Engine.open(str(tmp_path), objects=s3_store(server, bucket))
        try:
            assert await count(again) == 20
        finally:
            await again.close()

    asyncio.run(main())


def test_a_stopped_server_fails_storage_work_typed_and_the_engine_keeps_serving() -> None:
    async def main(server: MotoServer) -> None:
        bucket = new_bucket(server)
        wal = MemoryBackend()
        eng = await Engine.open(
            "unused",
            wal,
            objects=s3_store(server, bucket),
            policy=POLICY,
            maintenance=False,
        )
        assert eng.maintenance is not None
        await create(eng)
        await insert(eng, range(0, 200))
        await eng.maintenance.settle(freeze_all=True)  # an L1 object in S3
        (flushed,) = _held(eng)
        assert await count(eng) == 200  # reads it once: its columns are in the cache now
        server.kill()

        began = time.monotonic()
        await insert(eng, range(1000, 1100))  # commits go on
        await delete(eng, [1005])
        assert await count(eng) == 299  # the L1 block from the cache, the rest from memory
        async with eng.transaction() as txn:
            assert await txn.table("d", "t").get(1050) == rows([1050])[0]
        # A delete in the L1 block must find the row (its keys are not cached): it fails
        # typed, the transaction rolls back, and the engine goes on.
        with pytest.raises(ObjectStoreUnavailable):
            await delete(eng, [5])
        assert await count(eng) == 299
        await step(eng, freeze_all=True)  # the flush of the new block fails...
        assert eng.maintenance.errors == 1
        assert "ObjectStoreUnavailable" in str(eng.maintenance.last_error)
        with pytest.raises(ObjectStoreUnavailable):  # ...and so does a checkpoint
            await eng.checkpoint()
        assert time.monotonic() - began < 30  # bounded retries, not a hang
        assert metrics.storage_stats(eng).blocks == {"l0": 1, "l1": 1, "l2": 0}

        # A restarted moto is empty (its state was the killed process's memory): the bucket
        # and the L1 object are gone. The engine says exactly that (a new engine on the same
        # WAL cannot replay the block's CreateBlock and names the object), and flushes new
        # blocks.
        server.start()
        server.create_bucket(bucket)
        audit = await asyncio.to_thread(metrics.audit_objects, eng)
        assert audit.missing == (flushed,)
        with pytest.raises(ObjectNotFound, match=flushed):
            await Engine.open("unused", wal, objects=s3_store(server, bucket), read_only=True)
        await step(eng, freeze_all=True)
        assert metrics.storage_stats(eng).blocks == {"l0": 0, "l1": 2, "l2": 0}
        await eng.close()

    with MotoServer() as own:
        asyncio.run(main(own))


def _held(eng: Engine) -> tuple[str, ...]:
    return tuple(
        sorted(
            {
                b.object_name
                for t in eng._state.catalog.tables.values()
                for b in t.data.blocks.values()
                if hasattr(b, "object_name")
            }
        )
    )


class CuttingProxy:
    """A TCP forwarder on loopback in front of the S3 server that SIGKILLs the server once
    clients have sent it `armed` more bytes: a kill in the middle of an upload, at a byte
    count rather than at a moment (a 4 MiB put takes moto a tenth of a second, too short to
    aim at reliably on a busy machine). It forwards bytes unchanged; the server is real.
    Threads are daemons, stopped by `close()` (closing every socket ends them)."""

    CHUNK_BYTES = 64 * 1024

    def __init__(self, server: MotoServer) -> None:
        self._server = server
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._budget: int | None = None
        self.killed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, after_bytes: int) -> None:
        with self._lock:
            self._budget = after_bytes

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self._server.port), timeout=5)
            except OSError:
                client.close()  # the server is down: the client sees its connection end
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst, counted in ((client, upstream, True), (upstream, client, False)):
                thread = threading.Thread(target=self._pipe, args=(src, dst, counted), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(self.CHUNK_BYTES):
                if counted:
                    data = self._spend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _spend(self, data: bytes) -> bytes:
        """What of `data` may still reach the server; kills it when the budget runs out."""
        with self._lock:
            if self._budget is None:
                return data
            if len(data) < self._budget:
                self._budget -= len(data)
                return data
            self._budget = None
        self._server.kill()
        self.killed.set()
        raise OSError("the server was killed mid-upload")


def test_a_server_killed_mid_flush_fails_the_flush_cleanly_and_it_is_retried() -> None:
    async def main(server: MotoServer, proxy: CuttingProxy) -> None:
        bucket = new_bucket(server)
        wal = MemoryBackend()
        through_proxy = S3ObjectStore(
            proxy.endpoint, bucket, "engine", ACCESS_KEY, SECRET_KEY, REGION
        )
        eng = await Engine.open("unused", wal, objects=through_proxy, maintenance=False)
        assert eng.maintenance is not None
        await create(eng)
        rng = random.Random(14)
        for start in range(0, 8000, 400):  # 8 MB of hex text in one L0 block: a 4 MiB object
            async with eng.transaction() as txn:
                await txn.table("d", "t").insert(
                    [{"id": i, "v": rng.randbytes(512).hex()} for i in range(start, start + 400)]
                )
        digest = eng.digest()

        proxy.arm(after_bytes=1024 * 1024)
        await asyncio.wait_for(step(eng, freeze_all=True), 60)
        assert proxy.killed.is_set()
        assert eng.maintenance.errors == 1
        assert "ObjectStoreUnavailable" in str(eng.maintenance.last_error)
        # Not committed: the block is still L0 and nothing refers to any object.
        assert metrics.storage_stats(eng).blocks == {"l0": 1, "l1": 0, "l2": 0}
        assert _held(eng) == ()

        server.start()  # empty: whatever part of the upload it had is gone with it
        server.create_bucket(bucket)
        await eng.maintenance.settle()  # the block is sealed: the next round flushes it
        assert metrics.storage_stats(eng).blocks == {"l0": 0, "l1": 1, "l2": 0}
        assert await eng.checkpoint() is not None
        await eng.close()
        again = await Engine.open("unused", wal, objects=s3_store(server, bucket))
        try:
            assert again.digest() == digest
            audit = await asyncio.to_thread(metrics.audit_objects, again)
            assert audit.missing == () and audit.unreferenced == ()
        finally:
            await again.close()

    with MotoServer() as own:
        proxy = CuttingProxy(own)
        try:
            asyncio.run(main(own, proxy))
        finally:
            proxy.close()
