"""Offline disk faults on a node's data directory (shared/reference/chaos-plan.md §4.5).

Every function here runs ONLY while the node is dead (after SIGKILL, before the restart),
and returns a description of what it did (file, offset) for the nemesis log; each says when
it did nothing, so a scenario can tell a vacuous fault from an applied one.

* `power_loss(data_dir, ledger_path, mode, rng)`: cut the directory back to what the last
  syncs made durable, as recorded by `LedgerFileSystem` (ledger_fs.py), i.e. FaultFS's
  power-loss model (tests/support/faultfs.py) applied to real files:
    - names: a name created or renamed into place after its directory's last fsync is
      removed; a durable name that was unlinked or renamed over since is restored (from the
      kept hard link, or from where it was renamed to);
    - contents, for each file the ledger knows (by inode): the unsynced region starts at
      the durable size of its last returned fdatasync (or lower, at a later truncate);
      `trunc` cuts there; `torn` keeps a random prefix of the unsynced bytes and, with
      probability 1/2, replaces the last 1..64 kept bytes with garbage (a torn sector);
      `zeros` keeps a random length (the whole file with probability 1/2) with each 4 KiB
      page of the unsynced region zeroed with probability 1/2 (ext4 delayed allocation).
      Synced bytes are never touched. Files the ledger never saw are left as they are.
  Then the ledger is reset to a baseline of the resulting state (everything on disk is
  durable now), ready for the node's next run.
* `torn_tail`, `bitflip_sealed_segment`, `truncate_file`: damage at rest in one shard
  replica's journal (Jepsen's file faults), through the product's own format readers.

Layout: a node's replica of shard S keeps its journal in `<data_dir>/shards/S/journal`
(logsvc/config.py `shard_data_dir`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from typing import Literal

from logsvc.store import StoreError, records
from logsvc.store.fs import OsFileSystem
from logsvc.store.meta import load_meta
from logsvc.store.recovery import SEGMENT_NAME
from tests.chaos.harness.ledger_fs import KEEP_SUFFIX, TAIL_HASH_BYTES, list_names, tail_hash

PowerLossMode = Literal["trunc", "torn", "zeros"]
POWER_LOSS_MODES: tuple[PowerLossMode, ...] = ("trunc", "torn", "zeros")
PAGE_BYTES = 4096  # the unit of `zeros` damage (ext4 delayed allocation)
GARBAGE_BYTES_MAX = 64  # a torn sector: at most this many trailing garbage bytes
_STAGE_PREFIX = ".powerloss-stage-"


def shard_journal_dir(data_dir: str, shard: int) -> str:
    return os.path.join(data_dir, "shards", str(shard), "journal")


# --------------------------------------------------------------------------- power loss


@dataclass(frozen=True, slots=True)
class FileCut:
    """What a power loss did to one file's content."""

    path: str
    size_before: int
    unsynced_from: int  # the durable size (or a later truncate's): never cut below it
    size_after: int
    damage: str = ""  # garbage or zeroed pages written into the kept unsynced bytes

    def describe(self) -> str:
        text = f"{self.path}: {self.size_before} -> {self.size_after} bytes"
        text += f" (durable {self.unsynced_from})"
        return f"{text}, {self.damage}" if self.damage else text


@dataclass(frozen=True, slots=True)
class PowerLossReport:
    mode: PowerLossMode
    files: tuple[FileCut, ...] = ()  # only files that had unsynced bytes
    removed_names: tuple[str, ...] = ()  # created or renamed in after the last dir fsync
    restored_names: tuple[str, ...] = ()  # unlinked or renamed over after it
    unrestorable_names: tuple[str, ...] = ()  # durable names whose inode was not kept
    mismatches: tuple[str, ...] = ()  # synced bytes that differ from the ledger's hash
    unknown_files: tuple[str, ...] = ()  # files the ledger never saw: left as they were
    unsynced_bytes: int = 0  # bytes past the durable sizes, before the cut

    @property
    def vacuous(self) -> bool:
        """Nothing was unsynced: the power loss could not lose anything."""
        return self.unsynced_bytes == 0 and not self.removed_names and not self.restored_names

    def describe(self) -> str:
        if self.vacuous:
            return f"power_loss {self.mode}: nothing was unsynced (vacuous)"
        parts = [f"power_loss {self.mode}: {self.unsynced_bytes} unsynced bytes"]
        parts += [cut.describe() for cut in self.files]
        parts += [f"removed {name}" for name in self.removed_names]
        parts += [f"restored {name}" for name in self.restored_names]
        parts += [f"UNRESTORABLE {name}" for name in self.unrestorable_names]
        parts += [f"MISMATCH {text}" for text in self.mismatches]
        return "; ".join(parts)


@dataclass(slots=True)
class _FileState:
    durable_size: int  # -1: unknown (a truncate of a file never synced nor created here)
    tail: str | None
    unsynced_from: int  # min(durable size, truncates since the last sync)


@dataclass(slots=True)
class _LedgerView:
    files: dict[int, _FileState] = field(default_factory=dict)
    dirs: dict[str, dict[str, int]] = field(default_factory=dict)
    keeps: dict[int, str] = field(default_factory=dict)  # inode -> its newest keep link


def read_ledger(ledger_path: str) -> _LedgerView:
    """Replay the ledger's lines in order (a torn last line, if any, is ignored)."""
    view = _LedgerView()
    if not os.path.exists(ledger_path):
        return view
    with open(ledger_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            # Only the last line can be partial (a node killed inside write(2) never
            # leaves one: the page cache takes the write whole; keep the check anyway).
            assert number >= len(lines) - 2, f"{ledger_path}:{number + 1} is not JSON"
            continue
        _apply_record(view, record)
    return view


def _apply_record(view: _LedgerView, record: dict[str, object]) -> None:
    kind = record["k"]
    if kind == "create":
        view.files[_int(record["ino"])] = _FileState(0, None, 0)
    elif kind == "sync":
        size = _int(record["size"])
        view.files[_int(record["ino"])] = _FileState(size, str(record["tail"]), size)
    elif kind == "trunc":
        state = view.files.get(_int(record["ino"]))
        if state is not None:
            state.unsynced_from = min(state.unsynced_from, _int(record["size"]))
    elif kind == "dir":
        names = record["names"]
        assert isinstance(names, dict)
        view.dirs[str(record["dir"])] = {str(k): _int(v) for k, v in names.items()}
    elif kind == "keep":
        view.keeps[_int(record["ino"])] = str(record["link"])
    # "rename", "unlink": informational


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def power_loss(
    data_dir: str, ledger_path: str, mode: PowerLossMode, rng: random.Random
) -> PowerLossReport:
    """Cut `data_dir` back to a state a power loss could leave (module docstring); the node
    must be dead. Resets the ledger for the next run."""
    assert mode in POWER_LOSS_MODES
    root = os.path.realpath(data_dir)
    assert not _under(os.path.realpath(ledger_path), root), "the ledger must be outside"
    view = read_ledger(ledger_path)
    removed: list[str] = []
    restored: list[str] = []
    unrestorable: list[str] = []
    for dir_path in sorted(d for d in view.dirs if _under(d, root) and os.path.isdir(d)):
        _revert_names(dir_path, view, removed, restored, unrestorable)
    cuts: list[FileCut] = []
    mismatches: list[str] = []
    unknown: list[str] = []
    unsynced_total = 0
    seen: set[int] = set()
    for path in _regular_files(root):
        ino = os.stat(path, follow_symlinks=False).st_ino
        if ino in seen:
            continue  # another name of a file already settled
        seen.add(ino)
        state = view.files.get(ino)
        if state is None:
            unknown.append(path)
            continue
        cut = _settle_content(path, state, mode, rng, mismatches)
        if cut is not None:
            unsynced_total += cut.size_before - cut.unsynced_from
            cuts.append(cut)
    reset_ledger(data_dir, ledger_path)
    return PowerLossReport(
        mode=mode,
        files=tuple(cuts),
        removed_names=tuple(removed),
        restored_names=tuple(restored),
        unrestorable_names=tuple(unrestorable),
        mismatches=tuple(mismatches),
        unknown_files=tuple(unknown),
        unsynced_bytes=unsynced_total,
    )


def _regular_files(root: str) -> list[str]:
    found: list[str] = []
    for dir_path, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(dir_path, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
    return sorted(found)


def _revert_names(
    dir_path: str,
    view: _LedgerView,
    removed: list[str],
    restored: list[str],
    unrestorable: list[str],
) -> None:
    """Make the directory's regular files exactly its last durable listing."""
    durable = view.dirs[dir_path]
    current = list_names(dir_path)
    inode_paths: dict[int, str] = {}  # where each inode can be found now
    for name, ino in current.items():
        inode_paths.setdefault(ino, os.path.join(dir_path, name))
    # 1. Stage a link to every inode a durable name needs but no longer has.
    staged: list[tuple[str, str]] = []  # (stage path, final name)
    for name, ino in sorted(durable.items()):
        if current.get(name) == ino:
            continue
        source = inode_paths.get(ino) or view.keeps.get(ino)
        if source is None or not os.path.exists(source):
            unrestorable.append(os.path.join(dir_path, name))
            continue
        stage = os.path.join(dir_path, f"{_STAGE_PREFIX}{len(staged)}")
        try:
            os.link(source, stage)
        except OSError:
            shutil.copyfile(source, stage)  # a keep on another file system
        staged.append((stage, name))
        restored.append(os.path.join(dir_path, name))
    # 2. Remove every name that is not durable as it is.
    for name, ino in sorted(current.items()):
        if durable.get(name) != ino:
            os.unlink(os.path.join(dir_path, name))
            if name not in durable:
                removed.append(os.path.join(dir_path, name))
    # 3. Put the staged inodes in place.
    for stage, name in staged:
        os.rename(stage, os.path.join(dir_path, name))


def _settle_content(
    path: str,
    state: _FileState,
    mode: PowerLossMode,
    rng: random.Random,
    mismatches: list[str],
) -> FileCut | None:
    with open(path, "rb") as f:
        data = f.read()
    size_before = len(data)
    start = min(state.unsynced_from, state.durable_size)
    if start >= state.durable_size and size_before >= state.durable_size and state.tail:
        durable_tail = data[max(0, state.durable_size - TAIL_HASH_BYTES) : state.durable_size]
        if tail_hash(durable_tail) != state.tail:
            mismatches.append(f"{path}: synced bytes before {state.durable_size} changed")
    if size_before < start:
        start = size_before  # a truncate reached the disk and its ledger line did not
    if size_before == start:
        return None
    kept = bytearray(data)
    damage = ""
    if mode == "trunc":
        del kept[start:]
    elif mode == "torn":
        del kept[rng.randint(start, size_before) :]
        damage = _garble_tail(kept, start, rng)
    else:
        keep_bytes = size_before if rng.random() < 0.5 else rng.randint(start, size_before)
        del kept[keep_bytes:]
        damage = _zero_pages(kept, start, rng)
    with open(path, "r+b") as f:
        f.truncate(len(kept))
        f.seek(start)
        f.write(kept[start:])
    return FileCut(path, size_before, start, len(kept), damage)


def _garble_tail(data: bytearray, start: int, rng: random.Random) -> str:
    unsynced = len(data) - start
    if unsynced == 0 or rng.random() < 0.5:
        return ""
    garbage = rng.randint(1, min(GARBAGE_BYTES_MAX, unsynced))
    data[len(data) - garbage :] = rng.randbytes(garbage)
    return f"{garbage} garbage bytes at {len(data) - garbage}"


def _zero_pages(data: bytearray, start: int, rng: random.Random) -> str:
    zeroed: list[str] = []
    for page in range(start - start % PAGE_BYTES, len(data), PAGE_BYTES):
        if rng.random() < 0.5:
            lo, hi = max(page, start), min(page + PAGE_BYTES, len(data))
            data[lo:hi] = bytes(hi - lo)
            zeroed.append(f"[{lo}, {hi})")
    return f"zeroed {', '.join(zeroed)}" if zeroed else ""


def reset_ledger(data_dir: str, ledger_path: str) -> None:
    """Rewrite the ledger as a baseline: every directory under `data_dir` and every file in
    it durable as it is now; drop every keep link. Offline only. Also the way to attach a
    ledger to a data directory that already holds files (e.g. before the first start)."""
    root = os.path.realpath(data_dir)
    lines: list[str] = []
    for dir_path, _, _ in sorted(os.walk(root)):
        lines.append(_line({"k": "dir", "dir": dir_path, "names": list_names(dir_path)}))
    for path in _regular_files(root):
        with open(path, "rb") as f:
            data = f.read()
        ino = os.stat(path, follow_symlinks=False).st_ino
        lines.append(
            _line(
                {"k": "sync", "ino": ino, "path": path, "size": len(data), "tail": tail_hash(data)}
            )
        )
    tmp = ledger_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(lines))
    os.replace(tmp, ledger_path)
    keep_dir = ledger_path + KEEP_SUFFIX
    if os.path.isdir(keep_dir):
        shutil.rmtree(keep_dir)


def _line(record: dict[str, object]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


# --------------------------------------------------------------------------- damage at rest


@dataclass(frozen=True, slots=True)
class DiskMutation:
    """One offline mutation, for the nemesis log. `applied=False`: nothing fit (no file)."""

    kind: str
    applied: bool
    path: str = ""
    offset_bytes: int = 0
    detail: str = ""

    def describe(self) -> str:
        if not self.applied:
            return f"{self.kind}: not applied ({self.detail})"
        return f"{self.kind}: {self.path} at offset {self.offset_bytes}: {self.detail}"


def _segments(journal_dir: str) -> list[tuple[int, str]]:
    """(first index, path) of every segment file, in index order."""
    if not os.path.isdir(journal_dir):
        return []
    found = []
    for name in os.listdir(journal_dir):
        match = SEGMENT_NAME.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(journal_dir, name)))
    return sorted(found)


def _live_segments(journal_dir: str) -> list[tuple[int, str]]:
    """Segments that recovery will scan: not wholly below the log start (those are deleted
    on open, so damage there is never detected, nor needs to be)."""
    segments = _segments(journal_dir)
    try:
        meta = load_meta(OsFileSystem(), journal_dir)
    except StoreError:  # a damaged meta: every segment counts
        meta = None
    log_start = meta.first_index if meta is not None else 1
    live = []
    for position, (first_index, path) in enumerate(segments):
        following = segments[position + 1][0] if position + 1 < len(segments) else None
        if following is None or following > log_start:
            live.append((first_index, path))
    return live


def sealed_segment_count(data_dir: str, shard: int) -> int:
    """Sealed (not newest) segments of the shard that recovery scans: what a bit flip in a
    sealed segment needs at least one of. Read while the node runs: a listing only."""
    return max(0, len(_live_segments(shard_journal_dir(data_dir, shard))) - 1)


def _last_record_span(data: bytes, first_index: int) -> tuple[int, int] | None:
    """[start, end) of the last whole record of a segment's bytes (None: no whole record).
    The end is not the file's end: a running store keeps zero-ahead space after its last
    record (FORMAT.md "Zero-ahead"), which recovery cuts without a word."""
    try:
        scan = records.scan_segment(
            data, first_index, newest=True, payload_bytes_max=records.PAYLOAD_BYTES_LIMIT
        )
    except (records.TornHeader, records.ScanCorruption):
        return None
    return (scan.offsets[-1], scan.end_bytes) if scan.count else None


def torn_tail(data_dir: str, shard: int, rng: random.Random) -> DiskMutation:
    """Cut the newest segment at a random offset strictly inside its last record, or (half
    the time, or when it holds no whole record) append 1..64 random bytes to it."""
    segments = _segments(shard_journal_dir(data_dir, shard))
    if not segments:
        return DiskMutation("torn_tail", False, detail="no segment")
    first_index, path = segments[-1]
    with open(path, "rb") as f:
        data = f.read()
    span = _last_record_span(data, first_index)
    if span is not None and span[1] - span[0] >= 2 and rng.random() < 0.5:
        # Inside the record itself: a cut in the zero-ahead space after it would damage
        # nothing (C7 seed 2 once cut 27,270 bytes there and recovery rightly saw no tear).
        cut = rng.randint(span[0] + 1, span[1] - 1)
        os.truncate(path, cut)
        return DiskMutation(
            "torn_tail",
            True,
            path,
            cut,
            f"cut {span[1] - cut} bytes inside the last record ({len(data) - cut} in all)",
        )
    garbage = rng.randbytes(rng.randint(1, GARBAGE_BYTES_MAX))
    with open(path, "ab") as f:
        f.write(garbage)
    return DiskMutation("torn_tail", True, path, len(data), f"appended {len(garbage)} bytes")


def bitflip_sealed_segment(data_dir: str, shard: int, rng: random.Random) -> DiskMutation:
    """Flip one random bit of a random sealed (not newest) segment that recovery scans.
    Every byte of a sealed segment is covered by a checksum: recovery must report it."""
    live = _live_segments(shard_journal_dir(data_dir, shard))
    sealed = live[:-1]
    if not sealed:
        return DiskMutation("bitflip", False, detail="no sealed segment")
    _, path = rng.choice(sealed)
    size = os.path.getsize(path)
    offset = rng.randrange(size)
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
    return DiskMutation("bitflip", True, path, offset, f"flipped bit {bit}")


def truncate_file(data_dir: str, shard: int, rng: random.Random) -> DiskMutation:
    """Cut a random live segment by a Zipf-distributed number of bytes (Jepsen's
    truncate-file): `floor(size ** u)` for uniform u, mostly a few bytes, sometimes most of
    the file."""
    live = _live_segments(shard_journal_dir(data_dir, shard))
    if not live:
        return DiskMutation("truncate_file", False, detail="no segment")
    _, path = rng.choice(live)
    size = os.path.getsize(path)
    if size == 0:
        return DiskMutation("truncate_file", False, path, 0, "the segment is empty")
    dropped = max(1, min(size, int(size ** rng.random())))
    os.truncate(path, size - dropped)
    return DiskMutation(
        "truncate_file", True, path, size - dropped, f"cut {dropped} of {size} bytes"
    )
