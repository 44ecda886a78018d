"""The ports between a shard store and the node journal (docs/decisions/0011), in a module
that imports neither: the journal opens stores (journal_recovery.py replays into them), so
the store names what it needs of the journal here as Protocols, and `journal.NodeJournal`
and `journal.JournalLink` fit them structurally. The store's modules never import journal.py
(tests/unit/test_import_cycles.py: no import cycle, type-only imports included).

* `NodeJournalPort`: what `ShardStore.open(..., journal=)` does with the journal: attach,
  replay what an abandoned attachment of the same directory journaled, forget it.
* `JournalLinkPort`: one store's handle, through which its appends, votes and truncations
  are journaled and made durable, and its checkpoints reported.
* `JournalClient`: what the journal calls back on a store (`ShardStore` implements it).
* `ReplayTarget`: what a replay of journaled operations needs of a store
  (`journal_recovery.replay_into`; `ShardStore` has it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from logsvc.store.errors import StoreError
from logsvc.store.journal_replay import StoreOp
from logsvc.store.records import Entry


class JournalClient(Protocol):
    """What the journal calls back on a store (ShardStore implements it)."""

    def _journal_durable(self, position: int) -> None: ...

    def _journal_failed(self, error: StoreError) -> None: ...

    def checkpoint(self) -> None: ...


class ReplayTarget(Protocol):
    """A store's state and the operations a replay applies to it (ShardStore has them)."""

    @property
    def first_index(self) -> int: ...

    @property
    def last_index(self) -> int: ...

    @property
    def term(self) -> int: ...

    @property
    def voted_for(self) -> str | None: ...

    def term_at(self, index: int) -> int: ...

    def truncate_suffix(self, index: int) -> None: ...

    def append(self, entries: Sequence[Entry]) -> int: ...

    def save_vote(self, term: int, voted_for: str | None) -> None: ...

    def sync(self, timeout_ms: int | None = None) -> int: ...


class JournalLinkPort(Protocol):
    """One store's handle on the node journal (journal.JournalLink); thread-safe."""

    def submit_entries(self, entries: list[Entry]) -> int:
        """Journal an append; return the journal position that makes it durable."""
        ...

    def submit_vote(self, term: int, voted_for: str | None) -> int: ...

    def submit_truncate(self, index: int) -> int: ...

    def sync_upto(self, position: int, timeout_ms: int | None = None) -> None: ...

    def after_submit(self) -> None: ...

    def after_wait(self) -> None: ...

    def current_op_seq(self) -> int: ...

    def checkpointed(self, op_seq: int) -> None: ...

    def detach(self, *, checkpointed: bool) -> None: ...


class NodeJournalPort(Protocol):
    """What a store opened with `journal=` asks of the node journal (journal.NodeJournal)."""

    def attach(
        self, store_dir: str, client: JournalClient
    ) -> tuple[JournalLinkPort, list[StoreOp]]: ...

    def replay_into(self, store: ReplayTarget, ops: list[StoreOp], store_dir: str) -> None: ...

    def forget_abandoned(self, store_dir: str) -> None: ...
