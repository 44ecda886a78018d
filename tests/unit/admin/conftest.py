"""Fixtures for the admin API tests: the example cluster seen from n1 (`example_view`),
its app, TestClients with and without the token, and `asgi_call`, which drives the app's
ASGI interface directly (no sockets) for what a TestClient cannot do: chunked bodies and
requests overlapping in time."""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from logsvc.admin.app import create_app
from logsvc.admin.metrics import Metrics
from logsvc.admin.port import FakeNodeView, example_view

# What a real token looks like; every response body is searched for it.
TOKEN = "adm1n-t0ken-Zq8Xv3LmNp7Rt2Ws"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def metrics() -> Metrics:
    return Metrics("n1")


@pytest.fixture
def view(metrics: Metrics) -> FakeNodeView:
    return example_view(metrics=metrics.exposition)


@pytest.fixture
def app(view: FakeNodeView) -> FastAPI:
    return create_app(view, TOKEN)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    # raise_server_exceptions=False: a 500 must be an answer, as a real client sees it.
    with TestClient(app, raise_server_exceptions=False, headers=AUTH) as test_client:
        yield test_client


@pytest.fixture
def anon(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


async def asgi_call(
    app: FastAPI,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    chunks: tuple[bytes, ...] = (b"",),
) -> Answer:
    """One HTTP request through the ASGI interface; the body arrives in `chunks`. A list
    of header pairs may repeat a header."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    pending = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in pairs],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 7201),
    }
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    raw_headers = start["headers"]
    assert isinstance(raw_headers, list)
    body = b"".join(m["body"] for m in sent if m["type"] == "http.response.body")
    status = start["status"]
    assert isinstance(status, int)
    return Answer(status, {k.decode(): v.decode() for k, v in raw_headers}, body)
