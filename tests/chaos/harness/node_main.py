"""A logsvc node for the chaos suite: `logsvc serve`, optionally over a durability ledger.

    python -m tests.chaos.harness.node_main --config NODE.toml [--ledger PATH]

Runs `logsvc.node.daemon.serve(config)` in this process; with `--ledger`, every store
(journal and snapshot file) of the node goes through `LedgerFileSystem(PATH)`, so that
`tests/chaos/harness/disk.py power_loss` can cut the data directory back to what was
durable after the harness SIGKILLs the node. Failpoints (LOGSVC_FAILPOINTS) and the event
log (LOGSVC_EVENT_LOG) come from the environment, as for the product entry point. Refuses
to run under `python -O`, like `logsvc` itself: the store's invariants are assertions.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    if not __debug__:
        print(
            "node_main: refusing to run under python -O: invariants are assertions",
            file=sys.stderr,
        )
        return EXIT_USAGE
    parser = argparse.ArgumentParser(prog="node_main", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the node's TOML config")
    parser.add_argument("--ledger", help="durability ledger file (outside the data dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from logsvc.node.daemon import serve
    from tests.chaos.harness.ledger_fs import LedgerFileSystem

    file_system = LedgerFileSystem(args.ledger) if args.ledger else None
    try:
        return serve(args.config, file_system=file_system)
    finally:
        if file_system is not None:
            file_system.close()


if __name__ == "__main__":
    sys.exit(main())
