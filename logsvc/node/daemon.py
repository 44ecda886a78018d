"""`logsvc serve --config FILE.toml`: one node process hosting its shards' replicas.

Start: load and validate the config (errors exit 2, naming the key), open every hosted
replica (store recovery, Raft port bound), start the data plane. Stop on SIGTERM/SIGINT:
stop accepting, let in-flight requests finish (bounded), stop the Raft tick threads, then
close the stores (final sync). A SIGKILL at any moment loses nothing acknowledged: an
acknowledgement always followed a majority fsync.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from logsvc.admin.app import create_app
from logsvc.admin.metrics import Metrics
from logsvc.config import ConfigError, NodeConfig, load_node_config, main_config_error
from logsvc.node.admin_server import AdminServer
from logsvc.node.node_view import DaemonNodeView
from logsvc.node.server import DataPlaneServer, ServerLimits
from logsvc.node.shard_host import ShardHost, ShardHostLimits
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
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s node={config.node_id} %(name)s: %(message)s",
        force=True,  # the CLI configured logging before the config was known
    )
    asyncio.run(_run(config, file_system))
    return 0


def leader_addresses(config: NodeConfig, shard_id: int) -> dict[str, str]:
    """Raft address of each replica of the shard -> that node's data-plane address (what a
    client must be told in a NOT_LEADER answer)."""
    shard = config.shard(shard_id)
    return {
        config.raft_address(node_id, shard_id): config.node_by_id(node_id).data_address
        for node_id in shard.replicas
    }


def _data_address_of(config: NodeConfig, shard_id: int) -> Callable[[str | None], str | None]:
    addresses = leader_addresses(config, shard_id)

    def lookup(raft_address: str | None) -> str | None:
        return None if raft_address is None else addresses.get(raft_address)

    return lookup


async def _run(config: NodeConfig, file_system: FileSystem | None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    replicas: dict[int, ShardReplica] = {}
    loop.add_signal_handler(signal.SIGUSR1, lambda: _log_stats(config, replicas))
    reader = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="reader")
    limits = config.server_limits
    host_limits = ShardHostLimits(
        appends_queued_max=limits.appends_queued_per_shard_max,
        group_bytes_max=limits.batch_bytes_max,
        group_linger_ms_max=float(limits.batch_delay_ms_max),
        tail_wait_ms_max=limits.tail_wait_ms_max,
    )
    hosts: dict[int, ShardHost] = {}
    server: DataPlaneServer | None = None
    admin: AdminServer | None = None
    view: DaemonNodeView | None = None
    try:
        for shard in config.shards_hosted():
            replica_config = dataclasses.replace(
                config.replica_config_for(shard.id), file_system=file_system
            )
            replica = await loop.run_in_executor(None, ShardReplica, replica_config)
            replicas[shard.id] = replica
            replica.start()
            hosts[shard.id] = ShardHost(
                shard.id, replica, reader, host_limits, _data_address_of(config, shard.id)
            )
        server = DataPlaneServer(
            hosts,
            config.token,
            ServerLimits(
                connections_max=limits.connections_max,
                requests_inflight_max=limits.inflight_requests_per_connection_max,
            ),
        )
        host, _, port = config.node.data_address.rpartition(":")
        await server.start(host.strip("[]"), int(port))
        metrics = Metrics(config.node_id)
        view = DaemonNodeView(config, hosts, server, metrics)
        app = create_app(
            view, config.token, on_auth_failure=lambda: metrics.count_auth_failure("admin")
        )
        admin_host, _, admin_port = config.node.admin_address.rpartition(":")
        admin = AdminServer(app, admin_host.strip("[]"), int(admin_port))
        await admin.start()
        log.info(
            "serving shards %s on %s (admin API on %s)",
            sorted(hosts),
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
        for shard_host in hosts.values():
            await shard_host.close()
        for replica in replicas.values():
            await loop.run_in_executor(None, replica.close)
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
