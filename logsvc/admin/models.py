"""The admin API's request and response bodies (pydantic models; the one module importing
pydantic). FastAPI validates requests against them and documents them in /openapi.json;
app.py builds answers from the port's frozen dataclasses through them. No model has a field
for a secret, so no answer can hold the token or the cluster secret."""

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from logsvc.admin import changes
from logsvc.admin.limits import EPOCH_MAX, LSN_MAX, NODE_ID_CHARS, NODE_ID_PATTERN

# (No `from __future__ import annotations`: pydantic reads the annotations at runtime.)

NodeId = Annotated[
    str, StringConstraints(min_length=1, max_length=NODE_ID_CHARS, pattern=NODE_ID_PATTERN)
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TruncateRequest(_Request):
    """Truncate the records below `lsn` (fenced by the lease `epoch`, 0 while no lease was
    ever granted). Truncating at or below the current first LSN is a no-op; past the next
    LSN, everything is truncated."""

    lsn: Annotated[int, Field(strict=True, ge=1, le=LSN_MAX)]
    epoch: Annotated[int, Field(strict=True, ge=0, le=EPOCH_MAX)] = 0


class TransferLeaderRequest(_Request):
    """Hand leadership to `target_node_id`, or (null) to the most caught-up follower."""

    target_node_id: NodeId | None = None


class AddReplicaRequest(_Request):
    node_id: NodeId


class HostShardRequest(_Request):
    """Node to node: start a replica of the shard that joins `members` (the shard's
    members as its leader knows them; this node is added), a learner if `learner`."""

    members: Annotated[list[NodeId], Field(min_length=1, max_length=changes.MEMBERS_MAX)]
    learner: bool = False


class PromoteShardRequest(_Request):
    """Node to node: the learner caught up; restart it as a joining voter of `members`."""

    members: Annotated[list[NodeId], Field(min_length=1, max_length=changes.MEMBERS_MAX)]


# --------------------------------------------------------------------- response types


class _Response(BaseModel):
    # Built from the port's frozen dataclasses (their properties included).
    model_config = ConfigDict(from_attributes=True, frozen=True)


class NodeModel(_Response):
    node_id: str
    data_address: str
    admin_address: str


class ShardPlacementModel(_Response):
    shard_id: int
    replicas: list[str] = Field(description="Node ids of the members.")
    hosted: bool = Field(description="This node holds a replica.")
    leader: NodeModel | None = Field(description="Known only where hosted.")


class ClusterResponse(_Response):
    node_id: str = Field(description="The node answering.")
    nodes: list[NodeModel]
    shards: list[ShardPlacementModel]


class ReplicaModel(_Response):
    node_id: str
    match_index: int | None = Field(description="Known on the leader only.")
    lag_entries: int | None = Field(description="Raft entries behind the leader's log.")
    lag_records: int | None
    lag_seconds: float | None = Field(
        description="Seconds since it last had every entry of the leader's log (leader only)."
    )
    connected: bool | None = Field(description="The answering replica's link to it.")
    caught_up: bool | None = Field(
        description="Within a few entries of the leader's log: healthy (leader only)."
    )


class ShardStatusModel(_Response):
    shard_id: int
    node_id: str = Field(description="The node answering.")
    is_leader: bool
    leader: NodeModel | None
    term: int
    commit_index: int
    applied_index: int
    leader_commit_index: int | None
    apply_lag_entries: int | None
    first_lsn: int = Field(description="The lowest retained LSN: the truncation point.")
    next_lsn: int
    last_lsn: int | None = Field(description="The highest retained LSN; null if none.")
    truncated_lsn: int | None = Field(description="The highest LSN truncated; null if none.")
    lease_holder: str | None
    lease_epoch: int
    journal_first_index: int
    journal_physical_first_index: int
    physical_truncation_lag_entries: int = Field(
        description="Raft entries truncated but not yet deleted from disk."
    )
    last_election_at: datetime | None
    failed: bool
    replicas: list[ReplicaModel]
    joining: bool = Field(description="Started to join; the entry adding it not received yet.")
    learner: bool = Field(description="A non-voting learner catching up (not a member yet).")
    stage: str = Field(
        description='This replica\'s stage: "learner" (non-voting, catching up), "joining" '
        '(promoted, its addition not in its log yet) or "voter".'
    )
    learners: list[ReplicaModel] = Field(
        description="On the leader: learners catching up (they count in no majority)."
    )
    quiet: bool = Field(
        description="Quiescent: the shard was idle; no heartbeats, no election timer here "
        "(docs/decisions/0005-scheduler-quiescence.md)."
    )


class ShardListResponse(_Response):
    shards: list[ShardStatusModel]


class TruncateResponse(_Response):
    shard_id: int
    first_lsn: int = Field(description="The first retained LSN after the truncate.")


class TransferLeaderResponse(_Response):
    shard_id: int
    target_node_id: str | None = Field(description="The target, if known.")


class MembershipResponse(_Response):
    shard_id: int
    replicas: list[str] = Field(description="The members once the change is committed.")


class HostShardResponse(_Response):
    shard_id: int
    hosted: bool = Field(description="Hosted after the call; for a release: false.")
    replicas: list[str] = Field(description="The members the replica starts with.")
    stage: str | None = Field(
        default=None,
        description='The replica\'s stage after the call ("learner", "joining", "voter"); '
        "null after a release.",
    )


class HealthResponse(_Response):
    alive: bool


class ShardReadinessModel(_Response):
    shard_id: int
    ready: bool
    reasons: list[str]
    apply_lag_entries: int | None


class ReadinessResponse(_Response):
    ready: bool
    shards: list[ShardReadinessModel]


class ErrorBody(BaseModel):
    """Every error answer. `leader` on not_leader (null: unknown), `current_holder` and
    `current_epoch` on stale_epoch / not_lease_holder, `replicas` on shard_not_hosted."""

    code: str
    message: str
    leader: NodeModel | None = None
    current_holder: str | None = None
    current_epoch: int | None = None
    replicas: list[str] | None = None
