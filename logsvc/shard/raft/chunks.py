"""A large entry's chunks, reassembled before `ShardRaft` checks the message they end.

pysyncobj sends an entry of appendEntriesBatchSizeBytes or more as `append_entries` chunks
(`transmission` start / process / finish) of its pickle. The last one is turned into an
ordinary one-entry message, so the same conflict check applies (hole 3); the chunks before
it pass through to pysyncobj untouched."""

from __future__ import annotations

from typing import Any

import pysyncobj.pickle as pysyncobj_pickle

from logsvc.shard.raft import patches as _patches  # noqa: F401  (patched before use)
from logsvc.shard.raft.config import RaftFatal
from logsvc.shard.raft.snapshot_transfer import TRANSMISSION_BYTES_MAX


class ChunkAssembler:
    """The chunks of the large entry being received on one replica (one at a time: its
    leader sends them in order on one connection)."""

    def __init__(self) -> None:
        self._received = b""

    def assemble(self, message: dict[str, Any]) -> dict[str, Any]:
        """`message` as it is, or, for the last chunk, the whole entry as a one-entry
        AppendEntries. RaftFatal past TRANSMISSION_BYTES_MAX."""
        transmission = message.get("transmission")
        if transmission is None:
            return message
        if transmission == "start":
            self._received = message["data"]
            return message
        if transmission == "process":
            self._received += message["data"]
            return message
        assert transmission == "finish"
        data = self._received + message["data"]
        try:
            entry = pysyncobj_pickle.loads(data)
        except Exception:
            # pysyncobj's sender labels a chunk "finish" when it reaches the length of the
            # entry's *command*, not of its pickle, which is longer: more chunks may follow
            # (each labelled "finish"). A proper prefix of the pickle never loads, so keep
            # collecting, and let pysyncobj buffer it as an ordinary chunk.
            if len(data) > TRANSMISSION_BYTES_MAX:
                raise RaftFatal(
                    f"a chunked entry exceeded {TRANSMISSION_BYTES_MAX} bytes"
                ) from None
            self._received = data
            return {**message, "transmission": "process"}
        self._received = b""
        whole = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        whole["entries"] = [tuple(entry)]
        return whole
