"""The demo's ledger check (engine/tn/demo.py `check_ledger`): acknowledged keys against the
keys read back, each kind of discrepancy counted apart. Pure, no processes."""

from __future__ import annotations

from engine.tn.demo import LedgerCheck, check_ledger


def test_every_acknowledged_key_read_back_once_is_clean() -> None:
    checked = check_ledger([1, 2, 3], [3, 1, 2])
    assert checked == LedgerCheck(acked=3, present=3, duplicated=0, unacknowledged=0)
    assert checked.lost == 0
    assert checked.line() == (
        "3 of 3 acknowledged commits present, 0 lost, 0 duplicated, "
        "0 present but never acknowledged"
    )


def test_lost_duplicated_and_unacknowledged_keys_are_counted_apart() -> None:
    checked = check_ledger([1, 2, 3, 4], [1, 1, 2, 9])
    assert checked == LedgerCheck(acked=4, present=2, duplicated=1, unacknowledged=1)
    assert checked.lost == 2
