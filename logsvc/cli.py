"""The `logsvc` command.

    logsvc demo [--dir DIR] [--bench-seconds S]
    logsvc bench store [--modes group,sync_each,nosync] [--writers N] [--record-bytes B]
                       [--seconds S] [--dir DIR]

Usage errors exit 2 with a message naming the option, never a traceback. Refuses to run
under `python -O`: the store's invariants are assertions and must stay on.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from logsvc import __version__

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"logsvc: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _positive_int(name: str, maximum: int) -> object:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{name} must be in 1..{maximum}, got {value}")
        return value

    return parse


def _seconds(name: str, maximum: float) -> object:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not 0 < value <= maximum:
            raise argparse.ArgumentTypeError(f"{name} must be in (0, {maximum}], got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    from logsvc.bench import store_bench

    parser = _Parser(prog="logsvc", description="Raft-replicated log service")
    parser.add_argument("--version", action="version", version=f"logsvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = commands.add_parser("demo", help="show the shard store at work, then benchmark it")
    demo.add_argument("--dir", help="directory for the demo store (default: a temp dir)")
    demo.add_argument(
        "--bench-seconds",
        type=_seconds("--bench-seconds", 60.0),  # type: ignore[arg-type]
        default=2.0,
        help="seconds per benchmark mode (default 2)",
    )

    bench = commands.add_parser("bench", help="benchmarks; print JSON lines")
    targets = bench.add_subparsers(dest="target", required=True, parser_class=_Parser)
    store = targets.add_parser("store", help="group commit vs one fsync per append vs none")
    store.add_argument("--modes", default=",".join(store_bench.MODES))
    store.add_argument(
        "--writers",
        type=_positive_int("--writers", store_bench.WRITERS_MAX),  # type: ignore[arg-type]
        default=64,
    )
    store.add_argument(
        "--record-bytes",
        type=_positive_int("--record-bytes", 1 << 20),  # type: ignore[arg-type]
        default=100,
    )
    store.add_argument(
        "--seconds",
        type=_seconds("--seconds", store_bench.SECONDS_MAX),  # type: ignore[arg-type]
        default=3.0,
    )
    store.add_argument("--writer-kind", choices=store_bench.WRITER_KINDS, default="asyncio")
    store.add_argument("--dir", help="parent directory for the bench stores (default: temp)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if not __debug__:
        print("logsvc: refusing to run under python -O: invariants are assertions", file=sys.stderr)
        return EXIT_USAGE
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from logsvc import demo

        return demo.run(args.dir, args.bench_seconds)
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


if __name__ == "__main__":
    sys.exit(main())
