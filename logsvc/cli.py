"""The `logsvc` command.

    logsvc serve --config NODE.toml
    logsvc dev-cluster up|down|status --dir DIR [--nodes 3] [--shards 2]
    logsvc append|read|tail|truncate|status --shard N ... [--client-config client.toml]
    logsvc status [--json] [--admin HOST:PORT]... [--client-config client.toml]
    logsvc demo [--dir DIR]
    logsvc doctor --config NODE.toml | --data-dir DIR [--shard N] [--json] [--allow-running]
    logsvc bench shards [--nodes 3] [--shards 1000] [...]   (python -m logsvc.bench shards)
    logsvc bench store [--modes group,sync_each,sync_each_grow,nosync] [--writers N]
                       [--record-bytes B] [--seconds S] [--dir DIR]

`status` without `--shard` prints the cluster table (every node's readiness, every shard's
leader, term, LSNs and replica lag) from the nodes' admin APIs (logsvc/admin_client.py):
exit 1 when no admin API answers or the token is refused, 2 on a config error.

Usage errors exit 2 with a message naming the option, never a traceback. Output cut short by
its reader (`logsvc status --json | head`) ends quietly, exit 1.

`status --shard N` on a shard that no node of the client config hosts fails at once (every
node answered UNKNOWN_SHARD), exit 1; it is not retried like a transient error. Refuses to run
under `python -O`: the store's invariants are assertions and must stay on.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence

from logsvc import __version__, stop_signal
from logsvc.pipes import quiet_on_broken_pipe

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"logsvc: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _int_in(name: str, minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{name} must be in {minimum}..{maximum}, got {value}")
        return value

    return parse


def _positive_int(name: str, maximum: int) -> Callable[[str], int]:
    return _int_in(name, 1, maximum)


def _seconds(name: str, maximum: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not 0 < value <= maximum:
            raise argparse.ArgumentTypeError(f"{name} must be in (0, {maximum}], got {value}")
        return value

    return parse


def _admin_address(text: str) -> str:
    from logsvc.config import ConfigError, client_address

    try:
        return client_address(text, "--admin")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.rule) from None


def _parser() -> argparse.ArgumentParser:
    from logsvc.bench import store_bench

    parser = _Parser(prog="logsvc", description="Raft-replicated log service")
    parser.add_argument("--version", action="version", version=f"logsvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="run a node (hosts its shards' replicas)")
    serve.add_argument("--config", required=True, help="the node's TOML configuration")

    dev = commands.add_parser("dev-cluster", help="a local cluster of node processes")
    dev.add_argument("action", choices=("up", "down", "status"))
    dev.add_argument("--dir", required=True, help="where configs, data and logs go")
    dev.add_argument("--nodes", type=_positive_int("--nodes", 7), default=3)
    dev.add_argument("--shards", type=_positive_int("--shards", 2000), default=2)  # SHARDS_MAX

    for name, text in (
        ("append", "append records (one batch) and print their LSNs"),
        ("read", "read records from an LSN"),
        ("tail", "wait for and print records from an LSN"),
        ("truncate", "truncate the log below an LSN"),
        ("status", "print a shard's status (--shard N), or without it the cluster table"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("--client-config", default="client.toml")
        command.add_argument(
            "--shard",
            type=_positive_int("--shard", 2**31),
            required=name != "status",
        )
        if name == "status":
            command.add_argument(
                "--json", action="store_true", help="the cluster table as JSON (no --shard)"
            )
            command.add_argument(
                "--admin",
                action="append",
                type=_admin_address,
                metavar="HOST:PORT",
                help="an admin API to ask (repeatable; overrides the config's admin_addresses)",
            )
        if name == "append":
            command.add_argument("records", nargs="+", help="record payloads (UTF-8 text)")
        if name in ("append", "truncate"):
            command.add_argument(
                "--epoch",
                type=_int_in("--epoch", 0, 2**63 - 1),
                default=0,
                help="the writer's lease epoch (0: only while no lease was ever granted)",
            )
        if name in ("read", "tail", "truncate"):
            command.add_argument(
                "--lsn",
                type=_positive_int("--lsn", 2**63),
                required=True,
            )
        if name in ("read", "tail"):
            command.add_argument(
                "--max-bytes",
                type=_positive_int("--max-bytes", 1 << 24),
                default=1 << 20,
            )
        if name == "tail":
            command.add_argument(
                "--wait-ms",
                type=_positive_int("--wait-ms", 60_000),
                default=5000,
            )

    doctor = commands.add_parser(
        "doctor", help="check a node's data dir offline, read-only (exit 1: problems found)"
    )
    where = doctor.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the node's TOML configuration (gives its data_dir)")
    where.add_argument("--data-dir", help="a node's data directory (holds shards/)")
    doctor.add_argument("--shard", type=_positive_int("--shard", 2**31), help="only this shard")
    doctor.add_argument("--json", action="store_true", help="print a machine-readable report")
    doctor.add_argument(
        "--allow-running",
        action="store_true",
        help="check even if the node is running (otherwise exit 3); results may be inconsistent",
    )
    doctor.add_argument(
        "--repair",
        action="store_true",
        help="with --shard: say how a corrupt journal would be repaired (exit 1), changing "
        "nothing; with --yes, move its damaged suffix into journal/quarantine-*/",
    )
    doctor.add_argument("--yes", action="store_true", help="with --repair: act")

    demo = commands.add_parser("demo", help="a local 3-node cluster at work")
    demo.add_argument("--dir", help="directory for the demo cluster (default: a temp dir)")

    bench = commands.add_parser("bench", help="benchmarks; print JSON lines")
    targets = bench.add_subparsers(dest="target", required=True, parser_class=_Parser)
    store = targets.add_parser("store", help="group commit vs one fsync per append vs none")
    store.add_argument("--modes", default=",".join(store_bench.MODES))
    store.add_argument(
        "--writers",
        type=_positive_int("--writers", store_bench.WRITERS_MAX),
        default=64,
    )
    store.add_argument(
        "--record-bytes",
        type=_positive_int("--record-bytes", 1 << 20),
        default=100,
    )
    store.add_argument(
        "--seconds",
        type=_seconds("--seconds", store_bench.SECONDS_MAX),
        default=3.0,
    )
    store.add_argument("--writer-kind", choices=store_bench.WRITER_KINDS, default="asyncio")
    store.add_argument("--dir", help="parent directory for the bench stores (default: temp)")
    cluster = targets.add_parser("cluster", help="a local 3-replica cluster in closed loop")
    cluster.add_argument("--replicas", type=int, choices=(3,), default=3)
    cluster.add_argument("--concurrency", type=_positive_int("--concurrency", 4096), default=64)
    cluster.add_argument(
        "--record-bytes", type=_positive_int("--record-bytes", 1 << 20), default=100
    )
    cluster.add_argument("--seconds", type=_seconds("--seconds", 600.0), default=5.0)
    cluster.add_argument("--batch", type=_positive_int("--batch", 65_536), default=1)
    shards = targets.add_parser(
        "shards",
        help="many shards per node: time to all led, idle CPU/RSS/threads, load, failover",
        add_help=False,  # its own parser (logsvc/bench/shards_bench.py) answers --help
    )
    shards.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return quiet_on_broken_pipe(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    if not __debug__:
        print("logsvc: refusing to run under python -O: invariants are assertions", file=sys.stderr)
        return EXIT_USAGE
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:
        # A benchmark stops the clusters it started on SIGTERM too (`timeout`, kill).
        stop_signal.stop_on_sigterm()
    if arguments[:2] == ["bench", "shards"]:  # its own parser (and --help)
        from logsvc.bench import shards_bench

        return shards_bench.main(arguments[2:])
    parser = _parser()
    args = parser.parse_args(arguments)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        from logsvc.node.daemon import serve

        return serve(args.config)
    if args.command == "dev-cluster":
        return _dev_cluster(args)
    if args.command == "status" and args.shard is None:
        return _cluster_status(args)
    if args.command == "status" and (args.json or args.admin):
        parser.error("status: --json and --admin are for the cluster table (without --shard)")
    if args.command in ("append", "read", "tail", "truncate", "status"):
        return _client_command(args)
    if args.command == "doctor":
        from logsvc import doctor

        if args.repair and args.shard is None:
            print("error: --repair needs --shard N (one journal at a time)", file=sys.stderr)
            return 2
        if args.yes and not args.repair:
            print("error: --yes goes with --repair", file=sys.stderr)
            return 2

        return doctor.main(
            config_path=args.config,
            data_dir=args.data_dir,
            shard=args.shard,
            json_output=args.json,
            allow_running=args.allow_running,
            repair=args.repair,
            yes=args.yes,
        )
    if args.command == "demo":
        from logsvc import demo

        return demo.run(args.dir)
    if args.command == "bench" and args.target == "cluster":
        from logsvc.bench import cluster_bench

        return cluster_bench.main(
            cluster_bench.ClusterBenchConfig(
                concurrency=args.concurrency,
                record_bytes=args.record_bytes,
                seconds=args.seconds,
                batch=args.batch,
                replicas=args.replicas,
            )
        )
    if args.command == "bench" and args.target == "store":
        from logsvc.bench import store_bench

        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in store_bench.MODES]
        if unknown or not modes:
            print(
                f"logsvc: error: --modes: unknown mode(s) {unknown}; "
                f"choose from {','.join(store_bench.MODES)}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        config = store_bench.BenchConfig(
            args.writers, args.record_bytes, args.seconds, args.dir, args.writer_kind
        )
        return store_bench.main(modes, config)
    raise AssertionError(f"unhandled command {args.command}")


def _dev_cluster(args: argparse.Namespace) -> int:
    from logsvc import devcluster

    if args.action == "up":
        pids = devcluster.up(args.dir, args.nodes, args.shards)
        print(f"cluster up in {args.dir}: " + ", ".join(f"{n}={p}" for n, p in pids.items()))
        print(f"client config: {args.dir}/client.toml")
        return 0
    if args.action == "down":
        devcluster.down(args.dir)
        print(f"cluster in {args.dir} stopped")
        return 0
    pids = devcluster.read_pids(args.dir)
    if not pids:
        print(f"no cluster recorded in {args.dir}")
        return 1
    for node, pid in pids.items():
        print(f"{node} pid {pid} {'running' if devcluster.alive(pid) else 'stopped'}")
    return 0


def _cluster_status(args: argparse.Namespace) -> int:
    """`logsvc status` without `--shard`: the cluster table from the admin APIs."""
    from logsvc import admin_client
    from logsvc.config import ConfigError, load_client_config, main_config_error

    try:
        config = load_client_config(args.client_config)
    except ConfigError as exc:
        return main_config_error(exc)
    addresses = tuple(args.admin) if args.admin else config.admin_addresses
    if not addresses:
        return main_config_error(
            ConfigError(
                "admin_addresses",
                f'not set in {config.source}: add admin_addresses = ["host:port", ...] '
                "or pass --admin HOST:PORT",
            )
        )
    try:
        table = admin_client.fetch_table(addresses, config.token)
    except admin_client.AdminClientError as exc:
        print(f"logsvc: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(admin_client.table_json(table), indent=2))
    else:
        sys.stdout.write(admin_client.render_table(table))
    return 0


def _client_command(args: argparse.Namespace) -> int:
    from logsvc.client import LogsvcError, SyncClient
    from logsvc.config_files import ConfigError, main_config_error

    try:
        client = SyncClient(args.client_config)  # addresses and token from client.toml
    except ConfigError as exc:
        return main_config_error(exc)
    try:
        if args.command == "append":
            lsns = client.append(args.shard, [r.encode() for r in args.records], epoch=args.epoch)
            print(" ".join(str(lsn) for lsn in lsns))
        elif args.command in ("read", "tail"):
            page = (
                client.read(args.shard, args.lsn, args.max_bytes)
                if args.command == "read"
                else client.tail(args.shard, args.lsn, args.max_bytes, args.wait_ms)
            )
            for offset, record in enumerate(page.records):
                print(f"{page.first_lsn + offset}\t{record.decode('utf-8', 'backslashreplace')}")
            print(f"next_lsn\t{page.next_lsn}", file=sys.stderr)
        elif args.command == "truncate":
            print(client.truncate(args.shard, args.lsn, epoch=args.epoch))
        else:
            # The leader's answer after a barrier through the log, never a follower's view.
            status = client.leader_status(args.shard)
            print(
                f"shard {status.shard}: leader {status.leader} term {status.term} "
                f"lsn [{status.first_lsn}, {status.next_lsn}) commit {status.commit_index} "
                "(confirmed by the leader)"
            )
    except LogsvcError as exc:
        print(f"logsvc: error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
