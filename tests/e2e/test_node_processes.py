"""Real `logsvc serve` processes on loopback, driven through the client library, the CLI
and raw sockets.

Proves: append / read / tail / truncate / status through the client and the CLI (a status
is the leader's after a barrier, or a replica's view marked as such); a leader
killed with SIGKILL under concurrent load loses no acknowledged record and duplicates none
(clients retry with the same (client_id, seq)); a fenced writer's appends and truncates are
refused across processes; every kind of bad input gets a typed answer or a closed
connection while the server keeps serving others; a bad config exits 2 naming the key,
without a traceback.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from logsvc import devcluster
from logsvc.client import (
    Producer,
    ProducerFull,
    ProducerOptions,
    ServerError,
    StaleEpoch,
    SyncClient,
    Truncated,
    connect,
)
from logsvc.wire import messages as wire
from logsvc.wire.frames import FrameDecoder, FrameKind, encode_frame

from .conftest import LocalCluster


def test_append_read_tail_truncate_status_through_the_client(cluster: LocalCluster) -> None:
    client = cluster.client()
    try:
        lsns = client.append(1, [b"one", b"two", b"three"])
        assert lsns == [lsns[0], lsns[0] + 1, lsns[0] + 2]
        page = client.read(1, lsns[0], 1 << 20)
        assert page.records[:3] == (b"one", b"two", b"three")
        end = client.read(1, lsns[-1] + 1, 1 << 20)
        assert (end.records, end.next_lsn) == ((), lsns[-1] + 1)  # end of log: next == lsn

        waiting: list[wire.Records] = []
        tailer = threading.Thread(
            target=lambda: waiting.append(client.tail(1, lsns[-1] + 1, 1 << 20, 10_000))
        )
        tailer.start()
        time.sleep(0.3)  # let the long poll start waiting before the append
        later = client.append(1, [b"four"])
        tailer.join(15)
        assert waiting and waiting[0].records == (b"four",)
        assert waiting[0].first_lsn == later[0]

        assert client.truncate(1, lsns[1]) == lsns[1]
        with pytest.raises(Truncated) as raised:
            client.read(1, lsns[0], 100)
        assert raised.value.first_lsn == lsns[1]
        status = client.status(1)
        assert status.leader in cluster.client_config.addresses
        assert status.next_lsn == later[0] + 1
    finally:
        client.close()


def run_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "logsvc.cli",
            *args,
            "--client-config",
            f"{cluster.dir}/client.toml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_appends_reads_and_reports(cluster: LocalCluster) -> None:
    appended = run_cli(cluster, "append", "--shard", "2", "alpha", "beta")
    assert appended.returncode == 0, appended.stderr
    first, second = (int(x) for x in appended.stdout.split())
    assert second == first + 1
    read = run_cli(cluster, "read", "--shard", "2", "--lsn", str(first))
    assert read.stdout.splitlines()[:2] == [f"{first}\talpha", f"{second}\tbeta"]
    status = run_cli(cluster, "status", "--shard", "2")
    assert status.returncode == 0 and "leader 127.0.0.1:" in status.stdout
    assert "(confirmed by the leader)" in status.stdout
    below = run_cli(cluster, "truncate", "--shard", "2", "--lsn", str(second))
    assert below.returncode == 0
    refused = run_cli(cluster, "read", "--shard", "2", "--lsn", str(first))
    assert refused.returncode == 1 and "TRUNCATED" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_status_is_the_leaders_after_a_barrier_or_a_replicas_marked_view(
    cluster: LocalCluster,
) -> None:
    """Each node answers Status about its own replica: only the leader says `is_leader`
    (after a barrier through the log), the followers' answers are marked as their views;
    `leader_status` asked at a follower alone follows it to the leader's answer."""
    addresses = cluster.client_config.addresses
    token = cluster.client_config.token
    client = cluster.client()
    try:
        client.append(1, [b"status"])
        answers = {}
        for address in addresses:
            single = SyncClient([address], token)
            try:
                answers[address] = single.status(1)
            finally:
                single.close()
        leaders = [a for a, status in answers.items() if status.is_leader]
        assert len(leaders) == 1
        [leader] = leaders
        for address, status in answers.items():
            if address != leader:  # a follower's own view, marked as such
                assert not status.is_leader and status.term <= answers[leader].term
        follower = next(a for a in addresses if a != leader)
        single = SyncClient([follower], token)
        try:
            confirmed = single.leader_status(1)
        finally:
            single.close()
        assert confirmed.is_leader and confirmed.leader == leader
        assert confirmed.term == answers[leader].term
    finally:
        client.close()


def test_lease_fencing_across_processes(cluster: LocalCluster) -> None:
    client = cluster.client()
    try:
        assert client.acquire_lease(2, "tn-a", 1).epoch == 1
        [from_a] = client.append(2, [b"from a"], epoch=1)
        assert client.acquire_lease(2, "tn-b", 2).holder == "tn-b"
        with pytest.raises(StaleEpoch) as raised:
            client.append(2, [b"late write from a"], epoch=1)
        assert raised.value.response.current_holder == "tn-b"
        with pytest.raises(StaleEpoch):
            client.acquire_lease(2, "tn-a", 1)  # a fenced writer never takes it back
        [from_b] = client.append(2, [b"from b"], epoch=2)
        # Nor can it truncate the shared log (nor can anyone ahead of the lease).
        with pytest.raises(StaleEpoch) as raised:
            client.truncate(2, from_b, epoch=1)
        assert (raised.value.response.current_holder, raised.value.response.current_epoch) == (
            "tn-b",
            2,
        )
        with pytest.raises(ServerError) as ahead:
            client.truncate(2, from_b, epoch=3)
        assert ahead.value.code == wire.ErrorCode.NOT_LEASE_HOLDER
        page = client.tail(2, from_a, 1 << 20, 0)  # through the leader: not truncated
        assert page.records[:1] == (b"from a",)
        assert client.truncate(2, from_b, epoch=2) == from_b  # the holder truncates
        with pytest.raises(Truncated):
            client.tail(2, from_a, 1 << 20, 0)
    finally:
        client.close()


def test_leader_killed_under_load_loses_and_duplicates_nothing(own_cluster: LocalCluster) -> None:
    """One client, 32 concurrent writers (twice the shard's dedupe window, so the client's
    lanes and the reordering of redirected retries are exercised), the leader SIGKILLed
    mid-run and restarted."""

    async def scenario() -> tuple[dict[int, bytes], list[bytes]]:
        config = own_cluster.client_config
        acked: dict[int, bytes] = {}
        sent: list[bytes] = []
        client = await connect(config.addresses, config.token)
        restarted = asyncio.Event()
        in_flight_at_kill: list[int] = []

        async def writer(number: int) -> None:
            i = 0
            while not restarted.is_set() or i < 12:  # keep the load on across the kill
                payload = f"w{number}-{i}".encode()
                sent.append(payload)
                [lsn] = await client.append(1, [payload])
                acked[lsn] = payload
                i += 1

        async def killer() -> None:
            await asyncio.sleep(0.3)
            status = await client.status(1)
            assert status.leader is not None
            victim = own_cluster.node_of(status.leader)
            in_flight_at_kill.append(len(sent) - len(acked))
            await asyncio.to_thread(devcluster.kill_node, own_cluster.dir, victim)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(devcluster.start_node, own_cluster.dir, victim)
            restarted.set()

        await asyncio.gather(*(writer(n) for n in range(32)), killer())
        await client.close()
        assert in_flight_at_kill[0] > 0  # the kill really hit appends in flight
        return acked, sent

    acked, sent = asyncio.run(scenario())
    assert len(acked) == len(sent)  # every append was eventually acknowledged
    client = own_cluster.client()
    try:
        # A read may be answered by the restarted replica while it catches up (a prefix,
        # never wrong data); wait, bounded, until it has everything acknowledged.
        deadline = time.monotonic() + 30
        while len(records := client.read(1, 1, 1 << 24).records) < max(acked):
            assert time.monotonic() < deadline, f"only {len(records)} records readable"
            time.sleep(0.1)
        for lsn, payload in acked.items():
            assert records[lsn - 1] == payload, f"lsn {lsn}"
        assert sorted(records) == sorted(sent)  # nothing twice, nothing invented
    finally:
        client.close()


def raw_connection(cluster: LocalCluster) -> socket.socket:
    host, _, port = cluster.client_config.addresses[0].rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def exchange(sock: socket.socket, data: bytes) -> wire.Response | None:
    """Send bytes; return the next response, or None if the server closed."""
    sock.sendall(data)
    decoder = FrameDecoder()
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        decoder.feed(chunk)
        frame = decoder.next_frame()
        if frame is not None:
            return wire.decode_response(frame)


def authenticated(cluster: LocalCluster) -> socket.socket:
    sock = raw_connection(cluster)
    answer = exchange(sock, wire.encode_request(1, wire.Authenticate(cluster.client_config.token)))
    assert isinstance(answer, wire.Authenticated)
    return sock


def still_serving(cluster: LocalCluster) -> None:
    client = cluster.client()
    try:
        assert client.status(1).leader is not None
    finally:
        client.close()


def closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_requests_before_authenticating_or_with_a_wrong_token_are_refused(
    cluster: LocalCluster,
) -> None:
    with raw_connection(cluster) as sock:
        answer = exchange(sock, wire.encode_request(1, wire.Status(1)))
        assert isinstance(answer, wire.ErrorResponse)
        assert answer.code == wire.ErrorCode.UNAUTHENTICATED
    with raw_connection(cluster) as sock:
        answer = exchange(sock, wire.encode_request(1, wire.Authenticate("wrong-token")))
        assert isinstance(answer, wire.ErrorResponse)
        assert answer.code == wire.ErrorCode.UNAUTHENTICATED
        assert closed(sock)
    still_serving(cluster)


def test_unknown_op_and_unknown_shard_get_typed_errors_and_the_connection_lives(
    cluster: LocalCluster,
) -> None:
    with authenticated(cluster) as sock:
        unknown_op = encode_frame(FrameKind.REQUEST, 2, b"\x91\x63")  # msgpack [99]
        answer = exchange(sock, unknown_op)
        assert isinstance(answer, wire.ErrorResponse)
        assert answer.code == wire.ErrorCode.UNKNOWN_OP
        answer = exchange(sock, wire.encode_request(3, wire.Status(999)))
        assert isinstance(answer, wire.ErrorResponse)
        assert answer.code == wire.ErrorCode.UNKNOWN_SHARD
        answer = exchange(sock, wire.encode_request(4, wire.Status(1)))
        assert isinstance(answer, wire.ShardStatus)  # same connection, still served


@pytest.mark.parametrize("damage", ["garbage", "body_checksum", "oversize"])
def test_undecodable_frames_close_only_that_connection(cluster: LocalCluster, damage: str) -> None:
    with authenticated(cluster) as sock:
        frame = bytearray(wire.encode_request(5, wire.Status(1)))
        if damage == "garbage":
            data = b"GET / HTTP/1.1\r\n\r\n"
        elif damage == "body_checksum":
            frame[-1] ^= 0xFF
            data = bytes(frame)
        else:
            header = bytearray(frame[:32])
            struct.pack_into("<I", header, 16, 1 << 30)  # body length 1 GiB
            from logsvc.wire.frames import header_checksum

            struct.pack_into("<I", header, 28, header_checksum(bytes(header[:28])))
            data = bytes(header)
        answer = exchange(sock, data)
        if answer is not None:
            assert isinstance(answer, wire.ErrorResponse)
            expected = (
                wire.ErrorCode.TOO_LARGE if damage == "oversize" else wire.ErrorCode.BAD_REQUEST
            )
            assert answer.code == expected
        assert closed(sock)
    still_serving(cluster)


def test_a_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[node]\nid = "n1"\ndata_dir = "d"\nlog_levl = "info"\n')
    config.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "logsvc.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "log_levl" in done.stderr
    assert "Traceback" not in done.stderr


def test_producer_batching_shares_appends_and_is_bounded(cluster: LocalCluster) -> None:
    async def scenario() -> None:
        config = cluster.client_config
        client = await connect(config.addresses, config.token)
        producer = Producer(client, ProducerOptions(linger_ms=50, pending_records_max=1000))
        payloads = [f"p{i}".encode() for i in range(300)]
        lsns = await asyncio.gather(*(producer.send(1, p) for p in payloads))
        assert len(set(lsns)) == 300
        assert max(lsns) - min(lsns) == 299  # sent together: one contiguous run
        page = await client.read(1, min(lsns), 1 << 20)
        for lsn, payload in zip(lsns, payloads, strict=True):
            assert page.records[lsn - min(lsns)] == payload
        small = Producer(client, ProducerOptions(linger_ms=50, pending_records_max=5))
        waiting = [asyncio.ensure_future(small.send(1, b"x")) for _ in range(5)]
        await asyncio.sleep(0)
        with pytest.raises(ProducerFull):
            await small.send(1, b"one too many")
        await small.flush()
        assert all(w.done() and not w.exception() for w in waiting)
        await client.close()

    asyncio.run(scenario())


def test_sigterm_stops_a_node_cleanly_and_it_comes_back(own_cluster: LocalCluster) -> None:
    client = own_cluster.client()
    try:
        lsns = client.append(1, [b"before the clean stop"])
        # The exit code of the node process itself, reaped by kill_node (it is our child).
        code = devcluster.kill_node(own_cluster.dir, "n1", signal.SIGTERM)
        log = Path(own_cluster.dir, "n1.log").read_text()
        assert "stopping" in log and "stopped" in log  # the shutdown path ran to its end
        assert "Traceback" not in log
        devcluster.start_node(own_cluster.dir, "n1")
        devcluster.wait_for_leaders(own_cluster.dir, 1)
        # Through the leader: a plain read may reach the restarted replica while it replays
        # its journal (a shorter prefix, by design).
        assert client.tail(1, lsns[0], 100, 0).records[0] == b"before the clean stop"
        assert code == 0
    finally:
        client.close()
