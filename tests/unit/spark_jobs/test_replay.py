"""replay_as_of on the local engine equals what the engine itself scans, and its plan follows
the driver's replay rules (the storage cases, checkpoints and block commands, are in
test_checkpoint_replay.py).

* A real engine's file WAL (tables over two blocks, updates, deletes, a table dropped and
  created again, a database created and dropped): at 0, at every commit_ts and one past
  each, every live table replayed from the WAL alone equals `Engine.snapshot(ts)`'s scan,
  row for row and in order, and no other table is produced.
* The plan, on hand-made driver records: duplicate copies are replayed once; a copy named by
  a skip record is dropped and the other kept; two different copies without a skip record
  fail (`CopiesDisagree`); records after a gap above every safe DSN are trailing and left
  out; a gap under a safe DSN is `LogHole`; a truncated WAL or a log that does not start at
  DSN 1 is refused when no checkpoint covers what is gone (`ReplayRefused`); a repeated
  transaction (commit_ts not above an earlier one) is ignored as the engine ignores it.
* An Origin command (a compute node's request id) is read at the command level and changes
  no row.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import SyncEngine
from spark_jobs import entries as entries_module
from spark_jobs import local, local_replay, plan_inputs, replay, walread
from spark_jobs.errors import CopiesDisagree, LogHole, ReplayRefused
from spark_jobs.filters import Range
from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from spark_jobs.plan_stream import PlanStream
from spark_jobs.records import driver_records
from spark_jobs.run import run_job
from spark_jobs.walread import ReadOptions
from tae_driver.record import EntriesRecord
from tae_driver.record import decode as decode_record
from tests.unit.spark_jobs.logs import (
    ITEMS,
    History,
    anomalies_log,
    append_entry,
    bound_replay_memory,
    create_db_entry,
    create_table_entry,
    delete_entry,
    encode_record,
    encode_skip,
    engine_history,
    in_memory,
    kv_entries,
    records_of,
    snapshot_scans,
    write_file_wal,
)


def replayed(wal: str, as_of: int) -> dict[str, list[dict[str, Any]]]:
    result = local.run(JobParams("replay_as_of", file_input(wal), as_of=as_of))
    return {
        name.split("/", 1)[1].replace("/", "."): in_memory(table).to_pylist()
        for name, table in result.tables.items()
    }


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return engine_history(str(tmp_path_factory.mktemp("engine")))


def test_replay_equals_the_engine_at_every_timestamp(history: History) -> None:
    assert len(history.scans) >= 20
    for ts, scans in history.scans.items():
        got = replayed(history.path, ts)
        assert sorted(got) == sorted(scans), ts
        for name, rows in scans.items():
            assert got[name] == rows, (ts, name)
    final = history.scans[history.timestamps[-1]]
    assert set(final) == {"shop.orders", "shop.items"}
    assert len(final["shop.orders"]) == 9000 + 7 - 4 - 1
    assert final["shop.items"] == [{"sku": "b", "price": 2.0}]


def test_packed_appends_replay_the_same_rows(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local engine packs a table's append batches as it reads (bounded memory for logs
    of millions of small transactions): packing every 3 batches changes no row."""
    monkeypatch.setattr(local_replay, "BATCHES_PACKED_AT", 3)
    for ts in [*history.timestamps[:: max(1, len(history.timestamps) // 6)], 2**62]:
        expected = history.scans.get(ts)
        got = replayed(history.path, ts)
        if expected is not None:
            assert got == {name: rows for name, rows in expected.items()}, ts
    monkeypatch.undo()
    assert replayed(history.path, 2**62) == got


def test_a_timestamp_past_the_log_gives_the_last_state(history: History) -> None:
    result = local.run(JobParams("replay_as_of", file_input(history.path), as_of=2**62))
    assert result.summary["as_of_after_newest_commit"] is True
    assert any("after the newest commit" in line for line in result.lines)
    [log] = result.summary["logs"]
    assert log["last_dsn"] == len(history.timestamps)
    assert log["tables"] == {"shop.items": 1, "shop.orders": 9002}


def test_a_clean_log_is_read_once(history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log whose plan keeps every record is replayed in one read (the plan's records are
    gathered as the entries are replayed): the audit level is never asked for, and every
    timestamp still equals the engine's scan."""

    def no_second_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("the log was read twice")

    monkeypatch.setattr(local_replay, "read_level", no_second_read)
    for ts in [*history.timestamps[:: max(1, len(history.timestamps) // 5)], 2**62]:
        expected = history.scans.get(ts)
        got = replayed(history.path, ts)
        if expected is not None:
            assert got == expected, ts


def one_pass_taken(wal: str) -> bool:
    params = JobParams("replay_as_of", file_input(wal), as_of=2**62)
    options = ReadOptions("command", bounds=params.bounds())
    taken = local_replay._replay_one_pass(params, options, 2**62, "wal", replay.EMPTY_BASE)
    return taken is not None


def kv_rows(wal: str, as_of: int = 2**62) -> list[int]:
    return [row["k"] for row in replayed(wal, as_of).get("db.kv", [])]


def _rewritten_log(wal: str) -> None:
    """A duplicate copy, and a stale first copy of DSN 3 discarded by a skip record and
    written again with other bytes (a next writer's repair)."""
    entries = kv_entries(5)
    other = kv_entries(6, ts0=5000)[3]
    write_file_wal(
        wal,
        [
            encode_record(1, 0, entries[0:2]),
            encode_record(1, 0, entries[0:2]),
            encode_record(3, 2, [other]),  # LSN 3: a stale copy of DSN 3 ...
            encode_skip([(3, 3)]),  # ... discarded by the next writer's skip record
            encode_record(3, 2, entries[2:3]),
            encode_record(4, 3, entries[3:5]),
        ],
    )


def test_duplicates_are_replayed_once_and_skips_drop_their_copy(tmp_path: Path) -> None:
    wal = str(tmp_path / "wal")
    _rewritten_log(wal)
    assert kv_rows(wal) == [0, 1, 2]
    assert kv_rows(wal, as_of=1025) == [0]  # commit_ts 1020 is DSN 3, 1030 DSN 4
    assert not one_pass_taken(wal)  # copies the plan drops: read as the plan says
    plan = plan_inputs.plan_from_records(
        walread.read_level(JobParams("x", file_input(wal)), ReadOptions("audit")), "wal"
    )
    kept = {lsn for lsn in (1, 2, 3, 5, 6) if lsn in plan.kept_lsns}  # the entry records
    assert (kept, set(plan.duplicate_lsns), set(plan.skipped_lsns)) == ({1, 5, 6}, {2}, {3})
    assert plan.last_dsn == 5


def test_a_log_planned_record_by_record_is_refused_past_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log the streamed plan does not take (trailing records after a DSN gap) is planned
    record by record, holding every record: past REPLAY_PLAN_RECORDS_MAX the replay is
    refused, naming the limit (issue 23: a worker's memory), where a clean log of the same
    size, or one with a crashed driver's copies, is planned as it streams by."""
    entries = kv_entries(7)
    trailing, clean = str(tmp_path / "trailing"), str(tmp_path / "clean")
    copied = str(tmp_path / "copied")
    write_file_wal(trailing, [*records_of(entries[:4]), encode_record(6, 4, entries[5:7])])
    write_file_wal(clean, records_of(entries[:5]))
    write_file_wal(copied, [*records_of(entries[:3]), *records_of(entries[2:5], first_dsn=3)])
    assert kv_rows(trailing) == [0, 1]  # DSNs 6-7 left out
    assert kv_rows(clean) == kv_rows(copied) == [0, 1, 2]
    monkeypatch.setattr(plan_inputs, "REPLAY_PLAN_RECORDS_MAX", 4)
    with pytest.raises(ReplayRefused, match=r"REPLAY_PLAN_RECORDS_MAX \(4\)"):
        kv_rows(trailing)
    assert kv_rows(clean) == [0, 1, 2]  # five records, streamed
    assert kv_rows(copied) == [0, 1, 2]  # six records, one a copy: streamed


def test_a_log_one_read_cannot_replay_is_planned_from_its_records_streamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A skipped first copy rewritten with other bytes (`_rewritten_log`): one read cannot
    replay it (the first copy met is not the one replayed), so the log is read twice, its
    plan streamed from a read of its records alone, none held: past REPLAY_PLAN_RECORDS_MAX
    (4 here; the log has 6 records) it is answered, and the audit level is never read whole.
    On the old code: `ReplayRefused`."""
    wal = str(tmp_path / "wal")
    _rewritten_log(wal)
    assert not one_pass_taken(wal)
    monkeypatch.setattr(plan_inputs, "REPLAY_PLAN_RECORDS_MAX", 4)

    def not_whole(*args: object, **kwargs: object) -> None:
        raise AssertionError("the audit level was read whole")

    monkeypatch.setattr(local_replay, "read_level", not_whole)
    assert kv_rows(wal) == [0, 1, 2]
    assert kv_rows(wal, as_of=1025) == [0]


def _crashed_engine_wal(tmp_path: Path) -> tuple[str, int]:
    """A real engine's directory whose WAL holds what a crashed driver leaves near its tail:
    records re-appended with their DSNs and bytes at higher LSNs, one of those copies
    discarded by a skip record (the engine wrote 30 one-row transactions; its records are
    appended again through the file backend with the copies among them). Returns the
    directory and the engine's newest commit_ts."""
    source = tmp_path / "source"
    eng = SyncEngine.open(str(source), maintenance=False)
    try:
        with eng.transaction() as txn:
            txn.create_database("shop")
            txn.create_table("shop", "items", ITEMS)
        for i in range(30):
            with eng.transaction() as txn:
                txn.table("shop", "items").insert([{"sku": f"s{i}", "price": float(i)}])
    finally:
        eng.close()
    [unit] = JobParams("x", file_input(str(source))).units()
    payloads = [_payload(found.rec.payload) for found in driver_records(unit, "true", Range())]
    assert len(payloads) >= 31
    head, tail = payloads[:-4], payloads[-4:]
    log = [
        *head,
        payloads[-6],  # DSNs of the 6th-last record again, the same bytes
        tail[0],
        tail[1],
        payloads[-5],  # and of the 5th-last ...
        tail[2],
        tail[3],
    ]
    copy_lsn = len(head) + 4  # ... at this LSN (the file backend's LSNs run 1, 2, ...)
    log.append(encode_skip([(_start_dsn(payloads[-5]), copy_lsn)]))  # ... discarded
    crashed = tmp_path / "crashed"
    shutil.copytree(source, crashed, ignore=shutil.ignore_patterns("wal"))
    write_file_wal(str(crashed / "wal"), log)
    eng = SyncEngine.open(str(crashed), read_only=True, maintenance=False)
    try:
        newest = eng.visible_ts
    finally:
        eng.close()
    return str(crashed), newest


def _payload(payload: bytes | None) -> bytes:
    assert payload is not None
    return payload


def _start_dsn(payload: bytes) -> int:
    decoded = decode_record(payload)
    assert isinstance(decoded, EntriesRecord)
    return decoded.start_dsn


def test_a_crashed_log_past_the_record_limit_is_streamed_in_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23's gap: the copies a crashed driver leaves (`_crashed_engine_wal`) made a log
    be planned record by record, refused past REPLAY_PLAN_RECORDS_MAX. Now it is streamed:
    past a limit of 8 records, in one read of the log, the replay at several timestamps
    equals what the engine itself scans after opening that WAL (the driver's own replay).
    On the old code: `ReplayRefused`, naming the limit."""
    crashed, newest = _crashed_engine_wal(tmp_path)
    eng = SyncEngine.open(crashed, read_only=True, maintenance=False)
    try:
        scans = {ts: snapshot_scans(eng, ts) for ts in (newest - 3, newest - 1, newest)}
    finally:
        eng.close()
    assert len(scans[newest]["shop.items"]) == 30
    monkeypatch.setattr(plan_inputs, "REPLAY_PLAN_RECORDS_MAX", 8)
    for ts, expected in scans.items():
        assert replayed(crashed, ts) == expected, ts

    def no_second_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("the log was read twice")

    monkeypatch.setattr(local_replay, "read_level", no_second_read)
    assert replayed(crashed, newest) == scans[newest]
    result = local.run(JobParams("replay_as_of", file_input(crashed), as_of=newest))
    [summary] = result.summary["logs"]
    assert summary["duplicate_copies_ignored"] == 1
    assert summary["records_skipped_by_skip_records"] == 1
    assert summary["entries_replayed"] == 31


def test_a_log_out_of_dsn_order_is_refused_past_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries read out of DSN order are held until the log is read, then sorted: past
    REPLAY_UNSORTED_ENTRIES_MAX held the replay is refused, naming the limit."""
    entries = kv_entries(5)
    wal = str(tmp_path / "wal")
    write_file_wal(
        wal,
        [
            encode_record(1, 0, entries[0:2]),
            encode_record(4, 0, entries[3:4]),  # DSN 4 before DSN 3
            encode_record(3, 0, entries[2:3]),
            encode_record(5, 0, entries[4:5]),
        ],
    )
    assert kv_rows(wal) == [0, 1, 2]
    monkeypatch.setattr(local_replay, "REPLAY_UNSORTED_ENTRIES_MAX", 3)
    with pytest.raises(ReplayRefused, match=r"REPLAY_UNSORTED_ENTRIES_MAX \(3\)"):
        kv_rows(wal)


def test_conflicting_copies_fail(tmp_path: Path) -> None:
    entries = kv_entries(4)
    other = kv_entries(5, ts0=5000)[3]
    wal = str(tmp_path / "wal")
    write_file_wal(wal, [*records_of(entries), encode_record(4, 3, [other])])
    with pytest.raises(CopiesDisagree, match="DSNs 4-4 have two different copies"):
        kv_rows(wal)


def test_trailing_records_are_left_out_and_holes_fail(tmp_path: Path) -> None:
    entries = kv_entries(7)
    trailing = str(tmp_path / "trailing")
    # DSN 5 lost; the records after it vouch only for DSNs up to 4: a crashed writer's tail.
    write_file_wal(trailing, [*records_of(entries[:4]), encode_record(6, 4, entries[5:7])])
    assert kv_rows(trailing) == [0, 1]
    assert not one_pass_taken(trailing)  # the trailing DSNs 6-7 were replayed, then dropped
    clean = str(tmp_path / "clean")
    write_file_wal(clean, records_of(entries))
    assert one_pass_taken(clean)
    assert kv_rows(clean) == [0, 1, 2, 3, 4]
    hole = str(tmp_path / "hole")
    # The same gap, but a later record says DSN 5 was durable: acknowledged data is lost.
    write_file_wal(hole, [*records_of(entries[:4]), encode_record(6, 5, entries[5:7])])
    with pytest.raises(LogHole, match="DSN 5 is missing"):
        kv_rows(hole)


def test_truncated_logs_are_refused(tmp_path: Path) -> None:
    entries = kv_entries(5)
    truncated = str(tmp_path / "truncated")
    write_file_wal(truncated, records_of(entries), truncate_lsn=2)
    with pytest.raises(ReplayRefused, match="truncated up to LSN 2"):
        kv_rows(truncated)
    headless = str(tmp_path / "headless")
    write_file_wal(headless, records_of(entries[2:], first_dsn=3))
    with pytest.raises(ReplayRefused, match="starts at DSN 3"):
        kv_rows(headless)


def test_plan_rules_on_values() -> None:
    records = [
        replay.DriverRecord(1, 1, 2, 0, 11),
        replay.DriverRecord(2, 3, 1, 2, 12),
        replay.DriverRecord(3, 5, 0, 4, 13),  # a safe marker: DSNs up to 4 durable
        replay.DriverRecord(4, 3, 1, 2, 12),  # a copy of LSN 2
    ]
    plan = replay.plan_replay(records, [], 0, "log")
    assert (set(plan.kept_lsns), set(plan.duplicate_lsns), plan.last_dsn, plan.safe_dsn) == (
        {1, 2}, {4}, 3, 4,
    )  # fmt: skip
    overlapping = [replay.DriverRecord(1, 1, 2, 0, 11), replay.DriverRecord(2, 2, 2, 0, 12)]
    with pytest.raises(CopiesDisagree, match="overlap"):
        replay.plan_replay(overlapping, [], 0, "log")
    assert replay.repeated_dsns([(1, 10), (2, 20), (3, 15), (4, 30)]) == {3}
    # DSN 2's only copy is after a record vouching that it was durable before: its first
    # copy was lost, as the driver (reading in LSN order) finds at LSN 2.
    late_copy = [
        replay.DriverRecord(1, 1, 1, 0, 11),
        replay.DriverRecord(2, 3, 1, 2, 13),
        replay.DriverRecord(3, 2, 1, 1, 12),
    ]
    with pytest.raises(LogHole, match="DSN 2 is missing below LSN 2"):
        replay.plan_replay(late_copy, [], 0, "log")
    # The same for the log's first DSN: the driver skips it as a truncated prefix.
    first_late = [replay.DriverRecord(1, 2, 1, 1, 12), replay.DriverRecord(2, 1, 1, 0, 11)]
    with pytest.raises(ReplayRefused, match="DSN 1 is missing below LSN 1"):
        replay.plan_replay(first_late, [], 0, "log")


def test_an_origin_command_is_read_and_changes_no_row(tmp_path: Path) -> None:
    """A compute node's commit carries an Origin command (who asked, issue 15): the command
    level shows it; replay applies the rest of its entry and nothing for it."""
    from engine.wal.codec import decode_entry, encode_entry
    from engine.wal.entry import Origin, TxnEntry, memo_of

    entries = kv_entries(4)
    last = decode_entry(entries[-1], 4)
    assert isinstance(last, TxnEntry)
    commands = (*last.commands, Origin("cn-1", 7))
    entries[-1] = encode_entry(TxnEntry(last.start_ts, last.commit_ts, memo_of(commands), commands))
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records_of(entries))
    assert kv_rows(wal) == [0, 1]
    rows = walread.read_level(JobParams("x", file_input(wal)), ReadOptions("command")).to_pylist()
    [origin] = [r for r in rows if r["cmd_kind"] == "origin"]
    assert (origin["name"], origin["origin_seq"], origin["dsn"]) == ("cn-1", 7, 4)


def test_the_plan_reads_a_record_as_the_audit_level_does(tmp_path: Path) -> None:
    """The streaming plan shown the driver records as a reader passes them (one-read
    replay) ends in the state it reaches from the audit level's rows (two-read replay), on
    a log with every kind of record: entries, duplicates, a conflicting copy, a skip record,
    a marker, a truncation. Both go through records.record_fields."""
    wal = str(tmp_path / "wal")
    anomalies_log(wal)
    unit_params = JobParams("x", file_input(wal))
    audit = walread.read_level(unit_params, ReadOptions("audit"))
    from_rows = plan_inputs._stream_table(audit.select(plan_inputs.PLAN_COLUMNS), replay.EMPTY_BASE)
    from_records = plan_inputs.StreamInput(0)
    for unit in unit_params.units():
        for found in driver_records(unit, "true", Range()):
            from_records.add_record(found)
    assert from_rows.truncated_lsn > 0 and from_rows.skip_pairs and from_rows.records > 5
    assert from_rows.cannot_plan()  # a part-copy, a gap: this log is planned record by record
    assert from_records.stream.state() == from_rows.state()
    assert isinstance(from_rows, PlanStream)


def test_a_replay_in_bounded_memory_equals_the_unbounded_one(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: a worker's memory bounded whatever the log's size. Under a small bound a
    real engine's tables (updates, deletes, a table dropped and created again) are spilled
    as sorted runs and merged (spark_jobs/spill.py): the same rows in the same order."""
    timestamps = [*history.timestamps[:: max(1, len(history.timestamps) // 6)], 2**62]
    unbounded = {ts: replayed(history.path, ts) for ts in timestamps}
    bound_replay_memory(monkeypatch, 4 << 10)
    for ts in timestamps:
        assert replayed(history.path, ts) == unbounded[ts], ts
        expected = history.scans.get(ts)
        if expected is not None:
            assert unbounded[ts] == expected, ts
    result = local.run(JobParams("replay_as_of", file_input(history.path), as_of=2**62))
    assert result.summary["logs"][0]["rows_spilled_runs"] >= 2


def test_many_small_transactions_are_held_near_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 one-row appends to each of two tables (two databases) and a delete of three rows
    after every tenth, read 64 entries at a time: under a 2 KiB bound, rows and deleted keys
    are spilled in many runs (merged three at a time, in rounds), the Parquet outputs equal
    the unbounded replay's and the model, and what was held at once stayed within the bound
    plus one chunk's rows (the old replay held every row of a table until the end:
    `rows_held_bytes_peak` did not exist)."""
    entries = [*kv_entries(2), create_db_entry(1100, 1101, 3, "db2")]
    entries.append(create_table_entry(1101, 1102, 3, 4))
    ts = 2000
    for i in range(3000):
        for db_id, table_id in ((1, 2), (3, 4)):
            ts += 10
            entries.append(append_entry(ts - 5, ts, db_id, table_id, i, [i]))
        if i % 10 == 9:
            ts += 10
            entries.append(delete_entry(ts - 5, ts, 1, 2, [i - 9, i - 6, i - 3]))
    deleted = {i - d for i in range(9, 3000, 10) for d in (9, 6, 3)}
    expected = {"db/kv": [i for i in range(3000) if i not in deleted], "db2/kv": list(range(3000))}
    wal = str(tmp_path / "wal")
    write_file_wal(wal, records_of(entries, per_record=50))
    monkeypatch.setattr(entries_module, "CHUNK_ENTRIES_MAX", 64)

    def outputs(run_id: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        params = JobParams("replay_as_of", file_input(wal), as_of=2**62)
        done = run_job(params, engine="local", out=str(tmp_path / "out"), run_id=run_id)
        tables = {
            name.split("/", 1)[1]: pq.read_table(os.path.join(done.run_dir, name)).to_pylist()
            for name in done.manifest["outputs"]
        }
        return done.manifest["summary"]["logs"][0], tables

    _, unbounded = outputs("unbounded")
    assert {name: [row["k"] for row in rows] for name, rows in unbounded.items()} == expected
    held = 2 << 10
    bound_replay_memory(monkeypatch, held)
    log, bounded = outputs("bounded")
    assert bounded == unbounded
    assert log["rows_spilled_runs"] >= 20
    assert sum(pa.Table.from_pylist(rows).nbytes for rows in bounded.values()) > 20 * held
    assert log["rows_held_bytes_peak"] <= 2 * held


def test_each_log_is_written_before_the_next_is_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local engine holds one log's rows at a time: a run writes each log's tables
    once that log is replayed (the old code held every log's until the end), and they are
    the tables of a run that keeps them in memory."""
    wals = []
    for shard in range(3):
        wal = str(tmp_path / f"wal{shard}")
        write_file_wal(wal, records_of(kv_entries(40 + 10 * shard), per_record=7))
        wals.append(wal)
    params = JobParams("replay_as_of", file_input(*wals), as_of=2**62)
    out = tmp_path / "out"
    on_disk_before: list[list[str]] = []
    real = local_replay.replay_log

    def replay_log(params: JobParams, replica: str, shard: int) -> Any:
        on_disk_before.append(sorted(p.parts[-4] for p in out.rglob("*.parquet")))
        return real(params, replica, shard)

    monkeypatch.setattr(local_replay, "replay_log", replay_log)
    done = run_job(params, engine="local", out=str(out), run_id="run")
    assert on_disk_before == [[], ["shard-0"], ["shard-0", "shard-1"]]
    kept = local.run(params).tables
    assert set(done.manifest["outputs"]) == set(kept)
    for name, table in kept.items():
        assert done.manifest["outputs"][name]["rows"] == table.num_rows
        assert pq.read_table(os.path.join(done.run_dir, name)).equals(table)
