"""Opening an engine's parts: its WAL backend and its object store.

Why a module of its own: these are the places where a name in `Engine.open`'s arguments
becomes a concrete thing (a file log, a logsvc shard with its lease, a directory of objects,
an S3 bucket); the engine's shell then only sees the ports (`LogBackend`, `BlockStore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator

from engine.blockstore import ObjectBlockStore
from engine.errors import (
    BadInput,
    EngineError,
    EngineLocked,
    Fenced,
    NotAnEngine,
    NotFound,
    OpenFailed,
)
from engine.layout import OBJECTS_DIR_NAME, WAL_DIR_NAME
from engine.objects.store import LocalDirStore, MemoryObjectStore, ObjectStore
from tae_driver import LogBackend
from tae_driver import errors as driver_errors

WAL_QUARANTINE_PREFIX = "quarantine"
"""What the file backend may set aside in `wal/` (damaged segments kept for a repair)."""
NAMES_SHOWN_MAX = 5


def uses_directory(wal: object, objects: object) -> bool:
    """Whether `Engine.open(path, wal, objects=...)` keeps anything in `path`: a file WAL
    in `path/wal`, or objects in `path/objects` (the default for the file and logsvc WALs)."""
    if objects is None:
        objects = "dir" if wal in ("file", "logsvc") else "memory"
    return wal == "file" or objects == "dir"


def check_engine_dir(path: str, wal: object, *, create: bool) -> None:
    """Refuse a `path` that is not an engine's before anything is made in it (issue 20:
    `Engine.open("/etc")` created `/etc/wal`). An engine's directory is one holding `wal/` or
    `objects/` (every version wrote one of them at its first open); anything else may be
    in it too (a TN's config, logs). A missing or empty directory becomes an engine unless
    `create` is false. In `wal/` a file WAL has only its segments (and `*.tmp` ones being
    created), its `LOCK` and `quarantine*` entries: anything else is not an engine's WAL.
    Reads directory listings only."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise NotAnEngine(path, "it is a file, not a directory")
    entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if not any(name in (WAL_DIR_NAME, OBJECTS_DIR_NAME) for name in entries):
        if not create:
            raise NotFound(
                f"no engine here: {path} holds no {WAL_DIR_NAME}/ or {OBJECTS_DIR_NAME}/"
            )
        if entries:
            raise NotAnEngine(path, f"it holds {_names(entries)} and no {WAL_DIR_NAME}/")
        return
    for name in (WAL_DIR_NAME, OBJECTS_DIR_NAME):
        part = os.path.join(path, name)
        if os.path.lexists(part) and not os.path.isdir(part):
            raise NotAnEngine(path, f"{name} is a file, not a directory")
    wal_dir = os.path.join(path, WAL_DIR_NAME)
    if wal == "file" and os.path.isdir(wal_dir):
        from tae_driver.backends.file import LOCK_FILE_NAME
        from tae_driver.backends.segment import parse_segment_file_name

        junk = [
            name
            for name in sorted(os.listdir(wal_dir))
            if name != LOCK_FILE_NAME
            and not name.startswith(WAL_QUARANTINE_PREFIX)
            and parse_segment_file_name(name.removesuffix(".tmp")) is None
        ]
        if junk:
            raise NotAnEngine(path, f"{WAL_DIR_NAME}/ holds {_names(junk)}, not WAL segments")


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN_MAX])
    more = len(names) - NAMES_SHOWN_MAX
    return shown + (f" and {more} more" if more > 0 else "")


def open_block_store(
    path: str,
    objects: str | ObjectStore | None,
    wal: str | LogBackend,
    read_only: bool,
    cache_bytes: int,
) -> ObjectBlockStore | None:
    """The engine's object store (Engine.open's `objects`), or None for "none"."""
    if objects is None:
        objects = "dir" if wal in ("file", "logsvc") else "memory"
    if isinstance(objects, str):
        if objects == "none":
            return None
        if objects == "memory":
            store: ObjectStore = MemoryObjectStore()
        elif objects == "dir":
            root = os.path.join(path, OBJECTS_DIR_NAME)
            if read_only and not os.path.isdir(root):
                store = MemoryObjectStore()  # an engine of part 1, or one never flushed
            else:
                store = LocalDirStore(root, read_only=read_only)
        else:
            raise BadInput(
                f"objects must be 'dir', 'memory', 'none' or an object store, not {objects!r}"
            )
    else:
        store = objects
        # A store in a bucket (S3ObjectStore) may name one that does not exist: a typo, a
        # bucket deleted. Say so now: otherwise the restore finds no checkpoint and the WAL's
        # gap check reports a hole in a truncated WAL, or the first flush fails much later.
        check_bucket = getattr(store, "check_bucket", None)
        if check_bucket is not None:
            check_bucket()
    return ObjectBlockStore(store, cache_bytes)


async def open_backend(
    path: str,
    wal: str | LogBackend,
    client_config: str | None,
    shard: int | None,
    read_only: bool,
    holder: str | None,
    *,
    standby: bool = False,
) -> tuple[LogBackend, bool]:
    """The WAL backend and whether the engine owns it. A read-only file WAL is opened
    without its lock and changes nothing (a tool may look beside the running engine, issue
    20); a standby's keeps the lock, since `promote()` makes it the writer."""
    if not isinstance(wal, str):
        return wal, False
    if wal == "file":
        from tae_driver.backends.file import FileBackend
        from tae_driver.errors import StorageCorruption

        wal_dir = os.path.join(path, WAL_DIR_NAME)
        try:
            return await FileBackend.open(wal_dir, read_only=read_only and not standby), True
        except StorageCorruption as exc:
            # Refused and unchanged (ARCHITECTURE.md §11): say which DSNs and how to repair.
            from engine import repair

            raise await asyncio.to_thread(repair.wal_corruption, wal_dir, exc) from exc
    if wal == "memory":
        from tae_driver.backends.memory import MemoryBackend

        return MemoryBackend(), True
    if wal == "logsvc":
        from logsvc.config import load_client_config
        from tae_driver.backends.logsvc import LogsvcBackend

        if client_config is None or shard is None:
            raise BadInput("wal='logsvc' needs client_config (a client.toml path) and shard")
        from logsvc.config_files import ConfigError

        try:
            config = load_client_config(client_config)
        except ConfigError as exc:
            raise BadInput(f"client_config {client_config}: {exc}") from exc
        return (
            await LogsvcBackend.open(
                config.addresses,
                config.token,
                shard,
                lease=not read_only,
                holder=holder or f"engine@{socket.gethostname()}:{os.getpid()}",
            ),
            True,
        )
    raise BadInput(f"wal must be 'file', 'logsvc', 'memory' or a LogBackend, not {wal!r}")


def typed_open_error(path: str, exc: BaseException) -> EngineError | None:
    """What `Engine.open` raises for `exc`, or None to raise it as it is: only `EngineError`s
    leave it (issue 20: a second process got tae_driver's `BackendFailed`, which `except
    EngineError` missed). The driver's, its backends' and the file system's errors become
    `OpenFailed` (the lock: `EngineLocked`; a refused lease: `Fenced`); the caller keeps
    `exc` as the cause."""
    if isinstance(exc, driver_errors.BackendLocked):
        return EngineLocked(path, exc.holder_pid)
    if isinstance(exc, driver_errors.BackendFenced):  # the log's lease went to a newer writer
        return Fenced(f"fenced at open: a newer engine holds the WAL's lease ({exc})")
    if isinstance(exc, (driver_errors.DriverError, OSError)):
        return OpenFailed(f"engine {path} could not be opened: {exc}")
    return None


@contextlib.contextmanager
def typed_open_errors(path: str) -> Iterator[None]:
    """`typed_open_error` around a block."""
    try:
        yield
    except BaseException as exc:
        typed = typed_open_error(path, exc)
        if typed is None:
            raise
        raise typed from exc
