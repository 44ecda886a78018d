"""engine/keyset.py: a transaction's deleted keys, integers held in sorted int64 arrays.

Proves, against a plain Python set driven by a seeded random sequence: membership, length,
iteration and `sorted_keys` agree after any number of additions (across many merges of the
geometric arrays), for int64 keys, ints beyond int64, and non-integer keys.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.keyset import KeySet


@pytest.mark.parametrize("kind", ["int64", "mixed-ints", "strings"])
def test_a_keyset_agrees_with_a_set(kind: str) -> None:
    rng = random.Random(20)
    keys = KeySet()
    model: set[object] = set()
    for _ in range(12):
        batch: dict[object, None] = {}  # ordered and O(1) to probe
        wanted = rng.randrange(1, 9000)
        while len(batch) < wanted:
            if kind == "strings":
                key: object = f"k{rng.randrange(10**6)}"
            elif kind == "mixed-ints" and rng.random() < 0.01:
                key = (1 << 64) + rng.randrange(1000)  # beyond int64: stays in the set
            else:
                key = rng.randrange(-(10**12), 10**12)
            if key not in model:
                batch[key] = None
        keys.add_new(batch)
        model.update(batch)
        assert len(keys) == len(model)
        for probe in rng.sample(sorted(model, key=str), min(50, len(model))):
            assert probe in keys
        probes: list[object] = [*rng.sample(sorted(model, key=str), min(50, len(model)))]
        probes += [10**13, -(10**13), 7, "absent"] if kind == "strings" else [10**13, 7]
        assert keys.contains_many(probes) == [p in model for p in probes]
        assert 10**13 not in keys and "absent" not in keys and -1.5 not in keys
    assert sorted(keys, key=str) == sorted(model, key=str)
    ordered = keys.sorted_keys()
    if kind == "int64":
        assert isinstance(ordered, np.ndarray) and ordered.dtype == np.int64
    assert list(ordered) == sorted(model)  # type: ignore[type-var]
