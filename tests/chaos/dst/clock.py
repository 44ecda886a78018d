"""Virtual time for the simulator: one global clock plus one local clock per node.

The global clock (`now_ns`) orders everything the simulator records: operations, faults,
events. Each node also has a local monotonic clock that starts at a random offset and
advances at the node's own rate (1.0 normally; a clock fault makes one node's timers run
fast or slow relative to its peers, as libfaketime's `x1.5` does, chaos-plan §4.6). A node's
local clock keeps running while the node is down, like a host's monotonic clock across a
process restart.

pysyncobj reads one process-wide function for its timers; `monotonic_s` answers with the
local clock of the node being run (`running(node_id)`), and with global time otherwise.
Times are integers of nanoseconds so that no float rounding can depend on the order of
additions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


class VirtualClock:
    def __init__(self, local_offsets_ns: dict[str, int]) -> None:
        self.now_ns = 0
        self._local_ns = dict(local_offsets_ns)
        self._rate = dict.fromkeys(local_offsets_ns, 1.0)
        self._current: str | None = None

    def advance(self, dt_ns: int) -> None:
        assert dt_ns > 0
        self.now_ns += dt_ns
        for node_id, rate in self._rate.items():
            self._local_ns[node_id] += dt_ns if rate == 1.0 else round(dt_ns * rate)

    def set_rate(self, node_id: str, rate: float) -> None:
        assert 0.1 <= rate <= 10.0, rate
        self._rate[node_id] = rate

    def rate(self, node_id: str) -> float:
        return self._rate[node_id]

    def local_ns(self, node_id: str) -> int:
        return self._local_ns[node_id]

    def local_ms(self, node_id: str) -> float:
        return self._local_ns[node_id] / NS_PER_MS

    def monotonic_s(self) -> float:
        """What pysyncobj sees as `monotonicTime()`."""
        if self._current is None:
            return self.now_ns / NS_PER_S
        return self._local_ns[self._current] / NS_PER_S

    @contextmanager
    def running(self, node_id: str) -> Iterator[None]:
        """Everything in this block runs "on" `node_id`: pysyncobj reads its local clock."""
        assert self._current is None, "nodes never run inside one another"
        self._current = node_id
        try:
            yield
        finally:
            self._current = None
