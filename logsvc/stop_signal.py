"""SIGTERM as an exception, for the commands that start processes of their own.

`logsvc demo` and the benchmarks start nodes, TNs and peer servers each in a session of its
own (so that a signal reaches that process alone) and stop them by PID in a `finally`. Without
a handler SIGTERM (`timeout`, a service manager, `kill`) ends the command at once, skipping
that `finally`, and everything it started runs on. `stop_on_sigterm()` turns SIGTERM into
`Stopped`, a `SystemExit` whose status is 128 + the signal's (143), as a shell reports a
process ended by it: the `finally` blocks run and the command exits 143.

Where the exception would lose track of a process (raised inside `subprocess.Popen` after
the fork, before the caller has the PID), `deferred()` holds it until the block's end.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_deferring = 0  # nesting depth of `deferred()` blocks (main thread only: signal handlers)
_pending: int | None = None  # a SIGTERM that arrived inside one


class Stopped(SystemExit):
    """SIGTERM arrived: the command stops what it started, by PID, on its way out."""


def _raise_stopped(signum: int, _frame: object) -> None:
    global _pending
    # Once: a second SIGTERM must not cut the (bounded) stop that the first one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _deferring:
        _pending = signum
        return
    raise Stopped(128 + signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block that a SIGTERM does not interrupt: `Stopped` is raised when it ends (when
    the outermost such block ends), e.g. once a spawned process's PID is recorded where
    the stop will find it."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _pending is not None:
            # Also when the block raised: the stop was asked for, and the block's own
            # exception stays attached (`__context__`) for whoever reports it.
            signum, _pending = _pending, None
            raise Stopped(128 + signum)


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises `Stopped` in the main thread."""
    signal.signal(signal.SIGTERM, _raise_stopped)


def ignore_sigterm() -> None:
    """Before a stop that must run to its end (the normal way out, too)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
