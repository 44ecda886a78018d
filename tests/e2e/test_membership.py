"""Membership changes through the admin API of a real cluster, under load, across restarts.

What it proves (issue 6; docs/decisions/0002-membership.md): on a cluster of 4 node
processes with shard 1 placed on n1..n3 (n4 hosts nothing), while a background writer
appends through the client the whole time,

1. POST /v1/shards/1/replicas {"node_id": "n4"} on the leader makes n4 a member: n4 is
   started as a joining replica (not ready until its own `add` arrives), catches up, and
   the leader's status shows it `caught_up`, with lag in entries and seconds;
2. DELETE /v1/shards/1/replicas/<an old follower> removes it: the node stops hosting the
   shard and archives its replica;
3. no acknowledged append is lost and none is duplicated: the whole log, read through the
   leader, holds every acked (LSN, payload) and each payload once; n4's own replica serves
   the same full log;
4. leadership moves to n4 (transfer-leader), and the client follows it;
5. after every node restarts, the membership is the changed one (not the config's), the
   removed node still hosts nothing and the log is intact.

How: `logsvc dev-cluster` processes (LocalCluster), stopped by PID whatever happens; the
admin API over HTTP with the cluster's token; every wait is a bounded poll.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logsvc import devcluster
from logsvc.client import LogsvcError, SyncClient, Truncated
from logsvc.config import NodeConfig, load_node_config

from .conftest import LocalCluster

NODES = ("n1", "n2", "n3", "n4")
WAIT_S = 60.0


class Admin:
    """The admin API of every node, with the cluster's token."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.configs: dict[str, NodeConfig] = {
            node: load_node_config(str(Path(cluster.dir, f"{node}.toml"))) for node in NODES
        }
        self.token = self.configs["n1"].token

    def call(
        self, node: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        address = self.configs[node].node.admin_address
        request = urllib.request.Request(f"http://{address}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=90) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")
        except OSError as exc:  # a node restarting
            return 0, {"code": "unreachable", "message": str(exc)}

    def shard(self, node: str) -> tuple[int, Any]:
        return self.call(node, "GET", "/v1/shards/1")

    def leader(self, among: tuple[str, ...] = NODES) -> str:
        """The node that leads shard 1 in its own view (bounded poll)."""
        return str(poll(lambda: self._leader(among), "a leader of shard 1"))

    def _leader(self, among: tuple[str, ...]) -> str | None:
        leaders = []
        for node in among:
            status, shard = self.shard(node)
            if status == 200 and shard["is_leader"]:
                leaders.append(node)
        return leaders[0] if len(leaders) == 1 else None

    def change(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A membership change on the current leader; retried while another change or an
        election is in progress (409 membership_change_in_progress / not_leader), and while
        the node to add does not answer the leader in time (503 unavailable: on a loaded CI
        machine a node's first replica can take longer than the leader's 10 s peer call;
        the answer is transient by contract and a retried add finds the replica hosted)."""

        def attempt() -> Any:
            leader = self._leader(NODES)
            if leader is None:
                return None
            status, answer = self.call(leader, method, path, body)
            if status in (200, 201):
                return answer
            if status == 503 and answer["code"] == "unavailable":
                return None
            assert status == 409 and answer["code"] in (
                "membership_change_in_progress",
                "not_leader",
            ), (status, answer)
            return None

        return poll(attempt, f"{method} {path}")


def poll(check: Callable[[], Any], what: str, seconds: float = WAIT_S) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found is not None and found is not False:
            return found
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.2)


class Writer:
    """Appends unique payloads through the client on its own thread until stopped;
    remembers every acknowledged (LSN, payload)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self._client = cluster.client()
        self.acked: dict[int, bytes] = {}
        self.acked_at: list[float] = []  # time.monotonic() of each acknowledgement
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            payloads = [f"w{number}.{i}".encode() for i in range(3)]
            number += 1
            try:
                lsns = self._client.append(1, payloads)
            except (LogsvcError, TimeoutError) as exc:  # not acked: may or may not be in
                self.failures.append(f"{type(exc).__name__}: {exc}")
                continue
            self.acked_at.append(time.monotonic())
            for lsn, payload in zip(lsns, payloads, strict=True):
                assert lsn not in self.acked, f"LSN {lsn} acknowledged twice"
                self.acked[lsn] = payload
            time.sleep(0.005)

    def wait_for(self, count: int) -> None:
        target = len(self.acked) + count
        poll(lambda: len(self.acked) >= target, f"{count} more acked records")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        self._client.close()


def read_all(address: str, token: str) -> dict[int, bytes]:
    """Every retained record of shard 1 (LSN -> payload) as served by the node at
    `address`."""
    client = SyncClient([address], token)
    try:
        records: dict[int, bytes] = {}
        lsn = 1
        while True:
            try:
                answer = client.read(1, lsn, 1 << 20)
            except Truncated as exc:  # start at the first retained record
                assert exc.first_lsn is not None and exc.first_lsn > lsn
                lsn = exc.first_lsn
                continue
            if not answer.records:
                return records
            for offset, record in enumerate(answer.records):
                records[answer.first_lsn + offset] = record
            lsn = answer.next_lsn
    finally:
        client.close()


def check_log(log: dict[int, bytes], acked: dict[int, bytes]) -> None:
    """Every acked record at its LSN, and no payload twice (each payload is unique)."""
    for lsn, payload in acked.items():
        assert log.get(lsn) == payload, f"acked LSN {lsn} holds {log.get(lsn)!r}, not {payload!r}"
    payloads = list(log.values())
    assert len(payloads) == len(set(payloads)), "a payload appears twice in the log"
    assert sorted(log) == list(range(1, len(log) + 1)), "LSNs are not dense from 1"


def replicas_of(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {replica["node_id"]: replica for replica in status["replicas"]}


def test_add_then_remove_a_replica_under_load_and_restart(four_nodes: LocalCluster) -> None:
    cluster = four_nodes
    admin = Admin(cluster)
    data = {node: admin.configs[node].node.data_address for node in NODES}
    leader = admin.leader(("n1", "n2", "n3"))
    status, answer = admin.shard("n4")
    assert status == 404 and answer["code"] == "shard_not_hosted"

    # A log worth copying (~2.5 MB in 100 entries) before n4 joins, so that it catches up
    # while the writer keeps appending.
    client = cluster.client()
    preloaded: dict[int, bytes] = {}
    try:
        for batch in range(100):
            payloads = [f"p{batch}.{i}.".encode() + bytes(240) for i in range(100)]
            lsns = client.append(1, payloads)
            preloaded.update(zip(lsns, payloads, strict=True))
    finally:
        client.close()

    writer = Writer(cluster)
    writer.acked.update(preloaded)
    try:
        writer.wait_for(30)

        # 1. Add n4 while appends run.
        answer = admin.change("POST", "/v1/shards/1/replicas", {"node_id": "n4"})
        assert sorted(answer["replicas"]) == ["n1", "n2", "n3", "n4"]
        writer.wait_for(30)

        def n4_caught_up() -> dict[str, Any] | None:
            leader_now = admin._leader(NODES)
            if leader_now is None:
                return None
            status, shard = admin.shard(leader_now)
            n4 = replicas_of(shard).get("n4") if status == 200 else None
            return shard if n4 is not None and n4["caught_up"] else None

        shard = poll(n4_caught_up, "n4 caught up in the leader's status")
        n4 = replicas_of(shard)["n4"]
        assert n4["lag_entries"] is not None and n4["lag_entries"] <= 16
        assert n4["lag_seconds"] is not None and n4["lag_seconds"] >= 0
        assert shard["last_election_at"] is not None
        assert sorted(replicas_of(shard)) == ["n1", "n2", "n3", "n4"]

        def n4_ready() -> bool:
            status, own = admin.shard("n4")
            ready, _ = admin.call("n4", "GET", "/readyz")
            return status == 200 and not own["joining"] and ready == 200

        poll(n4_ready, "n4 no longer joining and ready")

        # 2. Remove an old follower while appends run.
        leader = admin.leader()
        removed = next(n for n in ("n1", "n2", "n3") if n != leader)
        answer = admin.change("DELETE", f"/v1/shards/1/replicas/{removed}")
        kept = sorted({"n1", "n2", "n3", "n4"} - {removed})
        assert sorted(answer["replicas"]) == kept
        writer.wait_for(30)
        status, answer = admin.shard(removed)
        assert status == 404 and answer["code"] == "shard_not_hosted"
    finally:
        writer.stop()

    # 3. Nothing acked lost, nothing duplicated; n4 serves the whole log too.
    assert len(writer.acked) >= 90 + len(preloaded)
    leader = admin.leader()
    whole = read_all(data[leader], admin.token)
    check_log(whole, writer.acked)
    on_n4 = poll(
        lambda: log if len(log := read_all(data["n4"], admin.token)) >= len(whole) else None,
        "n4 serving every record",
    )
    assert {lsn: on_n4[lsn] for lsn in whole} == whole

    # 4. Leadership to n4 (transfer-leader), and the client follows it there.
    if leader != "n4":
        status, answer = admin.call(
            leader, "POST", "/v1/shards/1/transfer-leader", {"target_node_id": "n4"}
        )
        assert status == 202, answer
        poll(lambda: admin._leader(NODES) == "n4", "n4 leading after the transfer")
    client = cluster.client()
    try:
        lsns = client.append(1, [b"after-transfer"])
    finally:
        client.close()
    writer.acked[lsns[0]] = b"after-transfer"

    # 5. Every node restarts: the membership is the changed one.
    for node in NODES:
        devcluster.kill_node(cluster.dir, node, signal.SIGTERM)
    for node in NODES:
        devcluster.start_node(cluster.dir, node)
    devcluster.wait_for_leaders(cluster.dir, shards=1)
    leader = admin.leader(tuple(kept))
    _, shard = admin.shard(leader)
    assert sorted(replicas_of(shard)) == kept
    status, answer = admin.shard(removed)
    assert status == 404 and answer["code"] == "shard_not_hosted"
    _, cluster_view = admin.call(removed, "GET", "/v1/cluster")
    assert cluster_view["shards"][0]["hosted"] is False
    archive = Path(cluster.dir, removed, "removed")
    assert [p.name.startswith("shard-1-") for p in archive.iterdir()] == [True]
    assert not Path(cluster.dir, removed, "shards", "1").exists()
    client = cluster.client()
    try:
        lsns = client.append(1, [b"after-restart"])
    finally:
        client.close()
    writer.acked[lsns[0]] = b"after-restart"
    check_log(read_all(data[admin.leader(tuple(kept))], admin.token), writer.acked)
    for node in NODES:  # no node hit an internal error or stopped a replica on a fault
        text = Path(cluster.dir, f"{node}.log").read_text(errors="replace")
        assert "Traceback" not in text and " CRITICAL " not in text, node


def test_membership_refusals(four_nodes: LocalCluster) -> None:
    """The rules, on a real leader: no removing the leader, none below three members,
    no adding a member twice, and a follower names the leader."""
    admin = Admin(four_nodes)
    leader = admin.leader(("n1", "n2", "n3"))
    follower = next(n for n in ("n1", "n2", "n3") if n != leader)
    status, answer = admin.call(leader, "DELETE", f"/v1/shards/1/replicas/{follower}")
    assert status == 409 and answer["code"] == "change_refused"  # would leave 2
    status, answer = admin.call(leader, "DELETE", f"/v1/shards/1/replicas/{leader}")
    assert status == 409 and answer["code"] == "change_refused"  # the leader itself
    status, answer = admin.call(leader, "POST", "/v1/shards/1/replicas", {"node_id": follower})
    assert status == 409 and answer["code"] == "already_a_replica"

    def named() -> Any:
        status, answer = admin.call(follower, "POST", "/v1/shards/1/replicas", {"node_id": "n4"})
        assert status == 409 and answer["code"] == "not_leader"
        return answer["leader"]

    assert poll(named, "the follower naming the leader")["node_id"] == leader
    status, answer = admin.shard("n4")
    assert status == 404  # nothing was started on n4
    assert not os.path.exists(Path(four_nodes.dir, "n4", "shards", "1"))


def test_a_node_removed_while_down_does_not_disrupt_when_it_returns(
    four_nodes: LocalCluster,
) -> None:
    """n4 joins; a follower is killed and removed while down (the leader cannot tell it);
    restarted, it still hosts its old replica, but its former peers refuse it: the leader
    and its term stay, writes go on, the node is not ready; releasing it by hand (the
    internal endpoint) stops it for good."""
    cluster = four_nodes
    admin = Admin(cluster)
    leader = admin.leader(("n1", "n2", "n3"))
    admin.change("POST", "/v1/shards/1/replicas", {"node_id": "n4"})
    poll(
        lambda: all(r["caught_up"] for r in admin.shard(admin.leader())[1]["replicas"]),
        "every replica caught up",
    )
    leader = admin.leader()
    victim = next(n for n in ("n1", "n2", "n3") if n != leader)
    devcluster.kill_node(cluster.dir, victim)  # SIGKILL
    answer = admin.change("DELETE", f"/v1/shards/1/replicas/{victim}")
    assert victim not in answer["replicas"]

    _, before = admin.shard(leader)
    devcluster.start_node(cluster.dir, victim)
    poll(lambda: admin.shard(victim)[0] == 200, "the removed node serving its admin API")
    client = cluster.client()
    try:
        deadline = time.monotonic() + 6.0  # over two of its election timeouts (1-2.5 s)
        while time.monotonic() < deadline:
            client.append(1, [b"still-writing"])
            time.sleep(0.1)
    finally:
        client.close()
    status, after = admin.shard(leader)
    assert status == 200 and after["is_leader"], after
    assert after["term"] == before["term"]  # nobody was deposed
    assert victim not in {r["node_id"] for r in after["replicas"]}
    ready, verdict = admin.call(victim, "GET", "/readyz")
    assert ready == 503, verdict

    status, answer = admin.call(victim, "DELETE", "/v1/internal/shards/1/host")
    assert status == 200 and answer["hosted"] is False
    status, answer = admin.shard(victim)
    assert status == 404 and answer["code"] == "shard_not_hosted"


def test_a_replica_added_after_compaction_starts_from_the_snapshot(
    four_nodes: LocalCluster,
) -> None:
    """The log was truncated twice, so the leader compacted its journal (0001: one
    truncation behind): n4 joins from the snapshot (which predates its `add`: it keeps
    the members it was given), then the retained entries, and serves exactly the
    retained records."""
    cluster = four_nodes
    admin = Admin(cluster)
    data = {node: admin.configs[node].node.data_address for node in NODES}
    client = cluster.client()
    try:
        for _ in range(2):
            for batch in range(20):
                client.append(1, [f"{batch}.{i}".encode() * 8 for i in range(50)])
            client.truncate(1, client.status(1).next_lsn)
        for batch in range(20):
            client.append(1, [f"kept {batch}.{i}".encode() for i in range(50)])
    finally:
        client.close()
    leader = admin.leader(("n1", "n2", "n3"))
    poll(lambda: admin.shard(leader)[1]["journal_first_index"] > 1, "the leader's compaction")

    admin.change("POST", "/v1/shards/1/replicas", {"node_id": "n4"})
    poll(
        lambda: replicas_of(admin.shard(admin.leader())[1]).get("n4", {}).get("caught_up"),
        "n4 caught up",
    )
    poll(lambda: admin.call("n4", "GET", "/readyz")[0] == 200, "n4 ready")
    _, on_leader = admin.shard(admin.leader())
    _, on_n4 = admin.shard("n4")
    assert on_n4["first_lsn"] == on_leader["first_lsn"] > 1
    assert on_n4["journal_first_index"] > 1  # it never had the compacted entries
    retained = read_all(data[admin.leader()], admin.token)
    assert len(retained) == 1000
    assert poll(lambda: read_all(data["n4"], admin.token) == retained or None, "n4's copy")
