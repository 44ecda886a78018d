"""Adding a replica through a learner stage (Raft thesis §4.2.1; docs/decisions/0005),
with real node processes.

What it proves: on 4 nodes with shard 1 on n1..n3, a log of ~48 MB, and one of the three
members (a follower) killed, so that the two left are exactly the write quorum, POST
/v1/shards/1/replicas {"node_id": "n4"} on the leader

1. starts n4 as a non-voting learner: its own status says stage "learner" and the leader's
   lists it under `learners` (not `replicas`), with its lag;
2. never takes the shard below its write quorum: appends keep being acknowledged while the
   learner is still far behind (were n4 a voter at once, 3 of 4 members would be needed and
   n4, empty, could not be one of them: nothing would commit until it caught up);
3. promotes n4 only once caught up: the leader's decision (its log line) was taken with n4
   at most `CAUGHT_UP_LAG_ENTRIES_MAX` entries behind, and n4 becomes a voter member;
4. loses nothing: every acknowledged append is in the log read through the leader, and n4
   serves the same log.

How: `logsvc dev-cluster` processes, the admin API over HTTP, a writer thread through the
client, a sampler thread polling n4's and the leader's shard status; bounded waits.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from logsvc import devcluster
from logsvc.admin.changes import CAUGHT_UP_LAG_ENTRIES_MAX

from .conftest import LocalCluster
from .test_membership import Admin, Writer, check_log, poll, read_all

PRELOAD_APPENDS = 96
PRELOAD_RECORDS = 64  # per append
PRELOAD_RECORD_BYTES = 8 * 1024  # 96 x 64 x 8 KiB = 48 MiB to copy to the learner


class Sampler:
    """Polls n4's and the leader's view of shard 1 until stopped."""

    def __init__(self, admin: Admin, leader: str) -> None:
        self._admin = admin
        self._leader = leader
        self.samples: list[tuple[float, str, Any]] = []  # (time, node, status or None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for node in ("n4", self._leader):
                status, answer = self._admin.shard(node)
                self.samples.append((time.monotonic(), node, answer if status == 200 else None))
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


# The leader bounds its wait for the learner (LEARNER_CATCH_UP_S_MAX, then 503 "still
# catching up", the learner going on); a slow machine may need the documented second call.
ADD_ATTEMPTS_MAX = 3
LOG_TAIL_LINES = 40


def add_n4(admin: Admin, leader: str) -> tuple[int, Any]:
    """POST n4 as a replica on the leader, again while the answer is "still catching up"."""
    for _ in range(ADD_ATTEMPTS_MAX):
        status, answer = admin.call(leader, "POST", "/v1/shards/1/replicas", {"node_id": "n4"})
        if status != 503 or "still catching up" not in str(answer.get("message")):
            break
        print(f"adding n4, again: {answer['message']}")
    return status, answer


def log_tails(cluster_dir: Path | str, nodes: tuple[str, ...]) -> str:
    """The last lines of `nodes`' logs (for a failure's message)."""
    tails = []
    for node in nodes:
        lines = Path(cluster_dir, f"{node}.log").read_text(errors="replace").splitlines()
        tails.append(f"--- {node}.log\n" + "\n".join(lines[-LOG_TAIL_LINES:]))
    return "\n".join(tails)


def test_a_replica_added_under_load_joins_as_a_learner_and_is_promoted_caught_up(
    four_nodes: LocalCluster,
) -> None:
    admin = Admin(four_nodes)
    client = four_nodes.client()
    try:
        filler = os.urandom(PRELOAD_RECORD_BYTES)
        preloaded: dict[int, bytes] = {}
        for number in range(PRELOAD_APPENDS):
            records = [b"p%d.%d:" % (number, i) + filler for i in range(PRELOAD_RECORDS)]
            lsns = client.append(1, records)
            preloaded.update(zip(lsns, records, strict=True))
    finally:
        client.close()
    leader = admin.leader(("n1", "n2", "n3"))
    down = next(n for n in ("n1", "n2", "n3") if n != leader)
    devcluster.kill_node(four_nodes.dir, down)  # two members left: exactly the quorum

    writer = Writer(four_nodes)
    sampler = Sampler(admin, leader)
    try:
        writer.wait_for(30)
        status, answer = add_n4(admin, leader)
        added_at = time.monotonic()
        assert status == 201, (answer, log_tails(four_nodes.dir, ("n4", leader)))
        assert sorted(answer["replicas"]) == sorted(["n1", "n2", "n3", "n4"])
        writer.wait_for(30)  # and the four-member shard (one down) commits on
    finally:
        sampler.stop()
        writer.stop()

    # 1. n4 was a learner, listed as such by the leader, not as a member.
    n4_views = [(t, s) for t, node, s in sampler.samples if node == "n4" and s is not None]
    learner_times = [t for t, s in n4_views if s["stage"] == "learner"]
    assert learner_times, "n4 was never seen as a learner"
    leader_views = [(t, s) for t, node, s in sampler.samples if node == leader and s]
    behind = [
        (t, learner["lag_entries"])
        for t, s in leader_views
        for learner in s["learners"]
        if learner["node_id"] == "n4" and learner["lag_entries"] > CAUGHT_UP_LAG_ENTRIES_MAX
    ]
    assert behind, "the leader never showed the learner behind: nothing to prove"
    assert all(
        "n4" not in [r["node_id"] for r in s["replicas"]]
        for t, s in leader_views
        if any(learner["node_id"] == "n4" for learner in s["learners"])
    )
    # 2. Appends were acknowledged while n4 was still far behind.
    first_behind, last_behind = behind[0][0], behind[-1][0]
    acked_meanwhile = [t for t in writer.acked_at if first_behind <= t <= last_behind]
    print(
        f"the learner was behind for {last_behind - first_behind:.2f} s (up to "
        f"{max(lag for _, lag in behind)} entries); {len(acked_meanwhile)} appends were "
        "acknowledged meanwhile"
    )
    assert acked_meanwhile, (
        f"no append acknowledged while the learner was behind ({behind[0][1]} entries); "
        "the quorum waited for it"
    )
    # 3. Promoted only once caught up: the leader's own decision, from its log.
    log_text = Path(four_nodes.dir, f"{leader}.log").read_text()
    decided = re.findall(
        r"the learner on n4 caught up \(it holds raft index (\d+) of (\d+)\)", log_text
    )
    assert decided, "no promotion decision in the leader's log"
    held, last = (int(x) for x in decided[-1])
    assert last - held <= CAUGHT_UP_LAG_ENTRIES_MAX
    assert all(t <= added_at for t in learner_times)

    def n4_voter() -> Any:
        status, view = admin.shard("n4")
        return view if status == 200 and view["stage"] == "voter" else None

    assert not poll(n4_voter, "n4 to be a voter")["learner"]

    # 4. Nothing acknowledged is missing, and n4 serves the same log.
    addresses = four_nodes.client_config.addresses
    token = four_nodes.client_config.token
    through_leader = read_all(addresses[int(leader[1:]) - 1], token)
    acked = {**preloaded, **writer.acked}
    check_log(through_leader, acked)
    poll(
        lambda: len(read_all(addresses[3], token)) >= len(through_leader),
        "n4 to serve the whole log",
    )


def test_a_learner_restarted_comes_back_a_learner_and_promotion_survives_a_restart(
    four_nodes: LocalCluster,
) -> None:
    """The stage across restarts (the `learner` marker file): n4 hosting a learner,
    killed and restarted, is a learner again and catches up; promoted (the internal call a
    leader makes), killed and restarted, it is a joining voter; once added, a voter."""
    admin = Admin(four_nodes)
    client = four_nodes.client()
    try:
        lsns = client.append(1, [b"before the learner"])
        members = {"members": ["n1", "n2", "n3"]}
        status, answer = admin.call(
            "n4", "POST", "/v1/internal/shards/1/host", {**members, "learner": True}
        )
        assert status == 200, answer

        def n4_stage(stage: str) -> Any:
            code, view = admin.shard("n4")
            return view if code == 200 and view["stage"] == stage else None

        poll(lambda: n4_stage("learner"), "n4 hosting a learner")
        devcluster.kill_node(four_nodes.dir, "n4")
        devcluster.start_node(four_nodes.dir, "n4")
        view = poll(lambda: n4_stage("learner"), "n4 a learner again after its restart")
        poll(lambda: (n4_stage("learner") or {}).get("next_lsn", 0) > lsns[0], "catch-up")
        assert "n4" not in [r["node_id"] for r in view["replicas"]]

        status, answer = admin.call("n4", "POST", "/v1/internal/shards/1/promote", members)
        assert status == 200, answer
        poll(lambda: n4_stage("joining"), "n4 a joining voter")
        devcluster.kill_node(four_nodes.dir, "n4")
        devcluster.start_node(four_nodes.dir, "n4")
        poll(lambda: n4_stage("joining"), "n4 a joining voter after its restart")
        # The leader adds it (it is no learner now: nothing to wait for).
        answer = admin.change("POST", "/v1/shards/1/replicas", {"node_id": "n4"})
        assert sorted(answer["replicas"]) == ["n1", "n2", "n3", "n4"]
        poll(lambda: n4_stage("voter"), "n4 a voter")
    finally:
        client.close()
