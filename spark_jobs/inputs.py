"""What a job reads, and how it splits into input partitions ("units"). Pure; no pyspark.

Two kinds of log hold the engine's WAL (ARCHITECTURE.md §1):

* **file WALs**: tae_driver's file backend directories (`DIR/wal` of `Engine.open(DIR)`),
  segments `wal-<base_lsn>.seg` (tae_driver/backends/FORMAT.md). Each is one engine's log,
  reported as replica `file` and shard 0, 1, ... in the order given (one directory: shard
  0). **One unit per segment file**: every frame carries its LSN.
* **logsvc node data directories**, one per replica: `<data_dir>/shards/<id>/journal/` holds
  the shard store's segments (logsvc/store/FORMAT.md), `<data_dir>/shards/<id>/snapshot` the
  Raft snapshot. **One unit per shard replica** (all its segments, in order): a logsvc LSN is
  assigned when the shard's state machine applies an entry (dedupe of retried appends,
  refusal of fenced writers: logsvc/shard/state_machine.py), so the LSNs of a segment are
  known only after applying everything before it. A scale-out planning pass (state machine
  images per segment) would allow one unit per segment; it is not built (phase 1).

Everything arrives at a Spark Data Source as strings, so `LogInputs` round-trips through
`to_option()` / `parse_inputs()`:

    file:/var/lib/engine                    (the engine dir, or its wal/ dir; ;-separated)
    logsvc:n1=/var/lib/logsvc/n1;n2=/var/lib/logsvc/n2
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from logsvc.store.recovery import SEGMENT_NAME
from spark_jobs.errors import BadInput
from spark_jobs.limits import LIVE_SEGMENT_READS_MAX, LIVE_SEGMENT_REREAD_PAUSE_S
from tae_driver.backends.segment import parse_segment_file_name
from tae_driver.errors import StorageCorruption

BACKEND_FILE = "file"
BACKEND_LOGSVC = "logsvc"
FILE_REPLICA = "file"
SHARDS_DIR = "shards"
JOURNAL_DIR = "journal"
SNAPSHOT_FILE = "snapshot"
WAL_DIR = "wal"
OBJECTS_DIR = "objects"  # Engine.open(DIR) keeps its objects (blocks, checkpoints) here
# A directory listing longer than this is not one of ours (a shard store rolls segments at
# 64 MiB: 100,000 segments is 6 TiB in one replica of one shard).
SEGMENTS_PER_LOG_MAX = 100_000
SHARDS_PER_NODE_MAX = 100_000
REPLICA_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Node:
    """One logsvc node's data directory: one replica of each shard it hosts."""

    replica: str
    data_dir: str


@dataclass(frozen=True, slots=True)
class LogInputs:
    file_wals: tuple[str, ...] = ()
    nodes: tuple[Node, ...] = ()

    def __post_init__(self) -> None:
        assert bool(self.file_wals) != bool(self.nodes), "exactly one kind of input"

    @property
    def backend(self) -> str:
        return BACKEND_FILE if self.file_wals else BACKEND_LOGSVC

    def to_option(self) -> str:
        if self.file_wals:
            return f"{BACKEND_FILE}:" + ";".join(self.file_wals)
        return BACKEND_LOGSVC + ":" + ";".join(f"{n.replica}={n.data_dir}" for n in self.nodes)

    def describe(self) -> dict[str, object]:
        if self.file_wals:
            return {"backend": BACKEND_FILE, "wal_dirs": list(self.file_wals)}
        return {
            "backend": BACKEND_LOGSVC,
            "nodes": {node.replica: node.data_dir for node in self.nodes},
        }


def file_input(*paths: str) -> LogInputs:
    """File WALs, each an engine's directory (holding `wal/`) or the wal directory itself;
    shard i is the i-th."""
    found = []
    for given in paths:
        path = os.path.abspath(given)
        candidate = os.path.join(path, WAL_DIR)
        if os.path.isdir(candidate):
            path = candidate
        if not os.path.isdir(path):
            raise BadInput(f"no file WAL at {path}: not a directory")
        found.append(path)
    if not found:
        raise BadInput("no file WAL given")
    return LogInputs(file_wals=tuple(found))


def logsvc_input(specs: list[str]) -> LogInputs:
    """logsvc node data directories, each `NAME=DIR` (or `DIR`: named after its basename)."""
    nodes: list[Node] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path, name = spec, os.path.basename(os.path.normpath(spec))
        if not REPLICA_NAME.match(name):
            raise BadInput(f"replica name {name!r}: 1-64 of [A-Za-z0-9_.-]")
        path = os.path.abspath(path)
        if not os.path.isdir(os.path.join(path, SHARDS_DIR)):
            raise BadInput(f"{path} is not a logsvc node data directory (no {SHARDS_DIR}/)")
        nodes.append(Node(name, path))
    if not nodes:
        raise BadInput("no logsvc node directory given")
    names = [node.replica for node in nodes]
    if len(set(names)) != len(names):
        raise BadInput(f"replica names repeat: {names}")
    return LogInputs(nodes=tuple(nodes))


def parse_inputs(text: str) -> LogInputs:
    """The inverse of `LogInputs.to_option()`."""
    kind, sep, rest = text.partition(":")
    if not sep or not rest:
        raise BadInput(f"input {text!r}: expected file:DIR or logsvc:NAME=DIR;...")
    if kind == BACKEND_FILE:
        return file_input(*(part for part in rest.split(";") if part))
    if kind == BACKEND_LOGSVC:
        return logsvc_input([part for part in rest.split(";") if part])
    raise BadInput(f"input {text!r}: unknown kind {kind!r} (file or logsvc)")


@dataclass(frozen=True, slots=True)
class Unit:
    """One input partition: a file WAL segment, or one shard replica's whole journal.
    Picklable (Spark ships it to the worker that reads it)."""

    backend: str
    replica: str
    shard: int
    path: str  # the segment file (file) or the shard directory (logsvc)
    segment: str  # the file name (file); "" for a logsvc journal (its rows name theirs)
    newest: bool  # file: the last segment of the log (only it may end in a torn tail)
    lsn_lo: int  # file: the segment's first LSN (its base); 0 for logsvc
    lsn_hi: int | None  # file: the next segment's base LSN (exclusive); None: unbounded
    size_bytes: int


def list_units(
    inputs: LogInputs, shards: frozenset[int] | None = None, replicas: frozenset[str] | None = None
) -> list[Unit]:
    """Every unit of the inputs, optionally only some shards and replicas, in a stable
    order (replica, shard, position)."""
    if inputs.file_wals:
        if replicas is not None and FILE_REPLICA not in replicas:
            return []
        return [
            unit
            for shard, wal_dir in enumerate(inputs.file_wals)
            if shards is None or shard in shards
            for unit in _file_units(wal_dir, shard)
        ]
    units: list[Unit] = []
    for node in inputs.nodes:
        if replicas is not None and node.replica not in replicas:
            continue
        for shard, shard_dir in shard_dirs(node.data_dir):
            if shards is not None and shard not in shards:
                continue
            journal = os.path.join(shard_dir, JOURNAL_DIR)
            size = sum(size for _, _, size in journal_segments(journal))
            units.append(
                Unit(BACKEND_LOGSVC, node.replica, shard, shard_dir, "", False, 0, None, size)
            )
    return units


def _file_units(wal_dir: str, shard: int) -> list[Unit]:
    found = []
    for name in _listdir(wal_dir):
        base = parse_segment_file_name(name)
        if base is not None:
            found.append((base, name))
    found.sort()
    units = []
    for position, (base, name) in enumerate(found):
        path = os.path.join(wal_dir, name)
        following = found[position + 1][0] if position + 1 < len(found) else None
        units.append(
            Unit(
                BACKEND_FILE,
                FILE_REPLICA,
                shard,
                path,
                name,
                following is None,
                base,
                following,
                os.path.getsize(path),
            )
        )
    return units


def shard_dirs(data_dir: str) -> list[tuple[int, str]]:
    """(shard id, shard directory) of every shard a node data directory holds."""
    root = os.path.join(data_dir, SHARDS_DIR)
    out = []
    for name in _listdir(root, SHARDS_PER_NODE_MAX):
        if name.isdigit() and not name.startswith("0"):
            path = os.path.join(root, name)
            if os.path.isdir(os.path.join(path, JOURNAL_DIR)):
                out.append((int(name), path))
    return sorted(out)


def journal_segments(journal_dir: str) -> list[tuple[int, str, int]]:
    """(first raft index, file name, size in bytes) of a shard store's segment files, in
    index order (the store's own naming rule, logsvc/store/recovery.py)."""
    out = []
    for name in _listdir(journal_dir):
        match = SEGMENT_NAME.match(name)
        if match:
            out.append(
                (int(match.group(1)), name, os.path.getsize(os.path.join(journal_dir, name)))
            )
    return sorted(out)


def _listdir(path: str, entries_max: int = SEGMENTS_PER_LOG_MAX) -> list[str]:
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise BadInput(f"cannot list {path}: {exc.strerror}") from None
    if len(names) > entries_max:
        raise BadInput(f"{path} holds {len(names)} entries, more than {entries_max}")
    return sorted(names)


_Read = TypeVar("_Read")


def read_segment_live(
    read: Callable[[], _Read], damaged: Callable[[_Read], bool], newest: bool
) -> _Read:
    """`read()` of a log's segment. The newest may be being written as it is read (a job
    beside a running engine or node), and a read that copies it while a write is copied in
    can see a tear with whole frames after it: damage found there (`damaged`, or the
    `StorageCorruption` of a file segment's header) is read again, up to
    `LIVE_SEGMENT_READS_MAX` reads `LIVE_SEGMENT_REREAD_PAUSE_S` apart, and the last read
    decides (spark_jobs/limits.py)."""
    for _ in range((LIVE_SEGMENT_READS_MAX if newest else 1) - 1):
        try:
            found = read()
        except StorageCorruption:  # a bad segment header: the last read raises it, if still there
            pass
        else:
            if not damaged(found):
                return found
        time.sleep(LIVE_SEGMENT_REREAD_PAUSE_S)
    return read()
