"""The cluster table of `logsvc status` (logsvc/admin_client.py) and its CLI exit codes.

What it proves: answers recorded from a real dev cluster (admin_client_answers.json)
become the table an operator reads: every shard's row is its leader's view (leader, term,
LSN range, truncation point, each replica's lag, caught_up and connected); a node that
does not answer is "unreachable" with the reason and its shards are shown from a
follower, the lag unknown and the leader it last heard of named; not-ready nodes show
their failed readiness rules; `--json` is the same table. Malformed answers are
BadAnswer. Over HTTP (a stub server on loopback): 401 is Unauthorized, a refused
connection or a server that never answers is Unreachable within the bound, the next
address is tried, and the CLI exits 1 with a one-line message (no traceback) or 2 on a
config error.

How: the pure functions on the recorded JSON; http.server in a thread for the HTTP part,
stopped by each test; the CLI as a real subprocess with short timeouts.
"""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from logsvc import admin_client
from logsvc.admin_client import (
    BadAnswer,
    ClusterTable,
    NoAdminAnswer,
    NodeReport,
    Unauthorized,
    Unreachable,
    assemble,
    parse_cluster,
    parse_readiness,
    parse_shards,
    render_table,
    table_json,
)

ANSWERS: dict[str, Any] = json.loads(
    (Path(__file__).with_name("admin_client_answers.json")).read_text()
)
TOKEN = "stub-token-stub-token"


def table_of(recorded: dict[str, Any], unreachable: dict[str, str] | None = None) -> ClusterTable:
    """The table from one recorded scenario; nodes without answers get `unreachable`'s
    problem (or "connection refused")."""
    cluster = parse_cluster(recorded["cluster"])
    reports = []
    for node in cluster.nodes:
        answers = recorded["nodes"].get(node.node_id)
        if answers is None or node.node_id in (unreachable or {}):
            problem = (unreachable or {}).get(node.node_id, "connection refused")
            reports.append(NodeReport(node, None, (), problem))
        else:
            readiness = parse_readiness(answers["readyz"])
            reports.append(NodeReport(node, readiness, parse_shards(answers["shards"])))
    return assemble(cluster, reports)


HEALTHY_TEXT = """\
cluster as n1 knows it

NODE  ADMIN            DATA             READY
n1    127.0.0.1:59305  127.0.0.1:35775  ready
n2    127.0.0.1:48499  127.0.0.1:34921  ready
n3    127.0.0.1:33821  127.0.0.1:40571  ready

{shard_header}
1      n3      1     3          5         2              n1       0            0.001  yes        yes
                                                         n2       0            0.001  yes        yes
                                                         n3       0            0.000  yes        -
2      n2      1     1          -         -              n1       0            0.019  yes        yes
                                                         n2       0            0.000  yes        -
                                                         n3       0            0.019  yes        yes
""".format(
    shard_header="SHARD  LEADER  TERM  FIRST_LSN  LAST_LSN  TRUNCATED_LSN  "
    "REPLICA  LAG_ENTRIES  LAG_S  CAUGHT_UP  CONNECTED"
)


def test_healthy_cluster_table_is_each_shards_leaders_view() -> None:
    table = table_of(ANSWERS["healthy"])
    assert render_table(table) == HEALTHY_TEXT
    assert [(s.shard_id, s.leader, s.view_of, s.note) for s in table.shards] == [
        (1, "n3", "n3", ""),
        (2, "n2", "n2", ""),
    ]


def test_unreachable_leader_shows_a_followers_view_with_lag_unknown() -> None:
    table = table_of(ANSWERS["n3_killed"])
    text = render_table(table)
    assert "n3    127.0.0.1:33821  127.0.0.1:40571  unreachable: connection refused" in text
    shard_1, shard_2 = table.shards
    # No replica claims shard 1 yet (no election): the view with the highest term, a
    # follower's, names the leader it last heard of; lag is unknown, not "0".
    assert (shard_1.leader, shard_1.view_of, shard_1.term) == ("n3", "n1", 1)
    assert (shard_1.first_lsn, shard_1.last_lsn, shard_1.truncated_lsn) == (3, 5, 2)
    assert all(r.lag_entries is None and r.caught_up is None for r in shard_1.replicas)
    assert "shard 1: n3 did not answer as its leader (view of n1; lag unknown)" in text
    # Shard 2's leader answered: its link to n3 is down.
    assert shard_2.leader == "n2"
    assert {r.node_id: r.connected for r in shard_2.replicas} == {
        "n1": True,
        "n2": None,
        "n3": False,
    }


def test_a_new_leader_with_a_higher_term_wins_over_a_stale_one() -> None:
    recorded = copy.deepcopy(ANSWERS["healthy"])
    stale = recorded["nodes"]["n3"]["shards"]["shards"][0]  # n3 still thinks it leads shard 1
    new = recorded["nodes"]["n2"]["shards"]["shards"][0]
    new.update(is_leader=True, term=3, leader=stale["leader"] | {"node_id": "n2"})
    shard_1 = table_of(recorded).shards[0]
    assert (shard_1.leader, shard_1.term, shard_1.view_of) == ("n2", 3, "n2")


def test_not_ready_nodes_show_the_failed_rules() -> None:
    recorded = copy.deepcopy(ANSWERS["healthy"])
    recorded["nodes"]["n2"]["readyz"] = {
        "ready": False,
        "shards": [
            {"shard_id": 1, "ready": True, "reasons": [], "apply_lag_entries": 0},
            {
                "shard_id": 2,
                "ready": False,
                "reasons": ["no_leader", "applying_behind"],
                "apply_lag_entries": 900,
            },
        ],
    }
    text = render_table(table_of(recorded))
    assert (
        "n2    127.0.0.1:48499  127.0.0.1:34921  not ready: shard 2: no_leader,applying_behind"
        in text
    )


def test_shards_nobody_answers_for_keep_their_row() -> None:
    everyone = {"n1": "timed out", "n2": "timed out", "n3": "timed out"}
    table = table_of(ANSWERS["healthy"], unreachable=everyone)
    assert [row.ready for row in table.nodes] == [None, None, None]
    shard_1 = table.shards[0]
    # The placement from /v1/cluster: the leader its answering node knew, the members.
    assert (shard_1.leader, shard_1.term, shard_1.note) == ("n3", None, "no replica answered")
    assert [r.node_id for r in shard_1.replicas] == ["n1", "n2", "n3"]
    text = render_table(table)
    assert "1      n3      -     -          -         -              n1       -" in text
    assert "shard 2: no replica answered" in text


def test_json_is_the_same_table() -> None:
    table = table_of(ANSWERS["n3_killed"])
    document = json.loads(json.dumps(table_json(table)))
    assert document["answered_by"] == "n1"
    assert [n["node_id"] for n in document["nodes"]] == ["n1", "n2", "n3"]
    assert document["nodes"][2] == {
        "node_id": "n3",
        "admin_address": "127.0.0.1:33821",
        "data_address": "127.0.0.1:40571",
        "reachable": False,
        "ready": None,
        "detail": "connection refused",
    }
    assert [(s["shard_id"], s["leader"]) for s in document["shards"]] == [(1, "n3"), (2, "n2")]
    assert document["shards"][1]["replicas"][2]["lag_entries"] == 0


def _edited(path: list[Any], value: object) -> dict[str, Any]:
    answer: dict[str, Any] = copy.deepcopy(ANSWERS["healthy"]["nodes"]["n3"]["shards"])
    target: Any = answer
    for step in path[:-1]:
        target = target[step]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return answer


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (["not", "an", "object"], "not a JSON object"),
        (_edited(["shards", 0, "term"], "1"), "'term' is not an integer"),
        (_edited(["shards", 0, "term"], True), "'term' is not an integer"),
        (_edited(["shards", 0, "is_leader"], 1), "'is_leader' is not a boolean"),
        (_edited(["shards", 0, "node_id"], KeyError), "no 'node_id'"),
        (_edited(["shards", 0, "replicas", 0, "lag_seconds"], "soon"), "'lag_seconds'"),
        (_edited(["shards", 0, "leader"], {"node_id": "n3"}), "no 'data_address'"),
    ],
)
def test_malformed_answers_are_bad_answers(answer: object, problem: str) -> None:
    with pytest.raises(BadAnswer, match=problem):
        parse_shards(answer)


# ------------------------------------------------------------------------- over HTTP

Handler = Callable[[str, str | None], tuple[int, bytes] | None]  # None: never answer


class Stub:
    """An admin API stand-in on loopback: `answer(path, authorization)` decides."""

    def __init__(self, answer: Handler) -> None:
        self.release = threading.Event()
        stub = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                result = answer(self.path, self.headers.get("Authorization"))
                if result is None:
                    stub.release.wait(10)
                    return
                status, body = result
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def stubs() -> Iterator[Callable[[Handler], Stub]]:
    started: list[Stub] = []

    def start(answer: Handler) -> Stub:
        started.append(Stub(answer))
        return started[-1]

    try:
        yield start
    finally:
        for stub in started:
            stub.close()


def closed_address() -> str:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def recorded_node(answers: dict[str, Any]) -> Handler:
    """A node answering like the recorded n1 (with its address rewritten to the stub's)."""

    def answer(path: str, authorization: str | None) -> tuple[int, bytes]:
        if authorization != f"Bearer {TOKEN}":
            return 401, b'{"code": "unauthorized", "message": "invalid bearer token"}'
        if path in answers:
            return 200, json.dumps(answers[path]).encode()
        return 404, b'{"code": "not_found", "message": "no such endpoint"}'

    return answer


def one_node_cluster(stubs: Callable[[Handler], Stub]) -> Stub:
    """A stub serving a consistent one-node view of the recorded n2 (leader of shard 2)."""
    answers: dict[str, Any] = {}
    stub = stubs(recorded_node(answers))
    healthy = ANSWERS["healthy"]
    cluster = copy.deepcopy(healthy["cluster"])
    n2 = next(n for n in cluster["nodes"] if n["node_id"] == "n2")
    n2["admin_address"] = stub.address
    cluster["node_id"] = "n2"
    cluster["nodes"] = [n2]
    answers["/v1/cluster"] = cluster
    answers["/readyz"] = healthy["nodes"]["n2"]["readyz"]
    answers["/v1/shards"] = healthy["nodes"]["n2"]["shards"]
    return stub


def test_fetch_tries_the_next_address_and_builds_the_table(
    stubs: Callable[[Handler], Stub],
) -> None:
    broken = stubs(lambda path, auth: (200, b"<html>not json</html>"))
    node = one_node_cluster(stubs)
    table = admin_client.fetch_table([closed_address(), broken.address, node.address], TOKEN)
    assert table.answered_by == "n2"
    assert [(row.node_id, row.ready) for row in table.nodes] == [("n2", True)]
    assert [(s.shard_id, s.leader) for s in table.shards] == [(1, "n3"), (2, "n2")]


def test_wrong_token_is_unauthorized_and_never_echoed(stubs: Callable[[Handler], Stub]) -> None:
    node = one_node_cluster(stubs)
    with pytest.raises(Unauthorized) as caught:
        admin_client.fetch_table([node.address], "wrong-token-value")
    assert node.address in str(caught.value) and "wrong-token-value" not in str(caught.value)


def test_no_answer_names_every_address_within_the_bound(
    stubs: Callable[[Handler], Stub],
) -> None:
    silent = stubs(lambda path, auth: None)
    overloaded = stubs(
        lambda path, auth: (503, b'{"code": "overloaded", "message": "too many in flight"}')
    )
    refused = closed_address()
    started = time.monotonic()
    with pytest.raises(NoAdminAnswer) as caught:
        admin_client.fetch_cluster(
            [silent.address, overloaded.address, refused], TOKEN, timeout_s=0.5
        )
    assert time.monotonic() - started < 5
    problems = dict(caught.value.problems)
    assert set(problems) == {silent.address, overloaded.address, refused}
    assert "timed out" in problems[silent.address]
    assert problems[overloaded.address] == "HTTP 503 overloaded: too many in flight"
    with pytest.raises(Unreachable):
        admin_client.get_json(refused, "/v1/cluster", TOKEN, timeout_s=0.5)


def test_a_node_failing_during_the_fan_out_is_a_row_not_an_error(
    stubs: Callable[[Handler], Stub],
) -> None:
    node = one_node_cluster(stubs)
    gone = closed_address()
    cluster = admin_client.parse_cluster(admin_client.get_json(node.address, "/v1/cluster", TOKEN))
    extra = admin_client.Node("n9", "127.0.0.1:1", gone)
    reports = [admin_client.fetch_node(n, TOKEN, timeout_s=0.5) for n in (*cluster.nodes, extra)]
    assert reports[0].problem is None and reports[0].readiness is not None
    assert reports[1].problem is not None and "refused" in reports[1].problem.lower()


# ------------------------------------------------------------------------------- CLI


def logsvc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logsvc.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def client_toml(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "client.toml"
    path.write_text(f'addresses = ["127.0.0.1:1"]\ntoken = "{TOKEN}"\n{extra}')
    path.chmod(0o600)
    return str(path)


def test_cli_exit_codes(tmp_path: Path, stubs: Callable[[Handler], Stub]) -> None:
    node = one_node_cluster(stubs)
    config = client_toml(tmp_path, f'admin_addresses = ["{closed_address()}"]\n')

    done = logsvc("status", "--client-config", config)  # nobody answers
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("logsvc: error: no admin API answered")

    done = logsvc("status", "--client-config", config, "--admin", node.address)  # overrides
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cluster as n2 knows it\n")
    done = logsvc("status", "--client-config", config, "--admin", node.address, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answered_by"] == "n2"

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    wrong_config = client_toml(wrong, f'admin_addresses = ["{node.address}"]\n')
    Path(wrong_config).write_text(Path(wrong_config).read_text().replace(TOKEN, "wrong-token"))
    done = logsvc("status", "--client-config", wrong_config)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "refused the token (401)" in done.stderr

    no_admin = tmp_path / "no-admin"
    no_admin.mkdir()
    done = logsvc("status", "--client-config", client_toml(no_admin))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("config error: admin_addresses: not set in")

    bad = tmp_path / "bad"
    bad.mkdir()
    done = logsvc("status", "--client-config", client_toml(bad, "admin_addresses = [1]\n"))
    assert done.returncode == 2
    assert done.stderr.startswith("config error: admin_addresses[0]:")
