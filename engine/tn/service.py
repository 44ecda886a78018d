"""What a TN does for each request, over its `Engine` (no sockets: the server in
engine/tn/server.py decodes, calls these, encodes).

Roles (decision 0007): an engine opened with `standby=True` is a standby: it serves status,
logtail, subscriptions and checkpoint listings as it tails the WAL, and refuses commits with
`NotActive` until it is promoted (by the watch in the daemon, or an operator's `Promote`);
then it is active. A standby whose tail of the WAL is failing says `failed` (decision 0008):
it retries, and until its tail works again it must not be taken for a standby that could
take over. `status()` says which, and the visible and checkpoint timestamps, as the
engine has them at that moment.

A commit that fails because the WAL failed (`WalFailed`; `Fenced` when a newer TN took the
lease), and a promotion that fails, are reported to `on_fatal`: the daemon then stops
serving and exits, since this engine will never acknowledge another commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from engine.cn.port import TNStatus
from engine.engine import Engine
from engine.errors import WalFailed
from engine.logtail import TailEntry
from engine.tn import limits
from engine.tn.errors import NotActive
from engine.tn.messages import LogtailPage, Promoted
from engine.writeset import WriteSet

log = logging.getLogger("engine.tn")


class TNService:
    def __init__(
        self,
        engine: Engine,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        page_bytes_max: int = limits.LOGTAIL_PAGE_BYTES_MAX,
        page_entries_max: int = limits.LOGTAIL_PAGE_ENTRIES_MAX,
    ) -> None:
        assert limits.ENTRY_BYTES_MAX <= page_bytes_max <= limits.LOGTAIL_PAGE_BYTES_MAX
        assert 1 <= page_entries_max <= limits.LOGTAIL_PAGE_ENTRIES_MAX
        self.engine = engine
        self._on_fatal = on_fatal
        self._page_bytes_max = page_bytes_max
        self._page_entries_max = page_entries_max
        self._promotion = asyncio.Lock()
        self._promoting = False

    @property
    def role(self) -> str:
        """ "active", "standby", or "failed": a standby whose tail of the WAL is failing
        (it retries, or gave up) and so could not take over now (issue 25)."""
        engine = self.engine
        if engine.standby and engine.standby_failure is not None:
            return "failed"
        return "standby" if engine.standby or self._promoting else "active"

    def status(self) -> TNStatus:
        engine = self.engine
        checkpointer = engine.checkpointer
        newest = checkpointer.newest if checkpointer is not None else None
        return TNStatus(engine.visible_ts, newest.ckp_ts if newest is not None else 0, self.role)

    def logtail_page(self, t0: int, t1: int) -> LogtailPage:
        """`Engine.logtail(t0, t1)`, cut to one page: at most `page_entries_max` entries
        and `page_bytes_max` of payload (the first entry always), `more` when cut."""
        tail = self.engine.logtail(t0, t1)
        entries = tail.entries
        size = 0
        count = 0
        for entry in entries:
            if count == self._page_entries_max or (
                count and size + len(entry.payload) > self._page_bytes_max
            ):
                break
            size += len(entry.payload)
            count += 1
        if count == len(entries):
            return LogtailPage(tail, more=False)
        kept = entries[:count]
        cut = type(tail)(tail.checkpoint, tail.checkpoint_ts, kept, kept[-1].commit_ts)
        return LogtailPage(cut, more=True)

    async def commit(self, write_set: WriteSet) -> int:
        if self.role != "active":
            raise NotActive("this TN is a standby: send commits to the active TN")
        try:
            return await self.engine.execute(write_set)
        except WalFailed as exc:
            # This engine will never acknowledge another commit (a Fenced one carries the
            # backend's BackendFenced as its cause: who fenced it).
            if self._on_fatal is not None:
                self._on_fatal(exc)
            raise

    def checkpoints(self) -> tuple[tuple[int, str], ...]:
        checkpointer = self.engine.checkpointer
        if checkpointer is None:
            return ()
        retained = [(m.ckp_ts, m.name) for m in checkpointer.retained]
        return tuple(retained[-limits.CHECKPOINTS_MAX :])

    def subscribe(self, callback: Callable[[TailEntry], None]) -> tuple[int, Callable[[], None]]:
        """(from_ts, unsubscribe): `callback` hears every entry with commit_ts > from_ts.
        Synchronous, so no entry can become visible between reading from_ts and
        registering the callback."""
        from_ts = self.engine.visible_ts
        return from_ts, self.engine.subscribe(callback)

    async def promote(self) -> Promoted:
        """Make a standby the active TN (at most once; a second caller waits for the first
        and is told it was active already)."""
        async with self._promotion:
            if not self.engine.standby:
                return Promoted(self.engine.visible_ts, was_standby=False)
            self._promoting = True
            try:
                log.info(
                    "promoting: taking the WAL's lease (visible_ts %d)", self.engine.visible_ts
                )
                await self.engine.promote()
            except Exception as exc:
                if self._on_fatal is not None:
                    self._on_fatal(exc)
                raise
            finally:
                self._promoting = False
            log.info("promoted: serving commits (visible_ts %d)", self.engine.visible_ts)
            return Promoted(self.engine.visible_ts, was_standby=True)
