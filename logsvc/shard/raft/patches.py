"""The import-time patches of pysyncobj 0.3.17 (pinned: asserted here), and the seams the
simulator (tests/chaos/dst/) uses. Importing any module of this package that imports
pysyncobj imports this one first, so the patches are in place before a SyncObj exists.

The five patches: `createJournal` (our `StoreJournal`), `createPoller` (the scheduler's
`ShardPoller`), `PIPE_NOTIFIER_ENABLED` off (the scheduler wakes ticks), the pickle
protocol (4, not 2), and the TCP connection's `zlib` (stored blocks, no compression)."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Any

import pysyncobj
import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.poller as pysyncobj_poller
import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.tcp_connection as pysyncobj_tcp_connection
import pysyncobj.transport as pysyncobj_transport
from pysyncobj.config import FAIL_REASON
from pysyncobj.journal import Journal
from pysyncobj.transport import Transport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from logsvc.shard import scheduler
from logsvc.shard.raft.config import FailReason

PINNED_PYSYNCOBJ_VERSION = "0.3.17"
# The private methods overridden below exist with these semantics in 0.3.17 only.
assert PYSYNCOBJ_VERSION == PINNED_PYSYNCOBJ_VERSION, (
    f"logsvc needs pysyncobj {PINNED_PYSYNCOBJ_VERSION}, found {PYSYNCOBJ_VERSION}"
)
assert pysyncobj.__name__ == "pysyncobj"

# config.py spells pysyncobj's failure codes out (it imports no pysyncobj).
for _name in (
    "SUCCESS",
    "QUEUE_FULL",
    "MISSING_LEADER",
    "DISCARDED",
    "NOT_LEADER",
    "LEADER_CHANGED",
    "REQUEST_DENIED",
    "UNKNOWN_OUTCOME",
):
    assert getattr(FailReason, _name) == getattr(FAIL_REASON, _name), _name


class _JournalRegistry:
    """pysyncobj creates its journal with `createJournal(journalFile)`; we hand it ours."""

    PREFIX = "logsvc-journal:"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._journals: dict[str, Journal] = {}
        self._counter = 0
        self._original = pysyncobj_syncobj.createJournal

    def register(self, journal: Journal) -> str:
        with self._lock:
            self._counter += 1
            key = f"{self.PREFIX}{self._counter}"
            self._journals[key] = journal
            return key

    def unregister(self, key: str) -> None:
        with self._lock:
            self._journals.pop(key, None)

    def create(self, journal_file: str | None) -> Journal:
        with self._lock:
            found = self._journals.get(journal_file or "")
        if found is not None:
            return found
        assert not (journal_file or "").startswith(self.PREFIX)
        return self._original(journal_file)


_JOURNALS = _JournalRegistry()
pysyncobj_syncobj.createJournal = _JOURNALS.create


class _PollerRegistry:
    """pysyncobj creates its poller with `createPoller(conf.pollerType)`; a replica driven by
    a scheduler gets its `ShardPoller` (scheduler.py) instead of a poller of its own."""

    PREFIX = "logsvc-poller:"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pollers: dict[str, scheduler.ShardPoller] = {}
        self._counter = 0
        self._original = pysyncobj_syncobj.createPoller

    def register(self, poller: scheduler.ShardPoller) -> str:
        with self._lock:
            self._counter += 1
            key = f"{self.PREFIX}{self._counter}"
            self._pollers[key] = poller
            return key

    def unregister(self, key: str) -> None:
        with self._lock:
            self._pollers.pop(key, None)

    def create(self, poller_type: str) -> Any:
        with self._lock:
            found = self._pollers.get(poller_type)
        if found is not None:
            return found
        assert not poller_type.startswith(self.PREFIX)
        return self._original(poller_type)


_POLLERS = _PollerRegistry()
pysyncobj_syncobj.createPoller = _POLLERS.create
# Our ShardPoller speaks pysyncobj's event bits.
assert pysyncobj_poller.POLL_EVENT_TYPE.READ == scheduler.POLL_READ
assert pysyncobj_poller.POLL_EVENT_TYPE.WRITE == scheduler.POLL_WRITE
assert pysyncobj_poller.POLL_EVENT_TYPE.ERROR == scheduler.POLL_ERROR
# pysyncobj wakes its own tick thread through a pipe per SyncObj when a command is queued
# (two descriptors per replica, a write per proposal). Ticks are the scheduler's here:
# `RaftNode.propose` wakes the replica's worker instead.
pysyncobj_syncobj.PIPE_NOTIFIER_ENABLED = False

# pysyncobj pickles every message and journal entry with protocol 2, which stores `bytes`
# as latin-1 text: non-ASCII payloads grow up to 2x on the wire and on disk. Protocol 4
# stores them raw (pysyncobj.md §3.4: 2.3-4.3x throughput). Unpickling detects the
# protocol, so replicas on either setting still read each other.
PICKLE_PROTOCOL = 4
setattr(pysyncobj_pickle, "__protocol", PICKLE_PROTOCOL)


# ------------------------------------------------------------------------ simulator seams
# For the deterministic simulator only (tests/chaos/dst/), which runs real replicas in one
# thread on a virtual clock over an in-memory network. This module stays the only importer
# of pysyncobj, so what the simulator needs of pysyncobj is exposed here; production never
# uses either name below.

# pysyncobj's transport interface: the simulator's in-memory transport subclasses it and is
# passed as `transport_base` (RaftNode, ShardRaft); the durable behaviour is added on top.
TransportBase = Transport

_HOST_MONOTONIC = (pysyncobj_syncobj.monotonicTime, pysyncobj_transport.monotonicTime)


def monotonic_s() -> float:
    """pysyncobj's clock (CLOCK_MONOTONIC_RAW, not `time.monotonic`'s CLOCK_MONOTONIC: they
    drift apart by NTP's slewing), or the simulator's: every deadline a replica's tick
    returns, and every liveness time, is on it; the scheduler sleeps by it."""
    return float(pysyncobj_syncobj.monotonicTime())


def set_monotonic_clock(clock: Callable[[], float] | None) -> None:
    """Simulator only: pysyncobj's timers (elections, heartbeats, leader fallback) read
    `clock()` (seconds) instead of the host's monotonic clock; None restores the host's.
    Process-wide, as pysyncobj reads one module-level function: a simulator that gives
    nodes different clocks switches what `clock` returns before it runs each node."""
    if clock is None:
        pysyncobj_syncobj.monotonicTime, pysyncobj_transport.monotonicTime = _HOST_MONOTONIC
    else:
        pysyncobj_syncobj.monotonicTime = clock
        pysyncobj_transport.monotonicTime = clock


# ------------------------------------------------------------------------ the transport


class _StoredZlib:
    """What pysyncobj's TCP connections see as `zlib`: messages are framed as zlib streams
    of stored (uncompressed) blocks instead of level 3.

    pysyncobj compresses every message it sends, once per follower. Ours are mostly
    record payloads, which the engine's own codecs have usually compressed or which are
    random: level 3 cost 270 us per 26 KB AppendEntries on the leader, twice per entry
    (one per follower), for no saving; stored blocks cost 9 us. The stream is still zlib,
    so a node of an earlier build decodes it, and this one decodes theirs."""

    @staticmethod
    def compress(data: bytes, level: int = -1) -> bytes:
        return zlib.compress(data, 0)

    decompress = staticmethod(zlib.decompress)


pysyncobj_tcp_connection.zlib = _StoredZlib
