"""Command-line output whose reader went away (`... | head`): one rule for every CLI entry
point of the project (logsvc's and the engine's)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


def quiet_on_broken_pipe(run: Callable[[], int]) -> int:
    """`run()`, then flush stdout; a reader that went away ends the command quietly instead
    of with a BrokenPipeError traceback (issue 20). Python's own recipe (docs of the signal
    module, "Note on SIGPIPE"): point stdout at /dev/null so the flush at exit fails no more,
    and exit 1."""
    try:
        code = run()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return code
