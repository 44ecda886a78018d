"""The engine soak run (`python -m tests.soak.engine_soak`): a script, not a test module;
pytest collects nothing here (no `test_` file)."""
