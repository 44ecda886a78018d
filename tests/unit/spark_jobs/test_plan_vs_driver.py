"""spark_jobs' replay plan (`replay.plan_replay`, over sets) and tae_driver's replayer
(`tae_driver.replay.Replayer`, record by record) state the same rules twice. On random logs -
records out of DSN order within a window, safe DSNs as the driver publishes them, records lost
in a crash or (durable ones, with all their copies) afterwards, identical duplicate copies,
copies with other bytes, restarts as the driver makes them (a skip record naming the trailing
copies, then new records reusing their DSNs) - both read the same DSNs from the same LSNs, or
both refuse: a hole below a safe DSN (`LogHole` / `ReplayHoleError`) or two different copies
of DSNs (`CopiesDisagree` / `ReplayOverlapError`). Records after a gap above every safe DSN are
trailing for both.

One difference, asserted as such: a log whose first DSNs are lost is refused by the plan (no
checkpoint here), while the driver leaves it all out as trailing (no safe DSN covers the loss)
or skips the lost prefix as truncated (a safe DSN does: its engine's checkpoint must cover it).
Not generated: truncated prefixes and logs not starting at DSN 1 (the same reason). A
durable record whose first copy is lost while a later copy survives at a higher LSN than a
record whose safe DSN covers it is a hole for both (the log lost what it said was durable).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.errors import CopiesDisagree, LogHole, ReplayRefused
from spark_jobs.replay import DriverRecord, plan_replay
from tae_driver.backend import Record
from tae_driver.errors import ReplayHoleError, ReplayOverlapError
from tae_driver.record import encode_record, encode_skip, payload_checksum
from tae_driver.replay import Apply, Finished, ReplayDecision, Replayer, Wait


def _log(rng: random.Random) -> list[bytes]:
    """Driver records in LSN order, as a driver with a window of a few records writes them."""
    ranges = []
    dsn = 1
    for _ in range(rng.randrange(1, 14)):
        count = rng.randrange(1, 4)
        ranges.append((dsn, count))
        dsn += count
    # LSN order: DSN order with neighbours swapped (the window), then losses and copies.
    order = list(range(len(ranges)))
    for i in range(len(order) - 1):
        if rng.random() < 0.3:
            order[i], order[i + 1] = order[i + 1], order[i]
    written: list[tuple[int, int]] = []  # (start, count) in LSN order
    for index in order:
        if rng.random() < 0.12:
            continue  # lost in a crash (never durable)
        written.append(ranges[index])
    payloads = []
    late: list[bytes] = []
    durable: set[int] = set()
    for start, count in written:
        contiguous = 0
        while contiguous + 1 in durable:
            contiguous += 1
        # Truthful, as the driver publishes it: every DSN <= safe is durable at a lower LSN.
        safe = (
            min(contiguous, start - 1) if rng.random() < 0.8 else rng.randrange(0, contiguous + 1)
        )
        entries = [f"e{d}".encode() for d in range(start, start + count)]
        payloads.append(encode_record(start, safe, entries))
        durable.update(range(start, start + count))
        roll = rng.random()
        if roll < 0.12:  # an identical copy (a retried append)
            payloads.append(payloads[-1])
        elif roll < 0.16:  # a copy with other bytes
            payloads.append(encode_record(start, safe, [b"x" + e for e in entries]))
        elif roll < 0.22:  # an identical copy written later (a retry after other appends)
            late.append(payloads[-1])
        if late and rng.random() < 0.3:
            payloads.append(late.pop(0))
    payloads.extend(late)
    if payloads and rng.random() < 0.25:
        lost = payloads[rng.randrange(len(payloads))]
        if rng.random() < 0.5:
            # A durable record lost afterwards with all its copies (damage, a bad copy of
            # the log): a later safe DSN may prove it was acknowledged.
            payloads = [p for p in payloads if p[24:32] != lost[24:32]]
        else:
            # Only its first copy lost: a copy may survive at a higher LSN than a record
            # whose safe DSN covers it. Both call that a hole (the log lost a record it
            # said was durable), though the bytes survive elsewhere.
            payloads.remove(lost)
    if rng.random() < 0.4:
        # A restart after a crash, as the driver does it: its replay's skip record names
        # every copy of the trailing records, then the new writer reuses their DSNs.
        restart = _restart(payloads)
        if restart is not None:
            last_dsn, pairs = restart
            if pairs:
                payloads.append(encode_skip(pairs))
            for start in range(last_dsn + 1, last_dsn + 1 + rng.randrange(1, 4)):
                payloads.append(encode_record(start, last_dsn, [f"new{start}".encode()]))
    return payloads


def _restart(payloads: list[bytes]) -> tuple[int, tuple[tuple[int, int], ...]] | None:
    """What a for-write replay of `payloads` leaves: the last DSN and the skip pairs (None: the
    replay fails, so no writer restarts on this log)."""
    replayer = Replayer(truncated_lsn=0)
    finished = None
    try:
        for lsn, payload in enumerate(payloads, start=1):
            replayer.offer(Record(lsn, payload))
            while isinstance(step := replayer.step(at_end=False), Apply):
                replayer.decided([ReplayDecision.APPLY] * len(step.entries))
        while not isinstance(step := replayer.step(at_end=True), Finished):
            assert isinstance(step, Apply)
            replayer.decided([ReplayDecision.APPLY] * len(step.entries))
        finished = step
    except (ReplayHoleError, ReplayOverlapError):
        return None
    return replayer.last_dsn, finished.skip_pairs


def _driver(payloads: list[bytes]) -> tuple[str, dict[int, int], int]:
    """The outcome, the LSN each DSN was applied from, and the highest DSN the driver skipped
    as a truncated prefix (one its engine's checkpoint would have to cover)."""
    replayer = Replayer(truncated_lsn=0)
    applied: dict[int, int] = {}

    def drain(at_end: bool) -> None:
        while True:
            step = replayer.step(at_end=at_end)
            if isinstance(step, Apply):
                for index in range(len(step.entries)):
                    applied[step.start_dsn + index] = step.lsn
                replayer.decided([ReplayDecision.APPLY] * len(step.entries))
            elif isinstance(step, Wait | Finished):
                return

    try:
        for lsn, payload in enumerate(payloads, start=1):
            replayer.offer(Record(lsn, payload))
            drain(at_end=False)
        drain(at_end=True)
    except ReplayHoleError:
        return "hole", {}, replayer.skipped_dsn_max
    except ReplayOverlapError:
        return "overlap", {}, replayer.skipped_dsn_max
    return "ok", applied, replayer.skipped_dsn_max


def _plan(payloads: list[bytes]) -> tuple[str, dict[int, int]]:
    from tae_driver.record import EntriesRecord, decode

    records = []
    skips: list[tuple[int, int]] = []
    for lsn, payload in enumerate(payloads, start=1):
        decoded = decode(payload)
        if isinstance(decoded, EntriesRecord):
            checksum = payload_checksum(payload)
            records.append(
                DriverRecord(lsn, decoded.start_dsn, decoded.count, decoded.safe_dsn, checksum)
            )
        else:
            skips.extend(decoded.pairs)
    try:
        plan = plan_replay(records, skips, 0, "test")
    except LogHole:
        return "hole", {}
    except CopiesDisagree:
        return "overlap", {}
    except ReplayRefused:
        return "refused", {}
    applied = {}
    for record in records:
        if record.lsn in plan.kept_lsns:
            for dsn in range(record.start_dsn, record.start_dsn + record.count):
                applied[dsn] = record.lsn
    assert set(applied) == set(range(plan.first_dsn, plan.last_dsn + 1)) or not applied
    return "ok", applied


@settings(max_examples=400, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_plan_reads_what_the_driver_replays(rng: random.Random) -> None:
    payloads = _log(rng)
    planned = _plan(payloads)
    outcome, applied, skipped_prefix = _driver(payloads)
    if planned[0] == "refused":
        # The log lost its first DSNs. The driver either leaves every record out as trailing
        # (no safe DSN covers the loss) or skips the missing prefix as truncated (one does:
        # its engine's checkpoint must cover it); the plan, without a checkpoint, refuses.
        assert (outcome, applied) == ("ok", {}) or skipped_prefix >= 1
    elif planned[0] != "ok" and outcome != "ok":
        # Both refuse. With a hole and two different copies in one log, which is met first
        # depends on the order of reading (all records at once, or LSN by LSN).
        assert {planned[0], outcome} <= {"hole", "overlap"}
    else:
        assert planned == (outcome, applied)
        assert skipped_prefix == 0
