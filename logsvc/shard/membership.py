"""Which replicas make up a shard, as this replica's own log says: kept durable, exactly.

Raft (thesis §4.1) has a server use the latest configuration *in its log*, committed or
not. pysyncobj 0.3.17 does that while it runs (a change is applied when appended or
received, undone when truncated) but remembers none of it: a restarted SyncObj starts with
the peers its constructor got and re-applies membership entries only as it applies them,
each one again on top of whatever the constructor said. Two problems follow
(docs/decisions/0002-membership.md):

* a node restarted after a change starts with stale peers: it refuses connections from a
  member it does not know (pysyncobj drops unknown peers at the handshake), so it may never
  hear from the leader that would tell it about the change;
* re-applying an old entry toggles the current configuration (a `rem n3` from before `n3`
  was added back removes it again until the later `add` is re-applied; stock pysyncobj
  does this even while running, when a follower applies two changes of one node that it
  received together).

So the configuration is tracked here, from the log, and pysyncobj's is made to follow it:

* `MembershipLog` (pure) holds the last few configurations as `ConfigRecord(index, term,
  members, joining)`: the raft index and term of the membership entry that made it (0 for
  the base, the peers the replica was created with), and every member's Raft address.
  The journal feeds it each membership entry appended (`on_entry`), each suffix truncated
  (`on_truncate_suffix`), each compaction (`on_truncate_prefix`) and a snapshot install
  (`on_reset`); `members` is the latest configuration in the log.
* `ReplicaMembership` keeps a `MembershipLog` in the replica's `members` file
  (small_file.py: checksummed, replaced atomically and durably). The file is written
  *before* the entry reaches the journal, so it may run ahead of the durable log after a
  crash, never behind it; on open, `validated()` drops every record whose entry is not in
  the log (by index and term: Raft's Log Matching property makes that exact), which
  leaves exactly the latest configuration in the durable log.

A replica started to *join* a shard (`joining`) was given the members as the leader knew
them just before it proposed adding this replica; every membership entry older than that
`add` is already reflected in them. It therefore ignores membership entries until its own
`add` (or a snapshot naming it), and holds its elections until then (raft/node.py).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from logsvc.shard import small_file
from logsvc.store.fs import FileSystem

MAGIC: Final = b"LSVCMEMB"
VERSION: Final = 1
FILE_NAME: Final = "members"

# Configurations kept. Only the newest few can ever be dropped by validation (entries
# lost in one crash, or one truncated suffix of uncommitted entries; changes go one at a
# time, each waiting for its commit), so a short history is plenty; compaction prunes it
# further.
RECORDS_MAX: Final = 16
MEMBERS_MAX: Final = 16  # far above a shard's 3..6: anything larger is damage

ChangeKind = Literal["add", "rem"]


class MembershipLost(Exception):
    """No configuration in the members file is backed by this replica's log: it cannot
    tell who its peers are (damage, or a members file from another replica)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One pysyncobj membership entry: add or remove the replica at `address`."""

    kind: ChangeKind
    address: str


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    index: int  # raft index of the entry that made this configuration; 0: the base
    term: int  # that entry's term (0 for the base)
    members: tuple[str, ...]  # Raft addresses, sorted
    joining: bool  # started to join; its own `add` entry not logged yet

    def __post_init__(self) -> None:
        assert self.index >= 0
        assert self.term >= 0
        assert list(self.members) == sorted(set(self.members))
        assert len(self.members) <= MEMBERS_MAX


class MembershipLog:
    """The configurations of one replica's log, newest last. Pure; not thread-safe."""

    def __init__(self, self_address: str, records: Sequence[ConfigRecord]) -> None:
        assert records, "at least the base configuration"
        assert all(a.index < b.index for a, b in itertools.pairwise(records))
        self.self_address = self_address
        self._records = list(records)
        self.version = 0  # bumped on every change (the tick loop compares it)

    @classmethod
    def initial(
        cls, self_address: str, members: Iterable[str], joining: bool = False
    ) -> MembershipLog:
        """The base: a replica created with `members` (itself added if missing)."""
        base = ConfigRecord(0, 0, tuple(sorted({*members, self_address})), joining)
        return cls(self_address, [base])

    @property
    def records(self) -> tuple[ConfigRecord, ...]:
        return tuple(self._records)

    @property
    def latest(self) -> ConfigRecord:
        return self._records[-1]

    @property
    def members(self) -> tuple[str, ...]:
        return self.latest.members

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(m for m in self.latest.members if m != self.self_address)

    @property
    def joining(self) -> bool:
        return self.latest.joining

    @property
    def is_member(self) -> bool:
        return self.self_address in self.latest.members

    def members_at(self, index: int) -> tuple[str, ...]:
        """The configuration in effect at raft index `index` (after applying it)."""
        for record in reversed(self._records):
            if record.index <= index:
                return record.members
        return self._records[0].members  # older than every record kept: the oldest known

    # ------------------------------------------------------------------ the log's events

    def on_entry(self, index: int, term: int, change: Change) -> bool:
        """A membership entry logged at (index, term). True if the records changed."""
        latest = self.latest
        assert index > latest.index, f"membership entry {index} after {latest.index}"
        if latest.joining:
            if change != Change("add", self.self_address):
                return False  # already reflected in the members we joined with
            record = ConfigRecord(index, term, latest.members, joining=False)
        else:
            members = set(latest.members)
            if change.kind == "add":
                members.add(change.address)
            else:
                members.discard(change.address)
            record = ConfigRecord(index, term, tuple(sorted(members)), joining=False)
        self._records.append(record)
        if len(self._records) > RECORDS_MAX:
            del self._records[0]
        self.version += 1
        return True

    def on_truncate_suffix(self, from_index: int) -> bool:
        """Entries at and after `from_index` deleted (a conflict, Raft §5.3)."""
        kept = [r for r in self._records if r.index < from_index]
        if len(kept) == len(self._records):
            return False
        if not kept:
            raise MembershipLost(
                f"truncating the log from raft index {from_index} would drop every "
                f"configuration kept (the oldest is at {self._records[0].index})"
            )
        self._records = kept
        self.version += 1
        return True

    def on_truncate_prefix(self, first_index: int) -> bool:
        """Entries before `first_index` deleted (compaction): keep the configuration in
        effect at the new log start and every later one."""
        older = [r for r in self._records if r.index < first_index]
        if len(older) <= 1:
            return False
        self._records = [older[-1], *(r for r in self._records if r.index >= first_index)]
        self.version += 1
        return True

    def on_reset(self, index: int, term: int, cluster: Iterable[str]) -> None:
        """A snapshot ending at (index, term) replaced the whole log; `cluster` is the
        configuration it carries."""
        cluster_members = tuple(sorted(set(cluster)))
        latest = self.latest
        if latest.joining and self.self_address not in cluster_members:
            # A snapshot from before our own `add`: the members we were given are newer.
            record = ConfigRecord(index, term, latest.members, joining=True)
        else:
            record = ConfigRecord(index, term, cluster_members, joining=False)
        self._records = [record]
        self.version += 1

    def validated(self, first_index: int, term_at: Callable[[int], int | None]) -> int:
        """Drop the records whose entry is not in the log; return how many were dropped.
        `term_at(index)` is the term of the log's entry at `index`, None past its end;
        entries below `first_index` were compacted (committed: their records stand).
        By Log Matching, once one record's entry is missing or differs, every later
        record's is too."""
        kept: list[ConfigRecord] = []
        for record in self._records:
            compacted = record.index == 0 or record.index < first_index  # committed
            if not compacted and term_at(record.index) != record.term:
                break
            kept.append(record)
        if not kept:
            raise MembershipLost(
                f"no configuration of {self.self_address} matches its log (records at "
                f"{[r.index for r in self._records]}, log from {first_index})"
            )
        dropped = len(self._records) - len(kept)
        if dropped:
            self._records = kept
            self.version += 1
        return dropped


# ---------------------------------------------------------------------- the file


def encode(log: MembershipLog) -> bytes:
    document = {
        "self": log.self_address,
        "records": [
            {"index": r.index, "term": r.term, "members": list(r.members), "joining": r.joining}
            for r in log.records
        ],
    }
    return small_file.encode(MAGIC, VERSION, document)


def decode(path: str, data: bytes, self_address: str) -> MembershipLog:
    """SmallFileCorrupt unless `data` is a members file of the replica at `self_address`."""
    document = small_file.decode(path, data, MAGIC, VERSION)
    return _from_document(path, document, self_address)


def _from_document(path: str, document: dict[str, Any], self_address: str) -> MembershipLog:
    def bad(reason: str) -> small_file.SmallFileCorrupt:
        return small_file.SmallFileCorrupt(path, reason)

    if set(document) != {"self", "records"}:
        raise bad(f"keys {sorted(document)}, expected ['records', 'self']")
    if document["self"] != self_address:
        raise bad(f"written by replica {document['self']!r}, this is {self_address!r}")
    raw = document["records"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= RECORDS_MAX:
        raise bad(f"records: a list of 1 to {RECORDS_MAX} expected")
    records: list[ConfigRecord] = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"index", "term", "members", "joining"}:
            raise bad(f"records[{position}]: index, term, members, joining expected")
        index, term, members, joining = (
            item["index"],
            item["term"],
            item["members"],
            item["joining"],
        )
        if not all(_is_count(v) for v in (index, term)) or not isinstance(joining, bool):
            raise bad(f"records[{position}]: ill-typed index, term or joining")
        if (
            not isinstance(members, list)
            or len(members) > MEMBERS_MAX
            or not all(isinstance(m, str) and m for m in members)
            or members != sorted(set(members))
        ):
            raise bad(f"records[{position}].members: sorted distinct addresses expected")
        if records and index <= records[-1].index:
            raise bad(f"records[{position}]: raft index {index} is not increasing")
        records.append(ConfigRecord(index, term, tuple(members), joining))
    return MembershipLog(self_address, records)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


class ReplicaMembership:
    """A replica's `MembershipLog`, kept in its members file. Changed on the Raft tick
    thread only (through the journal); read from any thread."""

    def __init__(self, fs: FileSystem, path: str, log: MembershipLog) -> None:
        self._fs = fs
        self._path = path
        self._log = log
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        fs: FileSystem,
        path: str,
        self_address: str,
        initial_members: Iterable[str],
        joining: bool,
        first_index: int,
        term_at: Callable[[int], int | None],
        reset_to: tuple[int, int, Iterable[str]] | None = None,
    ) -> ReplicaMembership:
        """Load the file (SmallFileCorrupt, MembershipLost), or create it from the
        initial members when there is none; validate it against the log either way.
        `reset_to` (index, term, cluster): a snapshot's, whose installation a crash cut
        short and which replaces the log next: the file is reset to it (`on_reset`),
        durably, instead of validated against the log it replaces."""
        data = small_file.read(fs, path, MAGIC, VERSION)
        if data is None:
            log = MembershipLog.initial(self_address, initial_members, joining)
            membership = cls(fs, path, log)
            if reset_to is not None:
                log.on_reset(*reset_to)
            membership._save()
            return membership
        log = _from_document(path, data, self_address)
        membership = cls(fs, path, log)
        if reset_to is not None:
            log.on_reset(*reset_to)
            membership._save()
        elif log.validated(first_index, term_at):
            membership._save()
        return membership

    # reads (any thread) --------------------------------------------------------------

    @property
    def self_address(self) -> str:
        return self._log.self_address

    @property
    def members(self) -> tuple[str, ...]:
        with self._lock:
            return self._log.members

    @property
    def peers(self) -> tuple[str, ...]:
        with self._lock:
            return self._log.peers

    @property
    def joining(self) -> bool:
        with self._lock:
            return self._log.joining

    @property
    def version(self) -> int:
        with self._lock:
            return self._log.version

    @property
    def config_index(self) -> int:
        """The raft index of the entry that made the latest configuration (0: the base)."""
        with self._lock:
            return self._log.latest.index

    def members_at(self, index: int) -> tuple[str, ...]:
        with self._lock:
            return self._log.members_at(index)

    def records(self) -> tuple[ConfigRecord, ...]:
        with self._lock:
            return self._log.records

    # changes (the tick thread), each durable before it returns ---------------------------

    def on_entry(self, index: int, term: int, change: Change) -> None:
        with self._lock:
            changed = self._log.on_entry(index, term, change)
        if changed:
            self._save()

    def on_truncate_suffix(self, from_index: int) -> None:
        with self._lock:
            changed = self._log.on_truncate_suffix(from_index)
        if changed:
            self._save()

    def on_truncate_prefix(self, first_index: int) -> None:
        with self._lock:
            changed = self._log.on_truncate_prefix(first_index)
        if changed:
            self._save()

    def on_reset(self, index: int, term: int, cluster: Iterable[str]) -> None:
        with self._lock:
            self._log.on_reset(index, term, cluster)
        self._save()

    def _save(self) -> None:
        with self._lock:
            data = encode(self._log)
        small_file.write_durably(self._fs, self._path, data)
