"""Tests of the admin plane (logsvc/admin): the HTTP API against `FakeNodeView`, the
readiness and change rules, and the Prometheus metrics. No sockets, no real cluster."""
