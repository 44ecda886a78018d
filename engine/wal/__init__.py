"""The engine's WAL entries (`entry`) and their codec (`codec`, bytes in engine/FORMAT.md)."""
