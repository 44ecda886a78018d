"""One simulated node: a FaultFS "disk" that outlives the process, and the real
`ShardReplica` built on it while the node is up.

Crash kinds (chaos-plan §4.4, §4.5): `kill` is SIGKILL (the page cache survives: every
byte written stays, synced or not); `power_loss` also cuts the disk back to what was
synced, in one of FaultFS's modes (`trunc`, `torn`, `zeros`) and with directory entries
reverted, kept or a random mix. A restart opens a new replica on the same FaultFS, which
runs the store's real recovery.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass

from logsvc.shard.limits import ShardLimits
from logsvc.shard.raft import config as raft_config
from logsvc.shard.replica import ReplicaConfig, ShardReplica, SimulatedRuntime
from logsvc.store import StoreLimits
from logsvc.store.fs import DirLock, FileSystem, ReadableFile, WritableFile
from tests.chaos.dst.clock import VirtualClock
from tests.chaos.dst.network import SimTransport
from tests.support.faultfs import FaultFS, NamesMode, PowerLossMode

SECRET = "dst-cluster-secret"
SHARD = 1


@dataclass(frozen=True, slots=True)
class Timing:
    """Raft timing for the simulation (milliseconds of each node's local clock)."""

    election_timeout_ms_min: int = 1000
    election_timeout_ms_max: int = 2500
    heartbeat_ms: int = 100
    leader_fallback_ms: int = 5000
    connection_timeout_ms: int = 3500
    # 0: no quiescence (the fixed seeds' runs, as before it existed); else the idle time
    # after which a leader asks its followers to go quiet (logsvc/shard/quiescence.py).
    quiesce_after_ms: int = 0


# Small segments and buffers so that a short run rolls segments, reads from "disk", and
# deletes segments below a truncation point; every fdatasync copies a whole file in
# FaultFS, so small segments also keep the simulator fast.
SIM_STORE_LIMITS = StoreLimits(
    segment_bytes_max=48 * 1024,
    write_buffer_bytes_max=16 * 1024,
    cache_bytes_max=64 * 1024,
).validate()
# One segment for the negative control: its lying fdatasync must leave a torn newest
# segment (which recovery cuts), not an empty sealed one (which recovery refuses).
ONE_SEGMENT_STORE_LIMITS = StoreLimits(
    segment_bytes_max=64 * 1024 * 1024,
    write_buffer_bytes_max=16 * 1024,
    cache_bytes_max=64 * 1024,
).validate()
SIM_SHARD_LIMITS = ShardLimits(dedupe_clients_max=64).validate()


class SimNode:
    def __init__(
        self,
        name: str,
        addresses: dict[str, str],
        clock: VirtualClock,
        timing: Timing,
        *,
        lying_disk: bool = False,
    ) -> None:
        self.name = name
        self.address = addresses[name]
        self._peers = tuple(a for n, a in sorted(addresses.items()) if n != name)
        self._clock = clock
        self._timing = timing
        self.disk = FaultFS(rng=random.Random(f"faultfs:{name}"))
        self._lying_disk = lying_disk
        self.replica: ShardReplica | None = None
        self.incarnation = 0
        self.fatal: str | None = None  # why the current incarnation stopped, if it did

    @property
    def up(self) -> bool:
        return self.replica is not None

    def start(self) -> None:
        """Open the replica (the store's recovery runs here). Raises what the replica's
        constructor raises (a store that cannot be recovered, a fatal snapshot)."""
        assert self.replica is None
        timing = self._timing
        config = ReplicaConfig(
            data_dir=f"/{self.name}",
            raft=raft_config.RaftConfig(
                self_address=self.address,
                peers=self._peers,
                secret=SECRET,
                snapshot_path=f"/{self.name}/snapshot",
                election_timeout_ms_min=timing.election_timeout_ms_min,
                election_timeout_ms_max=timing.election_timeout_ms_max,
                heartbeat_ms=timing.heartbeat_ms,
                leader_fallback_ms=timing.leader_fallback_ms,
                connection_timeout_ms=timing.connection_timeout_ms,
                quiesce_after_ms=timing.quiesce_after_ms,
            ),
            store_limits=ONE_SEGMENT_STORE_LIMITS if self._lying_disk else SIM_STORE_LIMITS,
            shard_limits=SIM_SHARD_LIMITS,
            file_system=self._file_system(),
            node_id=self.name,
            shard=SHARD,
            simulated=SimulatedRuntime(
                transport_base=SimTransport,
                clock_ms=lambda: self._clock.local_ms(self.name),
            ),
        )
        with self._clock.running(self.name):
            self.replica = ShardReplica(config)
        self.incarnation += 1
        self.fatal = None

    def _file_system(self) -> FileSystem:
        return _LyingDisk(self.disk) if self._lying_disk else self.disk

    def tick(self) -> bool:
        """One Raft tick on this node's clock; False if the replica stopped (fatal)."""
        assert self.replica is not None
        if self.fatal is not None:
            return False
        with self._clock.running(self.name):
            alive = self.replica.tick()
        if not alive:
            cause = self.replica.node.fatal
            assert cause is not None
            self.fatal = "".join(traceback.format_exception(cause)).strip()
        return alive

    def kill(self) -> None:
        """SIGKILL: nothing more is written; the page cache survives."""
        replica, self.replica = self.replica, None
        if replica is not None:
            with self._clock.running(self.name):
                replica.kill()
        self.disk.crash()

    def power_loss(self, mode: PowerLossMode, names: NamesMode, rng: random.Random) -> None:
        """The machine loses power: a kill, then the disk keeps only what was synced."""
        self.kill()
        self.disk.power_loss(mode, rng, names=names)


class _LyingDisk:
    """The negative control's disk: `fdatasync` of a segment file returns without making
    anything durable (stock pysyncobj's journal: an mmap nobody ever msyncs). Everything
    else, including the term/vote file and directory entries, is honest: only the sync the
    durable transport relies on before acknowledging is broken."""

    def __init__(self, inner: FaultFS) -> None:
        self._inner = inner

    def makedirs(self, dir_path: str) -> None:
        self._inner.makedirs(dir_path)

    def listdir(self, dir_path: str) -> list[str]:
        return self._inner.listdir(dir_path)

    def exists(self, path: str) -> bool:
        return self._inner.exists(path)

    def file_size(self, path: str) -> int:
        return self._inner.file_size(path)

    def read_file(self, path: str) -> bytes:
        return self._inner.read_file(path)

    def open_write(self, path: str, *, create: bool) -> WritableFile:
        handle = self._inner.open_write(path, create=create)
        return _LyingFile(handle) if path.endswith(".seg") else handle

    def open_read(self, path: str) -> ReadableFile:
        return self._inner.open_read(path)

    def rename(self, src_path: str, dst_path: str) -> None:
        self._inner.rename(src_path, dst_path)

    def unlink(self, path: str) -> None:
        self._inner.unlink(path)

    def fsync_dir(self, dir_path: str) -> None:
        self._inner.fsync_dir(dir_path)

    def lock_dir(self, dir_path: str) -> DirLock:
        return self._inner.lock_dir(dir_path)


class _LyingFile:
    def __init__(self, inner: WritableFile) -> None:
        self._inner = inner

    def write(self, data: bytes) -> None:
        self._inner.write(data)

    def truncate(self, size_bytes: int) -> None:
        self._inner.truncate(size_bytes)

    def write_zeros(self, upto_bytes: int) -> None:
        self._inner.write_zeros(upto_bytes)

    def allocated_bytes(self) -> int:
        return self._inner.allocated_bytes()

    def fdatasync(self) -> None:
        return None  # the lie

    def size(self) -> int:
        return self._inner.size()

    def close(self) -> None:
        self._inner.close()
