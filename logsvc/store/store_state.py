"""`StoreState`: the state of a shard store that every part of `ShardStore` shares (set by
`__init__`, typed there for each part), and the one way a store fails (`_fail`). The parts:
`segment_set.SegmentSet` -> `segment_writer.SegmentWriter` -> `truncation.Truncation`,
`syncer.Syncer`, `journal_mode.JournalMode`; `segment_reader.SegmentReader`; assembled,
with the public operations, in `store.ShardStore` (its docstring: promises, locks)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from logsvc.store.errors import StoreClosed, StoreError, StoreFailed
from logsvc.store.fs import DirLock, FileSystem
from logsvc.store.group_commit import GroupCommitPolicy
from logsvc.store.journal_port import JournalLinkPort
from logsvc.store.limits import StoreLimits
from logsvc.store.meta import Meta
from logsvc.store.records import Entry
from logsvc.store.recovery import RecoveryReport
from logsvc.store.segment import Segment
from logsvc.store.waiters import Waiters

log = logging.getLogger("logsvc.store")


class StoreState:
    """The state every part of the store shares (see the module docstring)."""

    def __init__(
        self,
        dir_path: str,
        fs: FileSystem,
        limits: StoreLimits,
        clock_ms: Callable[[], float],
        meta: Meta,
    ) -> None:
        self._dir = dir_path
        self._fs = fs
        self._limits = limits
        self._clock_ms = clock_ms
        self._io_lock = threading.Lock()
        self._meta_lock = threading.Lock()
        self._mu = threading.Lock()
        self._waiters = Waiters()
        self._listeners: list[Callable[[int, StoreFailed | None], None]] = []
        self._syncer_cv = threading.Condition(self._mu)
        self._meta = meta
        self._segments: list[Segment] = []
        self._obsolete: list[Segment] = []
        self._first_index = meta.first_index
        self._last_index = meta.first_index - 1
        self._written_index = self._last_index
        self._durable_index = self._last_index
        self._buffered_bytes = 0
        self._roll_requested = False
        self._cache: dict[int, Entry] = {}
        self._cache_lo = self._first_index
        self._cache_bytes = 0
        self._policy = GroupCommitPolicy(
            bytes_max=limits.group_commit_bytes_max,
            delay_ms_max=limits.group_commit_delay_ms_max,
        )
        self._suffix_generation = 0
        self._failed: StoreFailed | None = None
        self._closing = False
        self._closed = False
        self._syncer: threading.Thread | None = None
        self._background_sync = True  # False: syncs run inline in sync()/wait_durable()
        self._lock: DirLock | None = None
        self._dir_dirty = False  # a segment was created; the directory needs an fsync
        self._recovery = RecoveryReport()
        self._syncs = 0
        self._fdatasyncs = 0
        self._synced_bytes = 0
        self._sync_seconds_total = 0.0
        # Journal mode (docs/decisions/0011): the link, and (journal position, last index)
        # of each append not yet known durable, oldest first.
        self._link: JournalLinkPort | None = None
        self._journal_marks: deque[tuple[int, int]] = deque()
        self._journal_position_last = 0  # of this store's latest journaled operation
        self._segment_durable_index = self._last_index  # durable in the segment files
        self._meta_saved = meta  # what the `meta` file holds

    def _check_writable(self) -> None:
        if self._closed or self._closing:
            raise StoreClosed()
        if self._failed is not None:
            raise self._failed

    def _fail(self, error: StoreError) -> StoreError:
        with self._mu:
            first = self._failed is None
            if first:
                log.error("store %s failed: %s", self._dir, error)
                self._failed = StoreFailed(error)
            self._waiters.release_all()
            self._syncer_cv.notify_all()
            durable, failed, listeners = self._durable_index, self._failed, list(self._listeners)
        if first:
            for listener in listeners:
                listener(durable, failed)
        return error
