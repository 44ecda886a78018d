"""Crash points for in-process crash tests of the engine's storage: an object store that kills
the "process" at a chosen call, and a WAL whose truncation a test can hold.

Why a wrapper and not a mock: `CrashingStore` stands in front of a real store
(`MemoryObjectStore`, or `LocalDirStore` over FaultFS) and changes nothing about what a call
does; it only decides *when the process dies*: at the `nth` call of `op` on a name that
`matches`, either before the call has any effect (`landed=False`: a put cut before the store
committed it, a delete that never happened) or after it took effect but before the caller
learns it (`landed=True`: the object is there, the engine never heard). The calling thread
then blocks, the test sees `crashed`, aborts the engine (`Engine.abort`, the in-process
SIGKILL) and calls `kill()`: from then on every call through this wrapper raises
`ProcessKilled`, including the blocked one, so a dead engine's worker threads do nothing
after the crash point, as a killed process would not. The restarted engine opens on the
inner store directly (or on a new wrapper).

`HeldTruncation` is tae_driver's `MemoryBackend` whose `truncate` waits until the test opens
the gate: a crash can then come after a checkpoint's CKP entry is durable and before the WAL
was truncated, or after it was, deterministically.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import pyarrow as pa

from engine.objects.store import ObjectInfo, ObjectStore
from tae_driver.backends.memory import MemoryBackend

T = TypeVar("T")

CRASH_WAIT_S_MAX = 10.0
"""How long a test waits for its crash point to be reached before failing."""

Op = Literal["put", "delete"]


class ProcessKilled(Exception):
    """A call made by (a thread of) an engine that was killed at a crash point."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    op: Op
    matches: Callable[[str], bool]
    nth: int = 1
    """The nth matching call dies (1: the first)."""
    landed: bool = False
    """True: the call's effect happens, then the process dies before it returns."""
    label: str = ""


def prefix(start: str) -> Callable[[str], bool]:
    return lambda name: name.startswith(start)


def contains(part: str) -> Callable[[str], bool]:
    return lambda name: part in name


class CrashingStore:
    """An `ObjectStore` over `inner` that dies at `point` (module docstring)."""

    def __init__(self, inner: ObjectStore, point: CrashPoint | None = None) -> None:
        self.inner = inner
        self.description = inner.description
        self._point = point
        self._seen = 0
        self._lock = threading.Lock()
        self._dead = False
        self._released = threading.Event()
        self.crashed = threading.Event()
        """Set when the crash point is reached (the calling thread is blocked in it)."""
        self.crashed_on = ""
        """The name the fatal call was about."""

    def arm(self, point: CrashPoint) -> None:
        with self._lock:
            self._point = point
            self._seen = 0

    async def wait_crashed(self, timeout_s: float = CRASH_WAIT_S_MAX) -> None:
        """Return once the crash point was reached; AssertionError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self.crashed.is_set():
            assert time.monotonic() < deadline, f"crash point {self._point} never reached"
            await asyncio.sleep(0.001)

    def kill(self) -> None:
        """The process is dead: the blocked call and every later one raise ProcessKilled."""
        with self._lock:
            self._dead = True
        self._released.set()

    # --- ObjectStore --------------------------------------------------------------------------

    def put(self, name: str, data: bytes) -> None:
        self._call("put", name, lambda: self.inner.put(name, data))

    def delete(self, name: str) -> None:
        self._call("delete", name, lambda: self.inner.delete(name))

    def get(self, name: str) -> bytes:
        return self._read(lambda: self.inner.get(name))

    def get_range(self, name: str, offset: int, length: int) -> bytes:
        return self._read(lambda: self.inner.get_range(name, offset, length))

    def open_input(self, name: str) -> pa.NativeFile:
        return self._read(lambda: self.inner.open_input(name))

    def size(self, name: str) -> int:
        return self._read(lambda: self.inner.size(name))

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self._read(lambda: self.inner.list(prefix))

    # --- Private --------------------------------------------------------------------------------

    def _read(self, call: Callable[[], T]) -> T:
        with self._lock:
            if self._dead:
                raise ProcessKilled("read by a killed engine")
        return call()

    def _call(self, op: Op, name: str, call: Callable[[], None]) -> None:
        with self._lock:
            if self._dead:
                raise ProcessKilled(f"{op} {name} by a killed engine")
            point = self._point
            fatal = False
            if point is not None and point.op == op and point.matches(name):
                self._seen += 1
                fatal = self._seen == point.nth
        if not fatal:
            call()
            return
        assert point is not None
        if point.landed:
            call()
        self.crashed_on = name
        self.crashed.set()
        self._released.wait(CRASH_WAIT_S_MAX * 3)
        raise ProcessKilled(f"killed at {op} {name} ({'landed' if point.landed else 'cut'})")


class HeldTruncation(MemoryBackend):
    """A `MemoryBackend` whose truncations wait for `gate` while it is closed (`hold()`)."""

    def __init__(self) -> None:
        super().__init__()
        self._gate: asyncio.Event | None = None
        self.truncation_waiting = False

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def let_go(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    async def truncate(self, lsn: int) -> None:
        gate = self._gate
        if gate is not None:
            self.truncation_waiting = True
            try:
                await gate.wait()
            finally:
                self.truncation_waiting = False
        await super().truncate(lsn)
