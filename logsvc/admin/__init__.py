"""The admin plane of a node: an HTTP API (FastAPI) and its Prometheus metrics.

    operator / Prometheus --HTTP--> app.create_app(view, token) --> NodeView (port.py)
                                                                     |
                               the daemon's implementation over its replicas (issue 6),
                               or port.FakeNodeView in tests

Modules, one idea each:

* `limits.py`: every bound of the admin plane, with units and reasons.
* `errors.py`: the typed operating errors a `NodeView` raises (the tree is drawn there);
  the app maps each branch to one HTTP status.
* `port.py`: the `NodeView` Protocol (everything the app needs from a node), the frozen
  dataclasses it returns, and `FakeNodeView`, its in-memory implementation for tests.
* `readiness.py`: the pure rule deciding `/readyz` from the shards' statuses.
* `metrics.py`: the metric definitions (prometheus-client, the only module importing it),
  on a `CollectorRegistry` of their own, with the update methods the daemon calls.
* `models.py`: the request and response bodies (pydantic, the only module importing it).
* `gate.py`: the pure ASGI gate in front of routing: in-flight bound, bearer token, body
  bound.
* `dashboard.py`: the dashboard page and its Content-Security-Policy.
* `app.py`: the FastAPI app (the only module importing FastAPI): endpoints, errors as JSON.

Nothing is imported here, so `import logsvc.admin.metrics` does not pull in FastAPI.
"""
