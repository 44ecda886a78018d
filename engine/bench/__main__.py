"""`python -m engine.bench commit|scan|distributed ...`: see engine/bench/cli.py."""

import sys

from engine.bench.cli import main

sys.exit(main())
