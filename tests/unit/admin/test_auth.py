"""Bearer-token auth, the request gate, and that no answer carries a secret.

How: TestClients with no token, a wrong one, a malformed header and the right one, on
every endpoint (all but /healthz and the OpenAPI pages are 401 without the token, before
any routing or body parsing); `asgi_call` for what a TestClient cannot send (a chunked
body with no Content-Length, requests overlapping in time). Then every endpoint, on both
its happy and error paths, is called and each answer (status line, headers, body) is
searched for the token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from logsvc.admin.app import create_app
from logsvc.admin.errors import NotLeader, OutcomeUnknown, Overloaded
from logsvc.admin.limits import AdminLimits
from logsvc.admin.port import FakeNodeView, example_view

from .conftest import AUTH, TOKEN, asgi_call

# (method, path, json body) of every authenticated endpoint.
ENDPOINTS: list[tuple[str, str, object]] = [
    ("GET", "/v1/cluster", None),
    ("GET", "/v1/shards", None),
    ("GET", "/v1/shards/1", None),
    ("POST", "/v1/shards/1/truncate", {"lsn": 20, "epoch": 2}),
    ("POST", "/v1/shards/1/transfer-leader", {"target_node_id": "n2"}),
    ("POST", "/v1/shards/1/replicas", {"node_id": "n4"}),
    ("DELETE", "/v1/shards/1/replicas/n3", None),
    ("GET", "/readyz", None),
    ("GET", "/metrics", None),
]


def request(client: TestClient, method: str, path: str, body: object, **headers: str) -> Any:
    return client.request(method, path, json=body, headers=headers or None)


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_missing_token_is_401(anon: TestClient, method: str, path: str, body: object) -> None:
    response = request(anon, method, path, body)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "code": "unauthorized",
        "message": "missing bearer token (Authorization: Bearer <token>)",
    }


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_wrong_token_is_401(anon: TestClient, method: str, path: str, body: object) -> None:
    response = request(anon, method, path, body, Authorization=f"Bearer {TOKEN}x")
    assert response.status_code == 401
    assert response.json() == {"code": "unauthorized", "message": "invalid bearer token"}


@pytest.mark.parametrize(
    "header",
    [
        f"Basic {TOKEN}",
        TOKEN,
        "Bearer",
        "Bearer ",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN.upper()}",
    ],
)
def test_malformed_or_near_miss_headers_are_401(anon: TestClient, header: str) -> None:
    response = anon.get("/v1/cluster", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_right_token_is_let_in(anon: TestClient, method: str, path: str, body: object) -> None:
    response = request(anon, method, path, body, **AUTH)
    # The endpoint's own answer (removing n3 from 3 members is refused: 409).
    assert response.status_code in (200, 201, 202, 409), response.text
    assert response.status_code != 401


def test_the_scheme_is_case_insensitive(anon: TestClient) -> None:
    response = anon.get("/v1/cluster", headers={"Authorization": f"bearer {TOKEN}"})
    assert response.status_code == 200


def test_two_authorization_headers_are_refused(app: FastAPI) -> None:
    twice = [("Authorization", f"Bearer {TOKEN}")] * 2
    answer = asyncio.run(asgi_call(app, "GET", "/v1/cluster", headers=twice))
    assert answer.status == 401
    assert answer.json() == {
        "code": "unauthorized",
        "message": "more than one Authorization header",
    }


def test_healthz_and_docs_need_no_token(anon: TestClient) -> None:
    assert anon.get("/healthz").status_code == 200
    assert anon.get("/openapi.json").status_code == 200
    assert anon.get("/docs").status_code == 200


def test_docs_can_be_closed() -> None:
    app = create_app(example_view(), TOKEN, docs_public=False)
    with TestClient(app) as anon:
        assert anon.get("/openapi.json").status_code == 401
        assert anon.get("/docs").status_code == 401
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/openapi.json", headers=AUTH).status_code == 200


def test_auth_comes_before_routing_and_parsing(anon: TestClient) -> None:
    # An unknown path, a malformed body: still 401 first (nothing about the API leaks).
    assert anon.get("/v1/nope").status_code == 401
    response = anon.post(
        "/v1/shards/1/truncate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 401


def test_each_refusal_is_reported_once() -> None:
    refused: list[int] = []
    app = create_app(example_view(), TOKEN, on_auth_failure=lambda: refused.append(1))
    with TestClient(app) as anon:
        anon.get("/v1/cluster")
        anon.get("/metrics", headers={"Authorization": "Bearer nope"})
        anon.get("/healthz")
        anon.get("/v1/cluster", headers=AUTH)
    assert len(refused) == 2


# ------------------------------------------------------------------------ body bounds


def test_a_body_over_the_limit_is_413(client: TestClient) -> None:
    padding = " " * 5000
    response = client.post(
        "/v1/shards/1/truncate",
        content=f'{{"lsn": 20, "epoch": 2}}{padding}'.encode(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 413
    assert response.json()["code"] == "body_too_large"


def test_a_chunked_body_over_the_limit_is_413() -> None:
    view = example_view()
    app = create_app(view, TOKEN, limits=AdminLimits(request_body_bytes_max=256))
    headers = {**AUTH, "content-type": "application/json"}
    chunks = (b'{"lsn": 20, ', b" " * 200, b" " * 200, b'"epoch": 2}')
    answer = asyncio.run(
        asgi_call(app, "POST", "/v1/shards/1/truncate", headers=headers, chunks=chunks)
    )
    assert answer.status == 413
    assert answer.json() == {
        "code": "body_too_large",
        "message": "the request body is over 256 bytes",
    }
    assert view.status_now(1).first_lsn == 11  # nothing reached the view
    # The same body in small chunks, under the limit, is reassembled and served.
    small = (b'{"lsn": 20, ', b'"epoch": 2}')
    answer = asyncio.run(
        asgi_call(app, "POST", "/v1/shards/1/truncate", headers=headers, chunks=small)
    )
    assert answer.status == 200, answer.body
    assert answer.json() == {"shard_id": 1, "first_lsn": 20}


def test_a_bad_content_length_is_400(app: FastAPI) -> None:
    answer = asyncio.run(
        asgi_call(
            app,
            "POST",
            "/v1/shards/1/truncate",
            headers={**AUTH, "content-length": "12x"},
        )
    )
    assert answer.status == 400
    assert answer.json() == {"code": "bad_request", "message": "invalid Content-Length"}


def test_requests_in_flight_are_bounded() -> None:
    async def scenario() -> tuple[int, int, int]:
        view = example_view()
        app = create_app(view, TOKEN, limits=AdminLimits(requests_inflight_max=1))
        view.hold("shard_status")
        first = asyncio.create_task(asgi_call(app, "GET", "/v1/shards/1", headers=AUTH))
        while "shard_status" not in view.calls:  # the first is now waiting in the view
            await asyncio.sleep(0.001)
        second = await asgi_call(app, "GET", "/v1/cluster", headers=AUTH)
        # The liveness probe is outside the bound: it answers all the same.
        health = await asgi_call(app, "GET", "/healthz")
        assert (health.status, health.json()) == (200, {"alive": True})
        view.release()
        done = await first
        third = await asgi_call(app, "GET", "/v1/cluster", headers=AUTH)
        assert second.json() == {
            "code": "overloaded",
            "message": "too many admin requests in flight",
        }
        assert second.headers["retry-after"] == "1"
        return done.status, second.status, third.status

    assert asyncio.run(scenario()) == (200, 503, 200)


# ------------------------------------------------------------------------ no secrets


@pytest.fixture
def every_answer(view: FakeNodeView, client: TestClient, anon: TestClient) -> Iterator[list[str]]:
    """Status line, headers and body of every endpoint's answers: happy paths, errors of
    every class, auth refusals, docs."""
    answers: list[str] = []

    def record(response: Any) -> None:
        answers.append(f"{response.status_code} {dict(response.headers)!r} {response.text}")

    for method, path, body in ENDPOINTS:
        record(request(anon, method, path, body))
        record(request(anon, method, path, body, Authorization=f"Bearer {TOKEN}x"))
        record(request(client, method, path, body))
    for failure in (
        NotLeader(None),
        Overloaded("queue full"),
        OutcomeUnknown("no commit in 30 s"),
        RuntimeError(f"a bug that mentions {TOKEN}"),
    ):
        view.fail_next(failure)
        record(client.get("/v1/shards/1"))
    for path in ("/v1/shards/9", "/v1/shards/0", "/v1/nope", "/healthz", "/docs", "/openapi.json"):
        record(client.get(path))
    record(client.post("/v1/shards/1/truncate", json={"lsn": TOKEN}))
    record(client.post("/v1/shards/1/replicas", json={"node_id": TOKEN}))
    record(client.delete(f"/v1/shards/1/replicas/{TOKEN}"))
    yield answers


def test_no_answer_contains_the_token(every_answer: list[str]) -> None:
    assert len(every_answer) > 30
    for answer in every_answer:
        assert TOKEN not in answer, answer[:200]
