"""The simulated network: per-link FIFO delivery with seeded delays, TCP-like connections,
and partitions (chaos-plan §4.3, §4.10).

Model (what pysyncobj's TCP transport would see):

* One connection per pair of nodes. It exists only while both nodes are up and both
  directions pass; it is (re)established `reconnect delay` after that becomes true, and
  both ends are told (`_onNodeConnected`), as TCPTransport tells pysyncobj. A node that is
  not told it is connected never starts an election (pysyncobj's `__connectedToAnyone`);
  the appendix-A pitfall (a transport that is always `ready` and never reconnects after a
  restart) is exactly what this models away.
* Messages are pickled at send time (the sender may mutate the dict afterwards, and the
  receiver must not share objects with the sender) and delivered in order per directed
  link (TCP), each after the link's delay; a later message never overtakes an earlier one.
* A cut direction holds its messages (TCP retransmits) instead of dropping them. If the cut
  lasts `connection_timeout`, the connection dies: both ends are told
  (`_onNodeDisconnected`), and every message still in flight on it is dropped. A heal
  before the timeout delivers the held messages late. A partition may instead reset its
  connections at once (in-flight messages dropped, both ends told), and a crashed node's
  connections die at once (the kernel resets its sockets).
* Delivery and connection news reach a node only inside its own tick (pysyncobj's poll at
  the end of `_onTick`, through a tick callback, as TCPTransport's own), so any exception
  they raise is the replica's, not the simulator's.

Partition specs (Jepsen `:one :majority :primaries`, plus the plan's `bridge` and a one-way
cut): see `partition_cuts`.
"""

from __future__ import annotations

import pickle
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from logsvc.shard.raft import patches as raft_patches
from tests.chaos.dst.clock import NS_PER_MS, VirtualClock

PartitionSpec = Literal["one", "leader", "majority", "bridge", "one_way"]
PARTITION_SPECS: tuple[PartitionSpec, ...] = ("one", "leader", "majority", "bridge", "one_way")

# Per-message latency of a healthy link (loopback-like), drawn per message.
LINK_DELAY_NS_MIN = 200_000
LINK_DELAY_NS_MAX = 3 * NS_PER_MS
# A "slow link" fault adds this much (drawn per fault) plus +-50% jitter per message.
SLOW_LINK_DELAY_NS_MIN = 20 * NS_PER_MS
SLOW_LINK_DELAY_NS_MAX = 400 * NS_PER_MS
# After a link heals or a node comes up, the connection is back after up to this long
# (pysyncobj retries a connection every connectionRetryTime, 5 s by default; we dial
# sooner so that runs spend their time on faults, not waiting).
RECONNECT_DELAY_NS_MAX = 1500 * NS_PER_MS
# Messages in flight per directed link: a bound on the simulator's memory, far above what
# pysyncobj sends in a simulated connection timeout.
LINK_QUEUE_MESSAGES_MAX = 200_000


@dataclass(slots=True)
class _Message:
    deliver_ns: int
    epoch: int
    data: bytes


@dataclass(slots=True)
class _Link:
    queue: deque[_Message] = field(default_factory=deque)
    last_deliver_ns: int = 0
    extra_delay_ns: int = 0  # a slow-link fault


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0  # in flight when a connection died, or sent while disconnected
    connects: int = 0
    disconnects: int = 0
    bytes_sent: int = 0


_ACTIVE: SimNetwork | None = None


class SimTransport(raft_patches.TransportBase):  # type: ignore[misc]
    """pysyncobj's transport interface over the active `SimNetwork` (one simulation runs
    at a time in a process; `SimNetwork.activate` sets it). Node ids are the Raft
    addresses; the network maps them to simulator node names."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        assert _ACTIVE is not None, "no simulated network is active"
        self._network = _ACTIVE
        self.address: str = selfNode.id
        self._peers: dict[str, Any] = {node.id: node for node in otherNodes}
        self._ready = False
        syncObj.addOnTickCallback(self._on_tick)

    # pysyncobj's Transport API (names are theirs) ------------------------------------------

    def tryGetReady(self) -> None:
        if not self._ready:
            self._ready = True
            self._network.attach(self)

    @property
    def ready(self) -> bool:
        return self._ready

    def addNode(self, node: Any) -> None:
        self._peers[node.id] = node

    def dropNode(self, node: Any) -> None:
        self._peers.pop(node.id, None)

    def send(self, node: Any, message: Any) -> bool:
        return self._network.send(self.address, node.id, message)

    def destroy(self) -> None:
        if self._ready:
            self._network.detach(self)

    # the network's side ----------------------------------------------------------------

    def peer(self, address: str) -> Any:
        return self._peers[address]

    def connected(self, address: str) -> None:
        self._onNodeConnected(self._peers[address])

    def disconnected(self, address: str) -> None:
        self._onNodeDisconnected(self._peers[address])

    def received(self, address: str, message: Any) -> None:
        self._onMessageReceived(self._peers[address], message)

    def _on_tick(self) -> None:
        self._network.pump(self)


class SimNetwork:
    """See the module docstring. Node names (`n1`...) and Raft addresses map 1:1."""

    def __init__(
        self,
        rng: random.Random,
        clock: VirtualClock,
        addresses: dict[str, str],
        connection_timeout_ns: int,
    ) -> None:
        self._rng = rng
        self._clock = clock
        self._name_of = {address: name for name, address in addresses.items()}
        self._address_of = dict(addresses)
        self._names = sorted(addresses)
        self._timeout_ns = connection_timeout_ns
        self._endpoints: dict[str, SimTransport] = {}  # name -> the live incarnation's
        self._links = {(a, b): _Link() for a in self._names for b in self._names if a != b}
        self._blocked: set[tuple[str, str]] = set()
        self._cut_since: dict[tuple[str, str], int] = {}  # pair (a < b) -> cut start
        self._epoch: dict[tuple[str, str], int] = {}  # pair -> live connection's epoch
        self._dial_at: dict[tuple[str, str], int] = {}  # pair -> when it reconnects
        self._news: dict[str, list[tuple[bool, str]]] = {n: [] for n in self._names}
        self._epochs = 0
        self.stats = NetworkStats()
        # Called with the receiver's name after each message it handled: the observer
        # checks there too, since a tick may handle messages whose effects undo each other.
        self.after_delivery: Callable[[str], None] | None = None

    # -- the simulation's side ----------------------------------------------------------

    def activate(self) -> None:
        global _ACTIVE
        _ACTIVE = self

    def deactivate(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    @property
    def blocked(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._blocked)

    def set_cuts(self, cuts: Iterable[tuple[str, str]], *, reset: bool = False) -> None:
        """Replace the current partition by `cuts` (directed: a message a -> b is held).
        `reset`: the cut pairs' connections die at once, dropping what is in flight (an
        iptables REJECT with tcp-reset) instead of timing out (a blackhole)."""
        self._blocked = set(cuts)
        now = self._clock.now_ns
        for pair in self._pairs():
            a, b = pair
            cut = (a, b) in self._blocked or (b, a) in self._blocked
            if cut:
                self._cut_since.setdefault(pair, now)
                self._dial_at.pop(pair, None)
                if reset and pair in self._epoch:
                    self._kill(pair)
            else:
                self._cut_since.pop(pair, None)

    def heal(self) -> None:
        self.set_cuts(())
        for link in self._links.values():
            link.extra_delay_ns = 0

    def slow_link(self, src: str, dst: str, delay_ns: int) -> None:
        self._links[(src, dst)].extra_delay_ns = delay_ns

    def connected_pairs(self) -> list[tuple[str, str]]:
        return sorted(self._epoch)

    def step(self) -> None:
        """Once per simulated step, before nodes tick: connection timeouts and reconnects."""
        now = self._clock.now_ns
        for pair in self._pairs():
            if pair in self._epoch:
                since = self._cut_since.get(pair)
                if since is not None and now - since >= self._timeout_ns:
                    self._kill(pair)
                continue
            a, b = pair
            if a not in self._endpoints or b not in self._endpoints or pair in self._cut_since:
                self._dial_at.pop(pair, None)
                continue
            due = self._dial_at.get(pair)
            if due is None:
                self._dial_at[pair] = now + self._rng.randrange(RECONNECT_DELAY_NS_MAX)
            elif due <= now:
                del self._dial_at[pair]
                self._epochs += 1
                self._epoch[pair] = self._epochs
                self._news[a].append((True, b))
                self._news[b].append((True, a))
                self.stats.connects += 1

    # -- the transports' side -----------------------------------------------------------

    def attach(self, endpoint: SimTransport) -> None:
        name = self._name_of[endpoint.address]
        assert name not in self._endpoints, f"{name} attached twice"
        self._endpoints[name] = endpoint
        self._news[name] = []

    def detach(self, endpoint: SimTransport) -> None:
        name = self._name_of[endpoint.address]
        if self._endpoints.get(name) is not endpoint:
            return
        del self._endpoints[name]
        for pair in self._pairs():
            if name in pair:
                self._dial_at.pop(pair, None)
                if pair in self._epoch:
                    self._kill(pair)
        self._news[name] = []

    def send(self, src_address: str, dst_address: str, message: Any) -> bool:
        src, dst = self._name_of[src_address], self._name_of[dst_address]
        epoch = self._epoch.get(_pair(src, dst))
        if epoch is None:
            self.stats.dropped += 1
            return False
        link = self._links[(src, dst)]
        assert len(link.queue) < LINK_QUEUE_MESSAGES_MAX, f"link {src}->{dst} is flooded"
        delay = self._rng.randint(LINK_DELAY_NS_MIN, LINK_DELAY_NS_MAX)
        if link.extra_delay_ns:
            jitter = link.extra_delay_ns // 2
            delay += link.extra_delay_ns + self._rng.randint(-jitter, jitter)
        deliver = max(self._clock.now_ns + delay, link.last_deliver_ns)
        link.last_deliver_ns = deliver
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        link.queue.append(_Message(deliver, epoch, data))
        self.stats.sent += 1
        self.stats.bytes_sent += len(data)
        return True

    def pump(self, endpoint: SimTransport) -> None:
        """Inside `endpoint`'s tick: connection news, then every message now due to it."""
        name = self._name_of[endpoint.address]
        if self._endpoints.get(name) is not endpoint:
            return
        news, self._news[name] = self._news[name], []
        for up, peer in news:
            address = self._address_of[peer]
            if up:
                endpoint.connected(address)
            else:
                endpoint.disconnected(address)
        now = self._clock.now_ns
        for src in self._names:
            if src == name:
                continue
            link = self._links[(src, name)]
            pair = _pair(src, name)
            while link.queue and link.queue[0].deliver_ns <= now:
                head = link.queue[0]
                if head.epoch != self._epoch.get(pair):
                    link.queue.popleft()
                    self.stats.dropped += 1
                    continue
                if (src, name) in self._blocked:
                    break  # held: TCP keeps retransmitting until the heal or the timeout
                link.queue.popleft()
                self.stats.delivered += 1
                endpoint.received(self._address_of[src], pickle.loads(head.data))
                if self._endpoints.get(name) is not endpoint:
                    return  # the message made the replica stop
                if self.after_delivery is not None:
                    self.after_delivery(name)

    # -- internals ------------------------------------------------------------------------

    def _pairs(self) -> list[tuple[str, str]]:
        names = self._names
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]

    def _kill(self, pair: tuple[str, str]) -> None:
        epoch = self._epoch.pop(pair)
        a, b = pair
        for src, dst in ((a, b), (b, a)):
            queue = self._links[(src, dst)].queue
            kept = deque(m for m in queue if m.epoch != epoch)
            self.stats.dropped += len(queue) - len(kept)
            self._links[(src, dst)].queue = kept
        for name, peer in ((a, b), (b, a)):
            if name in self._endpoints:
                self._news[name].append((False, peer))
        self.stats.disconnects += 1


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def partition_cuts(
    spec: PartitionSpec, names: list[str], leader: str | None, rng: random.Random
) -> tuple[set[tuple[str, str]], str]:
    """Directed cuts for `spec`, and a description. `names` sorted; `leader` may be None.

    one       one random node cut off from the rest, both ways
    leader    the current leader cut off (a random node when there is none)
    majority  a random minority / majority split, both ways
    bridge    two halves that cannot talk, and one node that talks to both
    one_way   messages from one node (the leader half of the time) to the others are held;
              the others still reach it (a failed NIC direction, a one-way blackhole)
    """
    shuffled = list(names)
    rng.shuffle(shuffled)
    if spec in ("one", "leader"):
        isolated = leader if spec == "leader" and leader is not None else shuffled[0]
        rest = [n for n in names if n != isolated]
        return _both_ways([isolated], rest), f"{spec}: {isolated} | {' '.join(rest)}"
    if spec == "majority":
        minority = sorted(shuffled[: len(names) // 2])
        majority = sorted(shuffled[len(names) // 2 :])
        return _both_ways(minority, majority), f"majority: {' '.join(minority)} | " + " ".join(
            majority
        )
    if spec == "bridge":
        bridge, rest = shuffled[0], shuffled[1:]
        left, right = sorted(rest[: len(rest) // 2]), sorted(rest[len(rest) // 2 :])
        return _both_ways(left, right), f"bridge: {' '.join(left)} | {' '.join(right)} via {bridge}"
    assert spec == "one_way"
    source = leader if leader is not None and rng.random() < 0.5 else shuffled[0]
    cuts = {(source, n) for n in names if n != source}
    return cuts, f"one_way: {source} -> others held"


def _both_ways(left: Iterable[str], right: Iterable[str]) -> set[tuple[str, str]]:
    right = list(right)
    cuts: set[tuple[str, str]] = set()
    for a in left:
        for b in right:
            cuts.add((a, b))
            cuts.add((b, a))
    return cuts
