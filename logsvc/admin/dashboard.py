"""The dashboard page (`GET /`, dashboard.html): the page and the headers it is served with.
Pure: no web framework here (app.py serves what this returns)."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources
from typing import Final

DASHBOARD_FILE: Final = "dashboard.html"  # package data of logsvc.admin


def _inline_sources(html: str, tag: str) -> list[str]:
    """The CSP source of each inline `<tag>` block: its SHA-256, base64, as the browser
    hashes the text between the tags (so attributes on the tag are refused here)."""
    blocks: list[str] = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    assert blocks, f"the dashboard has no inline <{tag}>"
    assert html.count(f"<{tag}") == len(blocks), f"a <{tag}> with attributes: not hashed"
    digests = (hashlib.sha256(block.encode("utf-8")).digest() for block in blocks)
    return [f"'sha256-{base64.b64encode(digest).decode('ascii')}'" for digest in digests]


def dashboard_page() -> tuple[bytes, dict[str, str]]:
    """dashboard.html and the headers to serve it with. Nothing but the page's own inline
    script and style may run (so injected markup could not run code next to the token in
    sessionStorage), it connects to this origin only, and it may not be framed."""
    html = resources.files("logsvc.admin").joinpath(DASHBOARD_FILE).read_text("utf-8")
    policy = (
        "default-src 'none'",
        "script-src " + " ".join(_inline_sources(html, "script")),
        "style-src " + " ".join(_inline_sources(html, "style")),
        "connect-src 'self'",
        "img-src data:",  # the empty favicon: no request for /favicon.ico (and its 401)
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
    headers = {
        "Content-Security-Policy": "; ".join(policy),
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return html.encode("utf-8"), headers
