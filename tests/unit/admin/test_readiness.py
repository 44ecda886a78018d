"""/readyz: 200 when every hosted shard has a leader and this node has caught up, 503
(with the reasons, per shard) otherwise; the rule itself is pure (readiness.py).

How: a table of shard statuses (failed, leaderless, never heard from a leader, applying
behind by just under / at / over the allowance) through `assess_shard`, then the same
states put into the fake view and read back through GET /readyz.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from fastapi.testclient import TestClient

from logsvc.admin import readiness
from logsvc.admin.app import create_app
from logsvc.admin.errors import Unavailable
from logsvc.admin.limits import DEFAULT_ADMIN_LIMITS, AdminLimits
from logsvc.admin.port import FakeNodeView, example_view
from logsvc.admin.status import ShardStatus

from .conftest import AUTH, TOKEN

LAG_MAX = DEFAULT_ADMIN_LIMITS.ready_apply_lag_entries_max


def leader_status() -> ShardStatus:
    return example_view().status_now(1)


@pytest.mark.parametrize(
    ("changes", "reasons"),
    [
        ({}, ()),
        ({"failed": True}, ("replica_failed",)),
        ({"leader": None}, ("no_leader",)),
        ({"leader_commit_index": None}, ("leader_commit_unknown",)),
        ({"leader_commit_index": 120 + LAG_MAX}, ()),  # at the allowance: caught up
        ({"leader_commit_index": 121 + LAG_MAX}, ("applying_behind",)),
        ({"applied_index": 200}, ()),  # ahead of the commit index it heard: fine
        ({"joining": True}, ("joining",)),  # its own `add` not received yet
        (
            {"failed": True, "leader": None, "leader_commit_index": None},
            ("replica_failed", "no_leader", "leader_commit_unknown"),
        ),
    ],
)
def test_shard_rule(changes: dict[str, Any], reasons: tuple[str, ...]) -> None:
    status = dataclasses.replace(leader_status(), **changes)
    verdict = readiness.assess_shard(status, LAG_MAX)
    assert verdict.reasons == reasons
    assert verdict.ready is (not reasons)


def test_node_is_ready_only_when_every_shard_is() -> None:
    ready = readiness.assess_shard(leader_status(), LAG_MAX)
    assert readiness.assess([ready, ready]).ready
    assert not readiness.assess([ready, readiness.unavailable(2)]).ready
    assert readiness.assess([]).ready  # hosting nothing: nothing to wait for


def test_readyz_ready(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "shards": [
            {"shard_id": 1, "ready": True, "reasons": [], "apply_lag_entries": 0},
            {"shard_id": 2, "ready": True, "reasons": [], "apply_lag_entries": 0},
        ],
    }


def test_readyz_not_ready_without_a_leader(client: TestClient, view: FakeNodeView) -> None:
    view.put_status(dataclasses.replace(view.status_now(2), leader=None))
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False
    assert body["shards"][0]["ready"] is True
    assert body["shards"][1] == {
        "shard_id": 2,
        "ready": False,
        "reasons": ["no_leader"],
        "apply_lag_entries": 0,
    }


def test_readyz_not_ready_while_catching_up(view: FakeNodeView) -> None:
    # A follower 10 entries behind the leader's commit index, with an allowance of 5.
    behind = dataclasses.replace(view.status_now(2), applied_index=67)
    view.put_status(behind)
    app = create_app(view, TOKEN, limits=AdminLimits(ready_apply_lag_entries_max=5))
    with TestClient(app, headers=AUTH) as client:
        response = client.get("/readyz")
        assert response.status_code == 503
        assert response.json()["shards"][1]["reasons"] == ["applying_behind"]
        assert response.json()["shards"][1]["apply_lag_entries"] == 10
        view.put_status(dataclasses.replace(behind, applied_index=72))  # 5 behind: ok
        assert client.get("/readyz").status_code == 200


def test_readyz_not_ready_when_a_status_cannot_be_read(view: FakeNodeView) -> None:
    class Failing(FakeNodeView):
        async def shard_status(self, shard_id: int) -> ShardStatus:
            if shard_id == 2:
                raise Unavailable("replica is restarting")
            return await super().shard_status(shard_id)

    nodes = asyncio.run(view.cluster()).nodes
    statuses = [view.status_now(1), view.status_now(2)]
    failing = Failing("n1", nodes, statuses)
    with TestClient(create_app(failing, TOKEN), headers=AUTH) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["shards"][1]["reasons"] == ["status_unavailable"]


def test_readyz_needs_the_token(anon: TestClient) -> None:
    assert anon.get("/readyz").status_code == 401
