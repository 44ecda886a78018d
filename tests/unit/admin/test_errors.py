"""Errors are JSON `{"code", "message"}` with the right status, and never a traceback.

How: the fake view is put in each state that makes an endpoint fail (an unknown or
remote shard, a follower, a stale epoch, a full membership...), or told to raise a given
exception on its next call (`fail_next`), or to never answer (`hold`, with a short
`view_call_s_max`); each answer's status, code and extra fields are checked, and no
answer holds "Traceback" or the text of an unexpected exception. The 500 path is also
checked to log the traceback.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from logsvc.admin.app import create_app
from logsvc.admin.errors import (
    AdminError,
    MembershipChangeInProgress,
    OutcomeUnknown,
    Overloaded,
    Unavailable,
)
from logsvc.admin.limits import AdminLimits
from logsvc.admin.port import FakeNodeView, example_view

from .conftest import AUTH, TOKEN


def error_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert "Traceback" not in response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    assert isinstance(body["message"], str)
    assert body["message"]
    return body


# ------------------------------------------------------------------------------ 404


def test_unknown_shard(client: TestClient) -> None:
    body = error_of(client.get("/v1/shards/9"), 404, "unknown_shard")
    assert body == {"code": "unknown_shard", "message": "no shard 9 in this cluster"}
    error_of(client.post("/v1/shards/9/truncate", json={"lsn": 1}), 404, "unknown_shard")


def test_shard_hosted_elsewhere_names_its_replicas(client: TestClient) -> None:
    body = error_of(client.get("/v1/shards/3"), 404, "shard_not_hosted")
    assert body["replicas"] == ["n2", "n3", "n4"]


def test_unknown_node_and_not_a_replica(client: TestClient) -> None:
    error_of(client.post("/v1/shards/1/replicas", json={"node_id": "n9"}), 404, "unknown_node")
    error_of(client.delete("/v1/shards/1/replicas/n9"), 404, "unknown_node")
    error_of(client.delete("/v1/shards/1/replicas/n4"), 404, "not_a_replica")
    body = {"target_node_id": "n4"}
    error_of(client.post("/v1/shards/1/transfer-leader", json=body), 404, "not_a_replica")


def test_unknown_path_and_method(client: TestClient) -> None:
    assert error_of(client.get("/v1/nope"), 404, "not_found") == {
        "code": "not_found",
        "message": "no such endpoint",
    }
    response = client.put("/v1/cluster")
    error_of(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET"


# ------------------------------------------------------------------------------ 409


def test_not_leader_names_the_leader(client: TestClient) -> None:
    for response in (
        client.post("/v1/shards/2/truncate", json={"lsn": 5}),
        client.post("/v1/shards/2/transfer-leader", json={}),
        client.post("/v1/shards/2/replicas", json={"node_id": "n4"}),
        client.delete("/v1/shards/2/replicas/n3"),
    ):
        body = error_of(response, 409, "not_leader")
        assert body["leader"] == {
            "node_id": "n2",
            "data_address": "127.0.0.1:7102",
            "admin_address": "127.0.0.1:7202",
        }


def test_not_leader_with_no_known_leader_says_null(client: TestClient, view: FakeNodeView) -> None:
    view.put_status(dataclasses.replace(view.status_now(2), leader=None))
    body = error_of(client.post("/v1/shards/2/truncate", json={"lsn": 5}), 409, "not_leader")
    assert "leader" in body
    assert body["leader"] is None


@pytest.mark.parametrize(("epoch", "code"), [(1, "stale_epoch"), (3, "not_lease_holder")])
def test_fenced_truncate_names_the_lease(client: TestClient, epoch: int, code: str) -> None:
    response = client.post("/v1/shards/1/truncate", json={"lsn": 20, "epoch": epoch})
    body = error_of(response, 409, code)
    assert (body["current_holder"], body["current_epoch"]) == ("engine-a", 2)


def test_membership_rules(client: TestClient) -> None:
    error_of(client.post("/v1/shards/1/replicas", json={"node_id": "n2"}), 409, "already_a_replica")
    # At 3 members: removing one is refused; removing the leader itself always is.
    error_of(client.delete("/v1/shards/1/replicas/n2"), 409, "change_refused")
    assert client.post("/v1/shards/1/replicas", json={"node_id": "n4"}).status_code == 201
    error_of(client.delete("/v1/shards/1/replicas/n1"), 409, "change_refused")


def test_transfer_to_a_replica_behind_is_refused(client: TestClient) -> None:
    body = error_of(
        client.post("/v1/shards/1/transfer-leader", json={"target_node_id": "n3"}),
        409,
        "change_refused",
    )
    assert "5 entries behind" in body["message"]


def test_one_membership_change_at_a_time(client: TestClient, view: FakeNodeView) -> None:
    view.fail_next(MembershipChangeInProgress(1))
    response = client.post("/v1/shards/1/replicas", json={"node_id": "n4"})
    error_of(response, 409, "membership_change_in_progress")


# ------------------------------------------------------------------------------ 422


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/shards/1/truncate", {"lsn": 0}, "body.lsn"),
        ("/v1/shards/1/truncate", {"lsn": "5"}, "body.lsn"),  # strict: no string numbers
        ("/v1/shards/1/truncate", {"lsn": 5.5}, "body.lsn"),
        ("/v1/shards/1/truncate", {"lsn": True}, "body.lsn"),
        ("/v1/shards/1/truncate", {"lsn": 2**64}, "body.lsn"),
        ("/v1/shards/1/truncate", {"lsn": 5, "epoch": -1}, "body.epoch"),
        ("/v1/shards/1/truncate", {"lsn": 5, "force": True}, "body.force"),
        ("/v1/shards/1/truncate", {}, "body.lsn"),
        ("/v1/shards/1/truncate", None, "body"),
        ("/v1/shards/1/replicas", {"node_id": "bad id!"}, "body.node_id"),
        ("/v1/shards/1/replicas", {"node_id": "x" * 65}, "body.node_id"),
        ("/v1/shards/1/replicas", {"node_id": ""}, "body.node_id"),
        ("/v1/shards/1/transfer-leader", {"target_node_id": 7}, "body.target_node_id"),
        ("/v1/shards/0/truncate", {"lsn": 5}, "path.shard_id"),
        ("/v1/shards/65536/truncate", {"lsn": 5}, "path.shard_id"),
        ("/v1/shards/abc/truncate", {"lsn": 5}, "path.shard_id"),
    ],
)
def test_invalid_requests_are_422_naming_the_field(
    client: TestClient, view: FakeNodeView, path: str, body: object, field: str
) -> None:
    answer = error_of(client.post(path, json=body), 422, "invalid_request")
    assert set(answer) == {"code", "message"}
    assert answer["message"].startswith(f"{field}: ")
    assert view.calls == []  # refused before the view was asked


def test_malformed_json_is_422(client: TestClient) -> None:
    response = client.post(
        "/v1/shards/1/truncate", content=b'{"lsn": ', headers={"content-type": "application/json"}
    )
    error_of(response, 422, "invalid_request")


def test_invalid_path_node_id_is_422(client: TestClient) -> None:
    error_of(client.delete("/v1/shards/1/replicas/" + "x" * 65), 422, "invalid_request")


def test_validation_messages_do_not_echo_the_input(client: TestClient) -> None:
    response = client.post("/v1/shards/1/replicas", json={"node_id": "leaky value!"})
    assert "leaky value" not in error_of(response, 422, "invalid_request")["message"]


# ------------------------------------------------------------------------------ 5xx


def test_overloaded_and_unavailable_are_503_with_retry_after(
    client: TestClient, view: FakeNodeView
) -> None:
    for failure, code in (
        (Overloaded("queue full"), "overloaded"),
        (Unavailable("stopping"), "unavailable"),
    ):
        view.fail_next(failure)
        response = client.post("/v1/shards/1/truncate", json={"lsn": 20, "epoch": 2})
        error_of(response, 503, code)
        assert response.headers["retry-after"] == "1"


def test_outcome_unknown_is_504(client: TestClient, view: FakeNodeView) -> None:
    view.fail_next(OutcomeUnknown("membership change not committed within 30 s"))
    response = client.post("/v1/shards/1/replicas", json={"node_id": "n4"})
    body = error_of(response, 504, "outcome_unknown")
    assert "30 s" in body["message"]


def test_a_bare_admin_error_is_500_with_its_code(client: TestClient, view: FakeNodeView) -> None:
    view.fail_next(AdminError("an error of no branch"))
    error_of(client.get("/v1/cluster"), 500, "admin_error")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/cluster", None),
        ("GET", "/v1/shards", None),
        ("GET", "/v1/shards/1", None),
        ("POST", "/v1/shards/1/truncate", {"lsn": 20, "epoch": 2}),
        ("POST", "/v1/shards/1/transfer-leader", {}),
        ("POST", "/v1/shards/1/replicas", {"node_id": "n4"}),
        ("DELETE", "/v1/shards/1/replicas/n3", None),
        ("GET", "/readyz", None),
        ("GET", "/metrics", None),
        ("GET", "/healthz", None),
    ],
)
def test_a_bug_in_the_view_is_a_generic_500_and_a_log_line(
    client: TestClient,
    view: FakeNodeView,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: object,
) -> None:
    view.fail_next(KeyError("internal detail /var/lib/logsvc/x"))
    with caplog.at_level(logging.ERROR, logger="logsvc.admin"):
        response = client.request(method, path, json=body)
    answer = error_of(response, 500, "internal")
    assert answer == {
        "code": "internal",
        "message": "internal error; the node's log has the details",
    }
    assert "internal detail" not in response.text
    [record] = [r for r in caplog.records if r.name == "logsvc.admin"]
    assert path in record.getMessage()
    assert record.exc_info is not None  # the traceback goes to the log


def test_a_view_that_does_not_answer(view: FakeNodeView) -> None:
    app = create_app(view, TOKEN, limits=AdminLimits(view_call_s_max=0.05))
    with TestClient(app, headers=AUTH) as client:
        view.hold()
        # A query that timed out changed nothing: 503. A change may have happened: 504.
        error_of(client.get("/v1/shards/1"), 503, "unavailable")
        response = client.post("/v1/shards/1/truncate", json={"lsn": 20, "epoch": 2})
        error_of(response, 504, "outcome_unknown")
        view.release()
        assert client.get("/v1/shards/1").status_code == 200


def test_errors_are_documented_as_error_body() -> None:
    spec = create_app(example_view(), TOKEN).openapi()
    responses = spec["paths"]["/v1/shards/{shard_id}/replicas"]["post"]["responses"]
    for status in ("401", "404", "409", "413", "422", "500", "503", "504"):
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema["$ref"] == "#/components/schemas/ErrorBody", status
