"""Move a log's damaged suffix aside, durably and without deleting a byte: the one action of
an explicit repair (ARCHITECTURE.md §11: "refuse, name it, change nothing, repair only on
request").

Used by `logsvc doctor --repair --yes` (a shard store's journal) and by tae_driver's
`backends/repair.py` (the engine's file WAL, `python -m engine repair --yes`). Each decides
*what* to move with its own format's rules; this module only moves it. The log's own open
never reads the quarantine directory (it reads only its segment file names at the top
level).

Steps, each durable before the next, so a crash at any point loses nothing and leaves the
damage in place until the last step (the open still refuses; the repair can run again):

1. create `<dir>/quarantine-<UTC time>-<label>/` and fsync `<dir>`;
2. write `REPAIR.txt` (what was found, what is moved) and a copy of the damaged file's
   bytes from the cut offset to its end, fsync each and the quarantine directory;
3. rename every later file into it, fsync both directories;
4. cut the damaged file at the offset (ftruncate, fsync).
"""

from __future__ import annotations

import os
import time

QUARANTINE_PREFIX = "quarantine-"
REPORT_FILE_NAME = "REPAIR.txt"


def is_quarantine_name(name: str) -> bool:
    return name.startswith(QUARANTINE_PREFIX)


def move_aside(
    dir_path: str,
    *,
    label: str,
    report: str,
    cut_path: str | None,
    cut_offset_bytes: int,
    moved_paths: tuple[str, ...],
    now_s: float | None = None,
) -> str:
    """Carry out the steps above in `dir_path`; return the quarantine directory. The caller
    holds the log's lock. `cut_path` None: nothing is cut, only `moved_paths` move."""
    for path in moved_paths:
        assert os.path.dirname(path) == dir_path
    assert cut_path is None or os.path.dirname(cut_path) == dir_path
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now_s is None else now_s))
    target = os.path.join(dir_path, f"{QUARANTINE_PREFIX}{stamp}-{label}")
    os.mkdir(target)  # fails if it exists: two repairs never share a directory
    fsync_dir(dir_path)
    _write_durably(os.path.join(target, REPORT_FILE_NAME), report.encode())
    if cut_path is not None:
        with open(cut_path, "rb") as handle:
            handle.seek(cut_offset_bytes)
            suffix = handle.read()
        name = f"{os.path.basename(cut_path)}.from-{cut_offset_bytes}"
        _write_durably(os.path.join(target, name), suffix)
    fsync_dir(target)
    for path in moved_paths:
        os.rename(path, os.path.join(target, os.path.basename(path)))
    fsync_dir(target)
    fsync_dir(dir_path)
    if cut_path is not None:
        fd = os.open(cut_path, os.O_WRONLY)
        try:
            os.ftruncate(fd, cut_offset_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
    return target


def _write_durably(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(dir_path: str) -> None:
    fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
