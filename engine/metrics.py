"""The engine's storage figures, and its metrics in Prometheus text format.

    from engine import metrics
    figures = metrics.storage_stats(engine)     # a StorageStats value (python -m engine stats)
    body = metrics.render(engine)               # text format 0.0.4, for a /metrics endpoint
    audit = metrics.audit_objects(engine)       # blocking: lists the object store

Why these figures (issue 14 "Metrics"): an operator must see that the WAL stays a bounded
window (entries and bytes retained, entries since the newest checkpoint, the checkpoint's
age), that flushes keep up (L0 blocks and bytes, the rewrites the policy asks for now, rewrites
done, abandoned and failed), that the buffer cache works (hit ratio, bytes), and that garbage
goes (objects waiting for a checkpoint to cover their drop, orphans deleted at open).

`storage_stats` and `render` read only memory (the engine's state, its maintenance, its
checkpointer, the block store's counters, the WAL's segment sizes from `stat`): cheap enough
for every scrape. `audit_objects` lists the object store (one LIST per 1000 objects on S3), so
it is for `python -m engine stats` and the crash tests, not for scrapes.

Like `engine/checkpoint/runner.py` and `engine/maintenance.py`, this module reads the
`Engine`'s private parts: it is the engine's own observation code, in its own module so that
prometheus_client is imported here only (shared/STYLE.md: each library in one module; the
node's metrics are logsvc/admin/metrics.py, a separate process's registry).

Names start with `engine_`; counters end in `_total`; units come last (`_seconds`, `_bytes`).
Every render builds a fresh `CollectorRegistry` (never the library's global one), so two
engines in one process never share a series. A figure the engine cannot know is left out
rather than reported as zero: the WAL's bytes over logsvc (the shard's store is on other
machines), the checkpoint's age before the first checkpoint.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine import compaction
from engine.blockstore import DATA_PREFIX, ObjectBlockStore
from engine.checkpoint import layout
from engine.clock import wall_ms
from engine.objects.cache import CacheStats
from engine.storage import TS_NEVER, L0Block, PersistedBlock
from engine.wal.entry import BlockLevel
from tae_driver import LogBackend

if TYPE_CHECKING:
    from engine.engine import Engine

LEVELS = ("l0", "l1", "l2")
"""Block levels as metric labels and keys of `StorageStats.blocks` (decision 0006)."""


@dataclass(frozen=True, slots=True)
class CheckpointFigures:
    """The newest checkpoint (the one a restart would begin from)."""

    ckp_ts: int
    ckp_dsn: int
    kind: str
    name: str
    created_wall_ms: int
    age_s: float
    """Seconds since it was written (wall clock; may be negative across a clock step)."""


@dataclass(frozen=True, slots=True)
class StorageStats:
    objects: str | None
    """The object store's description ("dir:/path", "s3://bucket/prefix"), None without."""
    blocks: dict[str, int]
    """Live blocks (not dropped) by level: "l0" in memory, "l1" sorted block objects, "l2"
    blocks of merged segments."""
    blocks_dropped_held: int
    """Dropped blocks still kept for open snapshots (collected once no reader needs them)."""
    l0_bytes: int
    """Arrow bytes of the live L0 blocks (what flushes give back)."""
    persisted_rows: int
    """Rows in live L1/L2 blocks (deleted ones included until a compaction drops them)."""
    checkpoint: CheckpointFigures | None
    checkpoints_retained: int
    checkpoints_taken: int
    """By this engine since it opened."""
    checkpoint_last_duration_ms: float
    checkpoint_last_bytes: int
    """Bytes of the L0 dumps the last checkpoint wrote."""
    checkpoint_objects_retired: int
    orphans_deleted: int
    """Objects deleted at open because nothing referred to them (a crash's leftovers)."""
    checkpoint_fallbacks: int
    """Opens from an older checkpoint because the newest was damaged (the WAL covered it)."""
    wal_entries_retained: int
    """Entries the WAL still holds above its truncation point."""
    wal_entries_since_checkpoint: int
    """Entries durable after the newest checkpoint's DSN, its own CKP entry included (what a
    restart replays; the reserve kept below the checkpoint is not counted)."""
    wal_bytes_retained: int | None
    """Bytes the WAL occupies (file: its segment files; memory: its records); None over
    logsvc, where the shard's store is on other machines."""
    cache: CacheStats | None
    rewrites_done: dict[str, int]
    """Flushes, merges and compactions committed by this engine since it opened."""
    rewrites_abandoned: int
    """Rewrites whose objects were written but whose commit no longer applied."""
    rewrites_running: int
    rewrites_due: int
    """The compaction backlog: rewrites the policy asks for now, running ones included."""
    maintenance_errors: int
    """Rewrites and automatic checkpoints that failed (an object store error...); each is
    tried again by a later round."""
    maintenance_last_error: str | None
    l0_memory_waits: int
    """Commits that waited for flushes because L0 held more than `L0_BYTES_HARD_MAX`."""
    garbage_objects_pending: int
    """Objects no block refers to any more, deleted once a checkpoint covers their drop."""
    objects_written: int
    objects_deleted: int
    history_retention_ms: int = 0
    """The history retention window (decision 0010; 0: none)."""
    history_oldest_ts: int = 0
    """The oldest timestamp `snapshot()` reads now (`Engine.oldest_ts`)."""


@dataclass(frozen=True, slots=True)
class ObjectAudit:
    """The object store against what the engine refers to (`audit_objects`)."""

    stored: int
    stored_bytes: int
    referenced: int
    missing: tuple[str, ...]
    """Referenced (by a block the engine holds or a retained checkpoint) but not in the
    store: always empty unless objects were lost outside the engine (a bucket emptied)."""
    unreferenced: tuple[str, ...]
    """In the store, referred to by nothing: a crash's orphans (deleted by the next
    writable open) and, in a running engine, garbage waiting for a covering checkpoint."""


def storage_stats(engine: Engine, now_ms: int | None = None) -> StorageStats:
    """The engine's storage figures now (memory only: no I/O but `stat` of WAL segments)."""
    now_ms = wall_ms() if now_ms is None else now_ms
    blocks = dict.fromkeys(LEVELS, 0)
    dropped = 0
    l0_bytes = 0
    persisted_rows = 0
    for table in engine.state.catalog.tables.values():
        for block in table.data.blocks.values():
            if block.drop_ts != TS_NEVER:
                dropped += 1
                continue
            if isinstance(block, L0Block):
                blocks["l0"] += 1
                l0_bytes += block.byte_size()
            else:
                blocks["l2" if block.level == BlockLevel.L2 else "l1"] += 1
                persisted_rows += block.rows
    checkpointer = engine.checkpointer
    newest = checkpointer.newest if checkpointer is not None else None
    figures = None
    if newest is not None:
        figures = CheckpointFigures(
            ckp_ts=newest.ckp_ts,
            ckp_dsn=newest.ckp_dsn,
            kind=newest.kind,
            name=newest.name,
            created_wall_ms=newest.created_wall_ms,
            age_s=(now_ms - newest.created_wall_ms) / 1000,
        )
    maintenance = engine.maintenance
    store = engine.block_store
    blockstore = store if isinstance(store, ObjectBlockStore) else None
    return StorageStats(
        objects=blockstore.store.description if blockstore is not None else None,
        blocks=blocks,
        blocks_dropped_held=dropped,
        l0_bytes=l0_bytes,
        persisted_rows=persisted_rows,
        checkpoint=figures,
        checkpoints_retained=len(checkpointer.retained) if checkpointer is not None else 0,
        checkpoints_taken=checkpointer.taken if checkpointer is not None else 0,
        checkpoint_last_duration_ms=checkpointer.last_duration_ms if checkpointer else 0.0,
        checkpoint_last_bytes=checkpointer.last_bytes if checkpointer is not None else 0,
        checkpoint_objects_retired=checkpointer.objects_retired if checkpointer else 0,
        orphans_deleted=checkpointer.orphans_deleted if checkpointer is not None else 0,
        checkpoint_fallbacks=checkpointer.fallbacks if checkpointer is not None else 0,
        wal_entries_retained=wal_entries_retained(engine),
        wal_entries_since_checkpoint=max(
            0, engine.driver.committed_dsn() - (newest.ckp_dsn if newest is not None else 0)
        ),
        wal_bytes_retained=wal_bytes(engine.backend),
        cache=blockstore.cache_stats() if blockstore is not None else None,
        rewrites_done=dict(maintenance.rewrites_done) if maintenance is not None else {},
        rewrites_abandoned=maintenance.rewrites_abandoned if maintenance is not None else 0,
        rewrites_running=maintenance.backlog if maintenance is not None else 0,
        rewrites_due=_rewrites_due(engine, now_ms),
        maintenance_errors=maintenance.errors if maintenance is not None else 0,
        maintenance_last_error=maintenance.last_error if maintenance is not None else None,
        l0_memory_waits=maintenance.memory_waits if maintenance is not None else 0,
        garbage_objects_pending=blockstore.pending_garbage if blockstore is not None else 0,
        objects_written=blockstore.objects_written if blockstore is not None else 0,
        objects_deleted=blockstore.objects_deleted if blockstore is not None else 0,
        history_retention_ms=checkpointer.history_retention_ms if checkpointer else 0,
        history_oldest_ts=engine.oldest_ts,
    )


def wal_entries_retained(engine: Engine) -> int:
    """Entries the WAL holds above its truncation point (cheap: the driver's record map)."""
    driver = engine.driver
    records = driver.lsn_map()  # a writable driver's view of the log above its truncation
    first = min((r.start_dsn for r in records if r.holds_dsns), default=None)
    if first is not None:
        return max(0, driver.committed_dsn() - first + 1)
    if engine.read_only and engine.replay_summary is not None:
        # A reader never appends: what its replay read is exactly what the log holds.
        return engine.replay_summary.entries_handled
    return 0


def wal_bytes(backend: LogBackend) -> int | None:
    """Bytes the WAL occupies, where this process can know it (module docstring)."""
    # Imported here: engine/opening.py imports the backends only when one is opened.
    from tae_driver.backends.file import FileBackend
    from tae_driver.backends.memory import MemoryBackend

    if isinstance(backend, FileBackend):
        total = 0
        for path in backend.segment_paths():
            with contextlib.suppress(FileNotFoundError):  # deleted by a truncation meanwhile
                total += os.path.getsize(path)
        return total
    if isinstance(backend, MemoryBackend):
        return sum(len(record.payload) for record in backend.records())
    return None


def _rewrites_due(engine: Engine, now_ms: int) -> int:
    """What the maintenance policy would start now, on every visible table, with no input
    counted busy: so the rewrites running now are included (their inputs are live until
    they commit). The same pure `compaction.plan` the maintenance loop runs."""
    maintenance = engine.maintenance
    if maintenance is None:
        return 0
    ts = engine.visible_ts
    gc_ts = engine.oldest_snapshot_ts()
    tables = [t for t in engine.state.catalog.tables.values() if t.visible(ts)]
    memory_full = sum(compaction.l0_bytes(t.data) for t in tables) >= (
        maintenance.policy.l0_bytes_max
    )
    due = 0
    for table in tables:
        plan = compaction.plan(
            table.table_id,
            table.data,
            now_ms=now_ms,
            gc_ts=gc_ts,
            busy=frozenset(),
            policy=maintenance.policy,
            memory_full=memory_full,
        )
        due += len(plan.tasks)
    return due


def audit_objects(engine: Engine) -> ObjectAudit:
    """List the object store (blocking) and compare it with what the engine refers to: every
    persisted block it holds (live or kept for a snapshot) and every retained checkpoint's
    manifest and objects. Only the engine's prefixes (data/, ckp/) are listed."""
    store = engine.block_store
    if not isinstance(store, ObjectBlockStore):
        return ObjectAudit(0, 0, 0, (), ())
    referenced: set[str] = set()
    for table in engine.state.catalog.tables.values():
        for block in table.data.blocks.values():
            if isinstance(block, PersistedBlock):
                referenced.add(block.object_name)
    checkpointer = engine.checkpointer
    for manifest in checkpointer.retained if checkpointer is not None else []:
        referenced.add(manifest.name)
        referenced.update(manifest.objects)
    stored: dict[str, int] = {}
    for prefix in (DATA_PREFIX, layout.PREFIX):
        for info in store.store.list(prefix):
            stored[info.name] = info.size_bytes
    return ObjectAudit(
        stored=len(stored),
        stored_bytes=sum(stored.values()),
        referenced=len(referenced),
        missing=tuple(sorted(referenced - stored.keys())),
        unreferenced=tuple(sorted(stored.keys() - referenced)),
    )


# --- Prometheus ------------------------------------------------------------------------------


class _EngineCollector(Collector):
    """Yields the engine's families from one `StorageStats` taken at collection time."""

    def __init__(self, engine: Engine, now_ms: int | None) -> None:
        self._engine = engine
        self._now_ms = now_ms

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        stats = engine.stats()
        figures = storage_stats(engine, self._now_ms)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"engine_{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"engine_{name}", doc, value=value)

        yield counter(
            "commits", "Entries made visible since open (transactions, rewrites).", stats.commits
        )
        yield counter("conflicts", "Commits refused by the conflict check.", stats.conflicts)
        yield gauge("live_rows", "Rows visible now, over every table.", stats.live_rows)
        yield gauge("read_only", "1 when the engine refuses commits.", int(stats.read_only))
        yield gauge("wal_failed", "1 when the WAL failed (read-only).", int(bool(stats.failed)))
        yield gauge(
            "standby_tail_failed",
            "1 while a standby's tail of the WAL is failing (it cannot take over).",
            int(stats.standby_failure is not None),
        )
        yield counter(
            "standby_catchups",
            "Times a standby fell behind the WAL's truncation and caught up from a checkpoint.",
            stats.standby_catchups,
        )
        yield counter(
            "standby_tail_failures",
            "Failed attempts of a standby's tail of the WAL (each logged and retried).",
            stats.standby_tail_failures,
        )
        blocks = GaugeMetricFamily(
            "engine_blocks", "Live blocks by level (l0 in memory).", labels=["level"]
        )
        for level in LEVELS:
            blocks.add_metric([level], figures.blocks[level])
        yield blocks
        yield gauge(
            "blocks_dropped_held",
            "Dropped blocks kept for open snapshots.",
            figures.blocks_dropped_held,
        )
        yield gauge("l0_bytes", "Arrow bytes of live L0 blocks.", figures.l0_bytes)
        yield gauge(
            "wal_entries_retained",
            "WAL entries above its truncation point.",
            figures.wal_entries_retained,
        )
        yield gauge(
            "wal_entries_since_checkpoint",
            "WAL entries after the newest checkpoint's DSN.",
            figures.wal_entries_since_checkpoint,
        )
        if figures.wal_bytes_retained is not None:
            yield gauge("wal_retained_bytes", "Bytes the WAL occupies.", figures.wal_bytes_retained)
        if figures.checkpoint is not None:
            yield gauge(
                "checkpoint_age_seconds",
                "Seconds since the newest checkpoint was written.",
                figures.checkpoint.age_s,
            )
        yield gauge(
            "checkpoints_retained", "Checkpoints kept in the store.", figures.checkpoints_retained
        )
        yield counter("checkpoints", "Checkpoints taken since open.", figures.checkpoints_taken)
        yield gauge(
            "checkpoint_last_duration_seconds",
            "How long the last checkpoint took.",
            figures.checkpoint_last_duration_ms / 1000,
        )
        yield gauge(
            "checkpoint_last_dump_bytes",
            "Bytes of L0 dumps the last checkpoint wrote.",
            figures.checkpoint_last_bytes,
        )
        yield counter(
            "checkpoint_objects_retired",
            "Objects deleted with retired checkpoints.",
            figures.checkpoint_objects_retired,
        )
        yield counter(
            "orphan_objects_deleted",
            "Objects a crash left behind, deleted at open.",
            figures.orphans_deleted,
        )
        yield counter(
            "checkpoint_fallbacks",
            "Opens from an older checkpoint because the newest was damaged.",
            figures.checkpoint_fallbacks,
        )
        done = CounterMetricFamily(
            "engine_rewrites", "Flushes, merges, compactions committed.", labels=["kind"]
        )
        for kind in ("flush", "merge", "compact"):
            done.add_metric([kind], figures.rewrites_done.get(kind, 0))
        yield done
        yield counter(
            "rewrites_abandoned",
            "Rewrites written but no longer applicable at commit.",
            figures.rewrites_abandoned,
        )
        yield gauge("rewrites_running", "Rewrites in flight.", figures.rewrites_running)
        yield gauge(
            "compaction_backlog",
            "Rewrites the policy asks for now, running ones included.",
            figures.rewrites_due,
        )
        yield counter(
            "maintenance_errors",
            "Failed rewrites and automatic checkpoints (retried later).",
            figures.maintenance_errors,
        )
        yield counter(
            "l0_memory_waits",
            "Commits that waited for flushes (L0 past its hard limit).",
            figures.l0_memory_waits,
        )
        yield gauge(
            "garbage_objects_pending",
            "Objects waiting for a checkpoint to cover their drop.",
            figures.garbage_objects_pending,
        )
        yield counter("objects_written", "Block objects written.", figures.objects_written)
        yield counter("objects_deleted", "Block objects deleted.", figures.objects_deleted)
        yield gauge(
            "history_retention_seconds",
            "The history retention window (0: history only since the newest checkpoint).",
            figures.history_retention_ms / 1000,
        )
        yield gauge(
            "history_oldest_timestamp_seconds",
            "Wall time of the oldest timestamp a snapshot reads (0: the first commit).",
            (figures.history_oldest_ts >> 16) / 1000,
        )
        cache = figures.cache
        if cache is not None:
            yield gauge("cache_capacity_bytes", "Buffer cache bound.", cache.capacity_bytes)
            yield gauge("cache_used_bytes", "Bytes in the buffer cache.", cache.used_bytes)
            yield gauge("cache_pinned_bytes", "Bytes pinned by reads.", cache.pinned_bytes)
            yield counter("cache_hits", "Buffer cache hits.", cache.hit_count)
            yield counter("cache_misses", "Buffer cache misses (loads).", cache.miss_count)
            yield counter("cache_evictions", "Entries evicted.", cache.eviction_count)
            yield gauge(
                "cache_hit_ratio", "Hits over lookups since open (0 before any).", cache.hit_ratio
            )


def render(engine: Engine, now_ms: int | None = None) -> str:
    """The engine's metrics in Prometheus text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(engine, now_ms))
    return generate_latest(registry).decode()


__all__ = [
    "LEVELS",
    "CheckpointFigures",
    "ObjectAudit",
    "StorageStats",
    "audit_objects",
    "render",
    "storage_stats",
    "wal_bytes",
]
