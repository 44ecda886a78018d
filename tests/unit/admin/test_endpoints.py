"""Every admin endpoint answers its documented shape on the happy path.

How: the app over `example_view` (nodes n1..n4; shard 1 led by n1 with n2 caught up and
n3 five entries behind; shard 2 led by n2; shard 3 on n2-n4 only), called through
FastAPI's TestClient with the token. Changes (truncate, transfer, add and remove a
replica) are checked by their answer and then by what GET /v1/shards/{id} shows after;
the node-to-node calls of a membership change (host / release a shard) likewise.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from logsvc.admin.metrics import Metrics
from logsvc.admin.port import FakeNodeView

SHARD_FIELDS = {
    "shard_id",
    "node_id",
    "is_leader",
    "leader",
    "term",
    "commit_index",
    "applied_index",
    "leader_commit_index",
    "apply_lag_entries",
    "first_lsn",
    "next_lsn",
    "last_lsn",
    "truncated_lsn",
    "lease_holder",
    "lease_epoch",
    "journal_first_index",
    "journal_physical_first_index",
    "physical_truncation_lag_entries",
    "last_election_at",
    "failed",
    "replicas",
    "joining",
    "quiet",
    "learner",
    "stage",
    "learners",
}
REPLICA_FIELDS = {
    "node_id",
    "match_index",
    "lag_entries",
    "lag_records",
    "lag_seconds",
    "connected",
    "caught_up",
}
NODE_FIELDS = {"node_id", "data_address", "admin_address"}


def get_json(client: TestClient, path: str) -> Any:
    response = client.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def test_cluster_lists_nodes_shards_and_leaders(client: TestClient) -> None:
    cluster = get_json(client, "/v1/cluster")
    assert set(cluster) == {"node_id", "nodes", "shards"}
    assert cluster["node_id"] == "n1"
    assert [node["node_id"] for node in cluster["nodes"]] == ["n1", "n2", "n3", "n4"]
    assert all(set(node) == NODE_FIELDS for node in cluster["nodes"])
    assert cluster["nodes"][1] == {
        "node_id": "n2",
        "data_address": "127.0.0.1:7102",
        "admin_address": "127.0.0.1:7202",
    }
    shards = {shard["shard_id"]: shard for shard in cluster["shards"]}
    assert sorted(shards) == [1, 2, 3]
    assert shards[1]["replicas"] == ["n1", "n2", "n3"]
    assert shards[1]["hosted"] is True
    assert shards[1]["leader"]["node_id"] == "n1"
    assert shards[2]["leader"]["node_id"] == "n2"
    assert shards[3] == {
        "shard_id": 3,
        "replicas": ["n2", "n3", "n4"],
        "hosted": False,
        "leader": None,
    }


def test_shards_lists_the_hosted_shards(client: TestClient) -> None:
    listing = get_json(client, "/v1/shards")
    assert set(listing) == {"shards"}
    assert [shard["shard_id"] for shard in listing["shards"]] == [1, 2]
    assert all(set(shard) == SHARD_FIELDS for shard in listing["shards"])


def test_shard_status_on_the_leader(client: TestClient) -> None:
    shard = get_json(client, "/v1/shards/1")
    assert set(shard) == SHARD_FIELDS
    assert shard["is_leader"] is True
    assert shard["leader"] == {
        "node_id": "n1",
        "data_address": "127.0.0.1:7101",
        "admin_address": "127.0.0.1:7201",
    }
    assert (shard["term"], shard["commit_index"], shard["applied_index"]) == (3, 120, 120)
    assert (shard["first_lsn"], shard["next_lsn"]) == (11, 501)
    assert (shard["last_lsn"], shard["truncated_lsn"]) == (500, 10)
    assert (shard["lease_holder"], shard["lease_epoch"]) == ("engine-a", 2)
    assert shard["journal_first_index"] == 40
    assert shard["journal_physical_first_index"] == 1
    assert shard["physical_truncation_lag_entries"] == 39
    assert shard["last_election_at"] == "2026-05-01T12:00:00Z"
    assert shard["failed"] is False
    replicas = {replica["node_id"]: replica for replica in shard["replicas"]}
    assert all(set(replica) == REPLICA_FIELDS for replica in shard["replicas"])
    assert replicas["n3"] == {
        "node_id": "n3",
        "match_index": 115,
        "lag_entries": 5,
        "lag_records": None,
        "lag_seconds": 0.2,
        "connected": True,
        "caught_up": None,
    }
    assert replicas["n1"]["lag_entries"] == 0


def test_shard_status_on_a_follower_has_no_replica_progress(client: TestClient) -> None:
    shard = get_json(client, "/v1/shards/2")
    assert shard["is_leader"] is False
    assert shard["leader"]["node_id"] == "n2"
    assert shard["last_lsn"] is None  # nothing retained: [1, 1)
    assert shard["truncated_lsn"] is None
    assert shard["last_election_at"] is None
    for replica in shard["replicas"]:
        assert replica["match_index"] is None
        assert replica["lag_entries"] is None


def test_truncate_moves_the_first_lsn(client: TestClient) -> None:
    response = client.post("/v1/shards/1/truncate", json={"lsn": 100, "epoch": 2})
    assert response.status_code == 200
    assert response.json() == {"shard_id": 1, "first_lsn": 100}
    assert get_json(client, "/v1/shards/1")["first_lsn"] == 100
    # At or below the first LSN: a no-op, reporting the first retained LSN.
    response = client.post("/v1/shards/1/truncate", json={"lsn": 50, "epoch": 2})
    assert response.json() == {"shard_id": 1, "first_lsn": 100}
    # Past the next LSN: everything is truncated, no further.
    response = client.post("/v1/shards/1/truncate", json={"lsn": 10**6, "epoch": 2})
    assert response.json() == {"shard_id": 1, "first_lsn": 501}
    assert get_json(client, "/v1/shards/1")["last_lsn"] is None


def test_truncate_epoch_defaults_to_zero(client: TestClient, view: FakeNodeView) -> None:
    response = client.post("/v1/shards/1/truncate", json={"lsn": 20})
    assert response.status_code == 409  # the lease is at epoch 2
    assert response.json()["code"] == "stale_epoch"
    assert view.status_now(1).first_lsn == 11


def test_transfer_leader_to_a_named_replica(client: TestClient) -> None:
    response = client.post("/v1/shards/1/transfer-leader", json={"target_node_id": "n2"})
    assert response.status_code == 202
    assert response.json() == {"shard_id": 1, "target_node_id": "n2"}
    shard = get_json(client, "/v1/shards/1")
    assert shard["is_leader"] is False
    assert shard["leader"]["node_id"] == "n2"
    assert shard["term"] == 4


@pytest.mark.parametrize("body", [None, {}, {"target_node_id": None}])  # None: no body
def test_transfer_leader_to_any_picks_the_caught_up_follower(
    client: TestClient, body: dict[str, object] | None
) -> None:
    response = client.post("/v1/shards/1/transfer-leader", json=body)
    assert response.status_code == 202, response.text
    assert response.json() == {"shard_id": 1, "target_node_id": "n2"}  # n3 is behind
    # n1 is a follower now: a second transfer is refused, naming n2.
    again = client.post("/v1/shards/1/transfer-leader", json=body)
    assert again.status_code == 409
    assert again.json()["code"] == "not_leader"
    assert again.json()["leader"]["node_id"] == "n2"


def test_transfer_to_the_current_leader_is_a_no_op(client: TestClient) -> None:
    response = client.post("/v1/shards/1/transfer-leader", json={"target_node_id": "n1"})
    assert response.status_code == 202
    assert response.json() == {"shard_id": 1, "target_node_id": "n1"}
    assert get_json(client, "/v1/shards/1")["is_leader"] is True


def test_add_then_remove_a_replica(client: TestClient) -> None:
    response = client.post("/v1/shards/1/replicas", json={"node_id": "n4"})
    assert response.status_code == 201
    assert response.json() == {"shard_id": 1, "replicas": ["n1", "n2", "n3", "n4"]}
    shard = get_json(client, "/v1/shards/1")
    [joining] = [r for r in shard["replicas"] if r["node_id"] == "n4"]
    assert joining["match_index"] == 0
    assert joining["lag_entries"] == 120  # catching up on the whole log
    assert joining["caught_up"] is False  # not healthy before it has every record
    cluster = get_json(client, "/v1/cluster")
    assert cluster["shards"][0]["replicas"] == ["n1", "n2", "n3", "n4"]

    response = client.delete("/v1/shards/1/replicas/n3")
    assert response.status_code == 200
    assert response.json() == {"shard_id": 1, "replicas": ["n1", "n2", "n4"]}
    assert [r["node_id"] for r in get_json(client, "/v1/shards/1")["replicas"]] == [
        "n1",
        "n2",
        "n4",
    ]


def test_healthz_is_alive(anon: TestClient) -> None:
    response = anon.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"alive": True}


def test_healthz_is_503_once_the_node_stops(anon: TestClient, view: FakeNodeView) -> None:
    view.set_alive(False)
    response = anon.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"alive": False}


def test_metrics_is_prometheus_text(
    client: TestClient, view: FakeNodeView, metrics: Metrics
) -> None:
    for shard_id in (1, 2):
        metrics.set_shard_status(view.status_now(shard_id))
    metrics.observe_append(1, records=3, size_bytes=300, seconds=0.002)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    assert "logsvc_appends" in families  # the parser drops counters' _total
    assert "logsvc_shard_term" in families
    [term] = [s for s in families["logsvc_shard_term"].samples if s.labels == {"shard": "1"}]
    assert term.value == 3


def test_openapi_lists_every_endpoint(anon: TestClient) -> None:
    spec = anon.get("/openapi.json").json()
    paths = spec["paths"]
    assert set(paths) == {
        "/v1/cluster",
        "/v1/shards",
        "/v1/shards/{shard_id}",
        "/v1/shards/{shard_id}/truncate",
        "/v1/shards/{shard_id}/transfer-leader",
        "/v1/shards/{shard_id}/replicas",
        "/v1/shards/{shard_id}/replicas/{node_id}",
        "/v1/internal/shards/{shard_id}/host",
        "/v1/internal/shards/{shard_id}/promote",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert set(paths["/v1/shards/{shard_id}/replicas/{node_id}"]) == {"delete"}
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    # Errors are documented as ErrorBody, not FastAPI's default validation shape.
    truncate = paths["/v1/shards/{shard_id}/truncate"]["post"]["responses"]
    assert truncate["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    docs = anon.get("/docs")
    assert docs.status_code == 200
    assert "swagger" in docs.text.lower()


def test_host_then_release_a_shard(client: TestClient) -> None:
    """Node to node: n1 is asked to join shard 3 (hosted on n2..n4), then to leave it."""
    response = client.post("/v1/internal/shards/3/host", json={"members": ["n2", "n3", "n4"]})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "shard_id": 3,
        "hosted": True,
        "replicas": ["n1", "n2", "n3", "n4"],
        "stage": "joining",
    }
    shard = get_json(client, "/v1/shards/3")
    assert shard["joining"] is True
    assert client.get("/readyz").json()["shards"][-1]["reasons"][-1] == "joining"
    again = client.post("/v1/internal/shards/3/host", json={"members": ["n2", "n3", "n4"]})
    assert again.json() == response.json()  # a retried call

    response = client.delete("/v1/internal/shards/3/host")
    assert response.status_code == 200
    assert response.json() == {"shard_id": 3, "hosted": False, "replicas": [], "stage": None}
    assert client.get("/v1/shards/3").json()["code"] == "shard_not_hosted"
    assert client.delete("/v1/internal/shards/3/host").status_code == 200  # retried


def test_host_a_learner_then_promote_it(client: TestClient) -> None:
    """Node to node: n1 hosts shard 3 as a learner, then the leader promotes it."""
    members = {"members": ["n2", "n3", "n4"]}
    response = client.post("/v1/internal/shards/3/host", json={**members, "learner": True})
    assert response.status_code == 200, response.text
    assert response.json()["stage"] == "learner"
    shard = get_json(client, "/v1/shards/3")
    assert (shard["stage"], shard["learner"], shard["joining"]) == ("learner", True, True)
    promoted = client.post("/v1/internal/shards/3/promote", json=members)
    assert promoted.status_code == 200, promoted.text
    assert promoted.json()["stage"] == "joining"
    assert get_json(client, "/v1/shards/3")["stage"] == "joining"
    assert client.post("/v1/internal/shards/2/promote", json=members).json()["stage"] == "voter"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"members": []}, 422, "invalid_request"),
        ({"members": ["n1"] * 7}, 422, "invalid_request"),
        ({"members": ["bad id!"]}, 422, "invalid_request"),
        ({"members": ["n2"], "extra": 1}, 422, "invalid_request"),
    ],
)
def test_host_requests_are_validated(
    client: TestClient, body: dict[str, Any], status: int, code: str
) -> None:
    response = client.post("/v1/internal/shards/3/host", json=body)
    assert response.status_code == status
    assert response.json()["code"] == code


def test_host_an_unknown_shard_is_404(client: TestClient) -> None:
    response = client.post("/v1/internal/shards/9/host", json={"members": ["n2"]})
    assert response.status_code == 404
    assert response.json()["code"] == "unknown_shard"
