"""The admin API's gate: pure ASGI middleware in front of routing (no web framework here:
app.py hands it the app and how an error is answered).

In this order, so an unauthenticated client can make the node neither parse nor buffer
anything: at most `requests_inflight_max` requests at once (503 "overloaded"; /healthz is
outside the bound), a bearer token on every path but the public ones (401 "unauthorized",
compared in constant time), a body of at most `request_body_bytes_max` bytes (413
"body_too_large"; read here, then replayed to the app)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Final

from logsvc.admin.limits import AdminLimits
from logsvc.admin.models import ErrorBody

HEALTH_PATH: Final = "/healthz"
RETRY_AFTER_S: Final = 1  # on 503: most causes (a full queue, an election) pass in a second

# The ASGI interface (asgiref's spec), spelled here so no framework is imported.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorAnswer = Callable[[int, ErrorBody, "Mapping[str, str] | None"], AsgiApp]
"""An error answer as an ASGI app: (status, body, extra headers)."""


class Gate:
    """Pure ASGI middleware, in front of routing: the in-flight bound, the bearer token,
    the body bound (the body is read here, at most `request_body_bytes_max` bytes, then
    replayed to the app), in that order, so an unauthenticated client can make the node
    neither parse nor buffer anything."""

    def __init__(
        self,
        app: AsgiApp,
        *,
        answer: ErrorAnswer,
        token: str,
        public_paths: frozenset[str],
        limits: AdminLimits,
        on_auth_failure: Callable[[], None] | None,
    ) -> None:
        self._app = app
        self._answer = answer
        # Digests of equal length: compare_digest then takes the same time whatever the
        # presented token's length.
        self._token_digest = hashlib.sha256(token.encode("utf-8")).digest()
        self._public_paths = public_paths
        self._limits = limits
        self._on_auth_failure = on_auth_failure
        self._inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        if scope["path"] == HEALTH_PATH:
            # Outside the in-flight bound: a liveness probe must not fail (and get the
            # process restarted) because operators keep the admin API busy. It is cheap.
            await self._serve(scope, receive, send)
            return
        if self._inflight >= self._limits.requests_inflight_max:
            body = ErrorBody(code="overloaded", message="too many admin requests in flight")
            answer = self._answer(503, body, {"Retry-After": str(RETRY_AFTER_S)})
            await answer(scope, receive, send)
            return
        self._inflight += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self._inflight -= 1

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        if scope["path"] not in self._public_paths:
            problem = self._auth_problem(headers)
            if problem:
                if self._on_auth_failure is not None:
                    self._on_auth_failure()
                answer = self._answer(
                    401,
                    ErrorBody(code="unauthorized", message=problem),
                    {"WWW-Authenticate": "Bearer"},
                )
                await answer(scope, receive, send)
                return
        body_bytes_max = self._limits.request_body_bytes_max
        lengths = [value for name, value in headers if name == b"content-length"]
        if lengths:
            if len(lengths) > 1 or not lengths[0].isdigit():
                body = ErrorBody(code="bad_request", message="invalid Content-Length")
                answer = self._answer(400, body, None)
                await answer(scope, receive, send)
                return
            if int(lengths[0]) > body_bytes_max:
                await self._too_large(scope, receive, send)
                return
        chunks: list[bytes] = []
        size_bytes = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone: nothing to answer
            chunk: bytes = message.get("body", b"")
            size_bytes += len(chunk)
            if size_bytes > body_bytes_max:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self._app(scope, replay, send)

    def _auth_problem(self, headers: list[tuple[bytes, bytes]]) -> str:
        """ "" when the request carries the token; else what is wrong (never the token)."""
        values = [value for name, value in headers if name == b"authorization"]
        if not values:
            return "missing bearer token (Authorization: Bearer <token>)"
        if len(values) > 1:
            return "more than one Authorization header"
        scheme, _, credentials = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer" or not credentials.strip():
            return "the Authorization header must be: Bearer <token>"
        presented = hashlib.sha256(credentials.strip()).digest()
        if not hmac.compare_digest(presented, self._token_digest):
            return "invalid bearer token"
        return ""

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = ErrorBody(
            code="body_too_large",
            message=f"the request body is over {self._limits.request_body_bytes_max} bytes",
        )
        await self._answer(413, body, None)(scope, receive, send)
