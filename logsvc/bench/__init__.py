"""Benchmarks: commands that print figures as JSON lines. Never timed assertions."""
