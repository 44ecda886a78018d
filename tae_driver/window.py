"""The appending window: at most W records in flight, by the blog rule.

Why (reference/matrixone-wal.md §2.3, §4 scenario 10): concurrent appends complete out of DSN
order, and after a crash everything dispatched after the first lost record is "trailing" and
must be discarded. The window bounds how many records can be in flight, which bounds the
damage, the replay pending set and the size of a skip record. MatrixOne's
`writeTokenController.Apply` hands out one token per *record* (not per entry) and allows token
`t` iff nothing is outstanding or `t < W + min(outstanding)`. With W=7 and token 13
outstanding, token 19 may go (19 < 20) and token 20 blocks until 13 is put back.

Pure: no I/O, no asyncio. The caller (pipeline.py) asks `is_open()` before `take()`; blocking
is the caller's business (it stops packing, so entries pile up in the bounded intake and
`append` waits: back-pressure on the enqueue side). Like etcd-raft's `tracker/inflights.go`.
"""

from __future__ import annotations

from tae_driver import limits


class Window:
    """Tokens 1, 2, 3, ... one per dispatched record."""

    __slots__ = ("_next_token", "_outstanding", "records_max")

    def __init__(self, records_max: int) -> None:
        assert 1 <= records_max <= limits.WINDOW_RECORDS_MAX
        self.records_max = records_max
        self._next_token = 1
        self._outstanding: set[int] = set()

    @property
    def next_token(self) -> int:
        return self._next_token

    @property
    def in_flight(self) -> int:
        return len(self._outstanding)

    def is_open(self) -> bool:
        """Whether `next_token` may be taken now (the blog rule)."""
        if not self._outstanding:
            return True
        return self._next_token < self.records_max + min(self._outstanding)

    def take(self) -> int:
        assert self.is_open()
        token = self._next_token
        self._next_token += 1
        self._outstanding.add(token)
        # The rule implies this; checked because the replay bound relies on it.
        assert len(self._outstanding) <= self.records_max
        return token

    def put_back(self, token: int) -> None:
        assert token in self._outstanding
        self._outstanding.remove(token)
