"""The proxy mesh (tests/chaos/harness/proxy.py) does to bytes what each mode promises.

How: the pure parts (mode parsing, partition specs, the token bucket) are table tests with no
sockets. The modes are checked with plain sockets: node "b" is an echo server that counts
what it received, node "a" is a plain client that dials b's link proxy (a's canonical
address sorts higher, so a is the dialler, as pysyncobj would decide). "a->b" is what the
client sends, "b->a" the echo. Every wait is bounded; the mesh and the echo server are
stopped in `finally`/fixtures. The real-Raft test is tests/chaos/test_proxy_raft.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.chaos.harness.proxy import (
    HELD_BYTES_MAX,
    Bandwidth,
    Blackhole,
    Delay,
    Flaky,
    LinkStats,
    Pass,
    ProxyMesh,
    Reset,
    TokenBucket,
    burst_bytes_of,
    parse_mode,
    partition_of,
)
from tests.unit.shard import raft_harness

pytestmark = pytest.mark.timeout(60)

WAIT_S_MAX = 5.0
SHARD = 0


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_S_MAX) -> None:
    raft_harness.wait_until(condition, what, seconds)  # this file's own default bound


class EchoServer:
    """Echoes every byte back on each connection; counts what it received."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self.received = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(0.1)
            with self._lock:
                self._sockets.append(conn)
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.received += len(data)
            try:
                conn.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._accepter.join(2)
        for thread in self._threads:
            thread.join(2)
        with self._lock:
            for conn in self._sockets:
                conn.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


def make_mesh(echo: EchoServer, held_bytes_max: int = HELD_BYTES_MAX) -> ProxyMesh:
    # "127.0.0.2:1" sorts above "127.0.0.1:<port>": a dials b, as pysyncobj would.
    canonical = {"a": {SHARD: "127.0.0.2:1"}, "b": {SHARD: echo.address}}
    mesh = ProxyMesh(canonical, held_bytes_max=held_bytes_max)
    mesh.start()
    assert mesh.dialler("a", "b", SHARD) == "a"
    return mesh


@pytest.fixture
def mesh(echo: EchoServer) -> Iterator[ProxyMesh]:
    started = make_mesh(echo)
    try:
        yield started
    finally:
        started.close()


def connect(mesh: ProxyMesh) -> socket.socket:
    host, _, port = mesh.proxy_address("a", "b", SHARD).rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S_MAX)
    sock.settimeout(WAIT_S_MAX)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    out = b""
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {size} bytes")
        out += chunk
    return out


def nothing_arrives(sock: socket.socket, seconds: float) -> bool:
    """No byte and no close within `seconds`."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(WAIT_S_MAX)
    return False


def is_reset(sock: socket.socket) -> bool:
    """The peer answered with RST (not with data or a clean FIN)."""
    try:
        sock.sendall(b"x")
        sock.recv(1)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return False


def refused(mesh: ProxyMesh) -> bool:
    """A new connection is answered with RST (maybe before connect() returns)."""
    try:
        sock = connect(mesh)
    except (ConnectionResetError, ConnectionRefusedError):
        return True
    with sock:
        return is_reset(sock)


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("pass", Pass()),
        ("blackhole", Blackhole()),
        ("reset", Reset()),
        ("delay:50", Delay(50)),
        ("delay:50:10", Delay(50, 10)),
        ("bw:1000", Bandwidth(1000)),
        ("flaky:0.25", Flaky(0.25)),
    ],
)
def test_modes_parse_from_text_and_print_back(text: str, mode: object) -> None:
    assert parse_mode(text) == mode
    assert parse_mode(str(mode)) == mode


@pytest.mark.parametrize(
    "text", ["", "drop", "pass:1", "delay", "delay:x", "delay:-1", "bw:0", "flaky:2", "reset:1"]
)
def test_bad_modes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad link mode"):
        parse_mode(text)


NODES = ["n1", "n2", "n3"]


def both_ways(x: str, y: str) -> set[tuple[str, str]]:
    return {(x, y), (y, x)}


@pytest.mark.parametrize(
    ("spec", "leader", "groups", "blocked"),
    [
        ("one", None, (("n1",), ("n2", "n3")), both_ways("n1", "n2") | both_ways("n1", "n3")),
        ("leader", "n2", (("n2",), ("n1", "n3")), both_ways("n2", "n1") | both_ways("n2", "n3")),
        (
            "majority-minority",
            "n3",
            (("n3",), ("n1", "n2")),
            both_ways("n3", "n1") | both_ways("n3", "n2"),
        ),
        ("bridge", None, (("n1",), ("n3",), ("n2",)), both_ways("n1", "n2")),
        ("bridge", "n3", (("n3",), ("n2",), ("n1",)), both_ways("n3", "n1")),
        ("one-way-from-leader", "n1", (("n1",), ("n2", "n3")), {("n1", "n2"), ("n1", "n3")}),
        ("one-way-to-leader", "n1", (("n1",), ("n2", "n3")), {("n2", "n1"), ("n3", "n1")}),
    ],
)
def test_partition_specs_block_the_directions_they_name(
    spec: str, leader: str | None, groups: object, blocked: set[tuple[str, str]]
) -> None:
    partition = partition_of(spec, NODES, leader)  # type: ignore[arg-type]
    assert partition.groups == groups
    assert partition.blocked == blocked


def test_five_node_specs_and_bad_ones() -> None:
    five = ["n1", "n2", "n3", "n4", "n5"]
    split = partition_of("majority-minority", five)
    assert split.groups == (("n1", "n2"), ("n3", "n4", "n5"))
    assert len(split.blocked) == 2 * 2 * 3
    bridge = partition_of("bridge", five, leader="n4")
    assert bridge.groups == (("n4", "n1"), ("n5",), ("n2", "n3"))
    assert not any("n5" in pair for pair in bridge.blocked)
    with pytest.raises(ValueError, match="needs the leader"):
        partition_of("leader", NODES)
    with pytest.raises(ValueError, match="not one of"):
        partition_of("leader", NODES, leader="n9")
    with pytest.raises(ValueError, match="at least 3"):
        partition_of("bridge", ["n1", "n2"])
    with pytest.raises(ValueError, match="unknown partition"):
        partition_of("ring", NODES)  # type: ignore[arg-type]


def test_token_bucket_paces_to_the_rate() -> None:
    bucket = TokenBucket(1000, 100, now_s=0.0)
    assert bucket.wait_s(0.0, 100) == 0.0  # starts full
    bucket.take(0.0, 100)
    assert bucket.wait_s(0.0, 50) == pytest.approx(0.05)
    assert bucket.wait_s(0.05, 50) == 0.0
    bucket.take(0.05, 50)
    assert bucket.wait_s(10.0, 100) == 0.0  # refills, but never above the burst
    bucket.take(10.0, 100)
    assert bucket.wait_s(10.0, 100) == pytest.approx(0.1)
    assert burst_bytes_of(10) == 10
    assert burst_bytes_of(100_000) == 5_000
    assert burst_bytes_of(10**9) == 64 * 1024


def test_stats_add_and_subtract() -> None:
    before = LinkStats(connections_accepted=1, connections_open=1)
    after = LinkStats(connections_accepted=3, connections_open=0, connections_reset=2)
    assert after.since(before) == LinkStats(connections_accepted=2, connections_reset=2)
    assert (before + after).connections_accepted == 4


# ---------------------------------------------------------------------------- the modes


def test_pass_forwards_both_ways_and_counts(mesh: ProxyMesh, echo: EchoServer) -> None:
    payload = bytes(range(256)) * 400  # 100 KiB: several chunks
    with connect(mesh) as sock:
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        stats = mesh.stats("a", "b")
        assert stats.a_to_b.bytes_forwarded == stats.b_to_a.bytes_forwarded == len(payload)
        assert (stats.connections_accepted, stats.connections_open) == (1, 1)
        assert mesh.stats("b", "a").b_to_a == stats.a_to_b  # the caller's point of view
    wait_until(lambda: mesh.stats("a", "b").connections_open == 0, "the proxy to close")


def test_blackhole_holds_each_direction_then_delivers_on_heal(
    mesh: ProxyMesh, echo: EchoServer
) -> None:
    with connect(mesh) as sock:
        mesh.set_link("a", "b", "blackhole", direction="b->a")
        sock.sendall(b"ping")
        wait_until(lambda: echo.received == 4, "b to receive a's bytes")
        assert nothing_arrives(sock, 0.3), "b's echo must be held"
        held = mesh.stats("a", "b")
        assert held.b_to_a.bytes_queued == 4
        assert held.b_to_a.bytes_forwarded == 0
        assert held.connections_open == 1  # the sockets stay open: silence, not RST
        mesh.heal()
        assert recv_exactly(sock, 4) == b"ping"

        mesh.set_link("a", "b", Blackhole(), direction="a->b")
        assert mesh.modes("a", "b", SHARD) == (Blackhole(), Pass())
        sock.sendall(b"pong")
        wait_until(lambda: mesh.stats("a", "b").a_to_b.bytes_queued == 4, "a's bytes held")
        assert nothing_arrives(sock, 0.3)
        assert echo.received == 4, "b must not receive a's bytes"
        mesh.heal()
        assert recv_exactly(sock, 4) == b"pong"


def test_a_blackhole_drops_past_its_bound_and_the_broken_stream_is_reset_on_heal(
    echo: EchoServer,
) -> None:
    mesh = make_mesh(echo, held_bytes_max=4096)
    try:
        with connect(mesh) as sock:
            mesh.set_link("a", "b", "blackhole")
            for _ in range(10):
                sock.sendall(b"y" * 2000)
            wait_until(lambda: mesh.stats("a", "b").a_to_b.bytes_in == 20_000, "all read")
            stats = mesh.stats("a", "b")
            assert stats.a_to_b.bytes_queued <= 4096
            assert stats.a_to_b.bytes_dropped == 20_000 - stats.a_to_b.bytes_queued
            mesh.heal()
            wait_until(lambda: mesh.stats("a", "b").connections_reset == 1, "the reset")
            assert is_reset(sock)
        assert echo.received == 0  # nothing of a stream with a hole is delivered
    finally:
        mesh.close()


def test_reset_aborts_open_connections_and_refuses_new_ones(
    mesh: ProxyMesh, echo: EchoServer
) -> None:
    with connect(mesh) as sock:
        sock.sendall(b"hi")
        assert recv_exactly(sock, 2) == b"hi"
        mesh.set_link("a", "b", "reset", direction="a->b")  # either way resets the link
        sock.settimeout(WAIT_S_MAX)
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
    assert refused(mesh)
    stats = mesh.stats("a", "b")
    assert stats.connections_reset == 1
    assert stats.connections_refused >= 1
    mesh.heal()
    with connect(mesh) as sock:
        sock.sendall(b"back")
        assert recv_exactly(sock, 4) == b"back"


def test_delay_holds_each_chunk_and_keeps_the_order(mesh: ProxyMesh, echo: EchoServer) -> None:
    mesh.set_link("a", "b", Delay(150, 50), direction="a->b")
    with connect(mesh) as sock:
        sent = b""
        start_s = time.monotonic()
        for i in range(20):
            piece = f"<{i}>".encode()
            sock.sendall(piece)
            sent += piece
            time.sleep(0.005)
        first = recv_exactly(sock, 1)
        first_latency_s = time.monotonic() - start_s
        received = first + recv_exactly(sock, len(sent) - 1)
    assert received == sent
    assert 0.09 <= first_latency_s < 2.0


def test_bandwidth_limits_the_rate(mesh: ProxyMesh, echo: EchoServer) -> None:
    rate = 200_000
    payload = b"z" * 100_000
    mesh.set_link("a", "b", Bandwidth(rate), direction="a->b")
    with connect(mesh) as sock:
        start_s = time.monotonic()
        sock.sendall(payload)
        recv_exactly(sock, len(payload))
        elapsed_s = time.monotonic() - start_s
    expected_s = (len(payload) - burst_bytes_of(rate)) / rate  # the first burst is free
    assert expected_s * 0.8 <= elapsed_s <= expected_s * 4 + 0.5


def test_flaky_resets_connections_at_its_rate(mesh: ProxyMesh, echo: EchoServer) -> None:
    mesh.set_link("a", "b", Flaky(1.0))
    with connect(mesh) as sock:
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"  # flaky still forwards
        wait_until(lambda: mesh.stats("a", "b").connections_reset == 1, "a flaky reset")
        assert is_reset(sock)
    mesh.set_link("a", "b", Flaky(0.0))
    with connect(mesh) as sock:
        time.sleep(1.2)
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"
    assert mesh.stats("a", "b").connections_reset == 1


def test_a_dead_receiver_is_refused_to_the_dialler() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, not listening: refuses
        mesh = ProxyMesh({"a": {0: "127.0.0.2:1"}, "b": {0: dead}}).start()
        try:
            assert refused(mesh)
            assert mesh.stats("a", "b").upstream_failures == 1
        finally:
            mesh.close()


# -------------------------------------------------------------------- mesh bookkeeping


def test_dial_maps_shards_and_partitions_cover_every_shard_of_a_pair() -> None:
    canonical = {
        node: {shard: f"127.0.0.1:{base + shard}" for shard in (1, 2)}
        for node, base in (("n1", 17100), ("n2", 17200), ("n3", 17300))
    }
    with ProxyMesh(canonical) as mesh:
        # The higher address dials: n3 dials n1 and n2, n2 dials n1, n1 dials nobody.
        assert mesh.dial_map("n1") == {}
        assert set(mesh.dial_map("n2")) == {"127.0.0.1:17101", "127.0.0.1:17102"}
        assert set(mesh.dial_map("n3")) == {
            "127.0.0.1:17101",
            "127.0.0.1:17102",
            "127.0.0.1:17201",
            "127.0.0.1:17202",
        }
        ports = {v.rpartition(":")[2] for n in mesh.nodes for v in mesh.dial_map(n).values()}
        assert len(ports) == 6  # one proxy per (pair, shard)
        assert "LOGSVC_TEST_RAFT_DIAL" in mesh.dial_env("n3")

        chosen = mesh.partition("leader", leader="n2")
        assert chosen.groups == (("n2",), ("n1", "n3"))
        for shard in (1, 2):
            assert mesh.modes("n2", "n1", shard) == (Blackhole(), Blackhole())
            assert mesh.modes("n1", "n3", shard) == (Pass(), Pass())
        mesh.partition("one-way-from-leader", leader="n1", shard=2)
        assert mesh.modes("n1", "n2", 2) == (Blackhole(), Pass())
        assert mesh.modes("n1", "n2", 1) == (Blackhole(), Blackhole())  # shard 1 untouched
        mesh.heal(shard=1)
        assert mesh.modes("n1", "n2", 1) == (Pass(), Pass())
        with pytest.raises(ValueError, match="one-way"):
            mesh.partition("one-way-to-leader", leader="n1", mode="reset")
        with pytest.raises(KeyError):
            mesh.set_link("n1", "n9", "pass")
        assert len(mesh.all_stats()) == 6
