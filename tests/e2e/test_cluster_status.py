"""`logsvc status` without `--shard` against real node processes: the installed command
reads DIR/client.toml's admin_addresses (written by `logsvc dev-cluster up`), and every
shard row names the leader the admin API reports (the replica answering is_leader on
`GET /v1/shards`), with the LSN range the leader reports; `--json` parses to the same.
Leadership could move between the CLI's answers and the check: then the run is repeated
(bounded)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .conftest import LocalCluster

LEADERS_WAIT_S = 30.0
ATTEMPTS_MAX = 3


def logsvc_status(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    command = str(Path(sys.executable).with_name("logsvc"))  # .venv/bin/logsvc
    return subprocess.run(
        [command, "status", "--client-config", f"{cluster.dir}/client.toml", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def admin_leaders(cluster: LocalCluster) -> dict[int, tuple[str, int]]:
    """shard id -> (leader node id, its term), from every node's /v1/shards."""
    leaders: dict[int, tuple[str, int]] = {}
    for address in cluster.client_config.admin_addresses:
        request = urllib.request.Request(f"http://{address}/v1/shards")
        request.add_header("Authorization", f"Bearer {cluster.client_config.token}")
        with urllib.request.urlopen(request, timeout=5) as response:
            for status in json.load(response)["shards"]:
                if status["is_leader"]:
                    leaders[status["shard_id"]] = (status["node_id"], status["term"])
    return leaders


def stable_leaders(cluster: LocalCluster) -> dict[int, tuple[str, int]]:
    deadline = time.monotonic() + LEADERS_WAIT_S
    while len(leaders := admin_leaders(cluster)) < cluster.shards:
        assert time.monotonic() < deadline, f"not every shard has a leader: {leaders}"
        time.sleep(0.2)
    return leaders


def shard_rows(text: str) -> dict[int, list[str]]:
    """The table's shard rows (the lines starting with a shard id), split in cells."""
    rows: dict[int, list[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


def test_status_prints_the_cluster_table_from_the_admin_api(cluster: LocalCluster) -> None:
    assert len(cluster.client_config.admin_addresses) == 3
    client = cluster.client()
    try:
        lsns = client.append(1, [b"one", b"two", b"three"])
    finally:
        client.close()

    for _ in range(ATTEMPTS_MAX):
        before = stable_leaders(cluster)
        text = logsvc_status(cluster)
        as_json = logsvc_status(cluster, "--json")
        if stable_leaders(cluster) == before:
            break
    else:
        raise AssertionError("leadership kept moving")

    assert text.returncode == 0, text.stderr
    assert text.stderr == ""
    rows = shard_rows(text.stdout)
    assert set(rows) == set(range(1, cluster.shards + 1)), text.stdout
    for shard_id, (leader, term) in before.items():
        # SHARD LEADER TERM FIRST_LSN LAST_LSN TRUNCATED_LSN REPLICA ...
        assert rows[shard_id][1:3] == [leader, str(term)], text.stdout
    assert rows[1][4] == str(lsns[-1])
    for node in ("n1", "n2", "n3"):
        assert f"\n{node} " in text.stdout  # the node table

    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert {row["shard_id"]: row["leader"] for row in document["shards"]} == {
        shard_id: leader for shard_id, (leader, _) in before.items()
    }
    assert [node["node_id"] for node in document["nodes"]] == ["n1", "n2", "n3"]
    assert all(node["reachable"] for node in document["nodes"])
    shard_1 = next(row for row in document["shards"] if row["shard_id"] == 1)
    assert shard_1["last_lsn"] == lsns[-1]
    assert {replica["node_id"] for replica in shard_1["replicas"]} == {"n1", "n2", "n3"}
    assert all(replica["lag_entries"] is not None for replica in shard_1["replicas"])
