"""An entry's completion without a future: `Driver.submit_direct` (issue 21, target 2).

Why: an `asyncio.Future` runs its done-callbacks in the loop turn *after* it is completed, so
an engine that makes a commit visible from such a callback paid one more loop turn (and a
future, a handle and a context copy) between "the WAL says durable" and "the commit
returns". A `Completion` is completed by the driver in the turn it learns the outcome, and
its callback runs right there.

Order (what a callback may rely on): the driver marks the completions of a record it learned
durable (in DSN order), then fires their callbacks in the same order, after its own state is
consistent again: in that turn when no other record is in flight (a lone writer), else in the
next turn, so that every record the backend hands back in one turn (the file backend: all
the records of one fsync) is marked first. So a callback sees the completions that follow
its own in its group as done already (the engine holds a group back on exactly that,
engine/pipeline.py `durable`), and may submit new entries.

The surface is the part of a future the engine reads: `done`, `cancelled` (never), `result`,
`exception`. A callback that raises is reported to the loop's exception handler, as a
future's callback would be; it never reaches the driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeAlias


class Completion:
    __slots__ = ("_done", "_dsn", "_error", "on_done")

    def __init__(self, on_done: Callable[[Completion], None]) -> None:
        self.on_done: Callable[[Completion], None] | None = on_done
        """The callback until it is fired; then None (see `fire`)."""
        self._done = False
        self._dsn = 0
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        state = "pending" if not self._done else f"error={self._error!r}" if self._error else ""
        return f"<Completion {state or f'dsn={self._dsn}'}>"

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def result(self) -> int:
        """The entry's DSN (raises the error it failed with)."""
        assert self._done, "result() of a pending Completion"
        if self._error is not None:
            raise self._error
        return self._dsn

    def exception(self) -> BaseException | None:
        assert self._done, "exception() of a pending Completion"
        return self._error

    def set_result(self, dsn: int) -> None:
        assert not self._done
        self._done = True
        self._dsn = dsn

    def set_exception(self, error: BaseException) -> None:
        assert not self._done
        self._done = True
        self._error = error

    def fire(self) -> None:
        """Run the callback (the driver calls this once, after `set_*`) and drop it.

        Dropped, as an `asyncio.Future` drops its callbacks: the engine's callback closes
        over the commit whose waiter holds this completion, a reference cycle. Kept, it made
        every commit's objects (transaction, entry, waiter: ~34 per one-row commit) garbage
        only the cyclic collector frees: 3x the generation-0 collections and full
        collections of 40-70 ms inside the 64-writer run, its p99 (issue 21, branch commit2).
        """
        assert self._done
        on_done = self.on_done
        assert on_done is not None, "a Completion fired twice"
        self.on_done = None
        try:
            on_done(self)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            asyncio.get_running_loop().call_exception_handler(
                {"message": "exception in a WAL completion callback", "exception": exc}
            )


Ticket: TypeAlias = asyncio.Future[int] | Completion
"""What the driver completes for an entry: a future (`submit`, `append`) or a `Completion`."""


def fire_all(completions: list[Completion]) -> None:
    """Fire completions marked done, in order (see the module docstring)."""
    for completion in completions:
        completion.fire()
