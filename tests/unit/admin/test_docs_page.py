"""The admin API's /docs page is whole without internet (issue 24 item 6).

How: the app over `example_view` through TestClients. The page and every asset it names
come from the node itself (no URL of another host in the page), each asset is the installed
package's file with its media type, the page's Content-Security-Policy allows this origin
only, and the assets follow `docs_public` like the page (401 without a token when closed).
That a browser renders every operation from it is tests/e2e/test_dashboard_browser.py.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from fastapi.testclient import TestClient

from logsvc.admin import docs_page
from logsvc.admin.app import create_app
from logsvc.admin.port import example_view

from .conftest import AUTH, TOKEN


def test_the_page_names_only_its_own_assets(anon: TestClient) -> None:
    answer = anon.get("/docs")
    assert answer.status_code == 200
    html = answer.text
    assert "cdn." not in html and "http://" not in html and "https://" not in html
    named = set(re.findall(r'(?:src|href)="([^"]+)"', html))
    assert named == {docs_page.asset_path(name) for name in docs_page.ASSETS}
    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "script-src 'self' 'sha256-" in policy


def test_every_asset_is_the_installed_file(anon: TestClient) -> None:
    spec = importlib.util.find_spec(docs_page.ASSETS_PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    for name, media_type in docs_page.ASSETS.items():
        answer = anon.get(docs_page.asset_path(name))
        assert answer.status_code == 200, name
        assert answer.headers["content-type"] == media_type
        assert answer.content == (static / name).read_bytes()
    assert b"SwaggerUIBundle" in anon.get("/docs/assets/swagger-ui-bundle.js").content


def test_closed_docs_close_the_assets_too() -> None:
    with TestClient(create_app(example_view(), TOKEN, docs_public=False)) as anon:
        for name in docs_page.ASSETS:
            assert anon.get(docs_page.asset_path(name)).status_code == 401
        assert anon.get("/docs", headers=AUTH).status_code == 200
