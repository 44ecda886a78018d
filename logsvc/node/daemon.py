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
import signal
from concurrent.futures import ThreadPoolExecutor

from logsvc import gc_tuning
from logsvc.admin.app import create_app
from logsvc.admin.metrics import Metrics
from logsvc.config import ConfigError, NodeConfig, load_node_config, main_config_error
from logsvc.node.admin_server import AdminServer
from logsvc.node.hosting import ShardHosting
from logsvc.node.node_view import DaemonNodeView
from logsvc.node.server import DataPlaneServer
from logsvc.shard.replica import ShardReplica
from logsvc.store.fs import FileSystem

log = logging.getLogger("logsvc.node")

READER_THREADS = 4  # cold reads (disk) for all shards of the node
SHUTDOWN_GRACE_S = 5.0


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
    gc_tuning.tune_for_latency()
    asyncio.run(_run(config, file_system))
    return 0


async def _run(config: NodeConfig, file_system: FileSystem | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    reader = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="reader")
    limits = config.server_limits
    # The shards hosted: the node's placement file (the config's only at first), and
    # those added or removed at runtime by membership changes (hosting.py).
    hosting = ShardHosting(config, reader, limits, file_system)
    loop.add_signal_handler(signal.SIGUSR1, lambda: _log_stats(config, hosting.replicas))
    server: DataPlaneServer | None = None
    admin: AdminServer | None = None
    view: DaemonNodeView | None = None
    try:
        await hosting.open()
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
        if view is not None:
            view.stopping()  # /healthz turns 503 while we drain
        if server is not None:
            await server.close(SHUTDOWN_GRACE_S)
        if admin is not None:
            await admin.close()
        await hosting.close()
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
