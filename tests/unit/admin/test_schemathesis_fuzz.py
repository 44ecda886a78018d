"""Schemathesis against the admin API's own OpenAPI description: no request gets a 5xx.

How: schemathesis reads /openapi.json from the in-process app (over `example_view`, no
sockets) and generates requests for every operation, both schema-valid ones and invalid
ones (wrong types, out-of-range ids, malformed and non-UTF-8 bodies, extra fields). Each
request goes to an app whose fake node is reset to the example cluster first, so every
example starts from the same state (a transfer in one example does not turn the next
one's truncate into a 409) and a failure replays exactly. Checked:

* with the token: no 5xx; every error is the JSON `{"code", "message"}` body; the
  status code, content type and body are the ones the description documents;
* without a valid token (none, or whatever schemathesis puts in the bearer header): 401
  everywhere but /healthz, the same JSON error body, and never a 5xx.

No answer may contain the token.

Budget: CI runs FUZZ_EXAMPLES (default 10) examples per operation, derandomized (the
same examples every run, a few seconds in all). The longer command explores freely, with
a fresh random seed each run:

    FUZZ_EXAMPLES=2000 .venv/bin/pytest tests/unit/admin/test_schemathesis_fuzz.py

(about 40 examples a second on one core). Schema-valid bodies that the app refuses are
not checked (schemathesis's `positive_data_acceptance`): it compares integers near
LSN_MAX / EPOCH_MAX (2**64 - 1) as floats, so it calls 2**64 + 383 valid.

Bugs found so far: a non-UTF-8 JSON body was an undocumented 400 with the message "HTTP
400" (now a documented 400 "bad_request").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from logsvc.admin.app import create_app
from logsvc.admin.gate import HEALTH_PATH
from logsvc.admin.port import FakeNodeView, example_view
from logsvc.admin.status import ClusterInfo, ShardStatus

from .conftest import AUTH, TOKEN

FUZZ_EXAMPLES: Final = int(os.environ.get("FUZZ_EXAMPLES", "10"))
# A long run explores new inputs each time; the CI run is the same every time.
DERANDOMIZE: Final = "FUZZ_EXAMPLES" not in os.environ

CHECKS: Final = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


class ResettableView:
    """A `NodeView` over a fresh `example_view()` after each `reset()`: one app for the
    whole run (building one takes ~20 ms, the request ~1 ms) with no state carried over
    from one example to the next."""

    def __init__(self) -> None:
        self.current: FakeNodeView = example_view()

    def reset(self) -> None:
        self.current = example_view()

    async def cluster(self) -> ClusterInfo:
        return await self.current.cluster()

    async def shard_status(self, shard_id: int) -> ShardStatus:
        return await self.current.shard_status(shard_id)

    async def truncate(self, shard_id: int, lsn: int, epoch: int) -> int:
        return await self.current.truncate(shard_id, lsn, epoch)

    async def transfer_leader(self, shard_id: int, target_node_id: str | None) -> str | None:
        return await self.current.transfer_leader(shard_id, target_node_id)

    async def add_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        return await self.current.add_replica(shard_id, node_id)

    async def remove_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        return await self.current.remove_replica(shard_id, node_id)

    async def host_shard(
        self, shard_id: int, members: Sequence[str], learner: bool = False
    ) -> tuple[str, ...]:
        return await self.current.host_shard(shard_id, members, learner)

    async def promote_shard(self, shard_id: int, members: Sequence[str]) -> tuple[str, ...]:
        return await self.current.promote_shard(shard_id, members)

    async def release_shard(self, shard_id: int) -> bool:
        return await self.current.release_shard(shard_id)

    async def alive(self) -> bool:
        return await self.current.alive()

    async def metrics(self) -> bytes:
        return await self.current.metrics()


VIEW: Final = ResettableView()
APP: Final = create_app(VIEW, TOKEN)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

fuzz_settings = settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=DERANDOMIZE,
    database=None,  # nothing written to .hypothesis/: a CI run is the same every time
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def send(case: schemathesis.Case[Any], headers: dict[str, str] | None) -> Response:
    VIEW.reset()
    return case.call(app=APP, headers=headers)


def check_answer(case: schemathesis.Case[Any], response: Response) -> None:
    where = f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text}"
    assert TOKEN not in response.text and TOKEN not in str(response.headers)
    if response.status_code >= 400:
        body: Any = response.json()
        assert isinstance(body, dict) and {"code", "message"} <= set(body), (where, body)
        assert "Traceback" not in body["message"]


@schema.parametrize()
@fuzz_settings
def test_no_server_error_with_the_token(case: schemathesis.Case[Any]) -> None:
    response = send(case, dict(AUTH))
    check_answer(case, response)
    case.validate_response(response, checks=CHECKS, headers=dict(AUTH))


@schema.parametrize()
@fuzz_settings
def test_no_server_error_without_a_valid_token(case: schemathesis.Case[Any]) -> None:
    # The header is whatever schemathesis generated for the bearer scheme, or none.
    response = send(case, None)
    check_answer(case, response)
    if case.path != HEALTH_PATH:
        assert response.status_code == 401, (case.path, response.status_code, response.text)
        assert response.json()["code"] == "unauthorized"


# ------------------------------------------------------------- what the fuzz test found


def test_a_body_that_is_not_utf8_is_a_documented_400() -> None:
    """Found by the fuzz test: FastAPI refuses a JSON body it cannot decode with a 400,
    which the description did not list and which said only "HTTP 400"."""
    with TestClient(create_app(example_view(), TOKEN), headers=AUTH) as client:
        for path in ("/v1/shards/1/truncate", "/v1/shards/1/replicas"):
            response = client.post(
                path, content=b"z\xff\xfe", headers={"content-type": "application/json"}
            )
            assert response.status_code == 400
            assert response.json() == {
                "code": "bad_request",
                "message": "the request body could not be parsed",
            }
        documented = client.get("/openapi.json").json()["paths"]
        for path, operations in documented.items():
            for method, operation in operations.items():
                assert "400" in operation["responses"], (method, path)
