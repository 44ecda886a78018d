"""The admin HTTP API of one node: a FastAPI app over a `NodeView` (port.py).

The only module importing FastAPI. `create_app(view, token)` returns the app; the daemon
serves it with uvicorn on the node's `admin_address`.

    GET    /v1/cluster                         nodes, shards, leaders
    GET    /v1/shards                          the status of every shard hosted here
    GET    /v1/shards/{shard_id}               one hosted shard's status
    POST   /v1/shards/{shard_id}/truncate      {"lsn", "epoch"} -> first retained LSN
    POST   /v1/shards/{shard_id}/transfer-leader   [{"target_node_id": id | null}] -> 202
    POST   /v1/shards/{shard_id}/replicas      {"node_id"} -> 201, the members
    DELETE /v1/shards/{shard_id}/replicas/{node_id}  -> the members
    POST   /v1/internal/shards/{shard_id}/host  {"members", "learner"}: node to node, a
                                               leader adding this node (0002-membership.md;
                                               as a learner first: 0005)
    POST   /v1/internal/shards/{shard_id}/promote  {"members"}: node to node, the learner
                                               caught up: restarted as a joining voter
    DELETE /v1/internal/shards/{shard_id}/host  node to node, a leader that removed it
    GET    /healthz                            the process answers (no auth)
    GET    /readyz                             readiness.py's rule: 200 ready, 503 not
    GET    /metrics                            Prometheus text format 0.0.4
    GET    /docs, /openapi.json                the OpenAPI description (no auth, see below);
                                               Swagger UI's assets from the node itself
                                               (/docs/assets/..., docs_page.py: no CDN)
    GET    /                                   the dashboard page (no auth, no data: below)

Every request passes the gate (gate.py) first, before routing and before its body is parsed:
at most `requests_inflight_max` at once (503 "overloaded"), a bearer token on every path
but the public ones (401 "unauthorized", compared in constant time), a body of at most
`request_body_bytes_max` bytes (413 "body_too_large"). The OpenAPI description is public
by default (`docs_public`): it describes the API and holds no data, and the Swagger page
at /docs cannot send a token when the browser loads it.

The dashboard (`GET /`, dashboard.html) is public for the same reason: it is a static page
with no data and no secret. Its script asks the operator for the token, keeps it in the
tab's sessionStorage and calls /v1/cluster, /v1/shards and /readyz with it; a refused
token shows "401: wrong token". Its Content-Security-Policy allows exactly the page's own
inline script and style (by SHA-256) and connections to this origin, nothing else.

Errors are JSON, always `{"code": ..., "message": ...}` (`ErrorBody`, with a leader hint or
the current lease where they apply), never a traceback: the view's typed errors map by
branch (errors.py: NotFound 404, Conflict 409, Unavailable 503, OutcomeUnknown 504),
request validation is 422 "invalid_request" (naming the field, never echoing the input),
an unknown path 404 "not_found", and anything else 500 "internal" with a generic
message, the traceback going to the log only. No model has a field for a secret, so no
answer can hold the token or the cluster secret.

(No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations at
runtime.)
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Annotated, Any, Final, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from logsvc.admin import docs_page, readiness
from logsvc.admin.dashboard import dashboard_page
from logsvc.admin.errors import (
    AdminError,
    Conflict,
    NotFound,
    NotLeader,
    NotLeaseHolder,
    OutcomeUnknown,
    ShardNotHosted,
    StaleEpoch,
    Unavailable,
)
from logsvc.admin.gate import HEALTH_PATH, RETRY_AFTER_S, Gate
from logsvc.admin.limits import (
    DEFAULT_ADMIN_LIMITS,
    NODE_ID_CHARS,
    NODE_ID_PATTERN,
    SHARD_ID_MAX,
    SHARD_ID_MIN,
    AdminLimits,
)
from logsvc.admin.models import (
    AddReplicaRequest,
    ClusterResponse,
    ErrorBody,
    HealthResponse,
    HostShardRequest,
    HostShardResponse,
    MembershipResponse,
    NodeModel,
    PromoteShardRequest,
    ReadinessResponse,
    ShardListResponse,
    ShardStatusModel,
    TransferLeaderRequest,
    TransferLeaderResponse,
    TruncateRequest,
    TruncateResponse,
)
from logsvc.admin.port import EXPOSITION_CONTENT_TYPE, NodeView

log = logging.getLogger("logsvc.admin")

T = TypeVar("T")

DASHBOARD_PATH: Final = "/"
DOCS_PAGE_PATH: Final = "/docs"
DOCS_OAUTH2_REDIRECT_PATH: Final = "/docs/oauth2-redirect"
DOCS_PATHS: Final = (
    DOCS_PAGE_PATH,
    DOCS_OAUTH2_REDIRECT_PATH,
    "/openapi.json",
    *(docs_page.asset_path(name) for name in docs_page.ASSETS),
)

ASSET_HEADERS: Final = {
    "Cache-Control": "public, max-age=86400",  # versioned by the pinned package
    "X-Content-Type-Options": "nosniff",
}

# A validation error's message names at most this many fields: bounded, and enough to fix
# a request by hand.
VALIDATION_PROBLEMS_SHOWN_MAX: Final = 5
ERROR_MESSAGE_CHARS_MAX: Final = 1000

INTERNAL_MESSAGE: Final = "internal error; the node's log has the details"

API_DESCRIPTION: Final = """\
The admin API of one logsvc node: cluster and shard status, truncation, leadership
transfer, membership changes, health, readiness and Prometheus metrics.

Every endpoint but `/healthz` (and these docs) needs `Authorization: Bearer <token>`.
Errors are JSON: `{"code": ..., "message": ...}`, with `leader` on `not_leader` (retry
there), `current_holder` / `current_epoch` on `stale_epoch` / `not_lease_holder`, and
`replicas` on `shard_not_hosted`. Changes go to the shard's leader; a 504
`outcome_unknown` means the change may or may not have happened: read the shard's status
before retrying.
"""


# ---------------------------------------------------------------------- request types

ShardIdParam = Annotated[
    int, PathParam(ge=SHARD_ID_MIN, le=SHARD_ID_MAX, description="The shard's id.")
]
NodeIdParam = Annotated[
    str,
    PathParam(
        min_length=1, max_length=NODE_ID_CHARS, pattern=NODE_ID_PATTERN, description="A node id."
    ),
]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


# Errors any authenticated endpoint may answer (400: a bad Content-Length, or a body that
# is not even text; found undocumented by the schemathesis fuzz test).
_COMMON_ERRORS: Final = (400, 401, 413, 500, 503, 504)


# ------------------------------------------------------------------------ error answers


def _error_response(
    status: int, body: ErrorBody, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        body.model_dump(mode="json", exclude_unset=True), status_code=status, headers=headers
    )


def _status_of(exc: AdminError) -> int:
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, Unavailable):
        return 503
    if isinstance(exc, OutcomeUnknown):
        return 504
    return 500


def admin_error_response(exc: AdminError) -> JSONResponse:
    body = ErrorBody(code=exc.code, message=exc.message[:ERROR_MESSAGE_CHARS_MAX])
    if isinstance(exc, NotLeader):
        leader = None if exc.leader is None else NodeModel.model_validate(exc.leader)
        # Passed explicitly, so present (as null) even when the leader is unknown.
        body = ErrorBody(code=body.code, message=body.message, leader=leader)
    elif isinstance(exc, StaleEpoch | NotLeaseHolder):
        body = ErrorBody(
            code=body.code,
            message=body.message,
            current_holder=exc.current_holder,
            current_epoch=exc.current_epoch,
        )
    elif isinstance(exc, ShardNotHosted):
        body = ErrorBody(code=body.code, message=body.message, replicas=list(exc.replicas))
    status = _status_of(exc)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return _error_response(status, body, headers)


def _validation_message(problems: Iterable[Any]) -> str:
    """Which fields are wrong and why, without the values sent (they could be anything,
    a pasted secret included)."""
    parts: list[str] = []
    problems = list(problems)
    for problem in problems[:VALIDATION_PROBLEMS_SHOWN_MAX]:
        where = ".".join(str(part) for part in problem.get("loc", ()))
        parts.append(f"{where}: {problem.get('msg', 'invalid')}")
    hidden = len(problems) - len(parts)
    if hidden > 0:
        parts.append(f"and {hidden} more")
    return ("; ".join(parts) or "invalid request")[:ERROR_MESSAGE_CHARS_MAX]


async def _on_admin_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AdminError)
    return admin_error_response(exc)


async def _on_validation_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    body = ErrorBody(code="invalid_request", message=_validation_message(exc.errors()))
    return _error_response(422, body)


async def _on_http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        body = ErrorBody(code="not_found", message="no such endpoint")
    elif exc.status_code == 405:
        body = ErrorBody(code="method_not_allowed", message="method not allowed here")
    elif exc.status_code == 400:
        # FastAPI's answer to a body it cannot decode at all (not UTF-8): JSON that does
        # not parse is a validation error (422) instead.
        body = ErrorBody(code="bad_request", message="the request body could not be parsed")
    else:
        body = ErrorBody(code="http_error", message=f"HTTP {exc.status_code}")
    return _error_response(exc.status_code, body, exc.headers)


async def _on_internal_error(request: Request, exc: Exception) -> Response:
    """Last resort, outside the routes (the routes' own errors go through `_GuardedRoute`).
    Starlette re-raises the exception to the server after this answer; uvicorn logs it."""
    log.error("admin API: internal error on %s %s: %r", request.method, request.url.path, exc)
    return _error_response(500, ErrorBody(code="internal", message=INTERNAL_MESSAGE))


class _GuardedRoute(APIRoute):
    """A route whose unexpected exceptions become a logged 500 JSON answer here, rather
    than propagate to Starlette's ServerErrorMiddleware (which answers text and re-raises
    to the server)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (AdminError, RequestValidationError, StarletteHTTPException):
                raise  # answered by their exception handlers
            except Exception:
                log.exception(
                    "admin API: internal error on %s %s", request.method, request.url.path
                )
                return _error_response(500, ErrorBody(code="internal", message=INTERNAL_MESSAGE))

        return guarded


# ---------------------------------------------------------------------------- the app


def create_app(
    view: NodeView,
    token: str,
    *,
    limits: AdminLimits = DEFAULT_ADMIN_LIMITS,
    on_auth_failure: Callable[[], None] | None = None,
    docs_public: bool = True,
) -> FastAPI:
    """The admin app of one node. `token` is the admin bearer token (the config's
    `token`); `on_auth_failure` is called once per refused request (the daemon counts
    them: `Metrics.count_auth_failure("admin")`)."""
    assert token, "an empty token would let anyone in"
    limits = limits.validate()
    app = FastAPI(
        title="logsvc admin API",
        version="1",
        description=API_DESCRIPTION,
        docs_url=None,  # served below from the installed assets, not a CDN (docs_page.py)
        redoc_url=None,  # /docs is the one OpenAPI page
    )
    public = {HEALTH_PATH, DASHBOARD_PATH, *(DOCS_PATHS if docs_public else ())}
    app.add_middleware(
        Gate,
        answer=_error_response,
        token=token,
        public_paths=frozenset(public),
        limits=limits,
        on_auth_failure=on_auth_failure,
    )
    app.add_exception_handler(AdminError, _on_admin_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_internal_error)

    # The gate checks the token; this only puts the bearer scheme in the OpenAPI
    # description (so /docs has an "Authorize" button). It never refuses anything.
    bearer = HTTPBearer(auto_error=False, description="The node's token.")
    api = APIRouter(route_class=_GuardedRoute, dependencies=[Depends(bearer)])
    public_api = APIRouter(route_class=_GuardedRoute)

    async def ask(call: Awaitable[T], *, change: bool) -> T:
        """One view call, bounded by `view_call_s_max`: a change that does not answer in
        time may have happened (504 outcome_unknown), a query did not (503)."""
        try:
            return await asyncio.wait_for(call, limits.view_call_s_max)
        except TimeoutError:
            reason = f"no answer from the node within {limits.view_call_s_max} s"
            if change:
                raise OutcomeUnknown(reason) from None
            raise Unavailable(reason) from None

    async def hosted_shard_ids() -> list[int]:
        cluster = await ask(view.cluster(), change=False)
        return [shard.shard_id for shard in cluster.shards if shard.hosted]

    @api.get(
        "/v1/cluster",
        response_model=ClusterResponse,
        responses=_errors(*_COMMON_ERRORS),
        summary="Nodes, shards and their leaders",
    )
    async def get_cluster() -> ClusterResponse:
        return ClusterResponse.model_validate(await ask(view.cluster(), change=False))

    @api.get(
        "/v1/shards",
        response_model=ShardListResponse,
        responses=_errors(*_COMMON_ERRORS),
        summary="The status of every shard hosted on this node",
    )
    async def list_shards() -> ShardListResponse:
        statuses: list[ShardStatusModel] = []
        for shard_id in await hosted_shard_ids():
            try:
                status = await ask(view.shard_status(shard_id), change=False)
            except ShardNotHosted:
                continue  # removed from this node since the cluster answer
            statuses.append(ShardStatusModel.model_validate(status))
        return ShardListResponse(shards=statuses)

    @api.get(
        "/v1/shards/{shard_id}",
        response_model=ShardStatusModel,
        responses=_errors(404, 422, *_COMMON_ERRORS),
        summary="One hosted shard's status",
    )
    async def get_shard(shard_id: ShardIdParam) -> ShardStatusModel:
        return ShardStatusModel.model_validate(await ask(view.shard_status(shard_id), change=False))

    @api.post(
        "/v1/shards/{shard_id}/truncate",
        response_model=TruncateResponse,
        responses=_errors(404, 409, 422, *_COMMON_ERRORS),
        summary="Truncate the records below an LSN (on the leader, fenced by the lease)",
    )
    async def truncate(shard_id: ShardIdParam, request: TruncateRequest) -> TruncateResponse:
        first_lsn = await ask(view.truncate(shard_id, request.lsn, request.epoch), change=True)
        return TruncateResponse(shard_id=shard_id, first_lsn=first_lsn)

    @api.post(
        "/v1/shards/{shard_id}/transfer-leader",
        response_model=TransferLeaderResponse,
        status_code=202,
        responses=_errors(404, 409, 422, *_COMMON_ERRORS),
        summary="Ask the leader to hand leadership over (poll the shard to see it done)",
    )
    async def transfer_leader(
        shard_id: ShardIdParam, request: TransferLeaderRequest | None = None
    ) -> TransferLeaderResponse:
        target_node_id = None if request is None else request.target_node_id
        target = await ask(view.transfer_leader(shard_id, target_node_id), change=True)
        return TransferLeaderResponse(shard_id=shard_id, target_node_id=target)

    @api.post(
        "/v1/shards/{shard_id}/replicas",
        response_model=MembershipResponse,
        status_code=201,
        responses=_errors(404, 409, 422, *_COMMON_ERRORS),
        summary="Add a replica (one membership change at a time per shard)",
    )
    async def add_replica(shard_id: ShardIdParam, request: AddReplicaRequest) -> MembershipResponse:
        members = await ask(view.add_replica(shard_id, request.node_id), change=True)
        return MembershipResponse(shard_id=shard_id, replicas=list(members))

    @api.delete(
        "/v1/shards/{shard_id}/replicas/{node_id}",
        response_model=MembershipResponse,
        responses=_errors(404, 409, 422, *_COMMON_ERRORS),
        summary="Remove a replica (one membership change at a time per shard)",
    )
    async def remove_replica(shard_id: ShardIdParam, node_id: NodeIdParam) -> MembershipResponse:
        members = await ask(view.remove_replica(shard_id, node_id), change=True)
        return MembershipResponse(shard_id=shard_id, replicas=list(members))

    @api.post(
        "/v1/internal/shards/{shard_id}/host",
        response_model=HostShardResponse,
        responses=_errors(404, 422, *_COMMON_ERRORS),
        tags=["internal"],
        summary="Node to node: start hosting a replica that joins the shard",
    )
    async def host_shard(shard_id: ShardIdParam, request: HostShardRequest) -> HostShardResponse:
        members = await ask(
            view.host_shard(shard_id, request.members, request.learner), change=True
        )
        # A retried call finds the replica as it is (it may be promoted already).
        status = await ask(view.shard_status(shard_id), change=False)
        return HostShardResponse(
            shard_id=shard_id, hosted=True, replicas=list(members), stage=status.stage
        )

    @api.post(
        "/v1/internal/shards/{shard_id}/promote",
        response_model=HostShardResponse,
        responses=_errors(404, 422, *_COMMON_ERRORS),
        tags=["internal"],
        summary="Node to node: the learner caught up: restart it as a joining voter",
    )
    async def promote_shard(
        shard_id: ShardIdParam, request: PromoteShardRequest
    ) -> HostShardResponse:
        members = await ask(view.promote_shard(shard_id, request.members), change=True)
        status = await ask(view.shard_status(shard_id), change=False)
        return HostShardResponse(
            shard_id=shard_id, hosted=True, replicas=list(members), stage=status.stage
        )

    @api.delete(
        "/v1/internal/shards/{shard_id}/host",
        response_model=HostShardResponse,
        responses=_errors(404, 422, *_COMMON_ERRORS),
        tags=["internal"],
        summary="Node to node: stop hosting the shard (removed from it), archive the replica",
    )
    async def release_shard(shard_id: ShardIdParam) -> HostShardResponse:
        await ask(view.release_shard(shard_id), change=True)
        return HostShardResponse(shard_id=shard_id, hosted=False, replicas=[])

    @public_api.get(
        HEALTH_PATH,
        response_model=HealthResponse,
        responses={503: {"model": HealthResponse}, **_errors(400, 413, 500)},
        summary="The process is alive (no auth)",
    )
    async def healthz() -> JSONResponse:
        alive = await ask(view.alive(), change=False)
        body = HealthResponse(alive=alive).model_dump(mode="json")
        return JSONResponse(body, status_code=200 if alive else 503)

    @api.get(
        "/readyz",
        response_model=ReadinessResponse,
        responses={503: {"model": ReadinessResponse}, **_errors(400, 401, 413, 500)},
        summary="Every hosted shard has a leader and this node has caught up",
    )
    async def readyz() -> JSONResponse:
        shards: list[readiness.ShardReadiness] = []
        for shard_id in await hosted_shard_ids():
            try:
                status = await ask(view.shard_status(shard_id), change=False)
            except ShardNotHosted:
                continue
            except AdminError:
                shards.append(readiness.unavailable(shard_id))
                continue
            shards.append(readiness.assess_shard(status, limits.ready_apply_lag_entries_max))
        verdict = readiness.assess(shards)
        body = ReadinessResponse.model_validate(verdict).model_dump(mode="json")
        return JSONResponse(body, status_code=200 if verdict.ready else 503)

    @api.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
            **_errors(*_COMMON_ERRORS),
        },
        summary="Prometheus metrics",
    )
    async def metrics() -> Response:
        body = await ask(view.metrics(), change=False)
        return Response(content=body, media_type=EXPOSITION_CONTENT_TYPE)

    dashboard_html, dashboard_headers = dashboard_page()

    @public_api.get(DASHBOARD_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html, headers=dashboard_headers)

    _add_docs(public_api, app.title)
    app.include_router(api)
    app.include_router(public_api)
    return app


def _add_docs(router: APIRouter, title: str) -> None:
    """/docs: Swagger UI with its assets from the installed package (docs_page.py), so the
    page works on a node without internet access and makes no request elsewhere."""
    assets = docs_page.load_assets()
    page, page_headers = docs_page.docs_page(title, "/openapi.json", DOCS_OAUTH2_REDIRECT_PATH)

    @router.get(DOCS_PAGE_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page, headers=page_headers)

    @router.get(DOCS_OAUTH2_REDIRECT_PATH, response_class=HTMLResponse, include_in_schema=False)
    async def docs_oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    def serve(asset: docs_page.Asset) -> Callable[[], Awaitable[Response]]:
        async def asset_response() -> Response:
            return Response(asset.body, media_type=asset.media_type, headers=ASSET_HEADERS)

        return asset_response

    for path, asset in assets.items():
        router.add_api_route(path, serve(asset), methods=["GET"], include_in_schema=False)
