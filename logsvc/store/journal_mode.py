"""`JournalMode`: a shard store's side of the node journal (journal.py, decision 0011):
durability waits on the journal's fdatasync, the journal's callbacks, and the checkpoint
that makes the segment files and `meta` hold what was journaled."""

from __future__ import annotations

from logsvc.store.errors import (
    JournalSyncTimeout,
    StoreClosed,
    StoreError,
    StoreFailed,
    SyncTimeout,
)
from logsvc.store.meta import save_meta
from logsvc.store.segment_writer import SegmentWriter


class JournalMode(SegmentWriter):
    """The store as a client of the node journal (see the module docstring)."""

    def checkpoint(self) -> None:
        """Journal mode: make everything this store journaled durable in its own files
        (segments fdatasynced, `meta` saved), then tell the journal, which may then delete
        the journal files that held it (decision 0011). Called by the journal's checkpointer."""
        try:
            self._checkpoint_now()
        except StoreClosed:
            return  # closed meanwhile: close() checkpointed

    def _checkpoint_now(self) -> None:
        link = self._link
        assert link is not None, "checkpoint() is for a store opened with a journal"
        with self._io_lock:
            if self._closed:
                raise StoreClosed()
            with self._meta_lock:
                # Read under _meta_lock, whose holders submit votes, and before the buffer
                # is taken: every operation counted here is in what is written below.
                op_seq = link.current_op_seq()
                meta = self._meta
                self._write_out_locked(sync=True)
                if meta != self._meta_saved:
                    try:
                        save_meta(self._fs, self._dir, meta)
                    except StoreError as exc:
                        raise self._fail(exc) from exc
                    self._meta_saved = meta
            self._delete_obsolete_locked()
        link.checkpointed(op_seq)

    def _wait_journal(self, index: int, waited_ms_max: int) -> None:
        link = self._link
        assert link is not None
        with self._mu:
            if self._durable_index >= index or self._failed is not None or self._closed:
                return  # the caller's loop reports it
            if index > self._last_index:
                return
            position = next((p for p, last in self._journal_marks if last >= index), None)
        assert position is not None, f"entry {index} is neither durable nor journaled"
        try:
            link.sync_upto(position, waited_ms_max)
        except JournalSyncTimeout:
            raise SyncTimeout(index, waited_ms_max) from None
        except StoreFailed:
            pass  # _journal_failed failed this store too; the caller's loop raises it
        except StoreError as exc:
            raise self._fail(exc) from exc

    def _journal_durable(self, position: int) -> None:
        """The journal's fdatasync covering `position` returned (any thread)."""
        with self._mu:
            marks = self._journal_marks
            durable = self._durable_index
            while marks and marks[0][0] <= position:
                durable = max(durable, marks.popleft()[1])
            if durable == self._durable_index:
                return
            self._durable_index = durable
            self._waiters.release_upto(durable)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(durable, None)

    def _journal_failed(self, error: StoreError) -> None:
        self._fail(error)
