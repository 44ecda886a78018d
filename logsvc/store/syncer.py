"""`Syncer`: who runs a shard store's syncs: the syncer thread, driven by the group-commit
policy (`group_commit.py`), or the caller's thread with `background_sync=False`."""

from __future__ import annotations

import threading

from logsvc.store.errors import StoreError
from logsvc.store.group_commit import SyncNow, WaitUntil
from logsvc.store.segment_writer import SegmentWriter


class Syncer(SegmentWriter):
    """The syncer thread and its inline twin (see the module docstring)."""

    def _sync_inline(self) -> int:
        """The syncer's work, on the caller's thread (`background_sync=False`): write out
        and sync everything appended so far, delete segments below the log start; return
        the durable index. Nothing to do is not an error, as with the syncer."""
        with self._io_lock:
            with self._mu:
                if self._durable_index >= self._last_index and not self._obsolete:
                    return self._durable_index
                self._check_writable()
            self._write_out_locked(sync=True)
            self._delete_obsolete_locked()
            with self._mu:
                return self._durable_index

    def _start_syncer(self) -> None:
        self._syncer = threading.Thread(
            target=self._run_syncer, name=f"store-syncer:{self._dir}", daemon=True
        )
        self._syncer.start()

    def _run_syncer(self) -> None:
        while True:
            with self._mu:
                while True:
                    if self._closing or self._failed is not None:
                        return
                    action = self._policy.next_action(self._clock_ms())
                    if isinstance(action, SyncNow) or self._obsolete:
                        break
                    timeout_s = (
                        max(0.0, (action.deadline_ms - self._clock_ms()) / 1000.0)
                        if isinstance(action, WaitUntil)
                        else None
                    )
                    self._syncer_cv.wait(timeout_s)
            try:
                with self._io_lock:
                    if isinstance(action, SyncNow):
                        self._write_out_locked(sync=True)
                    self._delete_obsolete_locked()
            except StoreError:
                return  # the store is failed; waiters were told
