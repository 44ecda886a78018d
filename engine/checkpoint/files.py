"""Checkpoints in the object store: writing one (manifest last), finding and reading the
newest at restart, retiring old ones. Blocking; the engine calls these from worker threads.

Crash cases (decision 0006; FORMAT.md):

* a crash before the manifest is written leaves objects no manifest names: the checkpoint does
  not exist, and `orphans` finds its objects at the next open;
* a crash after the manifest, before the CKP WAL entry or the WAL truncation: the checkpoint
  exists and restart uses it; the WAL still holds everything after it (truncation comes
  strictly after the manifest is durable);
* retiring deletes the manifest first, so a crash half way leaves objects of a checkpoint that
  no longer exists: orphans, collected at the next open.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa

from engine.checkpoint import layout
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import Manifest
from engine.checkpoint.plan import CheckpointPlan, restore
from engine.objects import deltafile
from engine.objects.errors import ObjectCorrupt, ObjectNotFound
from engine.objects.store import ObjectStore
from engine.state import EngineState
from engine.storage import PersistedMeta
from engine.wal.entry import BlockLevel, CreateBlock


def write(store: ObjectStore, plan: CheckpointPlan, created_wall_ms: int) -> Manifest:
    """Write every object of `plan`, then its manifest (durable when this returns)."""
    for name, rows in plan.dumps.items():
        store.put(name, layout.write_parquet(rows))
    for name, (table_id, blocks) in plan.deltas.items():
        deltafile.write_deltas(store, name, table_id=table_id, blocks=blocks)
    manifest = plan.manifest(created_wall_ms)
    store.put(manifest.catalog, layout.encode_catalog(plan.catalog))
    store.put(manifest.blocks, layout.encode_blocks(plan.blocks))
    store.put(manifest.name, manifest.encode())
    return manifest


def manifests(store: ObjectStore) -> list[str]:
    """Every checkpoint's manifest in the store, oldest first."""
    found = []
    for info in store.list(layout.PREFIX):
        ckp_ts = layout.ckp_ts_of(info.name)
        if ckp_ts is not None:
            found.append((ckp_ts, info.name))
    return [name for _, name in sorted(found)]  # equal ckp_ts: by tag, any is the state


def read_manifest(store: ObjectStore, name: str) -> Manifest:
    return Manifest.decode(store.get(name), name)


def newest(store: ObjectStore) -> Manifest | None:
    """The newest checkpoint, or None. A damaged newest manifest is an error, not a reason to
    fall back: the WAL may already be truncated past the older ones."""
    names = manifests(store)
    return read_manifest(store, names[-1]) if names else None


def read(
    store: ObjectStore, manifest: Manifest, object_meta: Callable[[CreateBlock], PersistedMeta]
) -> EngineState:
    """The engine's state at `manifest.ckp_ts`. Persisted blocks' key ranges and zonemaps come
    from their objects' footers (`object_meta`); L0 dumps and delta masks are read whole."""
    try:
        catalog_rows = layout.decode_catalog(store.get(manifest.catalog), manifest.catalog)
        block_rows = layout.decode_blocks(store.get(manifest.blocks), manifest.blocks)
        dumps: dict[str, pa.Table] = {}
        deltas: dict[str, dict[int, deltafile.BlockDeletes]] = {}
        metas: dict[tuple[str, int], PersistedMeta] = {}
        for row in block_rows:
            if row.level == layout.LEVEL_L0_DUMP:
                if row.object not in dumps:
                    dumps[row.object] = layout.read_parquet(store.get(row.object), row.object)
            else:
                cmd = CreateBlock(
                    1,
                    row.table_id,
                    row.block_id,
                    BlockLevel(row.level),
                    row.object,
                    row.row_group,
                    row.rows,
                )
                metas[(row.object, row.row_group)] = object_meta(cmd)
            if row.delta_object is not None and row.delta_object not in deltas:
                deltas[row.delta_object] = deltafile.read_deltas(store, row.delta_object)
    except ObjectNotFound as exc:
        raise CheckpointCorrupt(exc.name, "an object the checkpoint names is missing") from None
    except ObjectCorrupt as exc:
        raise CheckpointCorrupt(exc.name, str(exc)) from None
    return restore(manifest, catalog_rows, block_rows, dumps, deltas, metas)


def retire(store: ObjectStore, manifest_name: str, garbage: Iterable[str]) -> int:
    """Delete a checkpoint: its manifest first (it stops existing), then `garbage` (its
    objects that nothing else refers to). Returns the objects deleted."""
    deleted = 0
    for name in (manifest_name, *garbage):
        try:
            store.delete(name)
            deleted += 1
        except ObjectNotFound:
            pass
    return deleted


def orphans(store: ObjectStore, referenced: set[str], prefixes: Iterable[str]) -> list[str]:
    """Objects under `prefixes` that nothing refers to: written by a rewrite or a checkpoint
    that a crash interrupted before it committed."""
    out = []
    for prefix in prefixes:
        for info in store.list(prefix):
            if info.name not in referenced:
                out.append(info.name)
    return out
