"""Calls from one node to another node's admin API (membership changes).

A shard's leader asks the node it adds to start hosting the shard, and the node it removed
to stop (`POST` / `DELETE /v1/internal/shards/{id}/host`). These go over the same admin
API as operators' calls, with the cluster's token (every node has it: `[cluster] token`),
as JSON, each with a bounded timeout. The standard library's HTTP client runs on the
default executor, so the event loop never blocks on a slow or dead peer.

Answers: `(status, body)` for any HTTP answer (the caller maps the admin API's error codes);
`PeerUnreachable` when no answer came (refused, reset, timed out).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Final

CALL_TIMEOUT_S_DEFAULT: Final = 10.0
ANSWER_BYTES_MAX: Final = 64 * 1024  # an admin answer to these calls is a few hundred bytes


class PeerUnreachable(Exception):
    """No answer from the peer's admin API (it may or may not have acted on the call)."""


@dataclass(frozen=True, slots=True)
class PeerAnswer:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> str:
        return str(self.body.get("code", ""))

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))[:500]


async def call(
    admin_address: str,
    method: str,
    path: str,
    token: str,
    body: dict[str, Any] | None = None,
    timeout_s: float = CALL_TIMEOUT_S_DEFAULT,
) -> PeerAnswer:
    assert timeout_s > 0
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(
        None, _call_blocking, admin_address, method, path, token, body, timeout_s
    )
    try:
        # The socket timeout bounds each read; this bounds the whole call.
        return await asyncio.wait_for(work, timeout_s * 2)
    except TimeoutError:
        raise PeerUnreachable(f"{admin_address}: no answer within {timeout_s * 2} s") from None


def _call_blocking(
    admin_address: str,
    method: str,
    path: str,
    token: str,
    body: dict[str, Any] | None,
    timeout_s: float,
) -> PeerAnswer:
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(f"http://{admin_address}{path}", data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read(ANSWER_BYTES_MAX)
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read(ANSWER_BYTES_MAX)
    except (OSError, ValueError) as exc:  # URLError, refused, reset, timed out
        raise PeerUnreachable(f"{admin_address}: {type(exc).__name__}: {exc}") from None
    try:
        parsed = json.loads(raw.decode("utf-8")) if raw else {}
    except (UnicodeDecodeError, ValueError):
        parsed = {}
    return PeerAnswer(int(status), parsed if isinstance(parsed, dict) else {})
