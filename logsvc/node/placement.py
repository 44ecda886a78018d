"""Which shards this node hosts: the node's placement file, `<data_dir>/placement`.

The config's [[shards]] replicas are the *initial* placement. Membership changes through
the admin API move replicas at runtime, so each node remembers its own decisions here,
durably (small_file.py: checksummed, replaced by temp file + fdatasync + rename + directory
fsync), and a restart hosts exactly what the file says:

* every shard the config names gets an entry the first time the node sees it: hosted iff
  the config places a replica on this node. From then on the file decides, whatever the
  config says (a replica removed at runtime must not come back because the config, which
  nobody edited, still lists the node);
* `host(shard, join_members)`: this node started a replica to join a running shard; the
  members it was given are kept so that a crash before the replica's own members file
  exists (logsvc/shard/membership.py) restarts it with the same peers;
* `release(shard)`: this node stopped hosting the shard (removed from it); the replica's
  directory is archived, never deleted (`archive_dir`).

The file holds no peers of an established replica: those change with the shard's log and
live in the replica's members file, next to its journal.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from logsvc.node_config import ShardConfig
from logsvc.shard import small_file
from logsvc.store.fs import FileSystem

MAGIC: Final = b"LSVCPLAC"
VERSION: Final = 1
FILE_NAME: Final = "placement"
ARCHIVE_DIR_NAME: Final = "removed"
SHARDS_MAX: Final = 4096  # config.SHARDS_MAX: a bigger file is damage
MEMBERS_MAX: Final = 16


@dataclass(frozen=True, slots=True)
class ShardEntry:
    shard_id: int
    hosted: bool
    # The members (node ids, this node included) a replica started at runtime joined
    # with; None for a replica placed by the config, or not hosted.
    join_members: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        assert self.shard_id >= 1
        assert self.join_members is None or self.hosted


@dataclass(frozen=True, slots=True)
class Placement:
    node_id: str
    shards: tuple[ShardEntry, ...]  # sorted by shard id, one entry per shard

    def __post_init__(self) -> None:
        ids = [entry.shard_id for entry in self.shards]
        assert ids == sorted(set(ids))

    @property
    def hosted(self) -> tuple[ShardEntry, ...]:
        return tuple(entry for entry in self.shards if entry.hosted)

    def entry(self, shard_id: int) -> ShardEntry | None:
        for entry in self.shards:
            if entry.shard_id == shard_id:
                return entry
        return None

    def merged_with(self, config_shards: Iterable[ShardConfig]) -> Placement:
        """Entries for the config's shards this placement has never seen (hosted iff the
        config puts a replica here); the entries it has are kept as they are."""
        known = {entry.shard_id for entry in self.shards}
        added = [
            ShardEntry(shard.id, self.node_id in shard.replicas)
            for shard in config_shards
            if shard.id not in known
        ]
        return self._with(*added) if added else self

    def host(self, shard_id: int, join_members: Iterable[str]) -> Placement:
        members = tuple(sorted({*join_members, self.node_id}))
        return self._with(ShardEntry(shard_id, True, members))

    def release(self, shard_id: int) -> Placement:
        return self._with(ShardEntry(shard_id, False))

    def _with(self, *entries: ShardEntry) -> Placement:
        by_id = {entry.shard_id: entry for entry in self.shards}
        by_id.update((entry.shard_id, entry) for entry in entries)
        return dataclasses.replace(self, shards=tuple(by_id[i] for i in sorted(by_id)))


def from_config(node_id: str, config_shards: Iterable[ShardConfig]) -> Placement:
    """The first start's placement: the config's."""
    return Placement(node_id, ()).merged_with(config_shards)


# ---------------------------------------------------------------------- the file


def encode(placement: Placement) -> bytes:
    document: dict[str, Any] = {
        "node": placement.node_id,
        "shards": [
            {
                "id": entry.shard_id,
                "hosted": entry.hosted,
                "join_members": None if entry.join_members is None else list(entry.join_members),
            }
            for entry in placement.shards
        ],
    }
    return small_file.encode(MAGIC, VERSION, document)


def decode(path: str, data: bytes, node_id: str) -> Placement:
    """SmallFileCorrupt unless `data` is the placement file of node `node_id`."""
    return _from_document(path, small_file.decode(path, data, MAGIC, VERSION), node_id)


def _from_document(path: str, document: dict[str, Any], node_id: str) -> Placement:
    def bad(reason: str) -> small_file.SmallFileCorrupt:
        return small_file.SmallFileCorrupt(path, reason)

    if set(document) != {"node", "shards"}:
        raise bad(f"keys {sorted(document)}, expected ['node', 'shards']")
    if document["node"] != node_id:
        raise bad(f"the placement of node {document['node']!r}, this is {node_id!r}")
    raw = document["shards"]
    if not isinstance(raw, list) or len(raw) > SHARDS_MAX:
        raise bad(f"shards: a list of at most {SHARDS_MAX} expected")
    entries: list[ShardEntry] = []
    for position, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"id", "hosted", "join_members"}:
            raise bad(f"shards[{position}]: id, hosted, join_members expected")
        shard_id, hosted, members = item["id"], item["hosted"], item["join_members"]
        if (
            not isinstance(shard_id, int)
            or isinstance(shard_id, bool)
            or not 1 <= shard_id <= 65535
            or not isinstance(hosted, bool)
        ):
            raise bad(f"shards[{position}]: ill-typed id or hosted")
        if members is not None and (
            not hosted
            or not isinstance(members, list)
            or not 1 <= len(members) <= MEMBERS_MAX
            or not all(isinstance(m, str) and m for m in members)
            or members != sorted(set(members))
            or node_id not in members
        ):
            raise bad(f"shards[{position}].join_members: sorted node ids with this node")
        if entries and shard_id <= entries[-1].shard_id:
            raise bad(f"shards[{position}]: shard ids are not increasing")
        entries.append(ShardEntry(shard_id, hosted, None if members is None else tuple(members)))
    return Placement(node_id, tuple(entries))


def load(fs: FileSystem, path: str, node_id: str) -> Placement | None:
    """The placement in the file; None when there is no file; SmallFileCorrupt."""
    document = small_file.read(fs, path, MAGIC, VERSION)
    return None if document is None else _from_document(path, document, node_id)


def save(fs: FileSystem, path: str, placement: Placement) -> None:
    small_file.write_durably(fs, path, encode(placement))


def archive_dir(shard_dir: str, data_dir: str, wall_s: float | None = None) -> str | None:
    """Move a replica's directory out of the way, into `<data_dir>/removed/` (kept for the
    operator: a removed replica's journal may still be wanted for forensics or recovery;
    deleting data is a human decision). Durable (both directories fsynced). Returns the
    new path; None when there was nothing to move."""
    if not os.path.isdir(shard_dir):
        return None
    archive = os.path.join(data_dir, ARCHIVE_DIR_NAME)
    os.makedirs(archive, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if wall_s is None else wall_s))
    target = os.path.join(archive, f"shard-{os.path.basename(shard_dir)}-{stamp}")
    suffix = 0
    while os.path.exists(target + (f".{suffix}" if suffix else "")):
        suffix += 1
    target += f".{suffix}" if suffix else ""
    os.rename(shard_dir, target)
    for directory in {os.path.dirname(shard_dir), archive, data_dir}:
        _fsync_dir(directory)
    return target


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
