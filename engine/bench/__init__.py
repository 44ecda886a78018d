"""The engine's benchmarks (`python -m engine.bench ...`, engine/bench/cli.py): commands that
print figures as JSON lines, each with its peer (SQLite, DuckDB) measured in the same run.
Never timed assertions."""
