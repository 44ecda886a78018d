"""The node journal's pure parts: record format, the torn-versus-corrupt scan, replay, ledger.

How: `plan_replay` is checked against a model of the true history (random appends, Raft
suffix truncations and votes of one store): whatever point the store's own files reached
between the journal's start and its end (and with an unsynced segment tail lost), replaying
the journal's operations ends in the state the whole history leads to, and replaying again
does nothing. The scan is fed whole files, torn tails (cut, zeroed pages) and damaged bytes
(a flipped bit before the tail, in a sealed file, after a later record's synced hint), and
must report exactly what decision 0009 says. No I/O, no threads.
"""

from __future__ import annotations

import random

import pytest

from logsvc.store import journal_records as jr
from logsvc.store.journal_replay import (
    AppendOp,
    JournalLedger,
    ReplayGap,
    StoreOp,
    TruncateOp,
    VoteOp,
    plan_replay,
)
from logsvc.store.records import Entry

PAYLOAD_MAX = 1 << 20


# ------------------------------------------------------------------ replay against a model


def _random_history(rng: random.Random) -> tuple[list[StoreOp], list[list[Entry]]]:
    """Operations and the log after each (states[k] = log after the first k ops)."""
    log: list[Entry] = []
    term = 1
    ops: list[StoreOp] = []
    states = [list(log)]
    for _ in range(rng.randint(1, 25)):
        roll = rng.random()
        if roll < 0.2 and log:
            cut = rng.randint(1, len(log))
            ops.append(TruncateOp(cut))
            del log[cut - 1 :]
            term += 1  # Raft cuts only on a term conflict: what follows has a newer term
        elif roll < 0.3:
            term += 1
            ops.append(VoteOp(term, rng.choice(["n1", "n2", None])))
        else:
            start = len(log) + 1
            batch = tuple(
                Entry(start + i, term, f"{start + i}/{term}/{rng.random()}".encode())
                for i in range(rng.randint(1, 4))
            )
            ops.append(AppendOp(batch))
            log.extend(batch)
        states.append(list(log))
    return ops, states


def _min_cut(ops: list[StoreOp]) -> int | None:
    cuts = [
        op.index if isinstance(op, TruncateOp) else op.entries[0].index
        for op in ops
        if not isinstance(op, VoteOp)
    ]
    return min(cuts) if cuts else None


def _apply(log: list[Entry], ops: list[StoreOp]) -> list[Entry]:
    plan = plan_replay(
        ops,
        first_index=1,
        last_index=len(log),
        term_at=lambda index: log[index - 1].term,
        term=0,
        voted_for=None,
    )
    result = list(log)
    if plan.cut_from is not None:
        del result[plan.cut_from - 1 :]
    for entry in plan.appends:
        assert entry.index == len(result) + 1
        result.append(entry)
    return result


def test_replay_from_any_checkpoint_reaches_the_final_state_and_is_idempotent() -> None:
    rng = random.Random(22)
    for _ in range(3000):
        ops, states = _random_history(rng)
        start = rng.randint(0, len(ops))  # the journal holds ops[start:]
        reached = rng.randint(start, len(ops))  # the store's files reached states[reached]
        files = list(states[reached])
        cut = _min_cut(ops[start:])
        if cut is not None and rng.random() < 0.5 and len(files) >= cut:
            # An unsynced segment tail lost: only entries the journal rewrites may go.
            del files[rng.randint(cut - 1, len(files)) :]
        replayed = _apply(files, ops[start:])
        assert replayed == states[-1], (ops, start, reached)
        assert _apply(replayed, ops[start:]) == replayed  # idempotent


def test_replay_skips_entries_below_the_log_start_and_reports_a_gap() -> None:
    ops: list[StoreOp] = [
        AppendOp((Entry(5, 1, b"a"), Entry(6, 1, b"b"))),
        AppendOp((Entry(7, 2, b"c"),)),
    ]
    plan = plan_replay(
        ops, first_index=7, last_index=6, term_at=lambda i: 1, term=0, voted_for=None
    )
    assert plan.cut_from is None
    assert plan.appends == (Entry(7, 2, b"c"),)
    with pytest.raises(ReplayGap):
        plan_replay(
            [AppendOp((Entry(9, 1, b"x"),))],
            first_index=1,
            last_index=3,
            term_at=lambda i: 1,
            term=0,
            voted_for=None,
        )
    with pytest.raises(ReplayGap):
        plan_replay(
            [AppendOp((Entry(4, 1, b"x"),)), AppendOp((Entry(6, 1, b"y"),))],
            first_index=1,
            last_index=3,
            term_at=lambda i: 1,
            term=0,
            voted_for=None,
        )


def test_replay_applies_only_a_newer_vote() -> None:
    def vote(ops: list[StoreOp], term: int, voted_for: str | None) -> object:
        return plan_replay(
            ops, first_index=1, last_index=0, term_at=lambda i: 0, term=term, voted_for=voted_for
        ).vote

    assert vote([VoteOp(3, "n1"), VoteOp(4, None)], 2, "n2") == (4, None)
    assert vote([VoteOp(3, "n1")], 3, "n1") is None  # already in meta
    assert vote([VoteOp(3, "n1")], 5, None) is None  # meta is newer
    assert vote([VoteOp(3, "n1")], 3, None) == (3, "n1")  # the vote of the term is new


# ------------------------------------------------------------------ ledger


def test_ledger_frees_a_sealed_file_only_once_every_store_checkpointed_it() -> None:
    ledger = JournalLedger()
    ledger.on_file_created(1)
    ledger.on_written(1, store_id=7, op_seq=3)
    ledger.on_written(1, store_id=8, op_seq=1)
    assert ledger.deletable() == []  # the newest file is never deleted
    ledger.on_file_created(2)
    ledger.on_written(2, store_id=7, op_seq=4)
    assert ledger.deletable() == []
    assert ledger.stores_behind(1) == {7: 3, 8: 1}
    ledger.checkpointed(7, 3)
    assert ledger.stores_behind(1) == {8: 1}
    assert ledger.deletable() == []
    ledger.checkpointed(8, 1)
    assert ledger.deletable() == [1]
    ledger.on_deleted(1)
    assert ledger.oldest_sealed() is None
    assert ledger.stores_behind(2) == {7: 4}


# ------------------------------------------------------------------ format and scan


def _file(records: list[tuple[int, int, int, int, bytes]], *, synced: int = 0) -> bytes:
    out = bytearray(jr.encode_file_header(5))
    for rtype, store_id, a, b, body in records:
        jr.encode_record_into(out, rtype, store_id, min(synced, len(out)), a, b, body)
    return bytes(out)


RECORDS = [
    (jr.TYPE_ATTACH, 1, 0, 0, b"shards/1/journal"),
    (jr.TYPE_ENTRY, 1, 1, 1, b"hello"),
    (jr.TYPE_VOTE, 1, 2, 1, b"n2"),
    (jr.TYPE_TRUNCATE, 1, 1, 0, b""),
    (jr.TYPE_ENTRY, 1, 1, 2, b"again" * 200),
]


def test_whole_file_scans_back_every_record() -> None:
    data = _file(RECORDS)
    scan = jr.scan_file(data, 5, newest=False, payload_bytes_max=PAYLOAD_MAX)
    assert [(r.rtype, r.store_id, r.a, r.b, r.body) for r in scan.records] == RECORDS
    assert scan.end_bytes == len(data)
    assert scan.torn_reason is None


def test_a_torn_tail_of_the_newest_file_is_cut() -> None:
    data = _file(RECORDS)
    last = jr.scan_file(data, 5, newest=True, payload_bytes_max=PAYLOAD_MAX).records[-1]
    for cut in range(last.offset_bytes + 1, len(data)):
        scan = jr.scan_file(data[:cut], 5, newest=True, payload_bytes_max=PAYLOAD_MAX)
        assert scan.end_bytes == last.offset_bytes
        assert scan.torn_reason is not None
    zeroed = data[: last.offset_bytes] + bytes(len(data) - last.offset_bytes)
    scan = jr.scan_file(zeroed, 5, newest=True, payload_bytes_max=PAYLOAD_MAX)
    assert len(scan.records) == len(RECORDS) - 1


def test_damage_before_the_tail_or_in_a_sealed_file_is_corruption() -> None:
    data = bytearray(_file(RECORDS))
    second = jr.scan_file(bytes(data), 5, newest=True, payload_bytes_max=PAYLOAD_MAX).records[1]
    data[second.offset_bytes + jr.RECORD_HEADER_BYTES] ^= 1  # a bit of "hello"
    with pytest.raises(jr.ScanCorruption) as caught:
        jr.scan_file(bytes(data), 5, newest=True, payload_bytes_max=PAYLOAD_MAX)
    assert caught.value.offset_bytes == second.offset_bytes
    whole = _file(RECORDS)
    with pytest.raises(jr.ScanCorruption):
        jr.scan_file(whole[:-3], 5, newest=False, payload_bytes_max=PAYLOAD_MAX)
    with pytest.raises(jr.ScanCorruption):
        jr.scan_file(whole, 6, newest=False, payload_bytes_max=PAYLOAD_MAX)  # misnamed


def test_a_later_record_whose_hint_covers_the_bad_bytes_makes_it_corruption() -> None:
    header = bytearray(jr.encode_file_header(5))
    first_offset = len(header)
    jr.encode_record_into(header, jr.TYPE_ATTACH, 1, 0, 0, 0, b"s")
    damaged_at = len(header)
    jr.encode_record_into(header, jr.TYPE_ENTRY, 1, 0, 1, 1, b"x" * 1200)
    # A sector of zeros, as unsynced pages would leave, but the next record says the bytes
    # up to past the damaged one were synced: so they were not unsynced.
    jr.encode_record_into(header, jr.TYPE_ENTRY, 1, len(header), 2, 1, b"y")
    data = bytearray(header)
    data[damaged_at : damaged_at + 1200] = bytes(1200)
    with pytest.raises(jr.ScanCorruption):
        jr.scan_file(bytes(data), 5, newest=True, payload_bytes_max=PAYLOAD_MAX)
    # The same zeroed span with a hint that does not reach it: unsynced pages, cut.
    data2 = bytearray(jr.encode_file_header(5))
    jr.encode_record_into(data2, jr.TYPE_ATTACH, 1, 0, 0, 0, b"s")
    jr.encode_record_into(data2, jr.TYPE_ENTRY, 1, first_offset, 1, 1, b"x" * 1200)
    jr.encode_record_into(data2, jr.TYPE_ENTRY, 1, first_offset, 2, 1, b"y")
    data2[damaged_at : damaged_at + 1200] = bytes(1200)
    scan = jr.scan_file(bytes(data2), 5, newest=True, payload_bytes_max=PAYLOAD_MAX)
    assert scan.end_bytes == damaged_at
    assert scan.torn_reason is not None


def test_a_torn_header_of_the_newest_file_is_reported_as_torn() -> None:
    header = jr.encode_file_header(5)
    with pytest.raises(jr.TornHeader):
        jr.scan_file(header[:10], 5, newest=True, payload_bytes_max=PAYLOAD_MAX)
    with pytest.raises(jr.ScanCorruption):
        jr.scan_file(header[:10], 5, newest=False, payload_bytes_max=PAYLOAD_MAX)
