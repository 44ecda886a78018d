"""The node's structured event log: white-box Raft events for the chaos checkers
(shared/reference/chaos-plan.md §4.7, §4.8 S12/S14). Disabled by default, and then free:
`ReplicaEvents.emit` returns after one check of a module global.

Enabled by the environment, read once at import:

    LOGSVC_EVENT_LOG=/path/events.jsonl

Every event is appended to that file as one JSON line (`O_APPEND`, one `write(2)` per line,
no user-space buffer): a SIGKILL loses nothing already emitted, since the page cache survives
the process, and lines of concurrent threads or processes never interleave. No fsync: the
harness reads the file after the nodes are dead, never after a power loss of its own.

Line format: exactly the fields of `tests/chaos/history.RaftEvent` plus `"t": "event"`, so
`tests.chaos.history.from_json_line` parses it (the product does not import tests; keep
`EVENT_FIELDS` in sync with that class, which tests/unit/test_events.py checks):

    {"t":"event","node_id":"n1","shard":1,"time_ns":123,"kind":"vote","term":4,
     "voted_for":"127.0.0.1:7001","detail":""}

`time_ns` is `time.monotonic_ns()`: every process of a test run shares the host's clock, so
events order against the workload's history and the nemesis log.

Kinds (what emits them):

    start       replica opened; term = the durable term recovered (replica.py)
    term        the durable term changed (raft/journal.py StoreJournal.flush_vote)
    vote        a vote for `voted_for` in `term` was made durable (same place, right after
                the store's save_vote returned; a candidate's vote for itself included)
    leader      this replica became leader in `term` (raft/node.py tick loop)
    follower    this replica stopped being leader; `term` is its term then (tick loop)
    recovery    opening the store repaired something: a torn tail cut, files deleted
    corruption  opening the store, loading the snapshot, or a read found damaged data
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Literal

ENV_VAR = "LOGSVC_EVENT_LOG"

EventKind = Literal["start", "term", "vote", "leader", "follower", "recovery", "corruption"]
EVENT_KINDS: tuple[EventKind, ...] = (
    "start",
    "term",
    "vote",
    "leader",
    "follower",
    "recovery",
    "corruption",
)
# The fields of tests/chaos/history.RaftEvent, in its order.
EVENT_FIELDS = ("node_id", "shard", "time_ns", "kind", "term", "voted_for", "detail")
DETAIL_CHARS_MAX = 2000  # a detail is a sentence or a file and offset, never a dump


class EventLogError(OSError):
    """The event log named by `LOGSVC_EVENT_LOG` cannot be opened for appending."""


def encode_event(
    node_id: str,
    shard: int,
    time_ns: int,
    kind: EventKind,
    term: int = 0,
    voted_for: str | None = None,
    detail: str = "",
) -> str:
    """One event as its JSON line (without the newline)."""
    assert kind in EVENT_KINDS
    assert term >= 0
    record = {
        "t": "event",
        "node_id": node_id,
        "shard": shard,
        "time_ns": time_ns,
        "kind": kind,
        "term": term,
        "voted_for": voted_for,
        "detail": detail[:DETAIL_CHARS_MAX],
    }
    return json.dumps(record, separators=(",", ":"))


class _Sink:
    __slots__ = ("_fd", "_lock", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise EventLogError(
                exc.errno, f"{ENV_VAR}: cannot open {path}: {exc.strerror}"
            ) from exc

    def write_line(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        with self._lock:
            written = os.write(self._fd, data)
        # A regular file takes a whole small write; a short one means a full disk, and a
        # missing event must not pass silently (the checkers rely on these lines).
        assert written == len(data), f"short write to the event log {self.path}"

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                os.close(fd)


def _open_sink(path: str | None) -> _Sink | None:
    return _Sink(path) if path else None


_sink: _Sink | None = _open_sink(os.environ.get(ENV_VAR))


def enabled() -> bool:
    return _sink is not None


def configure(path: str | None) -> None:
    """Point the event log at `path` (None: disable). For in-process tests; a node reads
    the environment at import and never calls this."""
    global _sink
    old, _sink = _sink, _open_sink(path)
    if old is not None:
        old.close()


@dataclass(frozen=True, slots=True)
class ReplicaEvents:
    """The events of one shard replica (a node hosts several)."""

    node_id: str
    shard: int

    def emit(
        self,
        kind: EventKind,
        *,
        term: int = 0,
        voted_for: str | None = None,
        detail: str = "",
    ) -> None:
        sink = _sink
        if sink is None:
            return
        sink.write_line(
            encode_event(
                self.node_id, self.shard, time.monotonic_ns(), kind, term, voted_for, detail
            )
        )
