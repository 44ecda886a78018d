"""The client's own bookkeeping: lanes bound the appends in flight per client id, and one
timer per connection still times out every request.

How: `_Lanes` driven directly (a seeded random walk of acquires and releases checking the
bounds after every step, and a full client waiting for a release or timing out); a
`_Connection` against a small asyncio server on loopback that speaks the wire protocol
(authenticates, then answers appends or stays silent), for the request timeout, the wait
for a pipelining slot, and the size of the timeout FIFO after many answered requests; a
`Client` over two such servers for what follows an answer on the known leader's open
connection (a NOT_LEADER hint followed with the same seq, a final error not sent again), and
for a shard no node hosts (every node answers UNKNOWN_SHARD: `UnknownShard` after one
question to each, where it used to retry for `retry_s_max`; one node's answer alone is still
retried on the others).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from logsvc.async_client import _Lanes
from logsvc.client import (
    Client,
    ClientOptions,
    StaleEpoch,
    SyncClient,
    TooManyInFlight,
    UnknownShard,
    connect,
)
from logsvc.client_connection import _Connection
from logsvc.config_files import ConfigError
from logsvc.wire import messages as wire
from logsvc.wire.frames import FrameDecoder

TOKEN = "t0ken"


def test_lanes_keep_seqs_in_flight_within_the_window_and_number_them_densely() -> None:
    async def walk() -> None:
        window, lanes_max = 3, 4
        lanes = _Lanes("c", window, lanes_max, wait_s_max=1.0)
        rng = random.Random(7)
        held: list[tuple[int, int]] = []
        outstanding: dict[str, set[int]] = {}
        last_seq: dict[str, int] = {}
        for _ in range(5000):
            if held and (len(held) == window * lanes_max or rng.random() < 0.5):
                lane, seq = held.pop(rng.randrange(len(held)))
                lanes.release(lane, seq)
                outstanding[f"c.{lane}"].discard(seq)
                continue
            taken = lanes.take_nowait()
            if taken is None:  # every lane's window is spanned: release the oldest
                lane, seq = min(held, key=lambda h: h[1])
                held.remove((lane, seq))
                lanes.release(lane, seq)
                outstanding[f"c.{lane}"].discard(seq)
                continue
            lane, lane_id, seq = taken
            assert lane_id == f"c.{lane}"
            assert seq == last_seq.get(lane_id, 0) + 1
            last_seq[lane_id] = seq
            seqs = outstanding.setdefault(lane_id, set())
            seqs.add(seq)
            assert max(seqs) - min(seqs) < window
            assert len(outstanding) <= lanes_max
            held.append((lane, seq))

    asyncio.run(walk())


def test_a_stuck_seq_stops_its_lane_a_window_later_while_the_others_complete() -> None:
    """A retry of seq 1 must still be remembered by the shard: however many later appends
    of its id complete, none more than `window - 1` past it is handed out."""
    lanes = _Lanes("c", 4, 1, wait_s_max=0.2)
    stuck = lanes.take_nowait()
    assert stuck == (0, "c.0", 1)
    for expected in (2, 3, 4):
        taken = lanes.take_nowait()
        assert taken is not None and taken[2] == expected
        lanes.release(0, expected)  # answered at once
    assert lanes.take_nowait() is None  # seq 5 would be 4 past the stuck one
    lanes.release(0, 1)
    assert lanes.take_nowait() == (0, "c.0", 5)


def test_a_full_set_of_lanes_waits_for_a_release_then_times_out() -> None:
    async def scenario() -> None:
        lanes = _Lanes("c", 1, 2, wait_s_max=0.2)
        first = await lanes.acquire()
        await lanes.acquire()
        waiting = asyncio.ensure_future(lanes.acquire())
        await _until(lambda: bool(lanes._waiters._futures))  # it waits...
        assert not waiting.done()  # ...for a release
        lanes.release(first[0], first[2])
        assert await waiting == (first[0], first[1], 2)
        with pytest.raises(TooManyInFlight):
            await lanes.acquire()

    asyncio.run(scenario())


class _Server:
    """Authenticates, then answers appends with `Appended` unless told to stay silent."""

    tokens: list[str]

    def __init__(self, answer: bool, respond: Callable[[object], object] | None = None) -> None:
        self.answer = answer
        self.respond = respond  # the answer to each request instead of `Appended`
        self.requests = 0
        self.seen: list[object] = []
        self.tokens = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        lsn = 1
        while data := await reader.read(65536):
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                request = wire.decode_request(frame)
                if isinstance(request, wire.Authenticate):
                    self.tokens.append(request.token)
                    writer.write(wire.encode_response(frame.request_id, wire.Authenticated()))
                    continue
                self.requests += 1
                self.seen.append(request)
                if self.respond is not None:
                    answer = self.respond(request)
                    writer.write(wire.encode_response(frame.request_id, answer))  # type: ignore[arg-type]
                elif self.answer:
                    writer.write(wire.encode_appended(frame.request_id, lsn, 1, False))
                    lsn += 1
        writer.close()


async def _connected(server: _Server, options: ClientOptions) -> tuple[_Connection, object]:
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    connection = _Connection(f"127.0.0.1:{port}", TOKEN, options)
    await connection.ensure_open()
    assert connection.ready
    return connection, listener


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):  # bounded: 2 s
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")


def _append(seq: int) -> wire.Append:
    return wire.Append(1, (b"x",), "c.0", seq, 0)


def test_a_request_without_an_answer_times_out_and_leaves_nothing_pending() -> None:
    async def scenario() -> None:
        options = ClientOptions(request_timeout_s=0.2)
        connection, listener = await _connected(_Server(answer=False), options)
        loop = asyncio.get_running_loop()
        began = loop.time()
        calls = asyncio.gather(
            *(connection.call(_append(seq)) for seq in range(1, 4)), return_exceptions=True
        )
        results = await asyncio.wait_for(calls, 10.0)  # the one timer fires...
        assert all(isinstance(result, TimeoutError) for result in results), results
        assert loop.time() - began >= 0.15  # ...and not before the timeout
        assert not connection._pending
        await connection.close()
        listener.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_past_the_inflight_limit_a_call_waits_for_a_slot_bounded_by_the_timeout() -> None:
    async def scenario() -> None:
        options = ClientOptions(request_timeout_s=0.3, requests_inflight_max=2)
        server = _Server(answer=False)
        connection, listener = await _connected(server, options)
        first = asyncio.ensure_future(connection.call(_append(1)))
        second = asyncio.ensure_future(connection.call(_append(2)))
        await _until(lambda: server.requests == 2)
        third = asyncio.ensure_future(connection.call(_append(3)))
        await _until(lambda: bool(connection._slot_waiters._futures))
        assert server.requests == 2  # the third waits for a slot, unsent
        for call in (first, second):
            with pytest.raises(TimeoutError, match="no answer"):
                await call
        # Slots freed by the timeouts: the third is sent, then times out in turn.
        with pytest.raises(TimeoutError):
            await third
        assert server.requests == 3
        await connection.close()
        listener.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_answered_requests_do_not_pile_up_in_the_timeout_fifo() -> None:
    async def scenario() -> None:
        connection, listener = await _connected(_Server(answer=True), ClientOptions())
        for round_ in range(20):
            answers = await asyncio.gather(
                *(connection.call(_append(round_ * 100 + i)) for i in range(100))
            )
            assert all(isinstance(answer, wire.Appended) for answer in answers)
        assert not connection._pending
        assert not connection._expiries._fifo
        await connection.close()
        listener.close()  # type: ignore[attr-defined]

    asyncio.run(scenario())


async def _listening(server: _Server) -> tuple[str, asyncio.Server]:
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    return f"127.0.0.1:{listener.sockets[0].getsockname()[1]}", listener


def test_a_not_leader_answer_on_the_known_leader_is_followed_with_the_same_seq() -> None:
    async def scenario() -> None:
        new_leader = _Server(answer=True)
        new_address, new_listener = await _listening(new_leader)
        old_leader = _Server(answer=True)
        old_address, old_listener = await _listening(old_leader)
        client = Client([old_address, new_address], TOKEN, ClientOptions(), "c")
        assert await client.append(1, [b"a"]) == [1]  # learns the old leader
        old_leader.respond = lambda _request: wire.ErrorResponse(
            wire.ErrorCode.NOT_LEADER, "moved", new_address
        )
        assert await client.append(1, [b"b"]) == [1]  # answered by the new leader
        moved = old_leader.seen[-1]
        assert isinstance(moved, wire.Append)
        assert new_leader.seen == [moved]  # sent on once, same client id and seq
        assert await client.append(1, [b"c"]) == [2]  # and the new one is now the leader
        assert old_leader.requests == 2
        await client.close()
        for listener in (old_listener, new_listener):
            listener.close()

    asyncio.run(scenario())


def test_after_the_known_leader_times_out_the_next_attempt_asks_another_node() -> None:
    """A leader cut off from its shard holds requests until the timeout: the retries must
    not start at the first address again when that is the one that just timed out."""

    async def scenario() -> None:
        stale = _Server(answer=True)
        stale_address, stale_listener = await _listening(stale)
        leader = _Server(answer=True)
        leader_address, leader_listener = await _listening(leader)
        options = ClientOptions(request_timeout_s=0.3, backoff_s_first=0.0)
        client = Client([stale_address, leader_address], TOKEN, options, "c")
        assert await client.append(1, [b"a"]) == [1]  # learns the first as its leader
        stale.answer = False  # ...which is then cut off: it takes requests, answers none
        assert await client.append(1, [b"b"]) == [1]  # answered by the other node
        assert stale.requests == 2  # asked once after it went silent, not once per round
        assert leader.requests == 1
        # The same for a status through the leader (its own retry loop).
        leader.respond = lambda _request: wire.ShardStatus(1, leader_address, 4, 1, 2, 0, True)
        client._leaders[1] = stale_address  # as if the stale one were known again
        assert (await client.leader_status(1)).term == 4
        assert stale.requests == 3
        await client.close()
        for listener in (stale_listener, leader_listener):
            listener.close()

    asyncio.run(scenario())


def test_a_final_error_on_the_known_leader_is_raised_without_sending_again() -> None:
    async def scenario() -> None:
        leader = _Server(answer=True)
        address, listener = await _listening(leader)
        client = Client([address], TOKEN, ClientOptions(), "c")
        await client.append(1, [b"a"])
        leader.respond = lambda _request: wire.ErrorResponse(
            wire.ErrorCode.STALE_EPOCH, "epoch 1 < 2", current_holder="h", current_epoch=2
        )
        with pytest.raises(StaleEpoch):
            await client.append(1, [b"b"], epoch=1)
        assert leader.requests == 2
        await client.close()
        listener.close()

    asyncio.run(scenario())


def _client_toml(directory: Path, address: str) -> Path:
    token_file = directory / "token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    config = directory / "client.toml"
    config.write_text(f'addresses = ["{address}"]\ntoken_file = "token"\n')
    return config


def test_connect_takes_a_client_config_path(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = _Server(answer=True)
        address, listener = await _listening(server)
        config = _client_toml(tmp_path, address)
        for where in (str(config), config):  # a str or a PathLike
            client = await connect(where)
            assert await client.append(1, [b"a"]) in ([1], [2])
            await client.close()
        assert server.tokens == [TOKEN, TOKEN]  # the token of the file's token_file
        with pytest.raises(TypeError, match="reads the token"):
            await connect(str(config), TOKEN)  # a path and a token: which token?
        with pytest.raises(TypeError, match="token is required"):
            await connect([address])
        (tmp_path / "bad.toml").write_text('addresses = "not a list"\ntoken_file = "token"\n')
        with pytest.raises(ConfigError) as bad:
            await connect(str(tmp_path / "bad.toml"))
        assert bad.value.key == "addresses"
        listener.close()

    asyncio.run(scenario())


def test_sync_client_takes_a_client_config_path(tmp_path: Path) -> None:
    server = _Server(answer=True)
    loop = asyncio.new_event_loop()  # the server's, on its own thread (SyncClient blocks)

    async def start() -> tuple[str, asyncio.Server]:
        return await _listening(server)

    address, listener = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = SyncClient(str(_client_toml(tmp_path, address)))
        try:
            assert client.append(1, [b"a"]) == [1]
        finally:
            client.close()
        assert server.tokens == [TOKEN]
    finally:
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def _unknown_shard(request: object) -> object:
    return wire.ErrorResponse(wire.ErrorCode.UNKNOWN_SHARD, "shard 7 is not hosted here")


def test_a_shard_no_node_hosts_fails_at_once_with_unknown_shard() -> None:
    async def scenario() -> None:
        servers = [_Server(answer=True, respond=_unknown_shard) for _ in range(3)]
        listening = [await _listening(server) for server in servers]
        addresses = [address for address, _ in listening]
        client = Client(addresses, TOKEN, ClientOptions(retry_s_max=3600.0), "c")
        for call in (
            lambda: client.leader_status(7),
            lambda: client.status(7),
            lambda: client.read(7, 1, 1024),
            lambda: client.append(7, [b"a"]),
        ):
            before = [server.requests for server in servers]
            with pytest.raises(UnknownShard) as unknown:
                await call()
            assert unknown.value.shard == 7 and set(unknown.value.addresses) == set(addresses)
            assert "shard 7 is not hosted by any node" in str(unknown.value)
            # One question to each node, not retries until retry_s_max (an hour here).
            assert [s.requests - b for s, b in zip(servers, before, strict=True)] == [1, 1, 1]
        await client.close()
        for _, listener in listening:
            listener.close()

    asyncio.run(scenario())


def test_a_node_without_the_shard_is_passed_over_for_one_that_has_it() -> None:
    status = wire.ShardStatus(7, None, 3, 1, 1, 0, True)

    async def scenario() -> None:
        without = _Server(answer=True, respond=_unknown_shard)
        hosting = _Server(answer=True, respond=lambda _request: status)
        listening = [await _listening(server) for server in (without, hosting)]
        client = Client([a for a, _ in listening], TOKEN, ClientOptions(), "c")
        assert await client.leader_status(7) == status
        assert await client.status(7) == status
        await client.close()
        for _, listener in listening:
            listener.close()

    asyncio.run(scenario())


def test_logsvc_status_on_a_shard_no_node_hosts_says_so_and_exits_1(tmp_path: Path) -> None:
    server = _Server(answer=True, respond=_unknown_shard)
    loop = asyncio.new_event_loop()  # the server's, on its own thread (the CLI is a process)

    async def start() -> tuple[str, asyncio.Server]:
        return await _listening(server)

    address, listener = loop.run_until_complete(start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        config = str(_client_toml(tmp_path, address))
        command = [sys.executable, "-m", "logsvc.cli", "status", "--shard", "7"]
        result = subprocess.run(
            [*command, "--client-config", config],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 1, result.stderr
        assert "shard 7 is not hosted by any node" in result.stderr
        assert "Traceback" not in result.stderr
        assert server.requests == 1  # asked once: not retried like a transient error
    finally:
        loop.call_soon_threadsafe(listener.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
