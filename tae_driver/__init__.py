"""tae_driver: the TAE engine's write-ahead-log driver.

The engine appends entries and gets back dense DSNs, completed in DSN order, whatever order
the backend finishes records in; it truncates by DSN; on restart it replays a gap-free,
duplicate-free DSN sequence (reference/matrixone-wal.md §0-§2.5, issue 7). Backends:
`tae_driver.backends.memory.MemoryBackend`, `tae_driver.backends.file.FileBackend`,
`tae_driver.backends.logsvc.LogsvcBackend`.

    from tae_driver import open_driver, ReplayMode, ReplayDecision

    driver = open_driver(backend, window=64)
    await driver.replay(handle, mode=ReplayMode.FOR_WRITE)   # handle(dsn, entry) -> decision
    dsn = await driver.append(b"entry")
    driver.truncate(dsn)
    await driver.close()

Modules: `pipeline` (group commit, window, in-order completion), `window` (the blog rule),
`truncation` (DSN intent -> backend LSN), `replay` (records -> DSN order), `record` (the
codec, FORMAT.md), `driver` (the asyncio shell), `backend` (the `LogBackend` port),
`limits`, `errors`.
"""

from tae_driver.backend import LogBackend, Record, RecordKind
from tae_driver.driver import Driver, DriverConfig, ReplaySummary, open_driver
from tae_driver.replay import ReplayDecision, ReplayMode

__all__ = [
    "Driver",
    "DriverConfig",
    "LogBackend",
    "Record",
    "RecordKind",
    "ReplayDecision",
    "ReplayMode",
    "ReplaySummary",
    "open_driver",
]
