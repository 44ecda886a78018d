"""The admin API's `/docs` page, served whole by the node (issue 24 item 6).

Why: FastAPI's default Swagger page loads its script and style from a CDN, so on a node
without internet access (most production networks) `/docs` was blank. The Swagger UI
assets come from the installed `fastapi-offline` package (pinned in pyproject.toml; we use
only its `static/` files, never its app factory) and are served by the node under
`/docs/assets/`; the page's Content-Security-Policy allows this origin only, so a stray
reference to another host is refused by the browser rather than fetched.

Bytes in, bytes out: no FastAPI here (app.py stays the only module importing it). The
package is located without importing it (importing it would import FastAPI's app code).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ASSETS_PACKAGE: Final = "fastapi_offline"
ASSETS_PREFIX: Final = "/docs/assets/"
ASSETS: Final = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon.png": "image/png",
}
"""The files of the package's `static/` the page needs, with their media types."""
ASSET_BYTES_MAX: Final = 8 * 1024 * 1024
"""One asset's size at most (Swagger UI's bundle is about 1.5 MB): read once at start, so a
package replaced by something unexpected cannot make the node hold more."""

PAGE_HEADERS_BASE: Final = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class DocsAssetsMissing(RuntimeError):
    """The installed assets package is missing or incomplete: a broken install (the
    dependency is in pyproject.toml and requirements.lock)."""


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media_type: str


def asset_path(name: str) -> str:
    return ASSETS_PREFIX + name


def load_assets() -> dict[str, Asset]:
    """Every asset by its URL path, read from the installed package."""
    spec = importlib.util.find_spec(ASSETS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DocsAssetsMissing(f"the {ASSETS_PACKAGE} package is not installed (./dev setup)")
    static = Path(next(iter(spec.submodule_search_locations))) / "static"
    out = {}
    for name, media_type in ASSETS.items():
        path = static / name
        try:
            size = path.stat().st_size
            if size > ASSET_BYTES_MAX:
                raise DocsAssetsMissing(f"{path}: {size} bytes, above {ASSET_BYTES_MAX}")
            out[asset_path(name)] = Asset(path.read_bytes(), media_type)
        except OSError as exc:
            raise DocsAssetsMissing(f"{path}: {exc.strerror or exc}") from None
    return out


def docs_page(
    title: str, openapi_url: str, oauth2_redirect_url: str
) -> tuple[bytes, dict[str, str]]:
    """The Swagger UI page over `openapi_url` and the headers to serve it with."""
    config = {
        "url": openapi_url,
        "dom_id": "#swagger-ui",
        "layout": "BaseLayout",
        "deepLinking": True,
        "showExtensions": True,
        "showCommonExtensions": True,
        "oauth2RedirectUrl": oauth2_redirect_url,
        "validatorUrl": None,  # Swagger UI would ask validator.swagger.io for a badge
    }
    script = (
        f"const ui = SwaggerUIBundle(Object.assign({json.dumps(config)}, "
        "{presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset]}));"
    )
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    html = (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        f'<link type="text/css" rel="stylesheet" href="{asset_path("swagger-ui.css")}">\n'
        f'<link rel="icon" href="{asset_path("favicon.png")}">\n'
        f"<title>{_escape(title)} - Swagger UI</title>\n</head>\n<body>\n"
        '<div id="swagger-ui"></div>\n'
        f'<script src="{asset_path("swagger-ui-bundle.js")}"></script>\n'
        f"<script>{script}</script>\n</body>\n</html>\n"
    )
    policy = (
        "default-src 'none'",
        f"script-src 'self' 'sha256-{script_hash}'",
        "style-src 'self' 'unsafe-inline'",  # Swagger UI sets style attributes
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self' data:",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
    return html.encode("utf-8"), {**PAGE_HEADERS_BASE, "Content-Security-Policy": "; ".join(policy)}


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
