"""A TCP proxy mesh between Raft replicas: network faults without root (chaos-plan §4.3).

Each node is told, through LOGSVC_TEST_RAFT_DIAL (`ProxyMesh.dial_env`), to dial its peers
at a proxy port instead of their canonical Raft address; the peers keep their canonical
ids, so the handshake is unchanged (logsvc/shard/raft/transport.py `_DialNode`). pysyncobj opens one
TCP connection per pair of replicas, dialled by the replica whose address string sorts
higher, so one `_Link` per (pair of nodes, shard) is enough: it listens on its own port,
accepts the dialler's connections and connects each to the lower node's canonical address.

Faults are set per DIRECTION: "a->b" is the bytes node a sends to node b, whichever of them
dialled. Modes (`Mode`, or its text form in brackets):

    Pass()              [pass]              forward
    Blackhole()         [blackhole]         read and hold the bytes, forward nothing, keep
                                            both sockets open (silence, as in a real
                                            partition: a peer notices only after its
                                            connection timeout). At most `held_bytes_max`
                                            per connection and direction are held; more
                                            are dropped and counted, and a connection that
                                            lost bytes is reset when the direction heals
                                            (TCP would have given up on it). Held bytes are
                                            delivered, in order, when it heals (TCP
                                            retransmission after a short partition).
    Reset()             [reset]             abort every connection of the link with RST and
                                            answer each new one with RST. A TCP connection
                                            has no one-way reset: either direction in this
                                            mode resets the link.
    Delay(ms, jitter)   [delay:MS[:JITTER]] deliver each chunk no earlier than
                                            ms +- jitter after it was read; chunks of one
                                            connection stay in order (head-of-line, as TCP)
    Bandwidth(rate)     [bw:BYTES_PER_S]    token bucket of `rate` bytes/s
    Flaky(p)            [flaky:P]           forward; every second, reset the link's
                                            connections with probability p (seeded)

Partitions (`partition_of`, `ProxyMesh.partition`) name the blocked directions for Jepsen's
specs: one, leader, majority-minority, bridge, one-way-from-leader, one-way-to-leader.

Every link counts what it did (`LinkStats`): a scenario compares two `stats()` to confirm
a fault took effect (bytes held or dropped, connections reset), not just that it was set.

Threads: the mesh runs its own asyncio loop on one daemon thread; every public method may
be called from any other thread and waits (bounded) for the loop to act. Queues are
bounded: past `queue_bytes_max` a direction stops reading (TCP back-pressure), past
`held_bytes_max` a blackholed direction drops. `close()` stops everything it started.
Pure parts (mode parsing, partition specs, the token bucket) are plain functions and
classes, tested without sockets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import socket
import struct
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

KIB = 1024
MIB = 1024 * KIB

# One read from a socket; also the largest piece handed to a writer at once.
CHUNK_BYTES = 64 * KIB
# Held by a blackholed direction of one connection before it drops. pysyncobj sends
# heartbeats of a few hundred bytes every 100 ms: minutes of silence fit.
HELD_BYTES_MAX = 4 * MIB
# Queued for delivery (delay, bandwidth) per direction and connection before the proxy
# stops reading from the sender: back-pressure instead of unbounded memory.
QUEUE_BYTES_MAX = 4 * MIB
# Connecting to the real replica: a dead node is refused at once, a stopped one times out.
UPSTREAM_CONNECT_S_MAX = 3.0
# Every call into the loop thread returns within this (or raises TimeoutError).
CALL_S_MAX = 10.0
# Flaky links draw once per this period (the p of Flaky is per second).
FLAKY_PERIOD_S = 1.0
# Binding a proxy port that happens to be a canonical Raft port is retried this often.
BIND_ATTEMPTS_MAX = 16
# Delays and jitter above a minute are a unit mistake.
DELAY_MS_MAX = 60_000
assert CHUNK_BYTES <= QUEUE_BYTES_MAX
assert CHUNK_BYTES <= HELD_BYTES_MAX

NodeId = str
ShardId = int
Direction = Literal["both", "a->b", "b->a"]
PartitionSpec = Literal[
    "one",
    "leader",
    "majority-minority",
    "bridge",
    "one-way-from-leader",
    "one-way-to-leader",
]
PARTITION_SPECS: tuple[PartitionSpec, ...] = (
    "one",
    "leader",
    "majority-minority",
    "bridge",
    "one-way-from-leader",
    "one-way-to-leader",
)

# ------------------------------------------------------------------------------- modes


@dataclass(frozen=True, slots=True)
class Pass:
    def __str__(self) -> str:
        return "pass"


@dataclass(frozen=True, slots=True)
class Blackhole:
    def __str__(self) -> str:
        return "blackhole"


@dataclass(frozen=True, slots=True)
class Reset:
    def __str__(self) -> str:
        return "reset"


@dataclass(frozen=True, slots=True)
class Delay:
    ms: float
    jitter_ms: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.ms <= DELAY_MS_MAX:
            raise ValueError(f"delay: ms must be in [0, {DELAY_MS_MAX}] (got {self.ms})")
        if not 0 <= self.jitter_ms <= DELAY_MS_MAX:
            raise ValueError(f"delay: jitter_ms must be in [0, {DELAY_MS_MAX}]")

    def __str__(self) -> str:
        return f"delay:{self.ms:g}:{self.jitter_ms:g}"


@dataclass(frozen=True, slots=True)
class Bandwidth:
    bytes_per_s: int

    def __post_init__(self) -> None:
        if self.bytes_per_s < 1:
            raise ValueError(f"bandwidth: bytes_per_s must be >= 1 (got {self.bytes_per_s})")

    def __str__(self) -> str:
        return f"bw:{self.bytes_per_s}"


@dataclass(frozen=True, slots=True)
class Flaky:
    p_per_s: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_per_s <= 1.0:
            raise ValueError(f"flaky: p_per_s must be in [0, 1] (got {self.p_per_s})")

    def __str__(self) -> str:
        return f"flaky:{self.p_per_s:g}"


Mode = Pass | Blackhole | Reset | Delay | Bandwidth | Flaky
PASS = Pass()


def parse_mode(mode: Mode | str) -> Mode:
    """A `Mode`, or its text form: pass | blackhole | reset | delay:MS[:JITTER_MS] |
    bw:BYTES_PER_S | flaky:P_PER_S. ValueError on anything else."""
    if not isinstance(mode, str):
        return mode
    name, _, rest = mode.partition(":")
    args = rest.split(":") if rest else []
    try:
        if name == "pass" and not args:
            return PASS
        if name == "blackhole" and not args:
            return Blackhole()
        if name == "reset" and not args:
            return Reset()
        if name == "delay" and 1 <= len(args) <= 2:
            return Delay(*(float(a) for a in args))
        if name == "bw" and len(args) == 1:
            return Bandwidth(int(args[0]))
        if name == "flaky" and len(args) == 1:
            return Flaky(float(args[0]))
    except ValueError as exc:
        raise ValueError(f"bad link mode {mode!r}: {exc}") from None
    raise ValueError(
        f"bad link mode {mode!r}: expected pass | blackhole | reset | delay:MS[:JITTER_MS] "
        "| bw:BYTES_PER_S | flaky:P_PER_S"
    )


class TokenBucket:
    """`rate` bytes/s, at most `burst` bytes at once. Time is an input (seconds)."""

    def __init__(self, rate_bytes_per_s: int, burst_bytes: int, now_s: float) -> None:
        assert rate_bytes_per_s >= 1
        assert burst_bytes >= 1
        self.rate = rate_bytes_per_s
        self.burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._at_s = now_s

    def wait_s(self, now_s: float, size_bytes: int) -> float:
        """How long until `size_bytes` (<= burst) may be sent; 0 if now."""
        assert 0 < size_bytes <= self.burst
        tokens = min(self.burst, self._tokens + (now_s - self._at_s) * self.rate)
        return max(0.0, (size_bytes - tokens) / self.rate)

    def take(self, now_s: float, size_bytes: int) -> None:
        self._tokens = min(self.burst, self._tokens + (now_s - self._at_s) * self.rate)
        self._at_s = now_s
        self._tokens -= size_bytes


def burst_bytes_of(rate_bytes_per_s: int) -> int:
    """A bucket holds 50 ms of traffic (so the rate is smooth), at least 1 KiB (so a slow
    link is not a stream of tiny writes), and never more than a chunk."""
    return max(1, min(CHUNK_BYTES, max(KIB, rate_bytes_per_s // 20), rate_bytes_per_s))


# -------------------------------------------------------------------------- partitions


@dataclass(frozen=True, slots=True)
class Partition:
    """What a partition spec blocks: `blocked` holds directed (sender, receiver) pairs;
    `groups` are the sides as the spec sees them (for the scenario's log)."""

    spec: str
    groups: tuple[tuple[NodeId, ...], ...]
    blocked: frozenset[tuple[NodeId, NodeId]]


def partition_of(
    spec: PartitionSpec, nodes: Sequence[NodeId], leader: NodeId | None = None
) -> Partition:
    """The directions to block for `spec` among `nodes` (in the caller's order: shuffle it
    with a seeded Random for a random choice).

    one                  nodes[0] cut off from the others, both ways
    leader               `leader` cut off from the others, both ways
    majority-minority    the first len//2 nodes (the leader first, if given) against the
                         rest, both ways
    bridge               (3+ nodes) the last node (never the leader) talks to everyone; the
                         others split in two halves (the leader in the first) that cannot
                         talk to each other (Jepsen's bridge)
    one-way-from-leader  nothing the leader sends arrives; it still hears everyone
    one-way-to-leader    the leader hears nobody; what it sends still arrives
    """
    order = list(dict.fromkeys(nodes))
    if len(order) != len(nodes):
        raise ValueError(f"partition: duplicate nodes in {list(nodes)}")
    needs_leader = spec in ("leader", "one-way-from-leader", "one-way-to-leader")
    if needs_leader and leader is None:
        raise ValueError(f"partition {spec!r} needs the leader")
    if leader is not None:
        if leader not in order:
            raise ValueError(f"partition: leader {leader!r} is not one of {order}")
        order.remove(leader)
        order.insert(0, leader)
    if len(order) < 2:
        raise ValueError(f"partition {spec!r} needs at least 2 nodes (got {order})")

    def cut(side_a: Sequence[NodeId], side_b: Sequence[NodeId]) -> set[tuple[NodeId, NodeId]]:
        return {(x, y) for x in side_a for y in side_b} | {(y, x) for x in side_a for y in side_b}

    if spec in ("one", "leader"):
        alone, rest = order[:1], order[1:]
        return Partition(spec, (tuple(alone), tuple(rest)), frozenset(cut(alone, rest)))
    if spec == "majority-minority":
        minority, majority = order[: len(order) // 2], order[len(order) // 2 :]
        return Partition(
            spec, (tuple(minority), tuple(majority)), frozenset(cut(minority, majority))
        )
    if spec == "bridge":
        if len(order) < 3:
            raise ValueError("partition 'bridge' needs at least 3 nodes")
        bridge, rest = order[-1], order[:-1]
        left, right = rest[: (len(rest) + 1) // 2], rest[(len(rest) + 1) // 2 :]
        groups = (tuple(left), (bridge,), tuple(right))
        return Partition(spec, groups, frozenset(cut(left, right)))
    if spec in ("one-way-from-leader", "one-way-to-leader"):
        head, rest = order[0], order[1:]
        if spec == "one-way-from-leader":
            blocked = {(head, other) for other in rest}
        else:
            blocked = {(other, head) for other in rest}
        return Partition(spec, ((head,), tuple(rest)), frozenset(blocked))
    raise ValueError(f"unknown partition spec {spec!r}; expected one of {PARTITION_SPECS}")


# ------------------------------------------------------------------------------- stats

_S = TypeVar("_S", "DirectionStats", "LinkStats")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class DirectionStats:
    """Bytes of one direction. Counters only grow, except `bytes_queued` (a gauge: held by
    a blackhole or waiting for a delay or the bandwidth, right now)."""

    bytes_in: int = 0  # read from the sender
    bytes_forwarded: int = 0  # written to the receiver
    bytes_queued: int = 0
    bytes_dropped: int = 0  # past held_bytes_max, or held when their connection ended

    def __add__(self, other: DirectionStats) -> DirectionStats:
        return _add(self, other)

    def since(self, earlier: DirectionStats) -> DirectionStats:
        """What happened after `earlier` (gauges keep their current value)."""
        return _since(self, earlier)


@dataclass(frozen=True, slots=True)
class LinkStats:
    """One link (or the sum over its shards) as seen from the (a, b) the caller named."""

    a_to_b: DirectionStats = field(default_factory=DirectionStats)
    b_to_a: DirectionStats = field(default_factory=DirectionStats)
    connections_accepted: int = 0  # from the dialling node
    connections_open: int = 0  # gauge
    connections_refused: int = 0  # answered with RST because the link was in reset mode
    connections_reset: int = 0  # open connections the proxy aborted (reset, flaky, loss)
    upstream_failures: int = 0  # the receiving node refused or did not answer

    def __add__(self, other: LinkStats) -> LinkStats:
        return _add(self, other)

    def since(self, earlier: LinkStats) -> LinkStats:
        return _since(self, earlier)

    def swapped(self) -> LinkStats:
        return LinkStats(
            self.b_to_a,
            self.a_to_b,
            self.connections_accepted,
            self.connections_open,
            self.connections_refused,
            self.connections_reset,
            self.upstream_failures,
        )


_GAUGES = frozenset({"bytes_queued", "connections_open"})


def _add(x: _S, y: _S) -> _S:
    values = {f.name: getattr(x, f.name) + getattr(y, f.name) for f in fields(x)}
    return type(x)(**values)


def _since(now: _S, earlier: _S) -> _S:
    values: dict[str, Any] = {}
    for f in fields(now):
        mine, theirs = getattr(now, f.name), getattr(earlier, f.name)
        if isinstance(mine, DirectionStats):
            values[f.name] = mine.since(theirs)
        elif f.name in _GAUGES:
            values[f.name] = mine
        else:
            values[f.name] = mine - theirs
    return type(now)(**values)


class _Counters:
    """Mutable counters of one direction of a link (loop thread only)."""

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_forwarded = 0
        self.bytes_dropped = 0


# --------------------------------------------------------------------------- the links


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), not FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Pipe:
    """One direction of one proxied connection: a bounded FIFO of (deliver_at_s, bytes)."""

    def __init__(self, sender: NodeId, receiver: NodeId) -> None:
        self.sender = sender
        self.receiver = receiver
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued_bytes = 0
        self.eof = False
        self.lost_bytes = False  # bytes were dropped: the stream is broken
        self.wake_writer = asyncio.Event()
        self.wake_reader = asyncio.Event()
        self.bucket: TokenBucket | None = None

    def poke(self) -> None:
        self.wake_writer.set()
        self.wake_reader.set()


class _Connection:
    def __init__(self, link: _Link, dialler: asyncio.StreamWriter) -> None:
        self.link = link
        self.dialler = dialler
        self.upstream: asyncio.StreamWriter | None = None
        self.pipes: list[_Pipe] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def close(self, *, reset: bool) -> None:
        """End both sockets (RST if `reset`, else FIN after what was written) and the
        pumps; held bytes are dropped and counted."""
        if self.closed:
            return
        self.closed = True
        self.link.connections.discard(self)
        if reset:
            self.link.connections_reset += 1
        for pipe in self.pipes:
            self.link.counters[pipe.sender].bytes_dropped += pipe.queued_bytes
            pipe.queue.clear()
            pipe.queued_bytes = 0
        for writer in (self.dialler, self.upstream):
            if writer is None:
                continue
            if reset:
                _abort(writer)
            else:
                writer.close()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class _Link:
    """The proxy of one (pair of nodes, shard): `dialler` connects here, we connect on to
    `target`'s canonical address."""

    def __init__(self, mesh: ProxyMesh, shard: ShardId, dialler: NodeId, target: NodeId) -> None:
        self.mesh = mesh
        self.shard = shard
        self.dialler = dialler
        self.target = target
        self.target_address = mesh.canonical[target][shard]
        self.modes: dict[NodeId, Mode] = {dialler: PASS, target: PASS}  # by sender
        self.counters = {dialler: _Counters(), target: _Counters()}  # by sender
        self.connections: set[_Connection] = set()
        self.server: asyncio.Server | None = None
        self.address = ""
        self.connections_accepted = 0
        self.connections_refused = 0
        self.connections_reset = 0
        self.upstream_failures = 0

    def resetting(self) -> bool:
        return any(isinstance(mode, Reset) for mode in self.modes.values())

    def flaky_p(self) -> float:
        return max((m.p_per_s for m in self.modes.values() if isinstance(m, Flaky)), default=0.0)

    def set_mode(self, sender: NodeId, mode: Mode) -> None:
        self.modes[sender] = mode
        if self.resetting():
            for connection in list(self.connections):
                connection.close(reset=True)
            return
        for connection in self.connections:
            for pipe in connection.pipes:
                pipe.bucket = None  # a new rate starts with a full bucket
                pipe.poke()

    def stats(self) -> LinkStats:
        def direction(sender: NodeId) -> DirectionStats:
            counters = self.counters[sender]
            queued = sum(
                pipe.queued_bytes
                for connection in self.connections
                for pipe in connection.pipes
                if pipe.sender == sender
            )
            return DirectionStats(
                counters.bytes_in, counters.bytes_forwarded, queued, counters.bytes_dropped
            )

        return LinkStats(
            direction(self.dialler),
            direction(self.target),
            self.connections_accepted,
            len(self.connections),
            self.connections_refused,
            self.connections_reset,
            self.upstream_failures,
        )

    # -- the I/O ---------------------------------------------------------------------------

    async def on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.resetting() or self.mesh.closing:
            self.connections_refused += 1
            _abort(writer)
            return
        connection = _Connection(self, writer)
        self.connections.add(connection)
        host, port = _split(self.target_address)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), UPSTREAM_CONNECT_S_MAX
            )
        except (TimeoutError, OSError):
            self.upstream_failures += 1
            self.connections.discard(connection)
            _abort(writer)  # the dialler sees the refusal the node gave us
            return
        connection.upstream = up_writer
        if connection.closed:  # the link was reset (or the mesh closed) meanwhile
            _abort(up_writer)
            return
        forth = _Pipe(self.dialler, self.target)
        back = _Pipe(self.target, self.dialler)
        connection.pipes = [forth, back]
        loop = asyncio.get_running_loop()
        for pipe, source, sink in ((forth, reader, up_writer), (back, up_reader, writer)):
            connection.tasks.append(loop.create_task(self._read(connection, pipe, source)))
            connection.tasks.append(loop.create_task(self._write(connection, pipe, sink)))

    async def _read(
        self, connection: _Connection, pipe: _Pipe, source: asyncio.StreamReader
    ) -> None:
        counters = self.counters[pipe.sender]
        rng = self.mesh.rng
        loop = asyncio.get_running_loop()
        try:
            while True:
                # Back-pressure, unless blackholed (a blackhole reads on, and drops).
                while pipe.queued_bytes >= QUEUE_BYTES_MAX and not isinstance(
                    self.modes[pipe.sender], Blackhole
                ):
                    pipe.wake_reader.clear()
                    await pipe.wake_reader.wait()
                data = await source.read(CHUNK_BYTES)
                if not data:
                    pipe.eof = True
                    pipe.wake_writer.set()
                    return
                counters.bytes_in += len(data)
                mode = self.modes[pipe.sender]
                now_s = loop.time()
                if (
                    isinstance(mode, Blackhole)
                    and pipe.queued_bytes + len(data) > self.mesh.held_bytes_max
                ):
                    counters.bytes_dropped += len(data)
                    pipe.lost_bytes = True
                    continue
                deliver_at_s = now_s
                if isinstance(mode, Delay):
                    jitter_ms = rng.uniform(-mode.jitter_ms, mode.jitter_ms)
                    deliver_at_s = now_s + max(0.0, mode.ms + jitter_ms) / 1000.0
                pipe.queue.append((deliver_at_s, data))
                pipe.queued_bytes += len(data)
                pipe.wake_writer.set()
        except (ConnectionError, OSError):
            connection.close(reset=True)

    async def _write(
        self, connection: _Connection, pipe: _Pipe, sink: asyncio.StreamWriter
    ) -> None:
        counters = self.counters[pipe.sender]
        loop = asyncio.get_running_loop()
        try:
            while True:
                mode = self.modes[pipe.sender]
                if isinstance(mode, Blackhole):
                    pipe.wake_writer.clear()
                    await pipe.wake_writer.wait()
                    continue
                if pipe.lost_bytes:
                    connection.close(reset=True)  # the stream has a hole: TCP gave up
                    return
                if not pipe.queue:
                    if pipe.eof:
                        connection.close(reset=False)
                        return
                    pipe.wake_writer.clear()
                    await pipe.wake_writer.wait()
                    continue
                deliver_at_s, data = pipe.queue[0]
                wait_s = deliver_at_s - loop.time()
                if isinstance(mode, Bandwidth):
                    data = data[: burst_bytes_of(mode.bytes_per_s)]
                    if pipe.bucket is None or pipe.bucket.rate != mode.bytes_per_s:
                        pipe.bucket = TokenBucket(
                            mode.bytes_per_s, burst_bytes_of(mode.bytes_per_s), loop.time()
                        )
                    wait_s = max(wait_s, pipe.bucket.wait_s(loop.time(), len(data)))
                if wait_s > 0:
                    # Sleep, but wake on a mode change (a heal ends a bandwidth wait).
                    pipe.wake_writer.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(pipe.wake_writer.wait(), wait_s)
                    continue
                if isinstance(mode, Bandwidth):
                    assert pipe.bucket is not None
                    pipe.bucket.take(loop.time(), len(data))
                head_at_s, head = pipe.queue.popleft()
                if len(data) < len(head):
                    pipe.queue.appendleft((head_at_s, head[len(data) :]))
                pipe.queued_bytes -= len(data)
                pipe.wake_reader.set()
                sink.write(data)
                await sink.drain()
                counters.bytes_forwarded += len(data)
        except (ConnectionError, OSError):
            connection.close(reset=True)


# ---------------------------------------------------------------------------- the mesh


class ProxyMesh:
    """The proxies between every pair of nodes, for every shard both host.

    `canonical[node][shard]` is that replica's canonical Raft address ("127.0.0.1:port",
    as in logsvc's config: raft_host:raft_port_base+shard). Proxy ports are chosen by the
    kernel at `start()`, avoiding every canonical port, and stay the same until `close()`,
    across restarts of the nodes. `seed` drives jitter and flaky draws.
    """

    def __init__(
        self,
        canonical: Mapping[NodeId, Mapping[ShardId, str]],
        *,
        seed: int = 0,
        listen_host: str = "127.0.0.1",
        held_bytes_max: int = HELD_BYTES_MAX,
    ) -> None:
        self.canonical = {node: dict(shards) for node, shards in canonical.items()}
        self.rng = random.Random(seed)
        self.listen_host = listen_host
        assert held_bytes_max >= 1
        self.held_bytes_max = held_bytes_max
        self.closing = False
        self._links: dict[tuple[NodeId, NodeId, ShardId], _Link] = {}
        nodes = sorted(self.canonical)
        for i, x in enumerate(nodes):
            for y in nodes[i + 1 :]:
                for shard in sorted(set(self.canonical[x]) & set(self.canonical[y])):
                    ax, ay = self.canonical[x][shard], self.canonical[y][shard]
                    assert ax != ay, f"{x} and {y} share the address {ax}"
                    # pysyncobj: the replica whose address string sorts higher dials.
                    dialler, target = (x, y) if ax > ay else (y, x)
                    self._links[(x, y, shard)] = _Link(self, shard, dialler, target)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._flaky_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ProxyMesh:
        assert self._thread is None, "start() once"
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="proxy-mesh", daemon=True)
        self._thread.start()
        try:
            self._call(self._start_servers)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every server and connection (RST), then the loop and its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._shutdown)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CALL_S_MAX)
        if not thread.is_alive():
            loop.close()
        self._loop = None

    def __enter__(self) -> ProxyMesh:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- what the nodes are told -----------------------------------------------------------

    @property
    def nodes(self) -> list[NodeId]:
        return sorted(self.canonical)

    def dial_map(self, node: NodeId) -> dict[str, str]:
        """canonical Raft address of a peer -> proxy address, for every link `node` dials
        (it never dials the others: pysyncobj's higher-address rule): the value of that
        node's LOGSVC_TEST_RAFT_DIAL, as a dict."""
        assert node in self.canonical, node
        return {
            link.target_address: link.address
            for link in self._sorted_links()
            if link.dialler == node
        }

    def dial_env(self, node: NodeId) -> dict[str, str]:
        """The environment to start `node` with: {"LOGSVC_TEST_RAFT_DIAL": json}."""
        return {"LOGSVC_TEST_RAFT_DIAL": json.dumps(self.dial_map(node), sort_keys=True)}

    def proxy_address(self, a: NodeId, b: NodeId, shard: ShardId) -> str:
        """Where the dialler of the (a, b, shard) link connects."""
        return self._link(a, b, shard).address

    def dialler(self, a: NodeId, b: NodeId, shard: ShardId) -> NodeId:
        return self._link(a, b, shard).dialler

    # -- faults ----------------------------------------------------------------------------

    def set_link(
        self,
        a: NodeId,
        b: NodeId,
        mode: Mode | str,
        direction: Direction = "both",
        shard: ShardId | None = None,
    ) -> None:
        """Set the mode of the bytes a sends to b ("a->b"), b to a ("b->a"), or both, on
        every shard the two share (or only `shard`)."""
        parsed = parse_mode(mode)
        if direction not in ("both", "a->b", "b->a"):
            raise ValueError(f"direction must be both, a->b or b->a (got {direction!r})")
        senders = {"both": (a, b), "a->b": (a,), "b->a": (b,)}[direction]
        links = self._links_of(a, b, shard)

        def apply() -> None:
            for link in links:
                for sender in senders:
                    link.set_mode(sender, parsed)

        self._call_sync(apply)

    def partition(
        self,
        spec: PartitionSpec,
        nodes: Sequence[NodeId] | None = None,
        leader: NodeId | None = None,
        *,
        shard: ShardId | None = None,
        mode: Mode | str = "blackhole",
    ) -> Partition:
        """Heal everything (of `shard`, or all shards), then block what `spec` names among
        `nodes` (default: every node, sorted) with `mode` (blackhole, or reset for the
        fast-fail variant; reset has no one-way form). Returns what was blocked."""
        parsed = parse_mode(mode)
        if not isinstance(parsed, Blackhole | Reset):
            raise ValueError(f"a partition blocks with blackhole or reset (got {parsed})")
        chosen = partition_of(spec, list(nodes) if nodes is not None else self.nodes, leader)
        if isinstance(parsed, Reset) and any(
            (y, x) not in chosen.blocked for x, y in chosen.blocked
        ):
            raise ValueError(f"partition {spec!r} is one-way: a reset cannot be one-way")
        plan = [
            (link, sender)
            for sender, receiver in sorted(chosen.blocked)
            for link in self._links_of(sender, receiver, shard)
        ]
        heal_links = [link for link in self._sorted_links() if shard in (None, link.shard)]

        def apply() -> None:
            for link in heal_links:
                for sender in (link.dialler, link.target):
                    link.set_mode(sender, PASS)
            for link, sender in plan:
                link.set_mode(sender, parsed)

        self._call_sync(apply)
        return chosen

    def heal(self, shard: ShardId | None = None) -> None:
        """Every link (of `shard`, or of all shards) back to pass, both ways."""
        links = [link for link in self._sorted_links() if shard in (None, link.shard)]

        def apply() -> None:
            for link in links:
                for sender in (link.dialler, link.target):
                    link.set_mode(sender, PASS)

        self._call_sync(apply)

    def modes(self, a: NodeId, b: NodeId, shard: ShardId) -> tuple[Mode, Mode]:
        """(mode of a->b, mode of b->a) of one link."""
        link = self._link(a, b, shard)
        return self._call_sync(lambda: (link.modes[a], link.modes[b]))

    # -- evidence --------------------------------------------------------------------------

    def stats(self, a: NodeId, b: NodeId, shard: ShardId | None = None) -> LinkStats:
        """The link between a and b (a_to_b = bytes a sent to b), summed over shards."""
        links = self._links_of(a, b, shard)

        def collect() -> LinkStats:
            total = LinkStats()
            for link in links:
                one = link.stats()
                total = total + (one if link.dialler == a else one.swapped())
            return total

        return self._call_sync(collect)

    def all_stats(self) -> dict[tuple[NodeId, NodeId, ShardId], LinkStats]:
        """Every link, keyed (x, y, shard) with x < y (a_to_b = bytes x sent to y)."""

        def collect() -> dict[tuple[NodeId, NodeId, ShardId], LinkStats]:
            out = {}
            for (x, y, shard), link in sorted(self._links.items()):
                one = link.stats()
                out[(x, y, shard)] = one if link.dialler == x else one.swapped()
            return out

        return self._call_sync(collect)

    # -- internals -------------------------------------------------------------------------

    def _sorted_links(self) -> Iterator[_Link]:
        for _key, link in sorted(self._links.items()):
            yield link

    def _link(self, a: NodeId, b: NodeId, shard: ShardId) -> _Link:
        x, y = sorted((a, b))
        found = self._links.get((x, y, shard))
        if found is None:
            raise KeyError(f"no link between {a!r} and {b!r} for shard {shard}")
        return found

    def _links_of(self, a: NodeId, b: NodeId, shard: ShardId | None) -> list[_Link]:
        if a == b:
            raise ValueError(f"a link joins two different nodes (got {a!r} twice)")
        for node in (a, b):
            if node not in self.canonical:
                raise KeyError(f"unknown node {node!r} (nodes: {self.nodes})")
        x, y = sorted((a, b))
        links = [
            link
            for (lx, ly, s), link in sorted(self._links.items())
            if (lx, ly) == (x, y) and shard in (None, s)
        ]
        if not links:
            raise KeyError(f"no link between {a!r} and {b!r} for shard {shard}")
        return links

    def _call(self, make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        """Run the coroutine `make()` on the loop thread; wait (bounded) for its result."""
        loop = self._loop
        assert loop is not None, "the mesh is not started"
        assert threading.current_thread() is not self._thread
        return asyncio.run_coroutine_threadsafe(make(), loop).result(CALL_S_MAX)

    def _call_sync(self, function: Callable[[], _T]) -> _T:
        """Run `function()` on the loop thread, where all the links' state lives."""

        async def run() -> _T:
            return function()

        return self._call(run)

    async def _start_servers(self) -> None:
        canonical_ports = {
            _split(a)[1] for shards in self.canonical.values() for a in shards.values()
        }
        for link in self._sorted_links():
            for _attempt in range(BIND_ATTEMPTS_MAX):
                server = await asyncio.start_server(link.on_accept, self.listen_host, 0)
                port = int(server.sockets[0].getsockname()[1])
                if port not in canonical_ports:
                    break
                server.close()
                await server.wait_closed()
            else:
                raise OSError("could not bind a proxy port that is not a canonical Raft port")
            link.server = server
            link.address = f"{self.listen_host}:{port}"
        self._flaky_task = asyncio.get_running_loop().create_task(self._flaky())

    async def _flaky(self) -> None:
        while True:
            await asyncio.sleep(FLAKY_PERIOD_S)
            for link in self._sorted_links():
                p = link.flaky_p()
                if p > 0 and self.rng.random() < p:
                    for connection in list(link.connections):
                        connection.close(reset=True)

    async def _shutdown(self) -> None:
        self.closing = True
        for link in self._sorted_links():
            if link.server is not None:
                link.server.close()
            for connection in list(link.connections):
                connection.close(reset=True)
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()  # pumps, the flaky ticker, accepts still connecting upstream
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
