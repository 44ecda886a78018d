"""The command and snapshot formats match the checked-in golden vectors and FORMAT.md.

Encoding fixed inputs must give exactly the bytes in `golden/`; decoding those bytes must
give the inputs back; the header fields sit where FORMAT.md says. A failure here means a
format changed: bump its version and add new vectors instead of editing these.

Commands are all version 1 (AppendGroup, tag 5, and the epoch-carrying Truncate, tag 6, were
added within it: the older vectors did not change; `command_truncate_v1.hex`, tag 2, now
decodes to `UnfencedTruncate`, what it always meant). Snapshots: version 1
(`snapshot_v1*.hex`, still what a state without grouped appends encodes to) and version 2
(`snapshot_v2.hex`, a state only version 2 can hold).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from logsvc.shard.commands import (
    AcquireLease,
    AppendBatch,
    Appended,
    AppendGroup,
    Barrier,
    Command,
    GroupAppended,
    StaleEpoch,
    Truncate,
    UnfencedTruncate,
    decode_command,
    decode_entry_records,
    encode_command,
    xxh3,
)
from logsvc.shard.state_machine import EntrySlice, Lease, ShardStateMachine

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text().strip())


COMMAND_VECTORS: list[tuple[str, Command]] = [
    ("command_append_batch_v1.hex", AppendBatch("c1", 7, 2, (b"hello", b""))),
    ("command_truncate_v1.hex", UnfencedTruncate(42)),
    ("command_truncate_epoch_v1.hex", Truncate(42, 3)),
    ("command_acquire_lease_v1.hex", AcquireLease("tn-1", 3)),
    ("command_barrier_v1.hex", Barrier(9)),
    (
        "command_append_group_v1.hex",
        AppendGroup((AppendBatch("c1", 7, 2, (b"hello", b"")), AppendBatch("c2", 1, 2, (b"x",)))),
    ),
]


@pytest.mark.parametrize(("name", "command"), COMMAND_VECTORS)
def test_command_vectors(name: str, command: Command) -> None:
    assert encode_command(command) == golden(name)
    assert decode_command(golden(name)) == command


def test_command_frame_fields_are_where_format_md_says() -> None:
    data = golden("command_append_batch_v1.hex")
    assert len(data) == 29
    assert data[0:3] == b"LSC"
    assert data[3] == 1
    assert int.from_bytes(data[4:12], "little") == xxh3(data[12:]) == 0x8E88F2C1FB33B891
    assert data[12] == 0x95  # msgpack array of 5
    assert data[13] == 1  # type tag: AppendBatch
    assert data[14:17] == b"\xa2c1"
    assert data[17:19] == b"\x07\x02"  # seq 7, epoch 2
    assert data[19:] == b"\x92\xc4\x05hello\xc4\x00"


def test_append_group_fields_are_where_format_md_says() -> None:
    data = golden("command_append_group_v1.hex")
    assert len(data) == 41
    assert data[0:4] == b"LSC\x01"
    assert int.from_bytes(data[4:12], "little") == xxh3(data[12:]) == 0xE68A7E009DCFE32B
    assert data[12:15] == b"\x92\x05\x92"  # array(2), type tag 5, array(2) of batches
    # Each batch is an AppendBatch body without its type tag: array(4).
    assert data[15:31] == b"\x94\xa2c1\x07\x02\x92\xc4\x05hello\xc4\x00"
    assert data[31:] == b"\x94\xa2c2\x01\x02\x91\xc4\x01x"
    assert decode_entry_records(data) == (b"hello", b"", b"x")


def test_truncate_fields_are_where_format_md_says() -> None:
    data = golden("command_truncate_epoch_v1.hex")
    assert len(data) == 16
    assert data[0:4] == b"LSC\x01"
    assert int.from_bytes(data[4:12], "little") == xxh3(data[12:]) == 0x5BCD2A9535C2DAE8
    assert data[12:] == b"\x93\x06\x2a\x03"  # array(3), type tag 6, lsn 42, epoch 3
    assert golden("command_truncate_v1.hex")[12:] == b"\x92\x02\x2a"  # tag 2: no epoch


def example_machine() -> ShardStateMachine:
    """FORMAT.md's worked example."""
    machine = ShardStateMachine()
    machine.apply(1, AcquireLease("tn-1", 1))
    machine.apply(2, AppendBatch("c1", 1, 1, (b"a", b"b", b"c")))
    machine.apply(4, AppendBatch("c1", 2, 1, (b"d",)))
    machine.apply(6, Truncate(3, 1))
    return machine


def test_snapshot_vector() -> None:
    data = golden("snapshot_v1.hex")
    assert example_machine().snapshot() == data
    assert example_machine().snapshot_points[0].data == data
    restored = ShardStateMachine.restore(data)
    assert restored.last_applied_raft_index == 6
    assert (restored.next_lsn, restored.first_lsn) == (5, 3)
    assert restored.lease == Lease("tn-1", 1)
    assert restored.remembered_seqs("c1") == {1: (1, 3), 2: (4, 1)}
    assert restored.lsn_to_raft_index(3) == (2, 2)
    assert restored.lsn_to_raft_index(4) == (4, 0)


def test_snapshot_fields_are_where_format_md_says() -> None:
    data = golden("snapshot_v1.hex")
    assert len(data) == 78
    assert data[0:4] == b"LSS\x01"
    assert int.from_bytes(data[4:12], "little") == xxh3(data[12:])
    assert data[12:16] == bytes([0x9A, 6, 5, 3])  # array(10), last applied 6, next 5, first 3
    assert data[16:21] == b"\xa4tn-1"
    assert data[42:44] == b"\xc4\x10"  # bin(16): raft indexes
    assert data[44:60] == (2).to_bytes(8, "little") + (4).to_bytes(8, "little")
    assert data[60:62] == b"\xc4\x10"  # bin(16): counts
    assert data[62:78] == (3).to_bytes(8, "little") + (1).to_bytes(8, "little")


def test_fresh_snapshot_vector() -> None:
    data = golden("snapshot_v1_fresh.hex")
    assert ShardStateMachine().snapshot() == data
    assert len(data) == 27
    restored = ShardStateMachine.restore(data)
    assert (restored.last_applied_raft_index, restored.next_lsn, restored.first_lsn) == (0, 1, 1)
    assert restored.lease == Lease(None, 0)


def example_machine_v2() -> ShardStateMachine:
    """FORMAT.md's version 2 worked example."""
    machine = ShardStateMachine()
    machine.apply(1, AcquireLease("tn-1", 1))
    result = machine.apply(
        2,
        AppendGroup(
            (
                AppendBatch("c2", 1, 1, (b"a", b"b")),
                AppendBatch("c9", 1, 0, (b"x",)),
                AppendBatch("c1", 1, 1, (b"c",)),
            )
        ),
    )
    assert result == GroupAppended(
        (Appended(1, 2, False), StaleEpoch("tn-1", 1), Appended(3, 1, False))
    )
    machine.apply(3, Truncate(2, 1))
    return machine


def test_snapshot_v2_vector() -> None:
    data = golden("snapshot_v2.hex")
    assert example_machine_v2().snapshot() == data
    restored = ShardStateMachine.restore(data)
    assert restored.snapshot() == data
    assert restored.last_applied_raft_index == 3
    assert (restored.next_lsn, restored.first_lsn) == (4, 2)
    assert restored.dedupe_clients() == ("c2", "c1")  # batch order, both active at 2
    assert restored.lsn_to_raft_index(2) == (2, 1)
    assert restored.locate(3) == EntrySlice(2, 3, 1)  # after the refused batch's record


def test_snapshot_v2_fields_are_where_format_md_says() -> None:
    data = golden("snapshot_v2.hex")
    assert len(data) == 103
    assert data[0:4] == b"LSS\x02"
    assert int.from_bytes(data[4:12], "little") == xxh3(data[12:]) == 0x6A4D4EDE842CEF3A
    assert data[12:16] == bytes([0x9B, 3, 4, 2])  # array(11), last applied 3, next 4, first 2
    # clients: array(2), "c2" first, then "c1" (batch order; both active at 2)
    assert data[26:34] == b"\x92\x94\xa2c2\x02\x00\x91"
    assert data[38:42] == b"\x94\xa2c1"
    assert data[49:51] == b"\xc4\x10"  # bin(16): raft indexes 2, 2
    assert data[51:67] == (2).to_bytes(8, "little") * 2
    assert data[67:69] == b"\xc4\x10"  # bin(16): counts 2, 1
    assert data[69:85] == (2).to_bytes(8, "little") + (1).to_bytes(8, "little")
    assert data[85:87] == b"\xc4\x10"  # bin(16): offsets 0, 3
    assert data[87:103] == (0).to_bytes(8, "little") + (3).to_bytes(8, "little")
