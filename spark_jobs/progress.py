"""A progress line for local-engine runs, on a terminal: how much of the input this process
has read so far, redrawn in place on stderr.

The core (`progress_line`) is pure: bytes read, input bytes, seconds in; a line out. The
shell (`LocalProgress`) is one daemon thread that samples this process's read bytes from
`/proc/self/io` (`rchar`: bytes returned by read() calls, page cache hits included) every
`PROGRESS_INTERVAL_S` and draws the line. Why the process's read counter and not a hook in
the readers: it measures what was actually read, needs nothing from the jobs' code, and
costs one small /proc read per redraw. A job may read its input more than once (replay
reads the record level for its plan, then the commands): the line says which pass the
count is in rather than pretend to know the job's plan. Where /proc/self/io does not exist
(not Linux) the line shows the time only. Spark runs show Spark's own console progress bar
instead (session.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from spark_jobs.engines import human_bytes
from spark_jobs.limits import PROGRESS_INTERVAL_S, PROGRESS_STOP_S_MAX

BAR_WIDTH = 24
PROC_IO = "/proc/self/io"


def progress_line(read_bytes: int | None, input_bytes: int, elapsed_s: float) -> str:
    """`read_bytes`: bytes read since the job started (None: unknown)."""
    assert input_bytes >= 0 and elapsed_s >= 0
    if read_bytes is None or input_bytes == 0:
        return f"local: {elapsed_s:.0f} s"
    passes, within = divmod(read_bytes, input_bytes)
    filled = within * BAR_WIDTH // input_bytes
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    pass_text = f" (pass {passes + 1})" if passes else ""
    return (
        f"local: [{bar}] {100 * within // input_bytes:3d}%{pass_text} of "
        f"{human_bytes(input_bytes)} read, {elapsed_s:.0f} s"
    )


def read_bytes_so_far() -> int | None:
    try:
        with open(PROC_IO) as file:
            for line in file:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class LocalProgress:
    """Use as a context manager around a local run. Draws nothing unless `stream` is a
    terminal; clears its line at the end."""

    def __init__(self, input_bytes: int, stream: TextIO | None = None) -> None:
        self._input_bytes = input_bytes
        self._stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_read: int | None = None
        self._started = 0.0

    def __enter__(self) -> LocalProgress:
        if not is_terminal(self._stream):
            return self
        self._start_read = read_bytes_so_far()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="spark_jobs-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(PROGRESS_STOP_S_MAX)
        self._stream.write("\r\033[K")
        self._stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            now = read_bytes_so_far()
            read = None if now is None or self._start_read is None else now - self._start_read
            line = progress_line(read, self._input_bytes, time.monotonic() - self._started)
            self._stream.write("\r\033[K" + line)
            self._stream.flush()


def is_terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM") != "dumb"
