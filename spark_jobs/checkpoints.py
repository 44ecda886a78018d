"""The engine's objects read offline: its checkpoints (the base state replay_as_of starts
from) and the block objects that the WAL's CreateBlock commands and the checkpoints' block
lists name. Pure Python and pyarrow over the engine's own codecs (engine/checkpoint/layout.py,
engine/objects/blockfile.py and deltafile.py), never a second parser; no pyspark.

The layout is engine/checkpoint/FORMAT.md's: under an engine's objects directory,

    ckp/<ckp_ts, 20 digits>-<tag>/manifest.json   written last: the checkpoint exists iff it does
    ckp/<...>/catalog.parquet, blocks.parquet     databases and tables, blocks live at ckp_ts
    ckp/<...>/l0-<table>-<block>.parquet          an L0 block's rows (a dump)
    ckp/<...>/delta-<table>.parquet               a table's deletes with their commit_ts
    data/<table>/<hex>.parquet                    L1/L2 block objects (one row group a block)

**Which checkpoint** (`choose_base`): the newest complete one with `ckp_ts <= TS`, as the
engine's restart takes the newest. A directory without a manifest is a checkpoint a crash cut
before it finished: it does not exist and is ignored (listed by the inventory as
incomplete). A manifest that fails `Manifest.decode` (checksum, version, fields, a ckp_ts
other than its directory's) is refused when it is the one chosen, not skipped for an older
one: the WAL may already be truncated past the older ones. (The engine refuses it too, with
`CheckpointDamaged`, and falls back only once its replay has seen that the WAL covers the
older one; this job does not.) With no checkpoint at or below TS the base is empty (replay
from DSN 1).

**The base rows of a table** (FORMAT.md "Reading a checkpoint"): for every block row of the
table, rows `[0, rows)` of `object` (row group `row_group`; a dump is read whole), keyed by
`(block_id, offset)`, minus the offsets its `delta_object` lists for that block with
`commit_ts <= ckp_ts`. Every object is checked as the engine checks it on restart: block
objects against their footer metadata (blockfile.read_block), dumps against the table's
columns and the list's row count, deltas against their metadata and the list's `deleted`.
A missing or damaged object is `ObjectsUnreadable` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.checkpoint import layout
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import BlockRow, CatalogRow, Manifest
from engine.errors import SchemaError
from engine.objects import blockfile, deltafile
from engine.objects.errors import ObjectNotFound, ObjectsError
from engine.objects.store import ObjectInfo, ObjectStore
from engine.schema import Schema
from spark_jobs.errors import BadInput, ObjectsUnreadable
from spark_jobs.objectstores import open_objects

COMMIT_TS_COLUMN = blockfile.COMMIT_TS_COLUMN
CHECKPOINTS_MAX = 10_000
"""Checkpoint directories listed at most: the engine retains CKP_RETAINED (2) and collects
the rest; a listing longer than this is not an engine's."""

Offsets = npt.NDArray[np.uint32]


def open_store(location: str) -> ObjectStore:
    """An engine's objects, read-only: a directory (no lock taken, nothing removed: the engine
    may be running) or `s3://bucket/prefix` (spark_jobs/objectstores.py)."""
    return open_objects(location)


# --- listing and choosing ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointDir:
    """One directory under ckp/: complete (a manifest that decodes), damaged (a manifest that
    does not: `error`), or incomplete (no manifest)."""

    directory: str
    ckp_ts: int
    manifest: Manifest | None
    error: str | None
    objects: int
    """Objects stored under this directory."""
    size_bytes: int

    @property
    def state(self) -> str:
        if self.manifest is not None:
            return "complete"
        return "damaged" if self.error is not None else "incomplete"


def list_checkpoints(store: ObjectStore) -> list[CheckpointDir]:
    """Every checkpoint directory, oldest first (by ckp_ts, then name)."""
    by_dir: dict[str, list[tuple[str, int]]] = {}
    for info in _list(store, layout.PREFIX):
        parts = info.name.split("/")
        if len(parts) != 3:
            continue
        by_dir.setdefault(parts[1], []).append((parts[2], info.size_bytes))
    if len(by_dir) > CHECKPOINTS_MAX:
        raise BadInput(
            f"{store.description}: {len(by_dir)} checkpoint directories, over {CHECKPOINTS_MAX}"
        )
    out = []
    for name, files in by_dir.items():
        directory = f"{layout.PREFIX}{name}/"
        manifest_name = layout.manifest_name(directory)
        ckp_ts = layout.ckp_ts_of(manifest_name)
        if ckp_ts is None:
            continue  # not a checkpoint directory's name
        manifest: Manifest | None = None
        error: str | None = None
        if any(file == layout.MANIFEST_NAME for file, _ in files):
            try:
                manifest = Manifest.decode(_get(store, manifest_name), manifest_name)
            except CheckpointCorrupt as exc:
                error = exc.reason
        size = sum(size for _, size in files)
        out.append(CheckpointDir(directory, ckp_ts, manifest, error, len(files), size))
    return sorted(out, key=lambda c: (c.ckp_ts, c.directory))


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A complete checkpoint, its lists decoded."""

    manifest: Manifest
    catalog: tuple[CatalogRow, ...]
    blocks: tuple[BlockRow, ...]

    @property
    def ckp_ts(self) -> int:
        return self.manifest.ckp_ts

    @property
    def ckp_dsn(self) -> int:
        return self.manifest.ckp_dsn

    def blocks_of(self, table_id: int) -> list[BlockRow]:
        return [row for row in self.blocks if row.table_id == table_id]


@dataclass(frozen=True, slots=True)
class BaseChoice:
    """The checkpoint replay starts from for one TS, or None, and why none (for errors)."""

    checkpoint: Checkpoint | None
    oldest_complete_ts: int | None
    """ckp_ts of the oldest complete checkpoint (None: there is none)."""
    ignored: tuple[str, ...]
    """Directories without a manifest (cut by a crash, or a retired checkpoint whose objects
    newer ones still use), ignored."""

    def why_none(self) -> str:
        if self.oldest_complete_ts is None:
            return "there is no checkpoint"
        return f"the oldest retained checkpoint is at ckp_ts {self.oldest_complete_ts}"


def choose_base(store: ObjectStore | None, as_of: int) -> BaseChoice:
    if store is None:
        return BaseChoice(None, None, ())
    found = list_checkpoints(store)
    ignored = tuple(c.directory for c in found if c.state == "incomplete")
    usable = [c for c in found if c.state != "incomplete"]
    oldest = min((c.ckp_ts for c in usable), default=None)
    below = [c for c in usable if c.ckp_ts <= as_of]
    if not below:
        return BaseChoice(None, oldest, ignored)
    chosen = below[-1]
    if chosen.manifest is None:
        raise ObjectsUnreadable(
            layout.manifest_name(chosen.directory),
            f"the newest checkpoint at or below {as_of} has a damaged manifest ({chosen.error}); "
            "an older one is not used instead: the WAL may be truncated past it",
        )
    return BaseChoice(read_checkpoint(store, chosen.manifest), oldest, ignored)


def read_checkpoint(store: ObjectStore, manifest: Manifest) -> Checkpoint:
    """The checkpoint's catalog and block lists, checked against each other and the
    manifest (every object a block row names is one the manifest lists)."""
    try:
        catalog = layout.decode_catalog(_get(store, manifest.catalog), manifest.catalog)
        blocks = layout.decode_blocks(_get(store, manifest.blocks), manifest.blocks)
    except CheckpointCorrupt as exc:
        raise ObjectsUnreadable(exc.name, exc.reason) from None
    listed = set(manifest.objects)
    tables = {row.table_id for row in catalog if row.kind == "table"}
    for row in blocks:
        if row.table_id not in tables:
            raise ObjectsUnreadable(manifest.blocks, f"block {row.block_id} of unknown table")
        for name in (row.object, row.delta_object):
            if name is not None and name not in listed:
                raise ObjectsUnreadable(manifest.blocks, f"{name} is not in the manifest")
    if len(blocks) != manifest.block_count:
        raise ObjectsUnreadable(manifest.blocks, "block count differs from the manifest's")
    return Checkpoint(manifest, tuple(catalog), tuple(blocks))


# --- rows ---------------------------------------------------------------------------------------


def block_rows(
    store: ObjectStore,
    schema: Schema,
    name: str,
    row_group: int,
    rows: int,
    *,
    dump: bool,
) -> pa.Table:
    """Rows `[0, rows)` of one block, the table's columns only, in the table's Arrow types:
    row group `row_group` of block object `name`, or the whole dump `name`."""
    names = [column.name for column in schema.columns]
    try:
        if dump:
            table = layout.read_parquet(_get(store, name), name)
            if table.schema.names != [*names, COMMIT_TS_COLUMN]:
                raise ObjectsUnreadable(
                    name, f"dump columns {table.schema.names} are not the table's"
                )
        else:
            with blockfile.BlockObjectReader(store, name) as reader:
                if not 0 <= row_group < len(reader.meta.blocks):
                    raise ObjectsUnreadable(name, f"no row group {row_group}")
                table = reader.read_block(row_group, names)
        table = table.select(names).cast(schema.to_arrow())
    except CheckpointCorrupt as exc:
        raise ObjectsUnreadable(exc.name, exc.reason) from None
    except ObjectNotFound:
        raise ObjectsUnreadable(name, "missing (named by the checkpoint or the WAL)") from None
    except (ObjectsError, SchemaError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ObjectsUnreadable(name, str(exc)) from None
    if table.num_rows != rows:
        raise ObjectsUnreadable(name, f"{table.num_rows} rows where {rows} are named")
    return table


def deleted_offsets(
    store: ObjectStore, block_rows_: Sequence[BlockRow], ckp_ts: int
) -> dict[int, Offsets]:
    """block_id -> offsets deleted at or before ckp_ts, for the blocks of one table that
    have a delta object (each read once)."""
    deltas: dict[str, dict[int, deltafile.BlockDeletes]] = {}
    out: dict[int, Offsets] = {}
    for row in block_rows_:
        name = row.delta_object
        if name is None:
            continue
        if name not in deltas:
            deltas[name] = read_deltas(store, name)
        block = deltas[name].get(row.block_id)
        if block is None or len(block.offsets) != row.deleted:
            raise ObjectsUnreadable(name, f"block {row.block_id}'s deletes do not match the list")
        dead = np.asarray(block.deleted_at(ckp_ts).to_array(), dtype=np.uint32)
        if dead.size and int(dead.max()) >= row.rows:
            raise ObjectsUnreadable(name, f"a delete past the end of block {row.block_id}")
        out[row.block_id] = dead
    return out


def read_deltas(store: ObjectStore, name: str) -> dict[int, deltafile.BlockDeletes]:
    try:
        return deltafile.read_deltas(store, name)
    except ObjectNotFound:
        raise ObjectsUnreadable(name, "missing (named by the checkpoint)") from None
    except ObjectsError as exc:
        raise ObjectsUnreadable(name, str(exc)) from None


def _get(store: ObjectStore, name: str) -> bytes:
    try:
        return store.get(name)
    except ObjectNotFound:
        raise ObjectsUnreadable(name, "missing (named by the checkpoint)") from None
    except ObjectsError as exc:
        raise ObjectsUnreadable(name, str(exc)) from None


def _list(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    try:
        return list(store.list(prefix))
    except ObjectsError as exc:
        raise ObjectsUnreadable(prefix, str(exc)) from None
