"""The cluster table of `logsvc status` (without `--shard`), read from the nodes' admin APIs.

    fetch_table(addresses, token) -> ClusterTable      the HTTP part (urllib, stdlib only)
    render_table(table) -> str                          the text table (pure)
    table_json(table) -> dict                           the `--json` document (pure)

How the table is built: `GET /v1/cluster` from the first of `addresses` that answers (in
order; an unreachable node or a bad answer moves on to the next) gives the nodes and the
shards' placement. Then every node the cluster lists, concurrently: `GET /readyz` (its
readiness; 503 "not ready" is an answer too) and `GET /v1/shards` (the status of every
shard it hosts). A shard's row is the view of the replica that says it leads (the highest
term if two do during an election): only the leader knows its followers' lag. With no
leader among the answers, the row is the view with the highest term, the lag unknown.

Everything is bounded: a request gets `REQUEST_TIMEOUT_S` per socket operation and its
whole answer must arrive within that time of its start (checked between reads), an answer
is at most `ANSWER_BYTES_MAX` bytes, and at most `FETCH_THREADS_MAX` nodes are asked at
once. No proxy is used (admin addresses are the nodes themselves). The token is sent as
`Authorization: Bearer` and appears in no error message.

Errors are typed: `Unauthorized` (a 401: the token is wrong), `NoAdminAnswer` (no address
gave the cluster view; each address's problem is in the message). Problems of single nodes
during the fan-out are not errors: the node's row says what went wrong.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

REQUEST_TIMEOUT_S: Final = 5.0
ANSWER_BYTES_MAX: Final = 16 * 1024 * 1024
READ_CHUNK_BYTES: Final = 64 * 1024
FETCH_THREADS_MAX: Final = 8
PROBLEM_CHARS_MAX: Final = 300  # a node's error message, as shown in the table


# ------------------------------------------------------------------------------- errors


class AdminClientError(Exception):
    """A problem talking to the admin API."""


class Unreachable(AdminClientError):
    """No HTTP answer from one address (refused, timed out, reset, not HTTP)."""


class Unauthorized(AdminClientError):
    """The admin API refused the token (401)."""


class BadAnswer(AdminClientError):
    """An answer that cannot be used: an error status, not JSON, or not the expected shape."""


class NoAdminAnswer(AdminClientError):
    """No admin address gave the cluster view."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        lines = "; ".join(f"{address}: {problem}" for address, problem in self.problems)
        super().__init__(f"no admin API answered ({lines or 'no address given'})")


# ------------------------------------------------------------------------------ answers


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    data_address: str
    admin_address: str


@dataclass(frozen=True, slots=True)
class Placement:
    shard_id: int
    replicas: tuple[str, ...]
    leader: str | None  # as the answering node knows it (only where it hosts the shard)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """`GET /v1/cluster`."""

    node_id: str
    nodes: tuple[Node, ...]
    shards: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Replica:
    node_id: str
    lag_entries: int | None
    lag_seconds: float | None
    caught_up: bool | None
    connected: bool | None


@dataclass(frozen=True, slots=True)
class ShardView:
    """One element of `GET /v1/shards`: a shard as one of its replicas sees it."""

    shard_id: int
    node_id: str
    is_leader: bool
    leader: str | None
    term: int
    first_lsn: int
    last_lsn: int | None
    truncated_lsn: int | None
    replicas: tuple[Replica, ...]


@dataclass(frozen=True, slots=True)
class Readiness:
    """`GET /readyz`: ready, or the failed rules of each shard ("2: no_leader")."""

    ready: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one node answered, or `problem` (then readiness and shards are empty)."""

    node: Node
    readiness: Readiness | None
    shards: tuple[ShardView, ...]
    problem: str | None = None


# -------------------------------------------------------------------------------- table


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    admin_address: str
    data_address: str
    reachable: bool
    ready: bool | None  # None: unknown (unreachable)
    detail: str  # the not-ready reasons or the problem; "" when ready


@dataclass(frozen=True, slots=True)
class ShardRow:
    shard_id: int
    leader: str | None
    term: int | None
    first_lsn: int | None
    last_lsn: int | None
    truncated_lsn: int | None
    view_of: str | None  # the node whose status the row shows (None: no hosting node answered)
    replicas: tuple[Replica, ...]
    note: str  # "" or why the row is incomplete


@dataclass(frozen=True, slots=True)
class ClusterTable:
    answered_by: str  # the node whose /v1/cluster answer gave the nodes and shards
    nodes: tuple[NodeRow, ...]
    shards: tuple[ShardRow, ...]


# -------------------------------------------------------------------------------- parse


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise BadAnswer(f"{what}: not a JSON object")
    return value


def _field(obj: Mapping[str, Any], key: str, what: str) -> object:
    if key not in obj:
        raise BadAnswer(f"{what}: no {key!r}")
    return obj[key]


def _wrong(key: str, what: str, wanted: str) -> BadAnswer:
    return BadAnswer(f"{what}: {key!r} is not {wanted}")


def _str(obj: Mapping[str, Any], key: str, what: str) -> str:
    value = _field(obj, key, what)
    if not isinstance(value, str):
        raise _wrong(key, what, "a string")
    return value


def _int(obj: Mapping[str, Any], key: str, what: str) -> int:
    value = _field(obj, key, what)
    if isinstance(value, bool) or not isinstance(value, int):  # JSON true is not a number
        raise _wrong(key, what, "an integer")
    return value


def _bool(obj: Mapping[str, Any], key: str, what: str) -> bool:
    value = _field(obj, key, what)
    if not isinstance(value, bool):
        raise _wrong(key, what, "a boolean")
    return value


def _list(obj: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = _field(obj, key, what)
    if not isinstance(value, list):
        raise _wrong(key, what, "a list")
    return value


def _int_or_none(obj: Mapping[str, Any], key: str, what: str) -> int | None:
    return None if obj.get(key) is None else _int(obj, key, what)


def _bool_or_none(obj: Mapping[str, Any], key: str, what: str) -> bool | None:
    return None if obj.get(key) is None else _bool(obj, key, what)


def _number_or_none(obj: Mapping[str, Any], key: str, what: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong(key, what, "a number")
    return float(value)


def _node(value: object, what: str) -> Node:
    obj = _object(value, what)
    return Node(
        _str(obj, "node_id", what),
        _str(obj, "data_address", what),
        _str(obj, "admin_address", what),
    )


def _leader_id(obj: Mapping[str, Any], what: str) -> str | None:
    leader = obj.get("leader")
    return None if leader is None else _node(leader, f"{what}.leader").node_id


def parse_cluster(answer: object) -> ClusterView:
    """A `GET /v1/cluster` answer (decoded JSON); BadAnswer if it is not one."""
    what = "/v1/cluster"
    obj = _object(answer, what)
    nodes = tuple(_node(item, f"{what} node") for item in _list(obj, "nodes", what))
    shards = []
    for item in _list(obj, "shards", what):
        shard = _object(item, f"{what} shard")
        replicas = _list(shard, "replicas", f"{what} shard")
        if not all(isinstance(r, str) for r in replicas):
            raise BadAnswer(f"{what} shard: 'replicas' must hold node ids")
        shards.append(
            Placement(
                _int(shard, "shard_id", f"{what} shard"),
                tuple(replicas),
                _leader_id(shard, f"{what} shard"),
            )
        )
    return ClusterView(_str(obj, "node_id", what), nodes, tuple(shards))


def _replica(value: object, what: str) -> Replica:
    obj = _object(value, what)
    return Replica(
        _str(obj, "node_id", what),
        _int_or_none(obj, "lag_entries", what),
        _number_or_none(obj, "lag_seconds", what),
        _bool_or_none(obj, "caught_up", what),
        _bool_or_none(obj, "connected", what),
    )


def parse_shards(answer: object) -> tuple[ShardView, ...]:
    """A `GET /v1/shards` answer (decoded JSON); BadAnswer if it is not one."""
    what = "/v1/shards"
    views = []
    for item in _list(_object(answer, what), "shards", what):
        obj = _object(item, f"{what} shard")
        views.append(
            ShardView(
                shard_id=_int(obj, "shard_id", what),
                node_id=_str(obj, "node_id", what),
                is_leader=_bool(obj, "is_leader", what),
                leader=_leader_id(obj, what),
                term=_int(obj, "term", what),
                first_lsn=_int(obj, "first_lsn", what),
                last_lsn=_int_or_none(obj, "last_lsn", what),
                truncated_lsn=_int_or_none(obj, "truncated_lsn", what),
                replicas=tuple(
                    _replica(r, f"{what} replica") for r in _list(obj, "replicas", what)
                ),
            )
        )
    return tuple(views)


def parse_readiness(answer: object) -> Readiness:
    """A `GET /readyz` answer (200 or 503, decoded JSON); BadAnswer if it is not one."""
    what = "/readyz"
    obj = _object(answer, what)
    reasons = []
    for item in _list(obj, "shards", what):
        shard = _object(item, f"{what} shard")
        failed = _list(shard, "reasons", f"{what} shard")
        if failed:
            shard_id = _int(shard, "shard_id", f"{what} shard")
            reasons.append(f"shard {shard_id}: {','.join(str(reason) for reason in failed)}")
    return Readiness(_bool(obj, "ready", what), tuple(reasons))


# ----------------------------------------------------------------------------- assemble


def _unknown(node_id: str) -> Replica:
    return Replica(node_id, None, None, None, None)


def _shard_row(placement: Placement | None, shard_id: int, views: Sequence[ShardView]) -> ShardRow:
    leading = [view for view in views if view.is_leader]
    if leading:
        view = max(leading, key=lambda v: v.term)
        return ShardRow(
            shard_id,
            view.node_id,
            view.term,
            view.first_lsn,
            view.last_lsn,
            view.truncated_lsn,
            view.node_id,
            view.replicas,
            "",
        )
    if views:
        # A follower's view: its LSNs may lag the leader's, and only a leader knows lag.
        view = max(views, key=lambda v: v.term)
        note = (
            f"no leader known (view of {view.node_id}; lag unknown)"
            if view.leader is None
            else f"{view.leader} did not answer as its leader (view of {view.node_id}; lag unknown)"
        )
        return ShardRow(
            shard_id,
            view.leader,
            view.term,
            view.first_lsn,
            view.last_lsn,
            view.truncated_lsn,
            view.node_id,
            tuple(_unknown(replica.node_id) for replica in view.replicas),
            note,
        )
    members = () if placement is None else placement.replicas
    return ShardRow(
        shard_id,
        None if placement is None else placement.leader,
        None,
        None,
        None,
        None,
        None,
        tuple(_unknown(member) for member in members),
        "no replica answered",
    )


def assemble(cluster: ClusterView, reports: Sequence[NodeReport]) -> ClusterTable:
    """The table from the answers (pure): one row per node of the cluster view, one per
    shard of the placement or of any node's status."""
    nodes = []
    views: dict[int, list[ShardView]] = {}
    for report in reports:
        node = report.node
        if report.problem is not None or report.readiness is None:
            problem = report.problem or "no readiness answer"
            nodes.append(
                NodeRow(node.node_id, node.admin_address, node.data_address, False, None, problem)
            )
            continue
        ready = report.readiness.ready
        detail = "; ".join(report.readiness.reasons)
        nodes.append(
            NodeRow(node.node_id, node.admin_address, node.data_address, True, ready, detail)
        )
        for view in report.shards:
            views.setdefault(view.shard_id, []).append(view)
    placements = {placement.shard_id: placement for placement in cluster.shards}
    shards = tuple(
        _shard_row(placements.get(shard_id), shard_id, views.get(shard_id, []))
        for shard_id in sorted(set(placements) | set(views))
    )
    return ClusterTable(cluster.node_id, tuple(nodes), shards)


# ------------------------------------------------------------------------------- render


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


NODE_HEADER: Final = ("NODE", "ADMIN", "DATA", "READY")
SHARD_HEADER: Final = (
    "SHARD",
    "LEADER",
    "TERM",
    "FIRST_LSN",
    "LAST_LSN",
    "TRUNCATED_LSN",
    "REPLICA",
    "LAG_ENTRIES",
    "LAG_S",
    "CAUGHT_UP",
    "CONNECTED",
)


def _readiness_cell(row: NodeRow) -> str:
    if not row.reachable:
        return f"unreachable: {row.detail}"
    if row.ready:
        return "ready"
    return f"not ready: {row.detail}" if row.detail else "not ready"


def render_table(table: ClusterTable) -> str:
    """The text of `logsvc status`: the nodes and their readiness, then one line per
    replica of every shard, the shard's columns on its first line only ("-": unknown;
    CONNECTED is the leader's link to the replica, "-" for the leader itself)."""
    lines = [f"cluster as {table.answered_by} knows it", ""]
    node_rows: list[Sequence[str]] = [NODE_HEADER]
    node_rows += [
        (row.node_id, row.admin_address, row.data_address, _readiness_cell(row))
        for row in table.nodes
    ]
    lines += _columns(node_rows)
    lines.append("")
    shard_rows: list[Sequence[str]] = [SHARD_HEADER]
    notes = []
    for shard in table.shards:
        head = [
            str(shard.shard_id),
            shard.leader or "none",
            _cell(shard.term),
            _cell(shard.first_lsn),
            _cell(shard.last_lsn),
            _cell(shard.truncated_lsn),
        ]
        blank = [""] * len(head)
        replicas = shard.replicas or (_unknown("-"),)
        for index, replica in enumerate(replicas):
            shard_rows.append(
                [
                    *(head if index == 0 else blank),
                    replica.node_id,
                    _cell(replica.lag_entries),
                    _cell(replica.lag_seconds),
                    _cell(replica.caught_up),
                    _cell(replica.connected),
                ]
            )
        if shard.note:
            notes.append(f"shard {shard.shard_id}: {shard.note}")
    lines += _columns(shard_rows)
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def table_json(table: ClusterTable) -> dict[str, Any]:
    """The `--json` document: the table's fields, null where unknown."""
    return dataclasses.asdict(table)


# --------------------------------------------------------------------------------- HTTP


_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _read_bounded(response: Any, deadline: float, timeout_s: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk: bytes = response.read(READ_CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > ANSWER_BYTES_MAX:
            raise BadAnswer(f"answer over {ANSWER_BYTES_MAX} bytes")
        if time.monotonic() > deadline:
            raise Unreachable(f"answer not complete within {timeout_s} s")
        chunks.append(chunk)


def _decode(body: bytes, status: int) -> object:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadAnswer(f"HTTP {status}: the answer is not JSON") from None


def _error_text(status: int, payload: object) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("code"), str):
        message = str(payload.get("message", ""))[:PROBLEM_CHARS_MAX]
        return f"HTTP {status} {payload['code']}: {message}"
    return f"HTTP {status}"


def get_json(
    address: str,
    path: str,
    token: str,
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    also_ok: frozenset[int] = frozenset(),
) -> object:
    """`GET http://address/path` with the bearer token: the decoded JSON of a 200 answer
    (or of a status in `also_ok`). Unreachable, Unauthorized (401) or BadAnswer."""
    request = urllib.request.Request(f"http://{address}{path}", method="GET")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Accept", "application/json")
    deadline = time.monotonic() + timeout_s
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            status = int(response.status)
            body = _read_bounded(response, deadline, timeout_s)
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            body = _read_bounded(exc, deadline, timeout_s)
        except (OSError, http.client.HTTPException):
            body = b""
        finally:
            exc.close()
    except urllib.error.URLError as exc:
        raise Unreachable(str(exc.reason)[:PROBLEM_CHARS_MAX]) from None
    except (OSError, http.client.HTTPException) as exc:  # timeouts and resets included
        raise Unreachable((str(exc) or type(exc).__name__)[:PROBLEM_CHARS_MAX]) from None
    if status == 401:
        raise Unauthorized(
            f"the admin API at {address} refused the token (401): the client config's token "
            "must be the nodes' token"
        )
    if status == 200 or status in also_ok:
        payload = _decode(body, status)
        if status != 200 and isinstance(payload, dict) and "code" in payload:
            raise BadAnswer(_error_text(status, payload))  # e.g. 503 overloaded, not a verdict
        return payload
    try:
        payload = _decode(body, status)
    except BadAnswer:
        payload = None
    raise BadAnswer(_error_text(status, payload))


def fetch_cluster(
    addresses: Sequence[str], token: str, *, timeout_s: float = REQUEST_TIMEOUT_S
) -> ClusterView:
    """The first usable `GET /v1/cluster` answer, trying `addresses` in order.
    Unauthorized at once on a 401 (every node has the same token); else NoAdminAnswer."""
    problems: list[tuple[str, str]] = []
    for address in addresses:
        try:
            return parse_cluster(get_json(address, "/v1/cluster", token, timeout_s=timeout_s))
        except (Unreachable, BadAnswer) as exc:
            problems.append((address, str(exc)))
    raise NoAdminAnswer(problems)


def fetch_node(node: Node, token: str, *, timeout_s: float = REQUEST_TIMEOUT_S) -> NodeReport:
    """One node's readiness and shard statuses; its problem instead, never an exception."""
    try:
        readiness = parse_readiness(
            get_json(
                node.admin_address,
                "/readyz",
                token,
                timeout_s=timeout_s,
                also_ok=frozenset({503}),
            )
        )
        shards = parse_shards(
            get_json(node.admin_address, "/v1/shards", token, timeout_s=timeout_s)
        )
    except AdminClientError as exc:
        return NodeReport(node, None, (), str(exc))
    return NodeReport(node, readiness, shards)


def fetch_table(
    addresses: Sequence[str], token: str, *, timeout_s: float = REQUEST_TIMEOUT_S
) -> ClusterTable:
    """The whole table: the cluster view from the first answering address, then every
    node's readiness and shards (concurrently). Unauthorized or NoAdminAnswer."""
    cluster = fetch_cluster(addresses, token, timeout_s=timeout_s)
    if not cluster.nodes:
        return assemble(cluster, [])
    workers = min(FETCH_THREADS_MAX, len(cluster.nodes))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="admin-fetch") as pool:
        reports = list(
            pool.map(lambda node: fetch_node(node, token, timeout_s=timeout_s), cluster.nodes)
        )
    return assemble(cluster, reports)
