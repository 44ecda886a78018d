"""The admin HTTP API served by real node processes (FastAPI on uvicorn, on each node's own
event loop): health without a token, 401 without one elsewhere, the cluster and shard
views, readiness, Prometheus metrics, truncation through the leader (409 with the leader
from a follower), the typed refusal of adding a replica that is already one (membership
changes themselves: test_membership.py), and no secret in any answer."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from logsvc.config import NodeConfig, load_node_config

from .conftest import LocalCluster


def node_configs(cluster: LocalCluster) -> list[NodeConfig]:
    return [load_node_config(str(Path(cluster.dir, f"n{i}.toml"))) for i in (1, 2, 3)]


def call(
    address: str, method: str, path: str, token: str | None, body: dict[str, Any] | None = None
) -> tuple[int, Any, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{address}{path}", data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        text = exc.read().decode()
        status = exc.code
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    return status, payload, text


def test_the_admin_api_of_a_real_node(cluster: LocalCluster) -> None:
    configs = node_configs(cluster)
    token = configs[0].token
    secret = configs[0].secret
    admin = {c.node_id: c.node.admin_address for c in configs}
    seen: list[str] = []

    def get(node: str, path: str, auth: bool = True) -> tuple[int, Any]:
        status, payload, text = call(admin[node], "GET", path, token if auth else None)
        seen.append(text)
        return status, payload

    assert get("n1", "/healthz", auth=False)[0] == 200
    status, payload = get("n1", "/v1/shards", auth=False)
    assert status == 401 and payload["code"] == "unauthorized"
    status, payload = get("n1", "/v1/cluster")
    assert status == 200
    assert {n["node_id"] for n in payload["nodes"]} == {"n1", "n2", "n3"}
    assert {s["shard_id"] for s in payload["shards"]} == {1, 2}

    deadline = time.monotonic() + 60
    while (ready := get("n1", "/readyz"))[0] != 200:
        assert time.monotonic() < deadline, ready
        time.sleep(0.2)
    client = cluster.client()
    try:
        lsns = client.append(1, [b"a", b"b", b"c"])
    finally:
        client.close()
    # A follower answers NOT_LEADER naming the leader (once it knows), and the leader as it
    # sees itself truncates. The leader may move meanwhile (an election, or the leader
    # balancer a while after the start): then the whole step is taken again (bounded).
    while True:
        assert time.monotonic() < deadline, seen[-3:]
        views = {node: get(node, "/v1/shards/1") for node in admin}
        leaders = [n for n, (code, body) in views.items() if code == 200 and body["is_leader"]]
        if len(leaders) != 1:
            time.sleep(0.2)
            continue
        leader = leaders[0]
        follower = next(n for n in admin if n != leader)
        status, payload, text = call(
            admin[follower], "POST", "/v1/shards/1/truncate", token, {"lsn": lsns[1]}
        )
        seen.append(text)
        if status == 200:
            continue  # the follower leads now: ask again who does
        assert status == 409 and payload["code"] == "not_leader", (status, payload)
        if payload["leader"] is None or payload["leader"]["node_id"] != leader:
            time.sleep(0.2)  # it does not know the leader yet, or the leader moved
            continue
        status, payload, text = call(
            admin[leader], "POST", "/v1/shards/1/truncate", token, {"lsn": lsns[1]}
        )
        seen.append(text)
        if status == 409 and payload["code"] == "not_leader":
            continue  # it lost the lead between the two calls
        assert status == 200 and payload["first_lsn"] >= lsns[1], (status, payload)
        break

    status, payload, text = call(
        admin[leader], "POST", "/v1/shards/1/replicas", token, {"node_id": follower}
    )
    seen.append(text)
    assert status == 409 and payload["code"] in ("change_refused", "already_a_replica")

    status, _, metrics = call(admin[leader], "GET", "/metrics", token)
    seen.append(metrics)
    assert status == 200
    assert "logsvc_shard_term" in metrics and "logsvc_store_syncs_total" in metrics

    assert get("n1", "/v1/shards/999")[0] == 404
    for text in seen:
        assert token not in text and secret not in text


@pytest.mark.parametrize("path", ["/v1/cluster", "/metrics", "/readyz"])
def test_a_wrong_token_is_refused_everywhere_but_healthz(cluster: LocalCluster, path: str) -> None:
    address = node_configs(cluster)[0].node.admin_address
    status, payload, _ = call(address, "GET", path, "wrong-token")
    assert status == 401 and payload["code"] == "unauthorized"
