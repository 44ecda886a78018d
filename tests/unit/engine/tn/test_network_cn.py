"""A compute node over the network (`ComputeNode` + `NetworkTN`, engine/cn/client.py)
against real TN servers on loopback, each with a real Engine on the memory WAL.

Proves: a CN reads at every timestamp exactly what the TN reads there, also when it starts
behind the TN's logtail buffer (from a checkpoint); a CN's transactions commit on the TN;
when the active TN goes away and a standby on the same WAL is promoted, the same NetworkTN
finds it, a retried commit (same client_id and seq) gets its first commit_ts back, new
commits go on, and the CN's subscription continues with no gap and no duplicate; a
subscription whose connection is lost catches up from the logtail, and one the logtail
cannot catch up calls `on_gap` instead of skipping; a commit whose TN never answers is
`OutcomeUnknown` within the client's bounds (and its first outcome is found later with the
same write set), and one that could not be sent anywhere is `TNUnavailable`; a logtail
longer than the TN's page bound arrives in pages and is put together whole.

How: in-process servers (engine/tn/server.py) on 127.0.0.1, small client bounds so the
failure cases take well under a second each.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pyarrow as pa
import pytest

from engine import Column, Engine, Schema
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.errors import OutcomeUnknown
from engine.logtail import TailEntry
from engine.objects.store import MemoryObjectStore
from engine.tn import messages
from engine.tn.channel import Channel
from engine.tn.errors import TNUnavailable
from engine.tn.limits import ClientOptions
from engine.tn.server import TNServer
from engine.tn.service import TNService
from engine.writeset import Op, WriteSet
from tae_driver.backends.memory import MemoryBackend

pytestmark = pytest.mark.timeout(60)

TOKEN = "tn-test-token-0123"
ROWS = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], primary_key=["id"])
FAST = ClientOptions(
    connect_timeout_s=0.5,
    request_timeout_s=2.0,
    failover_wait_s_max=5.0,
    backoff_s_first=0.02,
    backoff_s_max=0.2,
)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 50))


def rows(*ids: int, v: str = "v") -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"{v}{i}" for i in ids]}, schema=ROWS.to_arrow())


class TN:
    """An engine served on a port; `stop()` is the process dying (server gone, engine
    aborted), `restart_server()` the port coming back on the same engine."""

    def __init__(self, engine: Engine, server: TNServer) -> None:
        self.engine = engine
        self.server = server
        self.port = server.port
        self.address = f"127.0.0.1:{self.port}"

    @classmethod
    async def start(
        cls, wal: MemoryBackend, objects: MemoryObjectStore, *, standby: bool = False
    ) -> TN:
        engine = await Engine.open(
            "unused", wal, objects=objects, maintenance=False, standby=standby
        )
        server = TNServer(TNService(engine), TOKEN)
        await server.start("127.0.0.1", 0)
        return cls(engine, server)

    async def stop_server(self) -> None:
        await self.server.close(grace_s=0.5)

    async def restart_server(self) -> None:
        self.server = TNServer(TNService(self.engine), TOKEN)
        await self.server.start("127.0.0.1", self.port)

    async def crash(self) -> None:
        await self.stop_server()
        await self.engine.abort()

    async def close(self) -> None:
        await self.stop_server()
        await self.engine.close()


async def create_table(engine: Engine) -> None:
    """Database d, table t (ROWS), committed on the TN."""
    async with engine.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)


async def checkpoint_past_the_logtail(engine: Engine) -> None:
    """A checkpoint, and the TN's logtail buffer emptied up to it: what a TN whose buffer
    dropped its oldest entries answers a CN behind it (the checkpoint, then the rest)."""
    manifest = await engine.checkpoint()
    assert manifest is not None
    engine._logtail.reset(manifest.ckp_ts)


async def scan(view: Any) -> list[dict[str, Any]]:
    table = await view.table("d", "t").scan()
    return sorted(table.to_pylist(), key=lambda row: row["id"])


async def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_a_cn_reads_what_the_tn_reads_at_every_timestamp() -> None:
    async def main() -> None:
        objects = MemoryObjectStore()
        tn = await TN.start(MemoryBackend(), objects)
        client = NetworkTN([tn.address], TOKEN, FAST)
        cn = ComputeNode(client, objects)
        try:
            async with cn.transaction() as txn:  # DDL from the CN
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
            stamps = [tn.engine.visible_ts]
            for i in range(12):
                if i % 3 == 0:  # some from the CN, some on the TN itself
                    async with cn.transaction() as txn:
                        await txn.table("d", "t").insert(rows(i, 100 + i))
                else:
                    async with tn.engine.transaction() as txn:
                        await txn.table("d", "t").insert(rows(i))
                        if i > 4:
                            await txn.table("d", "t").delete([i - 4])
                stamps.append(tn.engine.visible_ts)
            for ts in stamps:
                async with cn.snapshot(ts) as mine, tn.engine.snapshot(ts) as theirs:
                    assert await scan(mine) == await scan(theirs), ts
            # A second CN that starts after the TN's buffer lost its oldest entries: it starts
            # from the checkpoint (read from the object store), then the entries after it.
            await checkpoint_past_the_logtail(tn.engine)
            async with tn.engine.transaction() as txn:
                await txn.table("d", "t").update([101], {"v": "after the checkpoint"})
            late = ComputeNode(client, objects)
            try:
                async with (
                    late.snapshot() as mine,
                    tn.engine.snapshot(tn.engine.visible_ts) as theirs,
                ):
                    assert await scan(mine) == await scan(theirs)
                assert late.checkpoints_loaded == 1
            finally:
                await late.close()
        finally:
            await cn.close()
            await client.close()
            await tn.close()

    run(main)


def test_failover_to_a_promoted_standby_keeps_commits_and_the_subscription() -> None:
    async def main() -> None:
        wal, objects = MemoryBackend(), MemoryObjectStore()
        active = await TN.start(wal, objects)
        await create_table(active.engine)
        standby = await TN.start(wal, objects, standby=True)
        client = NetworkTN([active.address, standby.address], TOKEN, FAST)
        cn = ComputeNode(client, objects, client_id="cn-failover")
        pushed: list[TailEntry] = []
        unsubscribe = await client.subscribe(pushed.append)
        try:
            await cn.follow()
            acked: dict[int, int] = {}
            for i in range(10):
                async with cn.transaction() as txn:
                    await txn.table("d", "t").insert(rows(i))
                acked[i] = txn.commit_ts  # type: ignore[assignment]
            last = WriteSet(
                active.engine.visible_ts, (Op("insert", "d", "t", rows=rows(50)),), "ops", 1
            )
            landed = await client.commit(last)
            assert client.address == active.address
            await wait_for(lambda: standby.engine.visible_ts == active.engine.visible_ts)
            await active.crash()  # the active TN dies
            channel = await Channel.open(standby.address, TOKEN, FAST)  # the operator
            try:
                promoted = await channel.call(messages.Promote())
                assert isinstance(promoted, messages.Promoted) and promoted.was_standby
            finally:
                await channel.close()
            assert await client.commit(last) == landed  # the retry finds its first outcome
            assert client.address == standby.address and client.failovers >= 1
            for i in range(10, 20):
                async with cn.transaction() as txn:
                    await txn.table("d", "t").insert(rows(i))
                acked[i] = txn.commit_ts  # type: ignore[assignment]
            await wait_for(lambda: cn.applied_ts == standby.engine.visible_ts)
            async with cn.snapshot() as view:
                ids = [row["id"] for row in await scan(view)]
            assert ids == [*range(20), 50]
            stamps = [entry.commit_ts for entry in pushed]
            assert stamps == sorted(set(stamps))  # in order, none twice
            expected = standby.engine.logtail(stamps[0] - 1, standby.engine.visible_ts).entries
            assert [e.commit_ts for e in expected] == stamps  # and none missing
            assert set(acked.values()) <= set(stamps)
        finally:
            unsubscribe()
            await cn.close()
            await client.close()
            await standby.close()

    run(main)


def test_a_lost_subscription_catches_up_from_the_logtail_or_says_it_cannot() -> None:
    async def main() -> None:
        objects = MemoryObjectStore()
        tn = await TN.start(MemoryBackend(), objects)
        await create_table(tn.engine)
        client = NetworkTN([tn.address], TOKEN, FAST)
        got: list[TailEntry] = []
        gaps: list[int] = []
        start = tn.engine.visible_ts
        unsubscribe = await client.subscribe(got.append, on_gap=lambda: gaps.append(1))
        try:
            async with tn.engine.transaction() as txn:
                await txn.table("d", "t").insert(rows(1))
            await wait_for(lambda: len(got) == 1)
            await tn.stop_server()  # the connection is lost...
            for i in range(2, 6):  # ...while commits go on
                async with tn.engine.transaction() as txn:
                    await txn.table("d", "t").insert(rows(i))
            await tn.restart_server()
            await wait_for(lambda: len(got) == 5)
            assert got == list(tn.engine.logtail(start, tn.engine.visible_ts).entries)
            assert not gaps
            # Again, but now the TN's buffer no longer holds what was missed: a checkpoint.
            await tn.stop_server()
            async with tn.engine.transaction() as txn:
                await txn.table("d", "t").insert(rows(6))
            await checkpoint_past_the_logtail(tn.engine)
            await tn.restart_server()
            await wait_for(lambda: bool(gaps))
            assert [e.commit_ts for e in got] == [e.commit_ts for e in got[:5]]  # no skip
            async with tn.engine.transaction() as txn:
                await txn.table("d", "t").insert(rows(7))
            await wait_for(lambda: len(got) == 6)  # following again after the gap was told
            assert got[-1].commit_ts == tn.engine.visible_ts
        finally:
            unsubscribe()
            await client.close()
            await tn.close()

    run(main)


def test_a_following_cn_pulls_across_a_gap_its_subscription_cannot_fill() -> None:
    async def main() -> None:
        objects = MemoryObjectStore()
        tn = await TN.start(MemoryBackend(), objects)
        await create_table(tn.engine)
        client = NetworkTN([tn.address], TOKEN, FAST)
        cn = ComputeNode(client, objects)
        try:
            await cn.follow()
            await tn.stop_server()  # the subscription's connection is lost; meanwhile the
            async with tn.engine.transaction() as txn:  # TN commits and checkpoints, and its
                await txn.table("d", "t").insert(rows(1, 2))  # logtail no longer holds it
            await checkpoint_past_the_logtail(tn.engine)
            await tn.restart_server()
            # No read asks the CN to pull: only its follower can bring it up to date.
            await wait_for(lambda: cn.applied_ts >= tn.engine.visible_ts)
            async with tn.engine.transaction() as txn:
                await txn.table("d", "t").insert(rows(3))
            await wait_for(lambda: cn.applied_ts == tn.engine.visible_ts)
            async with cn.snapshot(cn.applied_ts) as view:
                assert [row["id"] for row in await scan(view)] == [1, 2, 3]
        finally:
            await cn.close()
            await client.close()
            await tn.close()

    run(main)


def test_a_commit_no_tn_answers_is_outcome_unknown_then_found_by_its_retry() -> None:
    async def main() -> None:
        wal = MemoryBackend()
        tn = await TN.start(wal, MemoryObjectStore())
        await create_table(tn.engine)
        impatient = ClientOptions(
            connect_timeout_s=0.3, request_timeout_s=0.3, failover_wait_s_max=0.8
        )
        client = NetworkTN([tn.address], TOKEN, impatient)
        try:
            ws = WriteSet(tn.engine.visible_ts, (Op("insert", "d", "t", rows=rows(1)),), "cn", 1)
            wal.hold_appends = True  # the WAL never answers
            started = time.monotonic()
            with pytest.raises(OutcomeUnknown):
                await client.commit(ws)
            assert time.monotonic() - started < 3.0
            wal.hold_appends = False
            for held in wal.held():
                await wal.release(held)
            await wait_for(lambda: tn.engine.visible_ts > ws.start_ts)
            landed = tn.engine.visible_ts
            assert await client.commit(ws) == landed  # asked again: it did land, once
            async with tn.engine.transaction() as txn:
                assert len(await txn.table("d", "t").scan()) == 1
        finally:
            await client.close()
            await tn.close()

    run(main)


def test_nothing_sent_anywhere_is_tn_unavailable_within_the_bounds() -> None:
    async def main() -> None:
        tn = await TN.start(MemoryBackend(), MemoryObjectStore())
        address = tn.address
        await tn.close()  # nobody listens there any more
        options = ClientOptions(connect_timeout_s=0.2, failover_wait_s_max=0.5)
        client = NetworkTN([address, "127.0.0.1:1"], TOKEN, options)
        try:
            started = time.monotonic()
            with pytest.raises(TNUnavailable, match="not sent"):
                await client.commit(WriteSet(0, (Op("create_database", "d"),), "cn", 1))
            with pytest.raises(TNUnavailable):
                await client.status()
            assert time.monotonic() - started < 3.0
        finally:
            await client.close()

    run(main)


def test_a_logtail_longer_than_a_page_arrives_whole() -> None:
    async def main() -> None:
        objects = MemoryObjectStore()
        engine = await Engine.open("unused", MemoryBackend(), objects=objects, maintenance=False)
        server = TNServer(TNService(engine, page_entries_max=3), TOKEN)
        await server.start("127.0.0.1", 0)
        client = NetworkTN([f"127.0.0.1:{server.port}"], TOKEN, FAST)
        try:
            async with engine.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
            for i in range(10):
                async with engine.transaction() as txn:
                    await txn.table("d", "t").insert(rows(i))
            channel = await Channel.open(f"127.0.0.1:{server.port}", TOKEN, FAST)
            try:
                page = await channel.call(messages.PullLogtail(0, engine.visible_ts))
                assert isinstance(page, messages.LogtailPage) and page.more
                assert len(page.logtail.entries) == 3
                assert page.logtail.upto_ts == page.logtail.entries[-1].commit_ts
            finally:
                await channel.close()
            assert await client.logtail(0, engine.visible_ts) == engine.logtail(
                0, engine.visible_ts
            )
            cn = ComputeNode(client, objects)
            try:
                async with cn.snapshot() as view:
                    assert [row["id"] for row in await scan(view)] == list(range(10))
            finally:
                await cn.close()
        finally:
            await client.close()
            await server.close()
            await engine.close()

    run(main)


def test_one_cn_has_many_commits_in_flight_on_one_connection_at_once() -> None:
    """A compute node's concurrent transactions are not sent one at a time: with the TN's WAL
    holding every append, all of them reach the TN over the CN's one connection and wait
    there together; released, each gets its own commit_ts (issue 21, target 5)."""

    async def body() -> None:
        wal = MemoryBackend()
        objects = MemoryObjectStore()
        tn = await TN.start(wal, objects)
        await create_table(tn.engine)
        client = NetworkTN([tn.address], TOKEN, FAST)
        cn = ComputeNode(client, objects)
        count = 8

        async def insert(key: int) -> int:
            async with cn.transaction() as txn:
                await txn.table("d", "t").insert(rows(key))
            assert txn.commit_ts is not None
            return txn.commit_ts

        try:
            await cn.catch_up()
            wal.hold_appends = True
            tasks = [asyncio.ensure_future(insert(key)) for key in range(count)]
            await wait_for(lambda: tn.server.requests_inflight == count)
            assert tn.server.connections == 1
            assert not any(task.done() for task in tasks)
            wal.hold_appends = False
            deadline = time.monotonic() + 10
            while not all(task.done() for task in tasks):
                assert time.monotonic() < deadline, "commits not answered after the release"
                for held in wal.held():
                    await wal.release(held)
                await asyncio.sleep(0.01)
            commit_ts = [task.result() for task in tasks]
            assert len(set(commit_ts)) == count
            async with cn.snapshot() as view:
                assert [row["id"] for row in await scan(view)] == list(range(count))
        finally:
            await cn.close()
            await client.close()
            await tn.close()

    run(body)
