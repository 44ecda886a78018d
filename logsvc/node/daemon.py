"""`logsvc serve --config FILE.toml`: one node process hosting its shards' replicas.

Start: load and validate the config (errors exit 2, naming the key), open every hosted
replica (store recovery, Raft port bound), start the data plane. Stop on SIGTERM/SIGINT:
stop accepting, let in-flight requests finish (bounded), stop the Raft tick threads, then
close the stores (final sync). A SIGKILL at any moment loses nothing acknowledged: an
acknowledgement always followed a majority fsync.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
from concurrent.futures import ThreadPoolExecutor

from logsvc import gc_tuning
from logsvc.admin.app import create_app
from logsvc.admin.metrics import Metrics
from logsvc.config import ConfigError, load_node_config, main_config_error
from logsvc.node.admin_server import AdminServer
from logsvc.node.hosting import ShardHosting
from logsvc.node.leader_balancer import LeaderBalancer
from logsvc.node.node_view import DaemonNodeView
from logsvc.node.server import DataPlaneServer
from logsvc.node_config import NodeConfig
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.raft.config import CONNECTION_RETRY_MS_DEFAULT
from logsvc.shard.raft.patches import monotonic_s
from logsvc.shard.replica import ShardReplica
from logsvc.shard.scheduler import RaftScheduler
from logsvc.store.errors import StoreError
from logsvc.store.fs import FileSystem

log = logging.getLogger("logsvc.node")

READER_THREADS = 4  # cold reads (disk) for all shards of the node
SHUTDOWN_GRACE_S = 5.0
# Open descriptors a hosted replica holds: its Raft listening socket, a connection to each
# of 2 or 4 peers, its store's directory lock and open segment, its snapshot while shipped.
FDS_PER_REPLICA = 8
FDS_BASE = 512  # the process itself, client connections beyond that are bounded apart


def serve(config_path: str, *, file_system: FileSystem | None = None) -> int:
    """Run the node until SIGTERM/SIGINT. `file_system` replaces the real file-system port
    of every hosted store (the chaos suite's durability ledger); None in production."""
    try:
        config = load_node_config(config_path)
    except ConfigError as exc:
        return main_config_error(exc)
    from logsvc import logs

    # [node] log_level and log_format; replaces the CLI's setup made before the config
    # was known. Lines never carry the secret or the token (logsvc/logs.py).
    logs.configure_for_node(config)
    _raise_open_files_limit(len(config.shards_hosted()))
    gc_tuning.tune_for_latency()
    try:
        asyncio.run(_run(config, file_system))
    except StoreError as exc:
        # The node journal (`[node] journal = "node"`) refused to open: damage it will not
        # guess about (docs/decisions/0011). A replica's own errors never get here: they
        # quarantine that replica only (hosting.py).
        log.critical("the node cannot start: %s", exc)
        return 1
    return 0


def _raise_open_files_limit(shards: int) -> None:
    """A node hosting a thousand shards holds several thousand descriptors (a Raft port and
    connections per replica, a segment and a lock per store); distributions default the
    soft limit to 1024. Raise it to the hard limit, and say so if even that is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FDS_BASE + FDS_PER_REPLICA * shards
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open files limit (RLIMIT_NOFILE) raised from %d to %s", soft, hard)
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open files limit %d is below the ~%d descriptors %d replicas may need; raise "
            "the hard limit (LimitNOFILE= in the systemd unit, ulimit -Hn)",
            soft,
            wanted,
            shards,
        )


async def _run(config: NodeConfig, file_system: FileSystem | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reader = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="reader")
    limits = config.server_limits
    # The shards hosted: the node's placement file (the config's only at first), and
    # those added or removed at runtime by membership changes (hosting.py).
    # One scheduler ticks every replica of the node (logsvc/shard/scheduler.py), on
    # [raft] threads workers; its liveness table lets idle shards go quiet.
    raft_scheduler = RaftScheduler(
        NodeLiveness(
            config.node_id,
            interval_s=config.raft.heartbeat_ms / 1000.0,
            lapse_s=config.raft.election_timeout_ms_min / 1000.0,
            now_s=monotonic_s(),
        ),
        config.raft_node_of(),
        workers=config.raft.threads,
        reconnect_s=CONNECTION_RETRY_MS_DEFAULT / 1000.0,
        clock=monotonic_s,
    )
    raft_scheduler.start()
    hosting = ShardHosting(config, reader, limits, file_system, raft_scheduler)
    loop.add_signal_handler(signal.SIGUSR1, lambda: _log_stats(config, hosting.replicas))
    server: DataPlaneServer | None = None
    admin: AdminServer | None = None
    view: DaemonNodeView | None = None
    balancing: asyncio.Task[None] | None = None
    try:
        await hosting.open()
        balancer = LeaderBalancer(
            config.node_id,
            hosting.replicas,
            raft_scheduler.node_of,
            lambda node: not raft_scheduler.liveness.lapsed(node, monotonic_s()),
            config.raft.leader_moves_per_s,
            monotonic_s,
        )
        if balancer.enabled:
            balancing = asyncio.create_task(balancer.run(), name="leader-balancer")
        gc_tuning.freeze_now()  # the replicas' long-lived state: out of the collector's walks
        server = DataPlaneServer({}, config.token, limits)
        host, _, port = config.node.data_address.rpartition(":")
        hosting.attach(server)
        await server.start(host.strip("[]"), int(port))
        metrics = Metrics(config.node_id)
        view = DaemonNodeView(config, hosting, server, metrics)
        app = create_app(
            view, config.token, on_auth_failure=lambda: metrics.count_auth_failure("admin")
        )
        admin_host, _, admin_port = config.node.admin_address.rpartition(":")
        admin = AdminServer(app, admin_host.strip("[]"), int(admin_port))
        await admin.start()
        log.info(
            "serving shards %s on %s (admin API on %s)",
            sorted(hosting.hosts),
            config.node.data_address,
            config.node.admin_address,
        )
        await stop.wait()
        log.info("stopping")
    finally:
        if balancing is not None:
            balancing.cancel()
        if view is not None:
            view.stopping()  # /healthz turns 503 while we drain
        if server is not None:
            await server.close(SHUTDOWN_GRACE_S)
        if admin is not None:
            await admin.close()
        await hosting.close()
        raft_scheduler.close()
        reader.shutdown(wait=True)
        log.info("stopped")


def _log_stats(config: NodeConfig, replicas: dict[int, ShardReplica]) -> None:
    """SIGUSR1: one JSON line per hosted shard with its store counters (the benchmark reads
    them; the admin API of issue 6 will export the same as metrics)."""
    for shard_id, replica in sorted(replicas.items()):
        stats = replica.store.stats()
        line = {
            "node": config.node_id,
            "shard": shard_id,
            "syncs": stats.syncs,
            "fdatasyncs": stats.fdatasyncs,
            "synced_bytes": stats.synced_bytes,
            "durable_index": stats.durable_index,
        }
        print(f"STATS {json.dumps(line)}", flush=True)
