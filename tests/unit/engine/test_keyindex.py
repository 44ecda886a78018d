"""The key index (engine/storage/keyindex.py) against a brute-force model.

What it proves: after any sequence of adds and removes, `blocks_for_key` of every key returns
every live block that holds it (never one left out) and no removed block; a false block
appears only with a colliding fingerprint (checked exactly here: every block returned holds
a key of the same fingerprint); merges keep the runs geometric (few runs) and purges keep
dead entries bounded. Hashes are forced to collide in fingerprint (small key space with
hand-made hashes) so that the collision path is exercised, not just hoped for. Large merges
are offered to a worker thread (`take_merge` / `merged`): the model test interleaves taking,
finishing and abandoning them with adds and removes (a purge or an in-place merge makes a
job stale), and the answers stay exact throughout.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import limits
from engine.objects.bloom import key_hash, key_hashes
from engine.storage.keyindex import BLOCK_ID_END, KeyIndex, RunMerge


def _hashes(keys: list[int]) -> np.ndarray:
    return key_hashes([pa.array(keys, type=pa.int64())])


def test_a_key_is_found_in_every_block_that_holds_it_and_nowhere_else() -> None:
    index = KeyIndex()
    index.add(1, _hashes([1, 2, 3]))
    index.add(2, _hashes([3, 4]))
    index.add(7, _hashes([10]))
    assert sorted(index.blocks_for_key(3)) == [1, 2]
    assert index.blocks_for_key(4) == [2]
    assert index.blocks_for_key(10) == [7]
    assert index.blocks_for_key(99) == []
    index.remove(1)
    assert index.blocks_for_key(3) == [2]
    assert index.blocks_for_key(1) == []
    assert 1 not in index and 2 in index


def test_the_batched_lookup_agrees_with_one_key_at_a_time() -> None:
    index = KeyIndex()
    for block_id in range(1, 40):
        index.add(block_id, _hashes(list(range(block_id * 10, block_id * 10 + 25))))
    keys = list(range(0, 450, 7))
    batched = index.blocks_for_hashes(_hashes(keys))
    assert [sorted(b) for b in batched] == [sorted(index.blocks_for_key(k)) for k in keys]
    assert sorted(index.blocks_for_key(104)) == [8, 9, 10]


def test_a_hash_with_the_same_fingerprint_finds_the_block_too() -> None:
    """The answer is a superset: a block is returned for every key sharing a fingerprint
    (the caller verifies), and the all-ones low half of a probe never misses an entry."""
    index = KeyIndex()
    hashed = key_hash(12345)
    colliding = (hashed & ~0xFFFFFFFF) | ((hashed + 1) & 0xFFFFFFFF)
    index.add(BLOCK_ID_END - 1, np.array([colliding], dtype=np.uint64))
    index.add(5, np.array([hashed], dtype=np.uint64))
    assert sorted(index.blocks_for_hash(hashed)) == [5, BLOCK_ID_END - 1]
    assert not KeyIndex.fits(BLOCK_ID_END)
    assert KeyIndex.fits(BLOCK_ID_END - 1)


def test_runs_stay_geometric_and_dead_entries_bounded() -> None:
    index = KeyIndex()
    rng = np.random.default_rng(7)
    blocks = 300
    for block_id in range(1, blocks + 1):
        index.add(block_id, rng.integers(0, 2**63, 512, dtype=np.uint64))
    # Entries 153,600 in runs of >= 512 differing by 4x: at most log4(300) + 2 runs.
    assert index.run_count <= 6
    assert index.entries == blocks * 512
    assert index.size_bytes() == blocks * 512 * 8
    for block_id in range(1, blocks // 2):
        index.remove(block_id)
        assert index.entries <= (1 + limits.KEY_INDEX_DEAD_FRACTION) * (len(index) * 512) + 512
    assert len(index) == blocks - blocks // 2 + 1


def test_a_large_merge_is_offered_once_and_swapped_in_when_it_returns() -> None:
    index = KeyIndex(merge_on_loop_max=100)
    index.add(1, _hashes(list(range(0, 60))))
    index.add(2, _hashes(list(range(60, 120))))  # 60 < 4 * 60: a merge of 120 > 100 entries
    assert index.run_count == 2
    job = index.take_merge()
    assert isinstance(job, RunMerge) and job.entries == 120
    assert index.take_merge() is None  # once: it is running
    index.add(3, _hashes([500]))  # small runs still come and go meanwhile
    assert sorted(index.blocks_for_key(70)) == [2]
    assert index.merged(job, job.run())
    assert index.merges_offloaded == 1
    assert [sorted(index.blocks_for_key(k)) for k in (5, 70, 500)] == [[1], [2], [3]]
    assert index.run_count == 2  # the merged 120 and the newest single entry


def test_a_merge_made_stale_by_a_purge_is_dropped() -> None:
    index = KeyIndex(merge_on_loop_max=10)
    index.add(1, _hashes(list(range(0, 8))))
    index.add(2, _hashes(list(range(8, 16))))
    job = index.take_merge()
    assert job is not None
    index.remove(1)  # 8 dead of 8 live: a purge rewrites every run
    assert not index.merged(job, job.run())
    assert index.merges_offloaded == 0
    assert index.blocks_for_key(3) == [] and index.blocks_for_key(9) == [2]


def test_merges_nobody_takes_still_keep_the_runs_bounded() -> None:
    index = KeyIndex(merge_on_loop_max=0)  # every merge is offered; none is taken
    for block_id in range(1, 200):
        index.add(block_id, _hashes([block_id]))
        assert index.run_count <= limits.KEY_INDEX_RUNS_MAX + 1
    assert all(index.blocks_for_key(k) == [k] for k in range(1, 200))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.lists(st.integers(0, 60), max_size=40, unique=True)),
            st.tuples(st.just("remove"), st.integers(0, 30)),
            st.tuples(st.just("take"), st.just(0)),
            st.tuples(st.just("finish"), st.integers(0, 2)),
            st.tuples(st.just("abandon"), st.integers(0, 2)),
        ),
        max_size=60,
    ),
    st.integers(1, 4),
    st.sampled_from([0, 30, 100, limits.KEY_INDEX_MERGE_ON_LOOP_ENTRIES_MAX]),
)
def test_against_a_brute_force_model(
    ops: list[tuple[str, object]], hash_bits: int, merge_on_loop_max: int
) -> None:
    """Hashes are a key's value in few fingerprint bits (`hash_bits`), so many keys share a
    fingerprint: the model says exactly which blocks a lookup may return. Offered merges
    are taken, finished (maybe stale by then) or abandoned between the other operations."""

    def hashed(key: int) -> int:
        fingerprint = key % (1 << hash_bits)
        return (fingerprint << 32) | key

    index = KeyIndex(merge_on_loop_max=merge_on_loop_max)
    model: dict[int, set[int]] = {}
    next_id = 1
    taken: list[RunMerge] = []
    for op, arg in ops:
        if op == "add":
            assert isinstance(arg, list)
            index.add(next_id, np.array([hashed(k) for k in arg], dtype=np.uint64))
            model[next_id] = set(arg)
            next_id += 1
        elif op == "remove":
            assert isinstance(arg, int)
            index.remove(arg)
            model.pop(arg, None)
        elif op == "take":
            job = index.take_merge()
            if job is not None:
                taken.append(job)
        elif taken:
            assert isinstance(arg, int)
            job = taken.pop(arg % len(taken))
            if op == "finish":
                index.merged(job, job.run())
            else:
                index.merge_abandoned(job)
        assert index.run_count <= limits.KEY_INDEX_RUNS_MAX + 1
        assert index.size_bytes() == 8 * index.entries  # no merge lost or doubled a run
        for key in range(0, 61):
            found = index.blocks_for_hash(hashed(key))
            assert len(found) == len(set(found))
            holding = {b for b, keys in model.items() if key in keys}
            same_fp = {
                b
                for b, keys in model.items()
                if any(k % (1 << hash_bits) == key % (1 << hash_bits) for k in keys)
            }
            assert holding <= set(found) <= same_fp
        batched = index.blocks_for_hashes(np.array([hashed(k) for k in range(61)], dtype=np.uint64))
        assert [sorted(b) for b in batched] == [
            sorted(index.blocks_for_hash(hashed(k))) for k in range(61)
        ]
        assert len(index) == len(model)
