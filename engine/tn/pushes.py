"""A subscriber's queue of entries waiting to be pushed: bounded by count and bytes, and
dropped, not grown, when the subscriber falls that far behind (pure: no I/O, no asyncio).

Why drop (issue 15, shared/STYLE.md "a full queue returns a typed error instead of buffering
more"): the TN pushes every entry as it becomes visible (`Engine.subscribe` calls back on the
event loop and must not block), and a compute node that reads slowly must cost the TN a
bounded amount of memory. A dropped subscriber is told so (SUBSCRIBER_DROPPED) and pulls the
logtail from the last entry it has, which the TN keeps in its logtail buffer anyway.
"""

from __future__ import annotations

from collections import deque

from engine.logtail import TailEntry


class SubscriberQueue:
    __slots__ = ("_entries", "bytes", "bytes_max", "dropped", "entries_max")

    def __init__(self, entries_max: int, bytes_max: int) -> None:
        assert entries_max >= 1
        assert bytes_max >= 1
        self.entries_max = entries_max
        self.bytes_max = bytes_max
        self.bytes = 0
        self.dropped = False
        self._entries: deque[TailEntry] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def offer(self, entry: TailEntry) -> bool:
        """Queue one more entry (commit order). False once the queue is over a bound: it is
        then dropped for good (emptied, and every later offer refused)."""
        if self.dropped:
            return False
        if (
            len(self._entries) + 1 > self.entries_max
            or self.bytes + len(entry.payload) > self.bytes_max
        ):
            self.dropped = True
            self._entries.clear()
            self.bytes = 0
            return False
        assert not self._entries or entry.commit_ts > self._entries[-1].commit_ts
        self._entries.append(entry)
        self.bytes += len(entry.payload)
        return True

    def take(self, entries_max: int, bytes_max: int) -> tuple[TailEntry, ...]:
        """The oldest entries, at most `entries_max` and `bytes_max` of payload, but always
        the first one when there is one (an entry is never larger than a push)."""
        taken: list[TailEntry] = []
        size = 0
        entries = self._entries
        while entries and len(taken) < entries_max:
            payload_bytes = len(entries[0].payload)
            if taken and size + payload_bytes > bytes_max:
                break
            taken.append(entries.popleft())
            size += payload_bytes
        self.bytes -= size
        return tuple(taken)
