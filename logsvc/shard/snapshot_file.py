"""The Raft snapshot file of a shard: tiny state + the two journal entries it starts after.

pysyncobj ships this file, unchanged, to a replica whose next index lies below the leader's
first retained journal entry; the replica installs it and then receives every retained
entry by ordinary replication (docs/decisions/0001-shard-replication.md). Pure codec.

    file := magic "LOGSVSNP" | version u16 | reserved u16 | cluster_count u32
            | last_entry | prev_entry | cluster_node* | state
            | checksum u64 = xxh3_64(every byte before it)
    entry := index u64 | term u64 | command_bytes u32 | command[command_bytes]
    cluster_node := node_bytes u16 | node[node_bytes] (UTF-8 "host:port")
    state := state_bytes u32 | state[state_bytes] (ShardStateMachine.snapshot())

`last_entry` is the entry at the snapshot's raft index T (the truncate command that recorded
the snapshot point), `prev_entry` the one before it: pysyncobj keeps both as the first two
journal entries after compaction or install.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from logsvc.store.records import xxh3

MAGIC = b"LOGSVSNP"
VERSION = 1
_HEAD = struct.Struct("<8sHHI")
_ENTRY = struct.Struct("<QQI")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
CLUSTER_NODES_MAX = 64
NODE_BYTES_MAX = 512


class SnapshotFileCorrupt(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(f"snapshot file corrupt: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class JournalEntry:
    index: int
    term: int
    command: bytes


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    last: JournalEntry
    prev: JournalEntry
    cluster: tuple[str, ...]
    state: bytes


def encode(snapshot: SnapshotFile) -> bytes:
    assert snapshot.prev.index + 1 == snapshot.last.index
    assert len(snapshot.cluster) <= CLUSTER_NODES_MAX
    out = bytearray(_HEAD.pack(MAGIC, VERSION, 0, len(snapshot.cluster)))
    for entry in (snapshot.last, snapshot.prev):
        out += _ENTRY.pack(entry.index, entry.term, len(entry.command))
        out += entry.command
    for node in snapshot.cluster:
        raw = node.encode("utf-8")
        assert len(raw) <= NODE_BYTES_MAX
        out += _U16.pack(len(raw)) + raw
    out += _U32.pack(len(snapshot.state)) + snapshot.state
    out += _U64.pack(xxh3(out))
    return bytes(out)


def decode(data: bytes) -> SnapshotFile:
    if len(data) < _HEAD.size + _U64.size:
        raise SnapshotFileCorrupt(f"{len(data)} bytes is shorter than the header")
    (checksum,) = _U64.unpack_from(data, len(data) - _U64.size)
    if checksum != xxh3(data[: -_U64.size]):
        raise SnapshotFileCorrupt("checksum mismatch")
    magic, version, reserved, cluster_count = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise SnapshotFileCorrupt(f"bad magic {magic!r}")
    if version != VERSION or reserved != 0:
        raise SnapshotFileCorrupt(f"unknown version {version}")
    if cluster_count > CLUSTER_NODES_MAX:
        raise SnapshotFileCorrupt(f"{cluster_count} cluster nodes")
    reader = _Reader(data, _HEAD.size, len(data) - _U64.size)
    last = reader.entry()
    prev = reader.entry()
    cluster = tuple(reader.text() for _ in range(cluster_count))
    state = reader.blob()
    if reader.offset != reader.end:
        raise SnapshotFileCorrupt("trailing bytes")
    if prev.index + 1 != last.index or prev.term > last.term:
        raise SnapshotFileCorrupt("entries are not consecutive")
    return SnapshotFile(last=last, prev=prev, cluster=cluster, state=state)


class _Reader:
    def __init__(self, data: bytes, offset: int, end: int) -> None:
        self.data = data
        self.offset = offset
        self.end = end

    def take(self, size: int) -> bytes:
        if self.offset + size > self.end:
            raise SnapshotFileCorrupt("a length runs past the end")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def entry(self) -> JournalEntry:
        index, term, size = _ENTRY.unpack(self.take(_ENTRY.size))
        return JournalEntry(index, term, self.take(size))

    def text(self) -> str:
        (size,) = _U16.unpack(self.take(_U16.size))
        if size > NODE_BYTES_MAX:
            raise SnapshotFileCorrupt("node name too long")
        try:
            return self.take(size).decode("utf-8")
        except UnicodeDecodeError:
            raise SnapshotFileCorrupt("node name is not UTF-8") from None

    def blob(self) -> bytes:
        (size,) = _U32.unpack(self.take(_U32.size))
        return self.take(size)
