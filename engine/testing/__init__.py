"""Harnesses that drive real engine processes: the crash-test workload
(`python -m engine.testing.workload`, used by the e2e tests and the demo) and the engine's part
of `logsvc demo` built on it. Not imported by the engine itself."""
