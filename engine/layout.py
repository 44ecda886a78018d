"""An engine directory's layout (ARCHITECTURE.md §11): the file WAL's segments in `wal/`, the
objects (blocks, checkpoints) in `objects/` when they are kept locally. Names only, so that
opening an engine (opening.py) and repairing one offline (repair.py) share them without
importing each other."""

from __future__ import annotations

WAL_DIR_NAME = "wal"
OBJECTS_DIR_NAME = "objects"
