"""The dashboard page (GET /): public, static, self-contained, and locked down by its CSP.

How: the app over `example_view` through TestClients with and without the token. The
page must come without auth (it holds no data: its script asks for the token), hold no
secret, fetch nothing from elsewhere (no URL of another host, no external script, style or
font: the machine may be offline), and be served with a Content-Security-Policy that lets
only its own inline script and style run (by their SHA-256, checked here against the file)
and connect only to its own origin. The API names the script reads (endpoints, response
fields) are checked against the app, so renaming one breaks this test rather than the
page. What it shows in a browser is tests/e2e/test_dashboard_browser.py.
"""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from logsvc.admin.app import create_app
from logsvc.admin.models import (
    ClusterResponse,
    NodeModel,
    ReadinessResponse,
    ReplicaModel,
    ShardListResponse,
    ShardPlacementModel,
    ShardReadinessModel,
    ShardStatusModel,
)
from logsvc.admin.port import example_view

from .conftest import TOKEN


def page(anon: TestClient) -> str:
    response = anon.get("/")
    assert response.status_code == 200, response.text
    return response.text


def inline(html: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)


def csp_directives(anon: TestClient) -> dict[str, list[str]]:
    policy = anon.get("/").headers["content-security-policy"]
    directives: dict[str, list[str]] = {}
    for directive in policy.split(";"):
        name, *sources = directive.split()
        directives[name] = sources
    return directives


def test_the_page_needs_no_token_and_holds_none(anon: TestClient) -> None:
    refused: list[int] = []
    app = create_app(example_view(), TOKEN, on_auth_failure=lambda: refused.append(1))
    with TestClient(app) as fresh:
        response = fresh.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert refused == []  # loading the page is not an auth failure
    html = response.text
    assert TOKEN not in html
    assert "<title>logsvc cluster</title>" in html
    # No data is in the page: it comes from the API once a token is given.
    assert "127.0.0.1" not in html and "engine-a" not in html


def test_the_page_is_public_even_with_closed_docs() -> None:
    with TestClient(create_app(example_view(), TOKEN, docs_public=False)) as anon:
        assert anon.get("/").status_code == 200
        assert anon.get("/openapi.json").status_code == 401
        assert anon.get("/v1/cluster").status_code == 401


def test_the_page_is_not_in_the_api_description(anon: TestClient) -> None:
    assert "/" not in anon.get("/openapi.json").json()["paths"]


def test_only_get_serves_the_page(anon: TestClient) -> None:
    response = anon.post("/")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_nothing_is_fetched_from_elsewhere(anon: TestClient) -> None:
    html = page(anon)
    lowered = html.lower()
    for external in ("http://", "https://", "//cdn", "@import", "url(", "@font-face"):
        assert external not in lowered, external
    assert not re.search(r"<(script|img|iframe|link)[^>]*\bsrc=", lowered)
    assert not re.search(r"<link[^>]*rel=\"?stylesheet", lowered)
    assert '<link rel="icon" href="data:,">' in html  # so no /favicon.ico request (a 401)


def test_the_csp_allows_exactly_the_pages_own_script_and_style(anon: TestClient) -> None:
    html = page(anon)
    directives = csp_directives(anon)
    assert directives["default-src"] == ["'none'"]
    assert directives["connect-src"] == ["'self'"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["base-uri"] == ["'none'"]
    assert directives["form-action"] == ["'none'"]
    assert directives["img-src"] == ["data:"]
    for tag, directive in (("script", "script-src"), ("style", "style-src")):
        blocks = inline(html, tag)
        assert len(blocks) == 1 and html.count(f"<{tag}") == 1
        digest = base64.b64encode(hashlib.sha256(blocks[0].encode()).digest()).decode()
        assert directives[directive] == [f"'sha256-{digest}'"]
    policy = " ".join(" ".join(sources) for sources in directives.values())
    assert "unsafe" not in policy and "*" not in policy


def test_the_markup_does_nothing_the_csp_would_block(anon: TestClient) -> None:
    # Inline handlers and style attributes are not covered by the hashes: they would be
    # refused by the browser, silently.
    html = page(anon)
    assert not re.search(r"\son[a-z]+\s*=", html)
    assert not re.search(r"\sstyle\s*=", html)
    script = inline(html, "script")[0]
    for forbidden in ("eval(", "new Function", "innerHTML", "outerHTML", "document.write"):
        assert forbidden not in script, forbidden


def test_other_headers_lock_the_page_down(anon: TestClient) -> None:
    headers = anon.get("/").headers
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"


def test_the_page_is_accessible_and_addressable(anon: TestClient) -> None:
    html = page(anon)
    assert '<html lang="en">' in html
    for table in ("shards", "replicas", "nodes"):
        assert f'<table id="{table}">' in html
    assert html.count('<th scope="col"') >= 20
    assert '<label for="token">' in html and 'type="password"' in html
    assert 'id="error" role="alert"' in html
    assert "401: wrong token" in html


def test_the_script_reads_only_what_the_api_answers(anon: TestClient, app: FastAPI) -> None:
    script = inline(page(anon), "script")[0]
    paths = set(re.findall(r'getJson\("([^"]+)"', script))
    assert paths == {"/v1/cluster", "/v1/shards", "/readyz"}
    assert paths <= set(app.openapi()["paths"])
    models: list[type[BaseModel]] = [
        ClusterResponse,
        NodeModel,
        ShardPlacementModel,
        ShardListResponse,
        ShardStatusModel,
        ReplicaModel,
        ReadinessResponse,
        ShardReadinessModel,
    ]
    fields = {name for model in models for name in model.model_fields}
    # The API's fields are snake_case; the script's own names are camelCase.
    read = set(re.findall(r"\.([a-z]+(?:_[a-z]+)+)\b", script))
    assert read, "the script reads no field?"
    assert read <= fields, read - fields
    for needed in ("leader", "term", "first_lsn", "truncated_lsn", "next_lsn", "replicas"):
        assert f".{needed}" in script, needed


@pytest.mark.parametrize("token_in", ["header", "none"])
def test_the_page_is_the_same_with_or_without_a_token(
    anon: TestClient, client: TestClient, token_in: str
) -> None:
    chosen = client if token_in == "header" else anon
    assert chosen.get("/").text == page(anon)
