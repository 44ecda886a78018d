"""The node's leadership balancer: a task on the event loop that, every round, reads who
leads each hosted shard and hands some of this node's leaderships to less-loaded live
voters (the plan is logsvc/shard/leader_balance.py, which says why).

Bounded: at most `moves_per_s` transfers a second (`[raft] leader_moves_per_s`; 0 turns
the balancer off), a round every `ROUND_S` while leaderships move or an election runs and
every `ROUND_IDLE_S` once balanced (a round reads every hosted replica: a few milliseconds
for a thousand, so an idle node pays about 0.1% of a core for it). A move asked and not seen
done within `MOVE_SETTLE_S` is forgotten (the target was not caught up, say: pysyncobj
denies the transfer) and may be asked again.

The replicas are read from the event loop while their workers tick them: what a round reads
(the role, the leader, the members, the connections) are single attribute reads or copies,
and a replica whose peers changed during the copy is read as leaderless for that round (the
round then holds, as it does for a real election)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from logsvc.shard.leader_balance import Move, ShardLeadership, plan_moves
from logsvc.shard.raft.config import FailReason, RaftFatal
from logsvc.shard.replica import ShardReplica

log = logging.getLogger("logsvc.node")

# Seconds between rounds while moves are under way or a shard has no leader; once a round
# finds nothing to move, the next is ROUND_IDLE_S later (idle cost; a node that comes back
# is balanced within that much).
ROUND_S = 1.0
ROUND_IDLE_S = 5.0
# A move not seen done after this long is forgotten: above the largest election timeout
# (2.5 s by default), within which the target has stood and won or the transfer failed.
MOVE_SETTLE_S = 5.0


@dataclass(slots=True)
class _Pending:
    target: str
    asked_s: float


class LeaderBalancer:
    """One per node. `replicas`: the hosting's live map (shard id -> replica); `node_of`:
    Raft address -> node id; `live(node)`: the node is up (the scheduler's liveness)."""

    def __init__(
        self,
        node_id: str,
        replicas: Mapping[int, ShardReplica],
        node_of: Callable[[str], str],
        live: Callable[[str], bool],
        moves_per_s: int,
        clock: Callable[[], float],
    ) -> None:
        assert moves_per_s >= 0
        self._node_id = node_id
        self._replicas = replicas
        self._node_of = node_of
        self._live = live
        self._moves_per_round = max(1, round(moves_per_s * ROUND_S)) if moves_per_s else 0
        self._clock = clock
        self._pending: dict[int, _Pending] = {}
        self.moves_asked = 0  # counted (tests, and the log line below)
        self.moves_refused = 0  # pysyncobj refused the transfer (the target was behind...)

    @property
    def enabled(self) -> bool:
        return self._moves_per_round > 0

    async def run(self) -> None:
        """Rounds until cancelled."""
        while True:
            busy = self.round()
            await asyncio.sleep(ROUND_S if busy else ROUND_IDLE_S)

    def round(self) -> bool:
        """One round: read, plan, ask. True if a move is under way or a shard has no
        leader (look again soon)."""
        if not self.enabled:
            return False
        now_s = self._clock()
        shards = self._read()
        if shards is None:
            return True  # an election is running: no moves on top of it
        by_id = {shard.shard_id: shard for shard in shards}
        for shard_id, pending in list(self._pending.items()):
            shard = by_id.get(shard_id)
            if (
                shard is None
                or shard.leader != self._node_id
                or now_s - pending.asked_s > MOVE_SETTLE_S
            ):
                del self._pending[shard_id]  # done, gone, or given up on
        moves = plan_moves(
            self._node_id,
            shards,
            self._live,
            {shard_id: pending.target for shard_id, pending in self._pending.items()},
            self._moves_per_round,
        )
        for move in moves:
            self._ask(move, now_s)
        if moves:
            log.info(
                "leadership balance: handing %d shard(s) to other nodes (%s)",
                len(moves),
                ", ".join(f"{m.shard_id}->{m.target}" for m in moves[:8]),
            )
        return bool(moves or self._pending)

    def _read(self) -> list[ShardLeadership] | None:
        """Every hosted voting replica's view, or None if one has no live leader."""
        shards = []
        node_of, live = self._node_of, self._live
        for shard_id, replica in list(self._replicas.items()):
            raft = replica.node
            if raft.learner or raft.fatal is not None:
                continue  # never a leader nor a voter / serves nothing
            try:
                members = raft.members
                if raft.is_leader:
                    leader: str | None = self._node_id
                else:
                    address = raft.leader
                    leader = None if address is None else node_of(address)
                    if leader is not None and not (live(leader) and raft.connected_to(leader)):
                        leader = None  # lost: its followers are about to elect
            except RuntimeError:  # its peers changed while we copied them
                return None
            if leader is None:
                return None
            shards.append(ShardLeadership(shard_id, leader, tuple(node_of(a) for a in members)))
        return shards

    def _ask(self, move: Move, now_s: float) -> None:
        replica = self._replicas.get(move.shard_id)
        if replica is None:
            return
        raft = replica.node
        address = next((a for a in raft.members if self._node_of(a) == move.target), None)
        if address is None:
            return
        shard_id = move.shard_id

        def answered(_result: object, reason: int) -> None:  # on the replica's tick
            if reason != FailReason.SUCCESS:
                self.moves_refused += 1
                log.info("shard %d: leadership transfer refused (reason %d)", shard_id, reason)

        try:
            raft.transfer_leadership(address, answered)
        except RaftFatal as exc:  # its tick calls are full: not this round
            log.debug("shard %d: leadership transfer not asked: %s", move.shard_id, exc)
            return
        self._pending[move.shard_id] = _Pending(move.target, now_s)
        self.moves_asked += 1
