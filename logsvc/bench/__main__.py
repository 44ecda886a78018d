"""`python -m logsvc.bench store|cluster|shards ...`: same as `logsvc bench ...`."""

from __future__ import annotations

import sys

from logsvc.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
