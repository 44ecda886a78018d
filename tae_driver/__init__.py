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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tae_driver.backend import LogBackend, Record, RecordKind
    from tae_driver.driver import Driver, DriverConfig, ReplaySummary, open_driver
    from tae_driver.replay import ReplayDecision, ReplayMode

_HOMES = {
    "LogBackend": "tae_driver.backend",
    "Record": "tae_driver.backend",
    "RecordKind": "tae_driver.backend",
    "Driver": "tae_driver.driver",
    "DriverConfig": "tae_driver.driver",
    "ReplaySummary": "tae_driver.driver",
    "open_driver": "tae_driver.driver",
    "ReplayDecision": "tae_driver.replay",
    "ReplayMode": "tae_driver.replay",
}
"""Each name above and the module it lives in, imported when first asked for (PEP 562):
`import tae_driver.limits` (engine/limits.py, every reader of the WAL) or `tae_driver.record`
then costs no asyncio and no driver (~45 ms of imports, issue 23: readers that never write,
such as spark_jobs' replay, pay for what they use)."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tae_driver' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


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
