"""The shard replicas this node hosts: opened at start, and started or stopped at runtime.

At start, the node placement file (placement.py) says which shards to open (the config's
[[shards]] only the first time, and for shards the file has never seen). At runtime a
shard's leader asks this node (through the admin API, logsvc/node/node_view.py) to start
hosting a shard it is adding this node to (`host`), or to stop hosting one it removed
this node from (`release`). Both are serialized per node by one asyncio lock, run their
blocking work (opening a store, closing one, writing the placement file, archiving a
directory) on the default executor, and register or unregister the shard with the data
plane on the event loop.

Crash safety, in order of the steps:

* `host`: the placement file records the shard (with the members given) before the
  replica is created, so a crash afterwards restarts the same joining replica; the
  replica's own members file (logsvc/shard/membership.py) then takes over the peers.
* `release`: the data plane stops serving the shard, the replica closes (its store
  synced), the placement file records the release, then the replica's directory is
  archived under `<data_dir>/removed/`. A crash before the placement write restarts the
  replica (still listed as hosted): harmless, the leader's release is retried by the
  operator or the replica sits out (its peers refuse a node they removed, see 0002); a
  crash after it leaves the directory in place, archived at the next `host` of the shard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from logsvc.node import placement as node_placement
from logsvc.node.limits import ServerLimits
from logsvc.node.server import DataPlaneServer
from logsvc.node.shard_host import ShardHost
from logsvc.node_config import NodeConfig
from logsvc.shard import small_file
from logsvc.shard.raft.config import RaftFatal
from logsvc.shard.replica import ShardReplica
from logsvc.shard.scheduler import RaftScheduler
from logsvc.shard.small_file import SmallFileCorrupt
from logsvc.store import ShardStore, StoreError
from logsvc.store.fs import FileSystem, OsFileSystem
from logsvc.store.journal import JOURNAL_DIR_NAME, NodeJournal
from logsvc.store.limits import DEFAULT_JOURNAL_LIMITS
from logsvc.store.meta import load_meta

log = logging.getLogger("logsvc.node")

# Replicas opened at once at start (each on the default executor's threads).
OPENS_AT_ONCE_MAX = 8
# A file in a replica's directory while it is a non-voting learner (docs/decisions/0005):
# written before the placement records the shard, removed (durably) at its promotion.
LEARNER_MARKER = "learner"
LEARNER_MARKER_TEXT = b"a non-voting learner: promoted by the leader once caught up\n"


class ShardHosting:
    def __init__(
        self,
        config: NodeConfig,
        reader: Executor,
        limits: ServerLimits,
        file_system: FileSystem | None = None,
        raft_scheduler: RaftScheduler | None = None,
    ) -> None:
        """`file_system`: the stores' port (None: the real one), as `serve()` got it.
        `raft_scheduler`: the node's, ticking every replica (None: each its own)."""
        self._raft_scheduler = raft_scheduler
        self._config = config
        self._reader = reader
        self._limits = limits
        self._store_fs = file_system
        self._fs: FileSystem = file_system if file_system is not None else OsFileSystem()
        self._path = os.path.join(config.data_dir, node_placement.FILE_NAME)
        self._placement: node_placement.Placement | None = None
        self._lock = asyncio.Lock()
        self._server: DataPlaneServer | None = None
        self.hosts: dict[int, ShardHost] = {}  # read on the event loop only
        # Hosted shards whose replica refused to open (corruption): shard id -> why.
        self.failed: dict[int, str] = {}
        self.replicas: dict[int, ShardReplica] = {}
        # `[node] journal = "node"`: every replica's store journals into this one
        # (docs/decisions/0011-shared-journal.md); opened (and replayed) before any replica.
        self._node_journal: NodeJournal | None = None

    # ------------------------------------------------------------------ start and stop

    async def open(self) -> None:
        """Load (or create) the placement file and open every hosted shard's replica.
        SmallFileCorrupt if the file is damaged: the node refuses to start rather than
        guess which shards it hosts."""
        loop = asyncio.get_running_loop()
        self._placement = await loop.run_in_executor(None, self._load_placement)
        if self._config.journal_mode == "node":
            self._node_journal = await loop.run_in_executor(None, self._open_node_journal)
        # Several at once: opening a replica syncs its newest segment and its directory
        # (recovery), and those waits overlap (a thousand replicas in seconds, not a minute).
        opening = asyncio.Semaphore(OPENS_AT_ONCE_MAX)

        async def open_one(entry: node_placement.ShardEntry) -> None:
            async with opening:
                await self._open_hosted(entry)

        await asyncio.gather(*(open_one(entry) for entry in self._placement.hosted))

    async def _open_hosted(self, entry: node_placement.ShardEntry) -> None:
        """Open one replica the placement file lists; a failure is logged, not raised."""
        try:
            await self._open_replica(entry.shard_id, entry.join_members)
        except KeyError as exc:
            # Placed by the config once, and the config no longer places it here: the
            # replica's members file (if any) knows its peers, but with none there is
            # nobody to start it with. An operator's edit; say so and serve the rest.
            log.error("shard %d: not opened: %s", entry.shard_id, exc)
        except (StoreError, RaftFatal, SmallFileCorrupt) as exc:
            # A damaged replica (ARCHITECTURE.md §3 rule 5: corruption is reported,
            # never served, never skipped) must not take the node's other shards down
            # with it. It serves nothing; its peers keep the shard available; the
            # operator repairs it by removing this node from the shard and adding it
            # back (the re-added replica starts empty and catches up from the leader;
            # the damaged directory is archived, not deleted).
            self.failed[entry.shard_id] = f"{type(exc).__name__}: {exc}"
            log.critical(
                "shard %d: the replica cannot open and is quarantined (serving the "
                "other shards): %s. Repair: DELETE /v1/shards/%d/replicas/%s on the "
                "shard's leader, then POST /v1/shards/%d/replicas with this node",
                entry.shard_id,
                exc,
                entry.shard_id,
                self._config.node_id,
                entry.shard_id,
            )

    def attach(self, server: DataPlaneServer) -> None:
        """Serve every hosted shard on `server`, and the shards hosted from now on."""
        self._server = server
        for host in self.hosts.values():
            server.add_host(host)

    async def close(self) -> None:
        """Shutdown: every host and replica (the data plane has stopped already)."""
        loop = asyncio.get_running_loop()
        for host in self.hosts.values():
            await host.close()
        for replica in self.replicas.values():
            await loop.run_in_executor(None, replica.close)
        if self._node_journal is not None:
            await loop.run_in_executor(None, self._node_journal.close)

    def _open_node_journal(self) -> NodeJournal:
        store_limits = self._config.store_limits
        return NodeJournal.open(
            os.path.join(self._config.data_dir, JOURNAL_DIR_NAME),
            base_dir=self._config.data_dir,
            fs=self._fs,
            limits=dataclasses.replace(
                DEFAULT_JOURNAL_LIMITS,
                record_payload_bytes_max=store_limits.record_payload_bytes_max,
                sync_wait_ms_max=store_limits.sync_wait_ms_max,
            ).validate(),
            store_limits=store_limits,
        )

    # ------------------------------------------------------------------ runtime changes

    async def host(
        self, shard_id: int, members: Sequence[str], *, learner: bool = False
    ) -> ShardHost:
        """Start hosting `shard_id` to join it; `members` are its members (node ids) as
        the leader knows them; a non-voting learner first when `learner` (the marker
        file in its directory says so across restarts). Already hosted: the running
        replica (a retried call)."""
        async with self._lock:
            running = self.hosts.get(shard_id)
            if running is not None:
                return running
            self._config.shard(shard_id)  # KeyError: not a shard of this cluster
            loop = asyncio.get_running_loop()
            shard_dir = self._config.shard_data_dir(shard_id)
            # Left from an earlier membership of this node (released before a crash could
            # archive it, or quarantined for corruption): a joining replica starts with an
            # empty log, as its peers expect, but keeps the old term and vote: a vote it
            # cast must not be cast again differently in the same term (Raft's votedFor
            # is durable for this reason; two leaders in one term otherwise).
            old_vote = await loop.run_in_executor(None, self._recorded_vote, shard_id)
            archived = await loop.run_in_executor(
                None, node_placement.archive_dir, shard_dir, self._config.data_dir
            )
            if archived is not None:
                log.warning("shard %d: archived an old replica directory to %s", shard_id, archived)
            self.failed.pop(shard_id, None)
            if learner:  # before the placement: a crash in between leaves no hosted shard
                await loop.run_in_executor(None, self._mark_learner, shard_id)
            before = self._require_placement()
            placement = before.host(shard_id, members)
            await loop.run_in_executor(None, self._save_placement, placement)
            entry = placement.entry(shard_id)
            assert entry is not None
            try:
                if old_vote is not None:
                    await loop.run_in_executor(None, self._seed_vote, shard_id, old_vote)
                host = await self._open_replica(shard_id, entry.join_members)
            except BaseException:
                await loop.run_in_executor(None, self._save_placement, before)
                raise
            log.info(
                "shard %d: hosting a %s to join members %s",
                shard_id,
                "learner" if learner else "replica",
                list(members),
            )
            return host

    async def promote(self, shard_id: int, members: Sequence[str]) -> ShardHost:
        """The learner of `shard_id` caught up: close it, drop its marker, and reopen the
        same journal as a joining voter of `members` (the leader then adds it). Not a
        learner any more: the running replica (a retried call). KeyError: not hosted."""
        async with self._lock:
            host = self.hosts.get(shard_id)
            if host is None:
                raise KeyError(f"shard {shard_id} is not hosted here")
            if not host.replica.node.learner:
                return host
            loop = asyncio.get_running_loop()
            if self._server is not None:
                self._server.remove_host(shard_id)
            del self.hosts[shard_id]
            await host.close()
            replica = self.replicas.pop(shard_id)
            await loop.run_in_executor(None, replica.close)
            await loop.run_in_executor(None, self._unmark_learner, shard_id)
            placement = self._require_placement().host(shard_id, members)
            await loop.run_in_executor(None, self._save_placement, placement)
            entry = placement.entry(shard_id)
            assert entry is not None
            promoted = await self._open_replica(shard_id, entry.join_members)
            log.info(
                "shard %d: the learner caught up: now a voter joining %s", shard_id, list(members)
            )
            return promoted

    async def release(self, shard_id: int) -> bool:
        """Stop hosting `shard_id` and archive its replica; False if it was not hosted."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            host = self.hosts.pop(shard_id, None)
            placement = self._require_placement()
            entry = placement.entry(shard_id)
            if host is None:
                self.failed.pop(shard_id, None)
                if entry is not None and entry.hosted:  # e.g. it failed to open
                    await loop.run_in_executor(
                        None, self._save_placement, placement.release(shard_id)
                    )
                return False
            if self._server is not None:
                self._server.remove_host(shard_id)
            await host.close()
            replica = self.replicas.pop(shard_id)
            await loop.run_in_executor(None, replica.close)
            await loop.run_in_executor(None, self._save_placement, placement.release(shard_id))
            archived = await loop.run_in_executor(
                None,
                node_placement.archive_dir,
                self._config.shard_data_dir(shard_id),
                self._config.data_dir,
            )
            log.warning(
                "shard %d: no longer hosted here (removed from its members); replica "
                "archived to %s",
                shard_id,
                archived,
            )
            return True

    # ------------------------------------------------------------------ internals

    async def _open_replica(self, shard_id: int, join_members: tuple[str, ...] | None) -> ShardHost:
        loop = asyncio.get_running_loop()
        learner = join_members is not None and self._fs.exists(self._learner_marker(shard_id))
        replica_config = dataclasses.replace(
            self._config.replica_config_for(
                shard_id, join_members, joining=join_members is not None, learner=learner
            ),
            file_system=self._store_fs,
            raft_scheduler=self._raft_scheduler,
            node_journal=self._node_journal,
        )
        replica = await loop.run_in_executor(None, ShardReplica, replica_config)
        replica.start()
        host = ShardHost(
            shard_id, replica, self._reader, self._limits, self._data_address_of(shard_id)
        )
        self.replicas[shard_id] = replica
        self.hosts[shard_id] = host
        if self._server is not None:
            self._server.add_host(host)
        return host

    def _learner_marker(self, shard_id: int) -> str:
        return os.path.join(self._config.shard_data_dir(shard_id), LEARNER_MARKER)

    def _mark_learner(self, shard_id: int) -> None:
        shard_dir = self._config.shard_data_dir(shard_id)
        self._fs.makedirs(shard_dir)
        small_file.write_durably(self._fs, self._learner_marker(shard_id), LEARNER_MARKER_TEXT)

    def _unmark_learner(self, shard_id: int) -> None:
        """Durably: a crash after it reopens the replica as the joining voter it became."""
        path = self._learner_marker(shard_id)
        if self._fs.exists(path):
            self._fs.unlink(path)
            self._fs.fsync_dir(self._config.shard_data_dir(shard_id))

    def _journal_dir(self, shard_id: int) -> str:
        return os.path.join(self._config.shard_data_dir(shard_id), "journal")

    def _recorded_vote(self, shard_id: int) -> tuple[int, str | None] | None:
        """(term, voted_for) of an old replica directory of the shard, if readable."""
        try:
            meta = load_meta(self._fs, self._journal_dir(shard_id))
        except StoreError as exc:
            log.warning(
                "shard %d: the old replica's term/vote file is unreadable (%s): the new "
                "replica starts at term 0",
                shard_id,
                exc,
            )
            return None
        return None if meta is None else (meta.term, meta.voted_for)

    def _seed_vote(self, shard_id: int, vote: tuple[int, str | None]) -> None:
        store = ShardStore.open(self._journal_dir(shard_id), fs=self._store_fs)
        try:
            store.save_vote(*vote)
        finally:
            store.close()

    def _data_address_of(self, shard_id: int) -> Callable[[str | None], str | None]:
        """Raft address of the shard's leader -> its data-plane address (the hint in a
        NOT_LEADER answer). Every node of the cluster: any may hold a replica."""
        addresses = {node.raft_address(shard_id): node.data_address for node in self._config.nodes}

        def lookup(raft_address: str | None) -> str | None:
            return None if raft_address is None else addresses.get(raft_address)

        return lookup

    def _require_placement(self) -> node_placement.Placement:
        assert self._placement is not None, "open() first"
        return self._placement

    def _load_placement(self) -> node_placement.Placement:
        self._fs.makedirs(self._config.data_dir)
        loaded = node_placement.load(self._fs, self._path, self._config.node_id)
        if loaded is None:
            placement = node_placement.from_config(self._config.node_id, self._config.shards)
        else:
            placement = loaded.merged_with(self._config.shards)
        if placement != loaded:
            node_placement.save(self._fs, self._path, placement)
        return placement

    def _save_placement(self, placement: node_placement.Placement) -> None:
        node_placement.save(self._fs, self._path, placement)
        self._placement = placement
