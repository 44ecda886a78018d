"""`python -m engine tables|scan|stats DIR`: see engine/cli.py."""

import sys

from engine.cli import main

sys.exit(main())
