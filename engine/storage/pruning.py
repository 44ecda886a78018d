"""Zonemap pruning in microseconds for the filters people write most: comparisons of a column
with a number, joined by `and` / `or`.

Why not only pyarrow's guarantee simplification (engine/objects/zonemap.py `prune`): it is
general but costs 5-20 us per block in C++ plus the dataset's construction, 10-25 ms for a
thousand blocks, more than the whole range query it would speed up. Here a filter is
recognised from its canonical text (pyarrow prints `((id >= 5) and (id < 10))`), and each
comparison is evaluated at once over every block's min and max as numpy arrays. Anything not
recognised (other operators, strings, dates, `is_in`, `invert`, a field name that is not a
plain identifier, NaN or infinite literals) prunes nothing: never wrong, only slower.

Semantics per block, where a comparison with a null is never true: `c == v` may match iff
min <= v <= max; `c < v` iff min < v; `c <= v` iff min <= v; `c > v` iff max > v;
`c >= v` iff max >= v; `c != v` iff not min == max == v. A block whose bounds for `c` are
unknown (no non-null value, a NaN among its values) may always match.

A literal printed with a fraction or an exponent, or an integer above 2**24, may be a float32
printed short (`0.1` for 0.10000000149..., `123456790` for 123456792): it stands for
[v - s, v + s] with s = |v| * 2**-23 + 2**-149, each comparison above takes the end that
keeps more blocks, and `!=` of it prunes nothing.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

_EXACT_FLOAT_INT = 2**53
"""Integers beyond this do not all have a float64: such bounds or literals prune nothing."""

_TOKEN = re.compile(
    r"\s*(?:(?P<open>\()|(?P<close>\))|(?P<op>==|!=|<=|>=|<|>)|(?P<word>and\b|or\b)"
    r"|(?P<number>-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*))",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Compare:
    column: str
    op: str
    value: float
    slack: float = 0.0
    """How far the literal's true value may be from `value`: pyarrow prints a float32 scalar
    as the shortest text that reads back as that float32 (`0.1`, `123456790`), not its exact
    value (0.10000000149..., 123456792), and the text does not say the type."""


_FLOAT32_EXACT_INT = 2**24
"""Integer text up to this is exact in float32 and float64 alike: no slack."""

_FLOAT32_REL_SLACK = 2.0**-23
"""A float32 is within half an ulp, <= |v| * 2**-24, of its shortest text: twice that."""

_FLOAT32_ABS_SLACK = 2.0**-149
"""Plus the smallest float32 subnormal's ulp, for values near zero."""


@dataclass(frozen=True, slots=True)
class Junction:
    op: str  # "and" | "or"
    left: Node
    right: Node


Node = Compare | Junction


def parse(expression: pc.Expression) -> Node | None:
    """The filter as comparisons and junctions, or None when it is anything else."""
    return _parse_text(str(expression))


@functools.lru_cache(maxsize=256)
def _parse_text(text: str) -> Node | None:
    """`parse` of a filter's canonical text, kept for the last few texts: SQL's direct path
    (engine/sql.py) asks the key path's bounds of a filter, then scans with it (the nodes
    are frozen, so sharing them is safe)."""
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            return None
        kind = match.lastgroup
        assert kind is not None
        if kind == "name" and not _printed_alone(text, match.start(kind), match.end(kind)):
            # pyarrow prints a field name as it is: " b" or "b " shows as "( b > 1)" or
            # "(b  > 1)", which would read as column "b" (a different column, if the table
            # has one: the wrong bounds). Only "(" name " " op is a whole name.
            return None
        tokens.append((kind, match.group(kind)))
        position = match.end()
        while position < len(text) and text[position].isspace():
            position += 1
    parser = _Parser(tokens)
    node = parser.expr()
    return node if node is not None and parser.done() else None


def _printed_alone(text: str, start: int, end: int) -> bool:
    """The name at text[start:end] is all of a field's name: "(" right before it, one space
    and an operator right after."""
    return (
        start > 0
        and text[start - 1] == "("
        and text[end : end + 1] == " "
        and text[end + 1 : end + 2] in ("=", "!", "<", ">")
    )


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0

    def done(self) -> bool:
        return self.at == len(self.tokens)

    def take(self, kind: str) -> str | None:
        if self.at < len(self.tokens) and self.tokens[self.at][0] == kind:
            self.at += 1
            return self.tokens[self.at - 1][1]
        return None

    def expr(self) -> Node | None:
        """'(' name op number ')' | '(' expr ('and'|'or') expr ')'"""
        if self.take("open") is None:
            return None
        name = self.take("name")
        if name is not None:
            op, number = self.take("op"), self.take("number")
            if op is None or number is None or self.take("close") is None:
                return None
            value = float(number)
            if not math.isfinite(value) or (
                abs(value) >= _EXACT_FLOAT_INT and "." not in number and "e" not in number.lower()
            ):
                return None
            exact = abs(value) <= _FLOAT32_EXACT_INT and not any(c in number for c in ".eE")
            slack = 0.0 if exact else abs(value) * _FLOAT32_REL_SLACK + _FLOAT32_ABS_SLACK
            return Compare(name, op, value, slack)
        left = self.expr()
        word = self.take("word")
        right = self.expr()
        if left is None or word is None or right is None or self.take("close") is None:
            return None
        return Junction(word.lower(), left, right)


class Bounds:
    """Every block's min and max of each numeric column (float64, NaN when unknown)."""

    def __init__(self, zonemaps: Sequence[object]) -> None:
        self._zonemaps = zonemaps
        self._columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._zonemaps)

    def of(self, column: str) -> tuple[np.ndarray, np.ndarray] | None:
        found = self._columns.get(column)
        if found is not None:
            return found
        mins = np.full(len(self._zonemaps), np.nan)
        maxs = np.full(len(self._zonemaps), np.nan)
        for index, zonemap in enumerate(self._zonemaps):
            try:
                zone = zonemap.column(column)  # type: ignore[attr-defined]
            except (KeyError, AttributeError):
                return None
            low, high = zone.min, zone.max
            if _numeric(low) and _numeric(high):
                mins[index], maxs[index] = float(low), float(high)
        self._columns[column] = (mins, maxs)
        return mins, maxs


def _numeric(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) < _EXACT_FLOAT_INT
    return math.isfinite(value)


def columns_of(node: Node) -> set[str]:
    """The columns `node` compares."""
    if isinstance(node, Junction):
        return columns_of(node.left) | columns_of(node.right)
    return {node.column}


def may_match(node: Node, bounds: Bounds) -> np.ndarray:
    """Which blocks may hold a row matching `node` (True where unknown)."""
    if isinstance(node, Junction):
        left, right = may_match(node.left, bounds), may_match(node.right, bounds)
        joined: np.ndarray = left & right if node.op == "and" else left | right
        return joined
    found = bounds.of(node.column)
    if found is None:
        return np.ones(len(bounds), dtype=bool)
    mins, maxs = found
    unknown = np.isnan(mins) | np.isnan(maxs)
    v, low, high = node.value, node.value - node.slack, node.value + node.slack
    with np.errstate(invalid="ignore"):
        if node.op == "==":
            hit = (mins <= high) & (low <= maxs)
        elif node.op == "<":
            hit = mins < high
        elif node.op == "<=":
            hit = mins <= high
        elif node.op == ">":
            hit = maxs > low
        elif node.op == ">=":
            hit = maxs >= low
        elif node.slack:  # "!=" of a value known only within the slack: may always match
            hit = np.ones(len(bounds), dtype=bool)
        else:  # "!="
            hit = ~((mins == v) & (maxs == v))
    out: np.ndarray = hit | unknown
    return out


@dataclass(frozen=True, slots=True)
class KeyInterval:
    """What a filter says of an integer key column: every matching row has `lo <= key <= hi`
    (both ends included). `exact`: the filter is nothing but that (comparisons of the key with
    integers joined by `and`), so the rows of `[lo, hi]` are exactly its matches and need no
    filtering; otherwise the interval only narrows where to look."""

    lo: int
    hi: int
    exact: bool


_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def key_interval(node: Node, key: str) -> KeyInterval | None:
    """The bounds `node` puts on the integer column `key` (engine/scan.py's key path: a point
    or range predicate on the primary key reads only the blocks whose key ranges meet it, by
    binary search inside each), or None when it puts none. `and` intersects; `or` takes the
    hull of two bounded sides (not exact); `!=`, and comparisons of other columns, bound
    nothing. A literal known only within a slack (a float32 printed short) or with a
    fraction bounds conservatively: the interval may hold more keys, never fewer."""
    found = _interval(node, key)
    if found is None:
        return None
    lo, hi, exact = found
    return KeyInterval(max(lo, _INT64_MIN), min(hi, _INT64_MAX), exact)


def _interval(node: Node, key: str) -> tuple[int, int, bool] | None:
    if isinstance(node, Junction):
        left, right = _interval(node.left, key), _interval(node.right, key)
        if node.op == "and":
            if left is None or right is None:
                # The bounded side still bounds the matches; the other side needs the filter.
                one = left if left is not None else right
                return None if one is None else (one[0], one[1], False)
            return max(left[0], right[0]), min(left[1], right[1]), left[2] and right[2]
        if left is None or right is None:
            return None  # one side matches keys anywhere
        return min(left[0], right[0]), max(left[1], right[1]), False
    if node.column != key or node.op == "!=":
        return None
    value, slack = node.value, node.slack
    if slack == 0.0 and value.is_integer():
        v = int(value)
        return {
            "==": (v, v, True),
            "<": (_INT64_MIN, v - 1, True),
            "<=": (_INT64_MIN, v, True),
            ">": (v + 1, _INT64_MAX, True),
            ">=": (v, _INT64_MAX, True),
        }[node.op]
    # Not an exact integer: the true literal lies in [value - slack, value + slack]; widen to
    # the integers around that and let the filter decide.
    low, high = math.floor(value - slack), math.ceil(value + slack)
    return {
        "==": (low, high, False),
        "<": (_INT64_MIN, high, False),
        "<=": (_INT64_MIN, high, False),
        ">": (low, _INT64_MAX, False),
        ">=": (low, _INT64_MAX, False),
    }[node.op]
