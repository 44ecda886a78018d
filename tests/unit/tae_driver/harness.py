"""Shared test tools: backend harnesses (open / reopen for each kind) and replay handles.

A harness gives the conformance suite and the driver tests one way to open a backend and to
"restart" it: the memory backend survives a restart as the same object (it is the log), the
file backend is closed and opened again from its directory, the logsvc backend reconnects to
its shard (taking the lease at a new epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tae_driver import ReplayDecision
from tae_driver.backend import LogBackend
from tae_driver.backends.file import FileBackend
from tae_driver.backends.logsvc import LogsvcBackend
from tae_driver.backends.memory import MemoryBackend

BACKEND_KINDS = ["memory", "file"]
"""The kinds the unit suite runs the conformance suite against: no processes needed."""

ALL_BACKEND_KINDS = [*BACKEND_KINDS, "logsvc"]
""""logsvc" needs a running cluster: tests/e2e/test_tae_driver_logsvc.py runs the same
conformance tests against one (a `LogsvcTarget` per test, a fresh shard each)."""


@dataclass(frozen=True)
class LogsvcTarget:
    addresses: tuple[str, ...]
    token: str
    shard: int


@dataclass
class BackendHarness:
    kind: str
    dir_path: Path
    segment_bytes_max: int = 4096
    logsvc: LogsvcTarget | None = None
    persists: bool = field(init=False)

    def __post_init__(self) -> None:
        assert self.kind in ALL_BACKEND_KINDS
        assert (self.kind == "logsvc") == (self.logsvc is not None)
        self.persists = self.kind != "memory"

    async def open(self) -> LogBackend:
        if self.kind == "memory":
            return MemoryBackend()
        if self.logsvc is not None:
            target = self.logsvc
            return await LogsvcBackend.open(target.addresses, target.token, target.shard)
        return await FileBackend.open(str(self.dir_path), segment_bytes_max=self.segment_bytes_max)

    async def reopen(self, backend: LogBackend) -> LogBackend:
        """The same log after a clean restart of the process that owns it."""
        if self.kind == "memory":
            return backend
        await backend.close()
        return await self.open()


@dataclass
class Recorder:
    """A replay handle: TRUNCATED below `apply_from`, APPLY from it on; records every call and
    asserts that DSNs strictly increase (the contract every replay test relies on)."""

    apply_from: int = 1
    handled: list[int] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)
    entries: dict[int, bytes] = field(default_factory=dict)
    on_dsn: Callable[[int], None] | None = None

    def __call__(self, dsn: int, entry: bytes) -> ReplayDecision:
        assert not self.handled or dsn > self.handled[-1], (self.handled[-1:], dsn)
        self.handled.append(dsn)
        self.entries[dsn] = entry
        if self.on_dsn is not None:
            self.on_dsn(dsn)
        if dsn < self.apply_from:
            return ReplayDecision.TRUNCATED
        self.applied.append(dsn)
        return ReplayDecision.APPLY


def apply_all(dsn: int, entry: bytes) -> ReplayDecision:
    return ReplayDecision.APPLY
