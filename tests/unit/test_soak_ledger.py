"""The soak's ledger (tests/soak/ledger.py), driven through its public inputs: every anomaly
it must count (lost, duplicated, torn, phantom) appears in exactly one case, and what must
not count (in-doubt transactions either way, commits racing the read) does not."""

from __future__ import annotations

import numpy as np

from tests.soak.ledger import Chunk, Ledger


def rows(state: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(list(state), dtype=np.int64), np.array(list(state.values()), dtype=np.int64)


def test_acknowledged_writes_read_back_as_acknowledged_count_nothing() -> None:
    ledger = Ledger()
    ledger.begin("w/1", "w", {1: 10, 2: 10}, [Chunk(100, 103, 10)])
    ledger.ack("w/1")
    ledger.begin("w/2", "w", {1: 20, 2: None}, [])
    ledger.ack("w/2")
    result = ledger.check(ledger.mark(), *rows({1: 20, 100: 10, 101: 10, 102: 10}))
    assert (result.lost, result.duplicated, result.partial, result.phantom) == (0, 0, 0, 0)
    assert (result.keys_checked, result.chunks_checked) == (2, 1)


def test_a_missing_or_wrong_acknowledged_write_is_lost() -> None:
    ledger = Ledger()
    ledger.begin("w/1", "w", {1: 10, 2: 10, 3: 10}, [])
    ledger.ack("w/1")
    ledger.begin("w/2", "w", {3: None}, [])
    ledger.ack("w/2")
    result = ledger.check(ledger.mark(), *rows({1: 10, 2: 9, 3: 10}))
    assert result.lost == 2  # 2 has an old value, 3 was deleted and is back


def test_a_chunk_with_one_row_missing_is_lost_whole() -> None:
    ledger = Ledger()
    ledger.begin("w/1", "w", {}, [Chunk(100, 104, 7)])
    ledger.ack("w/1")
    result = ledger.check(ledger.mark(), *rows({100: 7, 101: 7, 103: 7}))
    assert result.lost == 4


def test_a_key_read_twice_is_duplicated_and_an_unknown_key_a_phantom() -> None:
    ledger = Ledger()
    ledger.begin("w/1", "w", {1: 10}, [])
    ledger.ack("w/1")
    ids = np.array([1, 1, 5], dtype=np.int64)
    result = ledger.check(ledger.mark(), ids, np.array([10, 10, 3], dtype=np.int64))
    assert (result.duplicated, result.phantom) == (1, 1)


def test_in_doubt_transactions_are_resolved_by_reading_back() -> None:
    ledger = Ledger()
    ledger.begin("w/1", "w", {1: 10}, [])
    ledger.ack("w/1")
    ledger.begin("w/2", "w", {1: 20, 2: 20}, [])  # landed
    ledger.begin("w/3", "w", {3: 30}, [Chunk(100, 102, 30)])  # did not land
    ledger.begin("w/4", "w", {4: 40, 5: 40}, [])  # torn
    assert ledger.orphan("w") == 3
    result = ledger.check(ledger.mark(), *rows({1: 20, 2: 20, 4: 40}))
    assert (result.resolved_applied, result.resolved_not_applied, result.partial) == (1, 1, 1)
    assert result.lost == 0
    assert not ledger.doubt
    # The ledger follows what was read: the next check expects it.
    assert ledger.check(ledger.mark(), *rows({1: 20, 2: 20, 4: 40})).lost == 0


def test_commits_racing_the_read_may_show_either_state() -> None:
    ledger = Ledger()
    ledger.begin("w/1", "w", {1: 10, 2: 10}, [])
    ledger.ack("w/1")
    ledger.begin("w/2", "w", {1: 20}, [])  # open at the mark
    mark = ledger.mark()
    ledger.begin("w/3", "w", {2: None}, [Chunk(100, 101, 30)])  # begun after it
    ledger.ack("w/2")
    ledger.ack("w/3")
    assert ledger.check(mark, *rows({1: 10, 2: 10})).lost == 0  # read before both
    mark = ledger.mark()
    assert ledger.check(mark, *rows({1: 20, 100: 30})).lost == 0  # after both
