"""`python -m engine tables|scan|stats|serve|promote|cn ...`: see engine/cli.py."""

import sys

from engine.cli import main

sys.exit(main())
