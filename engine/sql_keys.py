"""The key bounds of a SQL query, read from DuckDB's parse tree before DuckDB plans anything
(engine/sql_direct.py). Pure: text and parse trees in, plans and bounds out.

Why. DuckDB plans and scans a Python dataset in about 1 ms even for one row, three times its
own point lookup (engine/sql_direct.py, module docstring). A query over one table whose WHERE bounds
the table's integer key needs none of that: the engine's key path reads the few rows the
bounds allow, and DuckDB runs the query over those rows as a small in-memory table (or, for a
query that only projects columns, not at all).

Templates. A query's plain decimal integer literals (`5`, `123456`: at most 18 digits, not
part of `1.5`, `1e3`, `0x1F` or `1_000`) are replaced by `$1`, `$2`, ... in the order they
appear (`template`): `where id = 5` and `where id = 7` share one template, so the parse tree
is read once per template (`analyse`) and its plan kept (engine/sql_direct.py
`_TEMPLATES`); each query only tokenizes (microseconds) and substitutes its values
(`key_bounds`). A query already
holding `?` or `$` anywhere has no template (its own parameters would collide with ours).

What is trusted. Only what the plan proves implied by the WHERE clause: the conjuncts of its
top-level AND that compare the key with a template value (`=`, `<`, `<=`, `>`, `>=`, either
side, a value negated by unary minus; `BETWEEN`; `IN` of values). So the rows within the
bounds are a superset of the rows the WHERE keeps, and DuckDB applies the whole WHERE again
to them. A query qualifies only when nothing else in it can see other rows of the table:
one SELECT over one base table (no join, subquery, CTE, set operation, table sample, time
travel clause or column aliases on the table). The rows are handed over without running
DuckDB (`KeyPlan.projection`) only when the WHERE is nothing but such key conjuncts and the
query is nothing but a list of that table's columns (no DISTINCT, ORDER BY, LIMIT, GROUP BY,
HAVING, QUALIFY or expression). A GROUP BY engine/sql_groups.py answers gets a plan even
with no key conjunct (`KeyPlan.grouping`: it scans the whole table); its WHERE must still be
nothing but key bounds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.sql_aggregates import Aggregate, plain_select, select_aggregates
from engine.sql_groups import Grouping, select_grouping

_PLAIN_INT = re.compile(r"[0-9]{1,18}(?![0-9A-Za-z_.])")
"""A decimal integer literal that is exactly its digits (18 fit any int64; DuckDB reads a
longer one as HUGEINT, DECIMAL or DOUBLE, which is left in the template as text)."""

_COMPARISONS = {
    "COMPARE_EQUAL": "=",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
}
_FLIPPED = {"=": "=", "<": ">", ">": "<", "<=": ">=", ">=": "<="}

_CHEAP_FUNCTIONS = frozenset(
    {"sum", "count", "count_star", "min", "max", "avg", "+", "-", "*", "/", "//", "%"}
)
"""Functions whose cost is a few operations per row (engine/sql_direct.py may run a query made of
only these over a small table on the event loop, with no thread hand-over)."""
_CHEAP_CLASSES = frozenset(
    {"COLUMN_REF", "CONSTANT", "PARAMETER", "COMPARISON", "CONJUNCTION", "BETWEEN", "STAR"}
)
_CHEAP_OPERATORS = frozenset(
    {"COMPARE_IN", "COMPARE_NOT_IN", "OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"}
)


@dataclass(frozen=True, slots=True)
class Operand:
    """A template value in the tree: `$index` (1-based), times `sign` (unary minus)."""

    index: int
    sign: int


@dataclass(frozen=True, slots=True)
class Conjunct:
    """A top-level AND term comparing the column `column` (its reference, lower case) with
    template values: `op` is one of = < <= > >= (column on the left), "between" (two
    operands, both ends included) or "in"."""

    column: tuple[str, ...]
    op: str
    operands: tuple[Operand, ...]


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """What a template's parse tree says, independent of any snapshot.

    `schema`/`table`: the one base table as written ("" for no schema), lower case;
    `binding`: the name its columns are qualified by (its alias, else its name);
    `conjuncts`: the WHERE terms that may bound the key; `exact`: the WHERE is nothing but
    those; `references`: every column reference's parts, lower case; `all_columns`: the
    query reads columns it does not name (`*`, `COLUMNS(...)`, `#1`); `projection`: for a
    query that is only a list of columns (each a reference, or None for `*`), that list,
    else None; `cheap`: made only of `_CHEAP_FUNCTIONS` and plain comparisons;
    `aggregates`: for a query that is only a list of plain aggregates of columns
    (engine/sql_aggregates.py), those, else None; `grouping`: for a GROUP BY of one column
    that engine/sql_groups.py answers, what it says, else None (only such a plan may have
    no conjuncts: a GROUP BY over the whole table)."""

    schema: str
    table: str
    binding: str
    conjuncts: tuple[Conjunct, ...]
    exact: bool
    references: frozenset[tuple[str, ...]]
    all_columns: bool
    projection: tuple[tuple[str, ...] | None, ...] | None
    cheap: bool
    aggregates: tuple[Aggregate, ...] | None = None
    grouping: Grouping | None = None


@dataclass(frozen=True, slots=True)
class KeyBounds:
    """The key rows a query can keep: `lo <= key <= hi` (`lo > hi`: none), and when an IN
    list named them, only `points`. `exact`: the WHERE keeps exactly these rows."""

    lo: int
    hi: int
    points: frozenset[int] | None
    exact: bool


def template(query: str, numeric_positions: Iterable[int]) -> tuple[str, tuple[int, ...]] | None:
    """`query` with each plain integer literal starting at one of `numeric_positions` (the
    tokenizer's numeric constants) replaced by `$1`, `$2`, ..., and their values; None when
    the query holds `?` or `$`."""
    if "?" in query or "$" in query:
        return None
    parts: list[str] = []
    values: list[int] = []
    last = 0
    for position in numeric_positions:
        if position < last:
            continue
        found = _PLAIN_INT.match(query, position)
        if found is None:
            continue
        parts.append(query[last:position])
        values.append(int(found.group()))
        parts.append(f"${len(values)}")
        last = found.end()
    parts.append(query[last:])
    return "".join(parts), tuple(values)


def analyse(tree: Any, values_count: int) -> KeyPlan | None:
    """The plan of a template from DuckDB's `json_serialize_sql` tree, or None when the
    query is not one the direct path may take (module docstring). `values_count`: how many
    `$n` the template holds (any other parameter refuses)."""
    if not isinstance(tree, dict) or tree.get("error") is not False:
        return None
    statements = tree.get("statements")
    if not isinstance(statements, list) or len(statements) != 1:
        return None
    node = statements[0].get("node")
    if not isinstance(node, dict) or node.get("type") != "SELECT_NODE":
        return None
    if node.get("cte_map", {}).get("map") or node.get("sample") is not None:
        return None
    source = node.get("from_table")
    if not isinstance(source, dict) or source.get("type") != "BASE_TABLE":
        return None
    if source.get("catalog_name") or source.get("sample") is not None:
        return None
    if source.get("at_clause") is not None or source.get("column_name_alias"):
        return None
    table = source.get("table_name")
    if not isinstance(table, str) or not table:
        return None
    schema = source.get("schema_name") or ""
    binding = (source.get("alias") or table).lower()
    rest = [v for k, v in node.items() if k != "from_table"]  # (not the node itself)
    references: set[tuple[str, ...]] = set()
    all_columns = False
    cheap = True
    for item in _dicts(rest):
        if "from_table" in item or item.get("type") in ("SELECT_NODE", "SET_OPERATION_NODE"):
            return None  # a subquery's own FROM
        kind = item.get("class")
        if kind == "SUBQUERY":
            return None
        if kind == "PARAMETER" and not _our_parameter(item, values_count):
            return None
        if kind == "COLUMN_REF":
            parts = item.get("column_names")
            if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
                return None
            references.add(tuple(p.lower() for p in parts))
        elif kind in ("STAR", "POSITIONAL_REFERENCE"):
            all_columns = True
        if kind == "FUNCTION":
            cheap = cheap and item.get("function_name") in _CHEAP_FUNCTIONS
        elif kind == "OPERATOR":
            cheap = cheap and item.get("type") in _CHEAP_OPERATORS
        elif kind is not None:
            cheap = cheap and kind in _CHEAP_CLASSES
    terms = list(_and_terms(node.get("where_clause")))
    conjuncts = [c for c in (_conjunct(t) for t in terms) if c is not None]
    grouping = select_grouping(node)
    if not conjuncts and grouping is None:
        return None
    return KeyPlan(
        schema=schema.lower(),
        table=table.lower(),
        binding=binding,
        conjuncts=tuple(conjuncts),
        exact=len(conjuncts) == len(terms),
        references=frozenset(references),
        all_columns=all_columns,
        projection=_projection(node, binding),
        cheap=cheap,
        aggregates=select_aggregates(node),
        grouping=grouping,
    )


def key_bounds(
    plan: KeyPlan, key: str, columns: Sequence[str], values: Sequence[int]
) -> KeyBounds | None:
    """The bounds `plan`'s conjuncts put on the integer key column `key` of a table with
    `columns`, given the query's template values; None when none bounds the key."""
    names = {c.lower(): c for c in columns}
    lo: int | None = None
    hi: int | None = None
    points: frozenset[int] | None = None
    exact = plan.exact
    bounded = False
    for conjunct in plan.conjuncts:
        if column_of(conjunct.column, plan.binding, names) != key:
            exact = False
            continue
        got = [operand.sign * values[operand.index - 1] for operand in conjunct.operands]
        bounded = True
        first = got[0]
        low, high = {
            "=": (first, first),
            "<": (_NO_LOW, first - 1),
            "<=": (_NO_LOW, first),
            ">": (first + 1, _NO_HIGH),
            ">=": (first, _NO_HIGH),
            "between": (first, got[-1]),
            "in": (min(got), max(got)),
        }[conjunct.op]
        if conjunct.op == "in":
            here = frozenset(got)
            points = here if points is None else points & here
        lo = low if lo is None else max(lo, low)
        hi = high if hi is None else min(hi, high)
    if not bounded or lo is None or hi is None:
        return None
    if points is not None:
        points = frozenset(p for p in points if lo <= p <= hi)
        if points:
            lo, hi = min(points), max(points)
        else:
            lo, hi = 1, 0
    return KeyBounds(lo, hi, points, exact)


_NO_LOW = -(1 << 200)
_NO_HIGH = 1 << 200
"""Unbounded ends: beyond any template value (at most 18 digits), so an intersection with
them is the other bound; the caller clamps to the key's type."""


def column_of(parts: tuple[str, ...], binding: str, names: dict[str, str]) -> str | None:
    """The table column a reference names (`col` or `binding.col`), given the table's
    columns by lower-case name; None for anything else (an alias, a struct field)."""
    if len(parts) == 1:
        return names.get(parts[0])
    if len(parts) == 2 and parts[0] == binding and parts[0] not in names:
        return names.get(parts[1])
    return None


def columns_read(plan: KeyPlan, columns: Sequence[str]) -> list[str] | None:
    """The columns of a table (in table order) a query names, or None when it may read any:
    `*`, or a reference to the table itself or its qualifier that is not one column (the
    whole row as a struct). A name that is not a column (a select-list alias, a lambda's
    parameter) reads nothing; a column the plan missed is a binder error, never a wrong
    answer, since DuckDB is handed only these columns (engine/sql_direct.py retries with all)."""
    if plan.all_columns:
        return None
    names = {c.lower(): c for c in columns}
    wanted: set[str] = set()
    for parts in plan.references:
        column = column_of(parts, plan.binding, names)
        if column is not None:
            wanted.add(column)
        elif parts[0] in names:
            wanted.add(names[parts[0]])  # a struct column's field
        elif plan.binding in parts or plan.table in parts or len(parts) > 2:
            return None
    return [c for c in columns if c in wanted]


def projected(plan: KeyPlan, columns: Sequence[str]) -> list[str] | None:
    """For a plan whose query only lists columns: the table's columns it lists, in order;
    None when one is not a column of this table."""
    if plan.projection is None:
        return None
    names = {c.lower(): c for c in columns}
    out: list[str] = []
    for parts in plan.projection:
        if parts is None:
            out.extend(columns)
            continue
        column = column_of(parts, plan.binding, names)
        if column is None:
            return None
        out.append(column)
    return out


def aggregated(plan: KeyPlan, columns: Sequence[str]) -> list[str | None] | None:
    """For a plan whose query only aggregates columns: the table column each aggregate
    reads (None for count(*)), in order; None when one is not a column of this table."""
    if plan.aggregates is None:
        return None
    names = {c.lower(): c for c in columns}
    out: list[str | None] = []
    for aggregate in plan.aggregates:
        if aggregate.column is None:
            out.append(None)
            continue
        column = column_of(aggregate.column, plan.binding, names)
        if column is None:
            return None
        out.append(column)
    return out


def _projection(node: dict[str, Any], binding: str) -> tuple[tuple[str, ...] | None, ...] | None:
    if not plain_select(node):
        return None
    out: list[tuple[str, ...] | None] = []
    for item in node.get("select_list") or []:
        kind = item.get("class")
        if kind == "COLUMN_REF":
            out.append(tuple(p.lower() for p in item["column_names"]))
        elif kind == "STAR" and _plain_star(item, binding):
            out.append(None)
        else:
            return None
    return tuple(out) if out else None


def _plain_star(item: dict[str, Any], binding: str) -> bool:
    for key in ("exclude_list", "replace_list", "qualified_exclude_list", "rename_list"):
        if item.get(key):
            return False
    if item.get("columns") or item.get("expr") is not None:
        return False
    relation = item.get("relation_name") or ""
    return relation == "" or relation.lower() == binding


def _and_terms(where: Any) -> Iterator[Any]:
    if where is None:
        return
    if (
        isinstance(where, dict)
        and where.get("class") == "CONJUNCTION"
        and where.get("type") == "CONJUNCTION_AND"
    ):
        for child in where.get("children") or []:
            yield from _and_terms(child)
        return
    yield where


def _conjunct(term: Any) -> Conjunct | None:
    if not isinstance(term, dict):
        return None
    kind = term.get("class")
    if kind == "COMPARISON":
        op = _COMPARISONS.get(term.get("type", ""))
        if op is None:
            return None
        left, right = term.get("left"), term.get("right")
        column, value = _column(left), _operand(right)
        if column is None or value is None:
            column, value = _column(right), _operand(left)
            op = _FLIPPED[op]
        if column is None or value is None:
            return None
        return Conjunct(column, op, (value,))
    if kind == "BETWEEN" and term.get("type") == "COMPARE_BETWEEN":
        column = _column(term.get("input"))
        low, high = _operand(term.get("lower")), _operand(term.get("upper"))
        if column is None or low is None or high is None:
            return None
        return Conjunct(column, "between", (low, high))
    if kind == "OPERATOR" and term.get("type") == "COMPARE_IN":
        children = term.get("children") or []
        column = _column(children[0]) if children else None
        operands = [_operand(c) for c in children[1:]]
        if column is None or not operands or any(o is None for o in operands):
            return None
        return Conjunct(column, "in", tuple(o for o in operands if o is not None))
    return None


def _column(item: Any) -> tuple[str, ...] | None:
    if not isinstance(item, dict) or item.get("class") != "COLUMN_REF":
        return None
    parts = item.get("column_names")
    if not isinstance(parts, list) or not 1 <= len(parts) <= 2:
        return None
    return tuple(str(p).lower() for p in parts)


def _operand(item: Any) -> Operand | None:
    if not isinstance(item, dict):
        return None
    if item.get("class") == "PARAMETER":
        index = _index(item)
        return None if index is None else Operand(index, 1)
    if (
        item.get("class") == "FUNCTION"
        and item.get("function_name") == "-"
        and item.get("is_operator") is True
        and not item.get("schema")
        and not item.get("catalog")
        and len(item.get("arguments") or []) == 1
    ):
        inner = item["arguments"][0]
        if inner.get("name"):
            return None
        found = _operand(inner.get("expression"))
        if found is not None and found.sign == 1:
            return Operand(found.index, -1)
    return None


def _index(item: dict[str, Any]) -> int | None:
    identifier = item.get("identifier")
    if not isinstance(identifier, str) or not identifier.isdigit():
        return None
    return int(identifier)


def _our_parameter(item: dict[str, Any], values_count: int) -> bool:
    index = _index(item)
    return index is not None and 1 <= index <= values_count


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _dicts(child)
    elif isinstance(value, list):
        for child in value:
            yield from _dicts(child)
