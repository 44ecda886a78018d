"""The TN server (engine/tn/server.py) over loopback, against a real Engine on the memory WAL.

Proves: bad input gets typed answers and closes only its own connection while the server
goes on serving another (garbage, an oversize frame, a damaged frame, a wrong token, a wrong
protocol version, requests before authenticating); unknown databases and tables are the
engine's NotFound over the wire; every outcome of a commit sent through `NetworkTN` equals
the outcome of the same write set run locally on a twin engine; status tells the truth
(role, visible and checkpoint timestamps); a subscription receives every entry once, in
commit order, byte for byte the engine's logtail; a subscriber that does not read is
dropped with SUBSCRIBER_DROPPED while the others are served; the per-connection request
bound answers OVERLOADED; the connection bound closes new connections.

How: real sockets on 127.0.0.1, real engines (MemoryBackend WAL, memory objects), raw bytes
where the test is about bytes and `Channel`/`NetworkTN` elsewhere. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pyarrow as pa
import pytest

from engine import Column, Engine, Schema
from engine.cn.client import NetworkTN
from engine.errors import DuplicateKey, NotFound, Overloaded
from engine.logtail import TailEntry
from engine.objects.store import MemoryObjectStore
from engine.tn import limits, messages
from engine.tn.channel import Channel
from engine.tn.errors import BadRequest, ErrorCode, NotActive, Unauthorized
from engine.tn.limits import ClientOptions, ServerLimits
from engine.tn.server import TNServer
from engine.tn.service import TNService
from engine.writeset import Op, WriteSet
from logsvc.wire.frames import FrameKind, encode_frame
from tae_driver.backends.memory import MemoryBackend

pytestmark = pytest.mark.timeout(60)

TOKEN = "tn-test-token-0123"
ROWS = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], primary_key=["id"])
FAST = ClientOptions(
    connect_timeout_s=1.0, request_timeout_s=5.0, failover_wait_s_max=1.0, backoff_s_first=0.02
)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 50))


def rows(*ids: int, v: str = "v") -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"{v}{i}" for i in ids]}, schema=ROWS.to_arrow())


class TN:
    def __init__(self, engine: Engine, server: TNServer) -> None:
        self.engine = engine
        self.server = server
        self.address = f"127.0.0.1:{server.port}"


@asynccontextmanager
async def served(
    wal: MemoryBackend | None = None,
    *,
    standby: bool = False,
    server_limits: ServerLimits | None = None,
    objects: MemoryObjectStore | None = None,
) -> AsyncIterator[TN]:
    engine = await Engine.open(
        "unused",
        wal or MemoryBackend(),
        objects=objects or MemoryObjectStore(),
        maintenance=False,
        standby=standby,
    )
    server = TNServer(TNService(engine), TOKEN, server_limits)
    await server.start("127.0.0.1", 0)
    try:
        yield TN(engine, server)
    finally:
        await server.close(grace_s=1.0)
        await engine.close()


async def shop(engine: Engine) -> None:
    async with engine.transaction() as txn:
        await txn.create_database("d")
        await txn.create_table("d", "t", ROWS)


async def raw(tn: TN, data: bytes, expect: int | None = None) -> tuple[list[messages.Reply], bool]:
    """Send bytes on a fresh connection; the replies read until the server closes it (or
    `expect` replies came, or 2 s passed), and whether it closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", tn.server.port)
    writer.write(data)
    await writer.drain()
    decoder = messages.reply_decoder()
    replies: list[messages.Reply] = []
    closed = False
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 2.0)
            if not chunk:
                closed = True
                break
            decoder.feed(chunk)
            while (frame := decoder.next_frame()) is not None:
                replies.append(messages.decode_reply(frame))
            if expect is not None and len(replies) >= expect:
                break
    except TimeoutError:
        pass
    finally:
        writer.close()
    return replies, closed


def auth(request_id: int = 1, token: str = TOKEN) -> bytes:
    return messages.encode_request(request_id, messages.Authenticate(token))


def codes(replies: list[messages.Reply]) -> list[object]:
    return [r.code if isinstance(r, messages.ErrorReply) else type(r).__name__ for r in replies]


async def still_serves(tn: TN) -> None:
    channel = await Channel.open(tn.address, TOKEN, FAST)
    try:
        reply = await channel.call(messages.Status())
        assert isinstance(reply, messages.StatusReply)
        assert reply.status.visible_ts == tn.engine.visible_ts
    finally:
        await channel.close()


# --- bad input -----------------------------------------------------------------------------------


def test_garbage_gets_a_typed_last_word_and_closes_only_its_connection() -> None:
    async def main() -> None:
        async with served() as tn:
            replies, closed = await raw(tn, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed and codes(replies) == [ErrorCode.BAD_REQUEST]
            assert "magic" in replies[0].message  # type: ignore[union-attr]
            await still_serves(tn)
            # Authenticated first, then a frame whose body was damaged: closed too.
            damaged = bytearray(messages.encode_request(2, messages.Status()))
            damaged[-1] ^= 0xFF
            replies, closed = await raw(tn, auth() + bytes(damaged))
            assert closed and codes(replies) == ["Authenticated", ErrorCode.BAD_REQUEST]
            await still_serves(tn)
            assert tn.server.counters["bad_frames:BadMagic"] == 1
            assert tn.server.counters["bad_frames:BodyChecksumMismatch"] == 1

    run(main)


def test_an_oversize_frame_is_refused_from_its_header() -> None:
    async def main() -> None:
        async with served() as tn:
            size = limits.REQUEST_BODY_BYTES_MAX + 1
            header = encode_frame(FrameKind.REQUEST, 7, b"\x90" * size)[:32]
            replies, closed = await raw(tn, auth() + header)
            assert closed and codes(replies) == ["Authenticated", ErrorCode.TOO_LARGE]
            assert tn.server.counters["bad_frames:FrameTooLarge"] == 1
            await still_serves(tn)

    run(main)


def test_tokens_protocol_versions_and_authentication_first() -> None:
    async def main() -> None:
        async with served() as tn:
            with pytest.raises(Unauthorized):
                await Channel.open(tn.address, "wrong-token-wrong", FAST)
            replies, closed = await raw(tn, auth(token="wrong-token-wrong") + auth(2))
            assert closed and codes(replies) == [ErrorCode.UNAUTHORIZED]  # nothing after
            wrong = messages.encode_request(1, messages.Authenticate(TOKEN, protocol=2))
            replies, closed = await raw(tn, wrong)
            assert closed and codes(replies) == [ErrorCode.BAD_REQUEST]
            assert "protocol 2" in replies[0].message  # type: ignore[union-attr]
            status = messages.encode_request(1, messages.Status())
            replies, closed = await raw(
                tn, status + auth(2) + messages.encode_request(3, messages.Status()), expect=3
            )
            assert not closed  # asking first is refused, not fatal
            assert codes(replies) == [ErrorCode.UNAUTHORIZED, "Authenticated", "StatusReply"]
            await still_serves(tn)

    run(main)


def test_bad_requests_are_answered_and_the_connection_goes_on() -> None:
    async def main() -> None:
        async with served() as tn:
            body = b"\x92\x01\xa5token"  # logsvc's Authenticate: op 1
            logsvc_auth = encode_frame(FrameKind.REQUEST, 2, body)
            garbage_body = encode_frame(FrameKind.REQUEST, 3, b"\xc1")
            replies, closed = await raw(
                tn,
                auth() + logsvc_auth + garbage_body + messages.encode_request(4, messages.Status()),
                expect=4,
            )
            assert not closed
            assert codes(replies) == [
                "Authenticated",
                ErrorCode.UNKNOWN_OP,
                ErrorCode.BAD_REQUEST,
                "StatusReply",
            ]
            subscribe = messages.Subscribe()
            twice = messages.encode_request(2, subscribe) + messages.encode_request(3, subscribe)
            replies, closed = await raw(tn, auth() + twice, expect=3)
            assert not closed
            assert codes(replies) == ["Authenticated", "Subscribed", ErrorCode.BAD_REQUEST]
            assert "one subscription per connection" in replies[2].message  # type: ignore[union-attr]

    run(main)


def test_unknown_databases_and_tables_are_not_found_and_the_server_goes_on() -> None:
    async def main() -> None:
        async with served() as tn:
            await shop(tn.engine)
            channel = await Channel.open(tn.address, TOKEN, FAST)
            try:
                at = tn.engine.visible_ts
                for op in (
                    Op("insert", "nodb", "t", rows=rows(1)),
                    Op("insert", "d", "missing", rows=rows(1)),
                    Op("delete", "d", "missing", keys=(1,)),
                    Op("drop_table", "d", "missing"),
                ):
                    with pytest.raises(NotFound):
                        await channel.call(messages.Commit(WriteSet(at, (op,), "cn", 1)))
                reply = await channel.call(
                    messages.Commit(WriteSet(at, (Op("insert", "d", "t", rows=rows(1)),), "cn", 2))
                )
                assert isinstance(reply, messages.Committed)
                assert reply.commit_ts == tn.engine.visible_ts
            finally:
                await channel.close()

    run(main)


# --- outcomes, status ----------------------------------------------------------------------------

Step = Callable[[int, int], WriteSet]
"""(visible_ts now, visible_ts before the previous step) -> the write set of this step."""


def step(*ops: Op, old: bool = False, seq: int = 0, client: str = "cn-1") -> Step:
    return lambda now, before: WriteSet(before if old else now, ops, client, seq)


STEPS: list[Step] = [
    step(Op("create_database", "d"), Op("create_table", "d", "t", schema=ROWS), seq=1),
    step(Op("create_database", "d"), seq=2),  # AlreadyExists
    step(Op("insert", "d", "t", rows=rows(1, 2, 3)), seq=3),
    step(Op("insert", "d", "t", rows=rows(3, 4)), seq=4),  # DuplicateKey 3
    step(Op("update", "d", "t", keys=(1,), values={"v": "new"}), seq=5),
    step(Op("update", "d", "t", keys=(1,), values={"v": "late"}), old=True, seq=6, client="cn-2"),
    step(Op("update", "d", "t", keys=(2,), values={"nope": 1}), seq=7),  # SchemaError
    step(Op("delete", "d", "t", keys=("x",)), seq=8),  # SchemaError: a string for an int key
    step(Op("delete", "d", "t", keys=(2, 9)), seq=9),
    step(Op("insert", "d", "t", rows=rows(2)), seq=10),  # deleted, so allowed
    step(Op("insert", "d", "t", rows=rows(5)), seq=10),  # a retry of seq 10: first outcome
    step(Op("drop_table", "d", "t"), Op("create_table", "d", "t", schema=ROWS), seq=11),
]


def outcome(result: object) -> object:
    if isinstance(result, int):
        return "committed"
    if isinstance(result, DuplicateKey):
        return ("DuplicateKey", result.table, result.key)
    assert isinstance(result, Exception)
    return type(result).__name__


def test_commit_outcomes_over_the_network_equal_local_ones() -> None:
    async def main() -> None:
        async with served() as tn:
            twin = await Engine.open("twin", MemoryBackend(), objects=MemoryObjectStore())
            client = NetworkTN([tn.address], TOKEN, FAST)
            try:
                seen: list[object] = []
                befores = [tn.engine.visible_ts, twin.visible_ts]
                for make in STEPS:
                    remote_ws = make(tn.engine.visible_ts, befores[0])
                    local_ws = make(twin.visible_ts, befores[1])
                    befores = [tn.engine.visible_ts, twin.visible_ts]
                    results: list[object] = []
                    for call in (client.commit(remote_ws), twin.execute(local_ws)):
                        try:
                            results.append(await call)
                        except Exception as exc:
                            results.append(exc)
                    assert outcome(results[0]) == outcome(results[1]), make
                    seen.append(outcome(results[0]))
                assert seen == [
                    "committed",
                    "AlreadyExists",
                    "committed",
                    ("DuplicateKey", "d.t", 3),
                    "committed",
                    "WriteConflict",
                    "SchemaError",
                    "SchemaError",
                    "committed",
                    "committed",
                    "committed",
                    "committed",
                ]
            finally:
                await client.close()
                await twin.close()

    run(main)


def test_status_tells_the_truth() -> None:
    async def main() -> None:
        wal = MemoryBackend()
        async with served(wal) as tn:
            await shop(tn.engine)
            client = NetworkTN([tn.address], TOKEN, FAST)
            try:
                status = await client.status()
                assert (status.role, status.visible_ts, status.checkpoint_ts) == (
                    "active",
                    tn.engine.visible_ts,
                    0,
                )
                manifest = await tn.engine.checkpoint()
                assert manifest is not None
                assert (await client.status()).checkpoint_ts == manifest.ckp_ts
                assert await client.checkpoints() == ((manifest.ckp_ts, manifest.name),)
                async with served(wal, standby=True) as standby:
                    for _ in range(200):
                        if standby.engine.visible_ts == tn.engine.visible_ts:
                            break
                        await asyncio.sleep(0.01)
                    channel = await Channel.open(standby.address, TOKEN, FAST)
                    try:
                        reply = await channel.call(messages.Status())
                        assert isinstance(reply, messages.StatusReply)
                        assert reply.status.role == "standby"
                        assert reply.status.visible_ts == tn.engine.visible_ts
                        at = standby.engine.visible_ts
                        insert = WriteSet(at, (Op("insert", "d", "t", rows=rows(1)),), "cn", 1)
                        with pytest.raises(NotActive):
                            await channel.call(messages.Commit(insert))
                        page = await channel.call(messages.PullLogtail(0, at))
                        assert isinstance(page, messages.LogtailPage)
                        assert page.logtail.upto_ts == at
                    finally:
                        await channel.close()
            finally:
                await client.close()

    run(main)


# --- subscriptions -------------------------------------------------------------------------------


def test_a_subscription_receives_every_entry_in_order() -> None:
    async def main() -> None:
        async with served() as tn:
            await shop(tn.engine)
            client = NetworkTN([tn.address], TOKEN, FAST)
            got: list[TailEntry] = []
            start = tn.engine.visible_ts
            unsubscribe = await client.subscribe(got.append)
            try:
                for i in range(60):
                    if i % 2:
                        async with tn.engine.transaction() as txn:
                            await txn.table("d", "t").insert(rows(i))
                    else:
                        at = tn.engine.visible_ts
                        ops = (Op("insert", "d", "t", rows=rows(i)),)
                        await client.commit(WriteSet(at, ops, "cn", i + 1))
                for _ in range(500):
                    if got and got[-1].commit_ts == tn.engine.visible_ts:
                        break
                    await asyncio.sleep(0.01)
                expected = tn.engine.logtail(start, tn.engine.visible_ts).entries
                assert len(expected) == 60
                assert got == list(expected)  # commit_ts, dsn and payload: the WAL's own
            finally:
                unsubscribe()
                await client.close()
            for _ in range(100):
                if not tn.server.subscribers:
                    break
                await asyncio.sleep(0.01)
            assert tn.server.subscribers == 0

    run(main)


def test_a_subscriber_that_does_not_read_is_dropped_and_others_are_served() -> None:
    async def main() -> None:
        tight = ServerLimits(
            subscriber_queue_entries_max=8,
            subscriber_queue_bytes_max=1 << 20,
            write_buffer_bytes_max=64 * 1024,
        )
        async with served(server_limits=tight) as tn:
            await shop(tn.engine)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", tn.server.port))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(auth() + messages.encode_request(2, messages.Subscribe()))
            await writer.drain()
            big = "x" * 20_000
            for i in range(2000):  # until the server gives up on it (bounded)
                async with tn.engine.transaction() as txn:
                    await txn.table("d", "t").insert(rows(i, v=big))
                if tn.server.counters["subscribers_dropped"]:
                    break
                await asyncio.sleep(0)
            assert tn.server.counters["subscribers_dropped"] == 1
            assert tn.server.subscribers == 0
            await still_serves(tn)  # meanwhile
            # The slow reader finally reads: what it was sent, then why it was dropped.
            decoder = messages.reply_decoder()
            replies: list[messages.Reply] = []
            while not replies or not isinstance(replies[-1], messages.ErrorReply):
                chunk = await asyncio.wait_for(reader.read(1 << 20), 5.0)
                assert chunk
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    replies.append(messages.decode_reply(frame))
            kinds = codes(replies)
            assert kinds[:2] == ["Authenticated", "Subscribed"]
            assert kinds[-1] == ErrorCode.SUBSCRIBER_DROPPED
            assert set(kinds[2:-1]) <= {"Pushed"}
            pushed = [e for r in replies if isinstance(r, messages.Pushed) for e in r.entries]
            stamps = [e.commit_ts for e in pushed]
            assert stamps == sorted(set(stamps))  # in order, none twice, up to the drop
            writer.close()

    run(main)


# --- bounds ---------------------------------------------------------------------------------------


def test_requests_over_the_in_flight_bound_are_overloaded() -> None:
    async def main() -> None:
        wal = MemoryBackend()
        async with served(wal, server_limits=ServerLimits(requests_inflight_max=2)) as tn:
            await shop(tn.engine)
            at = tn.engine.visible_ts
            wal.hold_appends = True  # commits wait in the WAL: they stay in flight
            channel = await Channel.open(tn.address, TOKEN, FAST)
            try:
                calls = [
                    asyncio.ensure_future(
                        channel.call(
                            messages.Commit(
                                WriteSet(at, (Op("insert", "d", "t", rows=rows(i)),), "cn", i)
                            )
                        )
                    )
                    for i in range(1, 4)
                ]
                with pytest.raises(Overloaded, match="requests in flight"):
                    await asyncio.wait_for(calls[2], 2.0)  # refused at once
                assert not calls[0].done() and not calls[1].done()  # still in the WAL
                await wal.wait_held(1)
                wal.hold_appends = False
                for _ in range(200):
                    if calls[0].done() and calls[1].done():
                        break
                    for held in wal.held():
                        await wal.release(held)
                    await asyncio.sleep(0.01)
                assert all(isinstance(c.result(), messages.Committed) for c in calls[:2])
            finally:
                await channel.close()

    run(main)


def test_connections_over_the_bound_are_closed_at_once() -> None:
    async def main() -> None:
        async with served(server_limits=ServerLimits(connections_max=2)) as tn:
            first = await Channel.open(tn.address, TOKEN, FAST)
            second = await Channel.open(tn.address, TOKEN, FAST)
            try:
                with pytest.raises((ConnectionError, TimeoutError, OSError)):
                    await Channel.open(tn.address, TOKEN, FAST)
                assert tn.server.counters["connections_refused"] == 1
                assert isinstance(await first.call(messages.Status()), messages.StatusReply)
            finally:
                await first.close()
                await second.close()
            for _ in range(100):
                if tn.server.connections == 0:
                    break
                await asyncio.sleep(0.01)
            await still_serves(tn)

    run(main)


def test_a_request_the_client_cannot_encode_is_never_sent() -> None:
    async def main() -> None:
        async with served() as tn:
            client = NetworkTN([tn.address], TOKEN, FAST)
            try:
                ws = WriteSet(0, (Op("delete", "d", "t", keys=(object(),)),), "cn", 1)
                with pytest.raises(BadRequest):
                    await client.commit(ws)
                assert client.address is None  # not even connected
            finally:
                await client.close()

    run(main)


def test_requests_of_gone_connections_still_count_against_the_tn_bound() -> None:
    async def main() -> None:
        wal = MemoryBackend()
        bounds = ServerLimits(requests_inflight_total_max=2)
        async with served(wal, server_limits=bounds) as tn:
            await shop(tn.engine)
            at = tn.engine.visible_ts

            def commit(i: int) -> messages.Commit:
                return messages.Commit(
                    WriteSet(at, (Op("insert", "d", "t", rows=rows(i)),), "cn", i)
                )

            wal.hold_appends = True
            gone = await Channel.open(tn.address, TOKEN, FAST)
            lost = asyncio.ensure_future(gone.call(commit(1)))
            await wal.wait_held(1)
            await gone.close()  # its commit goes on in the WAL, unanswered
            with pytest.raises(ConnectionError):
                await lost
            channel = await Channel.open(tn.address, TOKEN, FAST)
            try:
                second = asyncio.ensure_future(channel.call(commit(2)))
                with pytest.raises(Overloaded, match="requests in flight on this TN"):
                    await asyncio.wait_for(channel.call(commit(3)), 2.0)
                wal.hold_appends = False
                for _ in range(200):
                    if second.done():
                        break
                    for held in wal.held():
                        await wal.release(held)
                    await asyncio.sleep(0.01)
                assert isinstance(second.result(), messages.Committed)
                retry = await channel.call(commit(1))  # the lost one landed, once
                assert isinstance(retry, messages.Committed)
                assert tn.server.requests_inflight == 0
            finally:
                await channel.close()
            async with tn.engine.transaction() as txn:
                got = await txn.table("d", "t").scan(columns=["id"])
            assert sorted(got.column("id").to_pylist()) == [1, 2]

    run(main)
