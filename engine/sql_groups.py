"""GROUP BY queries the engine answers itself, bit for bit as DuckDB (engine/sql_direct.py
takes them, engine/sql_grouped.py scans for them). Pure: parse trees, Arrow tables and numpy
arrays in; plans and Arrow tables out.

Why. DuckDB reading the engine's Arrow stream is most of a group-by's cost through `sql`
(`select customer, sum(amount) from orders group by customer` over 10M rows: ~150 ms
against DuckDB's 50 ms on its native table, while the engine's scan of those two columns
takes ~8 ms). Grouping the scanned batches here with numpy costs a few nanoseconds a row.

What is taken (`select_grouping`): a SELECT over one table (engine/sql_keys.py's plan checks
the FROM and the WHERE) with `GROUP BY col` of exactly one column, a select list of that
column and plain aggregates (engine/sql_aggregates.py: `count(*)`, `count(col)`, `sum`,
`min`, `max` of columns; aliases allowed), no HAVING, QUALIFY, DISTINCT, LIMIT, GROUPING
SETS/ROLLUP/CUBE or GROUP BY ALL, and either no ORDER BY or ORDER BY the group column (ASC or
DESC, NULLS FIRST or LAST). engine/sql_direct.py takes it only when the WHERE is absent or
nothing but key bounds, so the rows grouped are exactly the rows DuckDB would group.

When the answer is DuckDB's (`bind`, then `GroupTable.result`; anything else is DuckDB's):

* the group column is an integer column of at most 32 unsigned or 64 signed bits, a
  BOOLEAN or a VARCHAR (ordered by code point, as DuckDB's byte order of UTF-8); NULL keys
  form one group (DuckDB's); the groups come out by key ascending, NULL last, unless ORDER
  BY says otherwise (DuckDB's GROUP BY has no order of its own: without
  ORDER BY the answer is the same set of rows);
* the aggregates are the ones engine/sql_aggregates.py computes exactly, with the types it
  checks against DuckDB's answer schema (read from running the query over no rows):
  counts (BIGINT), sums of signed integers (HUGEINT, exact: each int64 is split into its
  high 32 bits and low 32 bits, summed in int64 per group, which cannot overflow below 2^31
  rows), sums of DOUBLE (additions in row order from +0.0 per group: `numpy.add.at` adds
  element after element, as DuckDB's hash aggregate does on the one thread its databases
  run: checked bit for bit against DuckDB 2.0 at one thread with 1,000 to 1M groups over
  2-4M rows of order-sensitive values, 2026-11-27), min and max of integer columns;
* at most `limits.SQL_GROUPS_MAX` groups (and `SQL_GROUP_TEXT_BYTES_MAX` of texts) and
  2^31 - 1 rows: past any, `add` says so and
  the query goes to DuckDB (which can spill), so the state here stays bounded.

Memory. The state is per group: a row count, and per aggregate one or two arrays of 8 bytes
a group. Keys map to group slots directly (`key - base`) while their span is at most
`limits.SQL_GROUP_DENSE_SLOTS_MAX`, else through a sorted array of the keys seen
(`numpy.searchsorted`); texts through a dict, looked up once per distinct text of a batch
(`pyarrow.compute.dictionary_encode`). Slot 0 is the NULL key's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import limits
from engine.sql_aggregates import HUGEINT, INTEGERS, SIGNED, Aggregate, aggregate_of

_NUMBER_KEYS = (*SIGNED, pa.uint8(), pa.uint16(), pa.uint32(), pa.bool_())
"""Group column types whose values all fit an int64 (and whose order is numpy's)."""
_TEXT_KEYS = (pa.string(), pa.large_string())
"""VARCHAR group columns: DuckDB orders them byte by byte (UTF-8), which is code point
order, Python's."""
_KEY_TYPES = (*_NUMBER_KEYS, *_TEXT_KEYS)

_ROWS_MAX = (1 << 31) - 1
"""Rows one query groups here: the int64 sums of 32-bit halves cannot overflow below it."""


@dataclass(frozen=True, slots=True)
class KeyColumn:
    """A select-list item that is the group column itself (its reference, lower case)."""

    column: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Grouping:
    """What a GROUP BY query's parse tree says: the group column's reference `key`, the
    select list `items`, and `order`: None, or (descending, nulls_first) of an ORDER BY
    of the group column."""

    key: tuple[str, ...]
    items: tuple[Aggregate | KeyColumn, ...]
    order: tuple[bool, bool] | None


@dataclass(frozen=True, slots=True)
class BoundGrouping:
    """A `Grouping` over one table's columns: `key` is the group column's name, `columns[i]`
    the column item i reads (the key for a `KeyColumn`, None for count(*)), `types` the
    table's Arrow type of each column named."""

    grouping: Grouping
    key: str
    columns: tuple[str | None, ...]
    types: dict[str, pa.DataType]

    @property
    def read(self) -> list[str]:
        """The columns the scan reads: the key, then each other column named, once."""
        return list(dict.fromkeys([self.key, *(c for c in self.columns if c is not None)]))


def select_grouping(node: dict[str, Any]) -> Grouping | None:
    """The grouping of a SELECT node (DuckDB's `json_serialize_sql` tree) this module
    answers (module docstring), else None."""
    if node.get("aggregate_handling") != "STANDARD_HANDLING":
        return None
    if node.get("having") is not None or node.get("qualify") is not None:
        return None
    groups = node.get("group_expressions")
    if not isinstance(groups, list) or len(groups) != 1 or node.get("group_sets") != [[0]]:
        return None
    key = _reference(groups[0])
    if key is None:
        return None
    items: list[Aggregate | KeyColumn] = []
    for item in node.get("select_list") or []:
        column = _reference(item)
        found: Aggregate | KeyColumn | None = (
            KeyColumn(column) if column is not None else aggregate_of(item)
        )
        if found is None:
            return None
        items.append(found)
    if not items:
        return None
    taken, order = _order(node.get("modifiers"), key)
    return Grouping(key, tuple(items), order) if taken else None


def _reference(item: Any) -> tuple[str, ...] | None:
    if not isinstance(item, dict) or item.get("class") != "COLUMN_REF":
        return None
    parts = item.get("column_names")
    if not isinstance(parts, list) or not 1 <= len(parts) <= 2:
        return None
    if not all(isinstance(p, str) for p in parts):
        return None
    return tuple(p.lower() for p in parts)


def _order(modifiers: Any, key: tuple[str, ...]) -> tuple[bool, tuple[bool, bool] | None]:
    """(taken, order): no ORDER BY is (True, None); one of the group column as written in
    GROUP BY is (True, (descending, nulls_first)); anything else (DISTINCT, LIMIT, other
    orders) is (False, None)."""
    if not modifiers:
        return True, None
    if not isinstance(modifiers, list) or len(modifiers) != 1:
        return False, None
    modifier = modifiers[0]
    if not isinstance(modifier, dict) or modifier.get("type") != "ORDER_MODIFIER":
        return False, None
    orders = modifier.get("orders")
    if not isinstance(orders, list) or len(orders) != 1 or not isinstance(orders[0], dict):
        return False, None
    if _reference(orders[0].get("expression")) != key:
        return False, None
    direction = {"ORDER_DEFAULT": False, "ASCENDING": False, "DESCENDING": True}
    # DuckDB's default null order is NULLS LAST, ascending or descending.
    nulls = {"ORDER_DEFAULT": False, "NULLS LAST": False, "NULLS FIRST": True}
    descending = direction.get(str(orders[0].get("type")))
    nulls_first = nulls.get(str(orders[0].get("null_order")))
    if descending is None or nulls_first is None:
        return False, None
    return True, (descending, nulls_first)


def bind(
    grouping: Grouping,
    resolve: Callable[[tuple[str, ...]], str | None],
    schema: pa.Schema,
) -> BoundGrouping | None:
    """`grouping` over a table of `schema`, each reference resolved by `resolve` (None: not
    one of its columns); None when a column is not one or a type is not computed here."""
    key = resolve(grouping.key)
    if key is None or schema.field(key).type not in _KEY_TYPES:
        return None
    columns: list[str | None] = []
    for item in grouping.items:
        if isinstance(item, KeyColumn):
            if resolve(item.column) != key:
                return None
            columns.append(key)
            continue
        if item.column is None:
            columns.append(None)
            continue
        column = resolve(item.column)
        if column is None or _wanted(item.function, schema.field(column).type) is None:
            return None
        columns.append(column)
    types = {n: schema.field(n).type for n in {key, *(c for c in columns if c is not None)}}
    return BoundGrouping(grouping, key, tuple(columns), types)


def _wanted(function: str, type_: pa.DataType) -> pa.DataType | None:
    """The type DuckDB answers `function` of a column of `type_` in, when computed here."""
    if function in ("count", "count_star"):
        return pa.int64()
    if function in ("min", "max"):
        return type_ if type_ in INTEGERS and type_ != pa.uint64() else None
    assert function == "sum"
    if type_ == pa.float64():
        return type_
    return HUGEINT if type_ in SIGNED else None


def answers_in(bound: BoundGrouping, schema: pa.Schema) -> bool:
    """Whether DuckDB's answer `schema` has the types computed here, item by item."""
    if len(schema) != len(bound.columns):
        return False
    for item, column, field in zip(bound.grouping.items, bound.columns, schema, strict=True):
        if isinstance(item, KeyColumn):
            wanted: pa.DataType | None = bound.types[bound.key]
        elif column is None:
            wanted = pa.int64()
        else:
            wanted = _wanted(item.function, bound.types[column])
        if field.type != wanted:
            return False
    return True


class GroupTable:
    """The per-group state of one query (module docstring): `add` each scanned part in scan
    order, then `result`. Not thread-safe: one caller at a time."""

    def __init__(self, bound: BoundGrouping) -> None:
        self.bound = bound
        self.rows_seen = 0
        self.base: int | None = None
        """Dense slots: key `base + i` is slot `i + 1`; None until a key is seen."""
        self.known: np.ndarray | None = None
        """Sorted keys (slot `i + 1` is `known[i]`), once their span outgrew dense slots."""
        self.texts: dict[str, int] | None = {} if bound.types[bound.key] in _TEXT_KEYS else None
        """For a VARCHAR group column: each text's slot (first seen, first numbered)."""
        self.text_keys: list[str] = []
        """The texts by slot - 1."""
        self.text_bytes = 0
        """Their UTF-8 bytes (bounded by `SQL_GROUP_TEXT_BYTES_MAX`)."""
        self.rows = np.zeros(1, dtype=np.int64)
        self.states: dict[tuple[str, str], list[np.ndarray]] = {}
        """Per distinct (function, column): its arrays of one value a slot (`_fresh`)."""
        for item, column in zip(bound.grouping.items, bound.columns, strict=True):
            if isinstance(item, KeyColumn) or column is None:
                continue
            self.states.setdefault((item.function, column), self._fresh(item.function, column))

    def _fresh(self, function: str, column: str) -> list[np.ndarray]:
        """New state arrays of one slot (each with its starting value): the non-NULL count,
        then a DOUBLE sum; or an integer sum's high and low halves; or a min or max."""
        counts = np.zeros(1, dtype=np.int64)
        if function == "count":
            return [counts]
        if function == "sum" and self.bound.types[column] == pa.float64():
            return [counts, np.zeros(1)]  # (+0.0: DuckDB's sum starts there)
        if function == "sum":
            return [counts, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)]
        info = np.iinfo(np.int64)
        return [counts, np.full(1, info.max if function == "min" else info.min)]

    def add(self, part: pa.Table) -> bool:
        """Fold `part` (the `bound.read` columns, in scan order) into the state; False when
        the groups or rows outgrew this module's bounds (the state is then unusable)."""
        self.rows_seen += part.num_rows
        if self.rows_seen > _ROWS_MAX:
            return False
        for batch in part.to_batches():  # (every column chunked alike, zero copy)
            if batch.num_rows == 0:
                continue
            keys = batch.column(self.bound.key)
            slots = self._slots(keys) if self.texts is None else self._text_slots(keys)
            if slots is None:
                return False
            counts = _count(slots, len(self.rows))
            self.rows += counts
            for (function, column), arrays in self.states.items():
                _fold(function, arrays, slots, counts, batch.column(column))
        return True

    def _slots(self, keys: pa.Array) -> np.ndarray | None:
        """Each row's slot (NULL keys: 0), growing the state for keys not seen; None when
        the groups would outgrow `SQL_GROUPS_MAX`."""
        if keys.type == pa.bool_():
            keys = keys.cast(pa.int8())  # (false 0, true 1: DuckDB's order too)
        valid = keys.is_valid().to_numpy(zero_copy_only=False) if keys.null_count else None
        numbers = _int64(pc.fill_null(keys, 0) if valid is not None else keys)
        present = numbers[valid] if valid is not None else numbers
        if len(present) == 0:
            return np.zeros(len(numbers), dtype=np.intp)
        low, high = int(present.min()), int(present.max())
        if self.known is None:
            base = low if self.base is None else min(self.base, low)
            top = high if self.base is None else max(self.base + len(self.rows) - 2, high)
            if top - base < limits.SQL_GROUP_DENSE_SLOTS_MAX:
                if base != self.base or top - base + 2 > len(self.rows):
                    old = np.arange(1, len(self.rows))
                    shift = 0 if self.base is None else self.base - base
                    self._remap(top - base + 2, old, old + shift)
                    self.base = base
                # (NULL rows' numbers are 0, maybe out of range: their slot is set after)
                dense = (numbers - base + 1).astype(np.intp, copy=False)
                if valid is None:
                    return dense
                dense[~valid] = 0
                return dense
            self._to_sorted()
        assert self.known is not None
        found = np.searchsorted(self.known, present)
        hit = found < len(self.known)
        hit[hit] = self.known[found[hit]] == present[hit]
        if not hit.all():
            fresh = np.unique(present[~hit])
            if len(self.known) + len(fresh) > limits.SQL_GROUPS_MAX:
                return None
            merged = np.union1d(self.known, fresh)
            self._remap(
                len(merged) + 1,
                np.arange(1, len(self.known) + 1),
                np.searchsorted(merged, self.known) + 1,
            )
            self.known = merged
            found = np.searchsorted(merged, present)
        slots = np.zeros(len(numbers), dtype=np.intp)
        if valid is None:
            slots[:] = found + 1
        else:
            slots[valid] = found + 1
        return slots

    def _text_slots(self, keys: pa.Array) -> np.ndarray | None:
        """`_slots` of a VARCHAR column: the batch's distinct texts (dictionary encoded,
        NULLs left NULL) looked up once each, then every row's slot by its index."""
        assert self.texts is not None
        encoded = pc.dictionary_encode(keys)
        texts = self.texts
        mapping = np.empty(len(encoded.dictionary), dtype=np.intp)
        for i, text in enumerate(encoded.dictionary.to_pylist()):
            slot = texts.get(text)
            if slot is None:
                self.text_bytes += len(text.encode())
                if len(texts) >= limits.SQL_GROUPS_MAX:
                    return None
                if self.text_bytes > limits.SQL_GROUP_TEXT_BYTES_MAX:
                    return None
                slot = texts[text] = len(texts) + 1
                self.text_keys.append(text)
            mapping[i] = slot
        if len(texts) + 1 > len(self.rows):  # (doubling: a copy per doubling, not per text)
            old = np.arange(1, len(self.rows))
            self._remap(max(len(texts) + 1, 2 * len(self.rows)), old, old)
        indices = encoded.indices
        if not indices.null_count:
            found: np.ndarray = mapping[indices.to_numpy()]
            return found
        slots = np.zeros(len(indices), dtype=np.intp)
        slots[indices.is_valid().to_numpy(zero_copy_only=False)] = mapping[
            indices.drop_null().to_numpy()
        ]
        return slots

    def _to_sorted(self) -> None:
        """Dense slots to sorted keys: only the slots in use are kept."""
        used = np.flatnonzero(self.rows[1:])
        self.known = (used + (self.base or 0)).astype(np.int64)
        self._remap(len(used) + 1, used + 1, np.arange(1, len(used) + 1))

    def _remap(self, size: int, old: np.ndarray, new: np.ndarray) -> None:
        """Every state to `size` slots, slot `old[i]` moved to `new[i]`; the NULL slot
        stays 0, other slots start afresh."""

        def moved(array: np.ndarray, start: np.ndarray) -> np.ndarray:
            out = np.full(size, start[0], dtype=array.dtype)
            out[0] = array[0]
            out[new] = array[old]
            return out

        self.rows = moved(self.rows, np.zeros(1, dtype=np.int64))
        for (function, column), arrays in self.states.items():
            starts = self._fresh(function, column)
            arrays[:] = [moved(a, s) for a, s in zip(arrays, starts, strict=True)]

    def result(self, schema: pa.Schema) -> pa.Table:
        """The answer in DuckDB's answer `schema` (`answers_in` held): one row per group,
        by key ascending with NULL last unless the query's ORDER BY says otherwise."""
        used = np.flatnonzero(self.rows[1:]) + 1
        if self.texts is not None:
            texts = self.text_keys
            used = np.array(sorted(used.tolist(), key=lambda slot: texts[slot - 1]), dtype=np.intp)
            keys = np.zeros(len(used), dtype=np.int64)  # (unused: the texts are the keys)
        elif self.known is not None:
            keys = self.known[used - 1]
        else:
            keys = (used - 1 + (self.base or 0)).astype(np.int64)
        order = self.bound.grouping.order
        if order is not None and order[0]:
            used, keys = used[::-1], keys[::-1]
        if self.rows[0] > 0:  # the NULL key's group
            at = 0 if order is not None and order[1] else len(used)
            used, keys = np.insert(used, at, 0), np.insert(keys, at, 0)
        arrays = []
        for item, column, field in zip(
            self.bound.grouping.items, self.bound.columns, schema, strict=True
        ):
            if isinstance(item, KeyColumn) and self.texts is not None:
                texts = self.text_keys
                values = pa.array(
                    [texts[slot - 1] if slot else None for slot in used.tolist()], type=field.type
                )
            elif isinstance(item, KeyColumn):
                values = pa.array(keys, type=pa.int64(), mask=used == 0).cast(field.type)
            elif column is None:
                values = pa.array(self.rows[used], type=pa.int64())
            else:
                arrays_of = self.states[(item.function, column)]
                values = _output(item.function, arrays_of, used, field.type)
            arrays.append(values)
        return pa.Table.from_arrays(arrays, schema=schema)


def _fold(
    function: str,
    arrays: list[np.ndarray],
    slots: np.ndarray,
    counts: np.ndarray,
    values: pa.Array,
) -> None:
    """One batch of one aggregate's column into its state arrays (`GroupTable._fresh`);
    `counts`: the batch's rows per slot (its non-NULL counts when it has no NULL)."""
    if values.null_count:
        slots = slots[values.is_valid().to_numpy(zero_copy_only=False)]
        values = values.drop_null()
        counts = _count(slots, len(arrays[0]))
    arrays[0] += counts
    if function == "count" or len(slots) == 0:
        return
    if values.type == pa.float64():
        # Element after element, in row order (module docstring): DuckDB's sum.
        np.add.at(arrays[1], slots, values.to_numpy())
        return
    numbers = _int64(values)
    if function == "sum":
        np.add.at(arrays[1], slots, numbers >> 32)  # (arithmetic: the signed high half)
        np.add.at(arrays[2], slots, numbers & 0xFFFFFFFF)
    elif function == "min":
        np.minimum.at(arrays[1], slots, numbers)
    else:
        np.maximum.at(arrays[1], slots, numbers)


def _output(
    function: str, arrays: list[np.ndarray], used: np.ndarray, type_: pa.DataType
) -> pa.Array:
    """One aggregate's answer column for the slots `used`, in order."""
    counts = arrays[0][used]
    if function == "count":
        return pa.array(counts, type=pa.int64())
    empty = counts == 0  # (no non-NULL value: NULL)
    if function == "sum" and len(arrays) == 3:
        high, low = arrays[1][used].tolist(), arrays[2][used].tolist()
        totals = [
            None if e else (h << 32) + lo
            for e, h, lo in zip(empty.tolist(), high, low, strict=True)
        ]
        return pa.array(totals, type=type_)
    return pa.array(arrays[1][used], mask=empty).cast(type_)


def _count(slots: np.ndarray, size: int) -> np.ndarray:
    """Rows per slot: `bincount` when the slots are few beside the rows (its pass over
    `size` per batch is then cheap), else `add.at` (no work per slot not hit)."""
    if size <= 4 * len(slots):
        return np.bincount(slots, minlength=size)
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, slots, 1)
    return out


def _int64(values: pa.Array) -> np.ndarray:
    """An integer or BOOLEAN array with no NULLs as int64 numbers."""
    if values.type == pa.bool_():
        values = values.cast(pa.int8())
    numbers: np.ndarray = values.to_numpy().astype(np.int64, copy=False)
    return numbers
