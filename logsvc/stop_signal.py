"""SIGTERM as an exception, for the commands that start processes of their own.

`logsvc demo` and the benchmarks start nodes, TNs and peer servers each in a session of its
own (so that a signal reaches that process alone) and stop them by PID in a `finally`. Without
a handler SIGTERM (`timeout`, a service manager, `kill`) ends the command at once, skipping
that `finally`, and everything it started runs on. `stop_on_sigterm()` turns SIGTERM into
`Stopped`, a `SystemExit` whose status is 128 + the signal's (143), as a shell reports a
process ended by it: the `finally` blocks run and the command exits 143.
"""

from __future__ import annotations

import signal


class Stopped(SystemExit):
    """SIGTERM arrived: the command stops what it started, by PID, on its way out."""


def _raise_stopped(signum: int, _frame: object) -> None:
    # Once: a second SIGTERM must not cut the (bounded) stop that the first one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped(128 + signum)


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises `Stopped` in the main thread."""
    signal.signal(signal.SIGTERM, _raise_stopped)


def ignore_sigterm() -> None:
    """Before a stop that must run to its end (the normal way out, too)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
