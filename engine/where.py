"""The `--where` filter grammar of `python -m engine scan` (issue 24): a small text language
parsed into a pyarrow compute expression that the engine's scan takes as its `filter`, so
zonemaps prune blocks and only matching rows come back.

Pure: text and a table's `Schema` in, a `pc.Expression` out, or `BadFilter` naming what is
wrong and where. Nothing here reads an engine.

Grammar (keywords are case-insensitive)::

    expr       := or_expr
    or_expr    := and_expr ("OR" and_expr)*
    and_expr   := not_expr ("AND" not_expr)*
    not_expr   := "NOT" not_expr | primary
    primary    := "(" expr ")" | predicate
    predicate  := column compare literal
                | column ["NOT"] "IN" "(" literal ("," literal)* ")"
                | column "IS" ["NOT"] "NULL"
    compare    := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    column     := name [A-Za-z_][A-Za-z0-9_]* | "double-quoted name" ("" is a quote)
    literal    := ["-"] digits ["." digits] [("e"|"E") ["+"|"-"] digits]
                | 'single-quoted text' ('' is a quote) | TRUE | FALSE

A literal is typed by its column's schema: integer columns take integers within the type's
range; float columns take numbers; bool columns TRUE or FALSE; string and binary columns
quoted text (binary as its UTF-8 bytes); date32 columns 'YYYY-MM-DD'; timestamp columns
'YYYY-MM-DD[ T]HH:MM[:SS[.ffffff]]' without a time zone (the column has none). NULL is not a
literal: `x = NULL` is never true in SQL, so it is refused with a pointer to `IS NULL`.

Semantics are SQL's three-valued logic: a comparison with a null value is unknown, NOT
unknown is unknown, and a row is returned only when the whole filter is true; `x IN (...)`
with a null x is unknown too (pyarrow's `is_in` would say false, so it is wrapped).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import BadFilter
from engine.schema import Column, Schema

TEXT_CHARS_MAX = 64 * 1024
"""A filter's text: longer is refused before it is read (a command line, not a program)."""

DEPTH_MAX = 64
"""Nesting of parentheses and NOT: deeper is refused (the parser recurses)."""

IN_VALUES_MAX = 10_000
"""Literals in one IN list."""

_COMPARE = {
    "=": "==",
    "==": "==",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
_KEYWORDS = frozenset(["and", "or", "not", "in", "is", "null", "true", "false"])

_TOKEN = re.compile(
    r"""(?P<space>\s+)
    |(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
    |(?P<text>'(?:[^']|'')*')
    |(?P<quoted>"(?:[^"]|"")*")
    |(?P<word>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op><=|>=|<>|!=|==|=|<|>)
    |(?P<punct>[(),])""",
    re.VERBOSE,
)

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number | text | column | keyword | op | punct | end
    value: str
    position: int  # 0-based character offset in the filter's text


def parse(text: str, schema: Schema) -> pc.Expression:
    """The filter `text` over a table of `schema` as a pyarrow expression; `BadFilter`
    (naming the column, literal or character) when it is not one."""
    if len(text) > TEXT_CHARS_MAX:
        raise BadFilter(f"the filter is longer than {TEXT_CHARS_MAX} characters")
    parser = _Parser(_tokens(text), {c.name: c for c in schema.columns})
    expression = parser.expr(0)
    parser.expect_end()
    return expression


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise BadFilter(f"unexpected character {text[position]!r} at character {position + 1}")
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        if kind == "text":
            tokens.append(_Token("text", value[1:-1].replace("''", "'"), position))
        elif kind == "quoted":
            tokens.append(_Token("column", value[1:-1].replace('""', '"'), position))
        elif kind == "word":
            lowered = value.lower()
            if lowered in _KEYWORDS:
                tokens.append(_Token("keyword", lowered, position))
            else:
                tokens.append(_Token("column", value, position))
        elif kind != "space":
            tokens.append(_Token(kind, value, position))
        position = match.end()
    tokens.append(_Token("end", "", len(text)))
    return tokens


def _where(token: _Token) -> str:
    return "at the end" if token.kind == "end" else f"at character {token.position + 1}"


def _shown(token: _Token) -> str:
    return "the end of the filter" if token.kind == "end" else repr(token.value)


def _found(token: _Token) -> str:
    return _shown(token) if token.kind == "end" else f"{token.value!r} {_where(token)}"


class _Parser:
    def __init__(self, tokens: list[_Token], columns: dict[str, Column]) -> None:
        self._tokens = tokens
        self._at = 0
        self._columns = columns

    def _peek(self) -> _Token:
        return self._tokens[self._at]

    def _next(self) -> _Token:
        token = self._tokens[self._at]
        if token.kind != "end":
            self._at += 1
        return token

    def _keyword(self, word: str) -> bool:
        token = self._peek()
        if token.kind == "keyword" and token.value == word:
            self._at += 1
            return True
        return False

    def _punct(self, char: str) -> bool:
        token = self._peek()
        if token.kind == "punct" and token.value == char:
            self._at += 1
            return True
        return False

    def _expect_punct(self, char: str, after: str) -> None:
        if not self._punct(char):
            token = self._peek()
            raise BadFilter(f"expected {char!r} {after}, found {_found(token)}")

    def expect_end(self) -> None:
        token = self._peek()
        if token.kind != "end":
            raise BadFilter(f"unexpected {_found(token)} (join conditions with AND or OR)")

    def expr(self, depth: int) -> pc.Expression:
        if depth > DEPTH_MAX:
            raise BadFilter(f"the filter nests deeper than {DEPTH_MAX} levels")
        left = self._and(depth)
        while self._keyword("or"):
            left = left | self._and(depth)
        return left

    def _and(self, depth: int) -> pc.Expression:
        left = self._not(depth)
        while self._keyword("and"):
            left = left & self._not(depth)
        return left

    def _not(self, depth: int) -> pc.Expression:
        if self._keyword("not"):
            if depth + 1 > DEPTH_MAX:
                raise BadFilter(f"the filter nests deeper than {DEPTH_MAX} levels")
            return ~self._not(depth + 1)
        if self._punct("("):
            inner = self.expr(depth + 1)
            self._expect_punct(")", "to close a parenthesis")
            return inner
        return self._predicate()

    def _predicate(self) -> pc.Expression:
        token = self._next()
        if token.kind != "column":
            raise BadFilter(f"expected a column name, found {_found(token)}")
        column = self._columns.get(token.value)
        if column is None:
            known = ", ".join(self._columns)
            raise BadFilter(f"unknown column {token.value!r} {_where(token)} (columns: {known})")
        field = pc.field(column.name)
        if self._keyword("is"):
            negated = self._keyword("not")
            if not self._keyword("null"):
                found = self._peek()
                raise BadFilter(
                    f"expected NULL after IS{' NOT' if negated else ''}, found {_found(found)}"
                )
            return field.is_valid() if negated else field.is_null()
        negated = self._keyword("not")
        if negated or self._keyword("in"):
            if negated and not self._keyword("in"):
                found = self._peek()
                raise BadFilter(f"expected IN after NOT, found {_found(found)}")
            result = self._in_list(column, field)
            return ~result if negated else result
        op = self._next()
        if op.kind != "op":
            raise BadFilter(
                f"expected a comparison (= != < <= > >=), IN or IS after {column.name!r}, "
                f"found {_found(op)}"
            )
        value = _literal(column, self._next())
        compare = _COMPARE[op.value]
        if compare == "==":
            return field == value
        if compare == "!=":
            return field != value
        if compare == "<":
            return field < value
        if compare == "<=":
            return field <= value
        if compare == ">":
            return field > value
        return field >= value

    def _in_list(self, column: Column, field: pc.Expression) -> pc.Expression:
        self._expect_punct("(", "after IN")
        values = [_literal(column, self._next())]
        while self._punct(","):
            if len(values) >= IN_VALUES_MAX:
                raise BadFilter(f"an IN list holds at most {IN_VALUES_MAX} values")
            values.append(_literal(column, self._next()))
        self._expect_punct(")", "to close the IN list")
        value_set = pa.array([v.as_py() for v in values], type=column.arrow_type)
        # SQL: `null IN (...)` is unknown, so that NOT IN does not return the null rows.
        return pc.if_else(field.is_valid(), field.isin(value_set), pa.scalar(None, pa.bool_()))


def _literal(column: Column, token: _Token) -> pa.Scalar:
    """`token` as a scalar of `column`'s type, or BadFilter saying what that column takes."""
    kind = column.type
    where = _where(token)
    if token.kind == "keyword" and token.value == "null":
        raise BadFilter(
            f"NULL {where}: a comparison with NULL is never true; use {column.name!r} IS NULL "
            "or IS NOT NULL"
        )
    if token.kind not in ("number", "text", "keyword"):
        raise BadFilter(f"expected a value for {column.name!r}, found {_found(token)}")
    bad = BadFilter(
        f"{_shown(token)} {where} is not a value of column {column.name!r} ({kind}): "
        f"{_TAKES.get(kind, 'a literal of that type')}"
    )
    if kind in _INT_RANGES:
        if token.kind != "number" or not re.fullmatch(r"-?\d+", token.value):
            raise bad
        integer = int(token.value)
        low, high = _INT_RANGES[kind]
        if not low <= integer <= high:
            raise BadFilter(
                f"{token.value} {where} is out of the range of column {column.name!r} ({kind}: "
                f"{low}..{high})"
            )
        return pa.scalar(integer, type=column.arrow_type)
    if kind in ("float32", "float64"):
        if token.kind != "number":
            raise bad
        return pa.scalar(float(token.value), type=column.arrow_type)
    if kind == "bool":
        if token.kind != "keyword" or token.value not in ("true", "false"):
            raise bad
        return pa.scalar(token.value == "true", type=pa.bool_())
    if token.kind != "text":
        raise bad
    if kind == "string":
        return pa.scalar(token.value, type=pa.string())
    if kind == "binary":
        return pa.scalar(token.value.encode(), type=pa.binary())
    if kind == "date32":
        try:
            return pa.scalar(datetime.date.fromisoformat(token.value), type=pa.date32())
        except ValueError:
            raise bad from None
    if kind == "timestamp[us]":
        try:
            moment = datetime.datetime.fromisoformat(token.value)
        except ValueError:
            raise bad from None
        if moment.tzinfo is not None:
            raise BadFilter(
                f"{_shown(token)} {where}: column {column.name!r} is a timestamp without a "
                "time zone; give the literal without one"
            )
        return pa.scalar(moment, type=column.arrow_type)
    raise bad


_TAKES = {
    **{name: "an integer" for name in _INT_RANGES},
    "float32": "a number",
    "float64": "a number",
    "bool": "TRUE or FALSE",
    "string": "'quoted text'",
    "binary": "'quoted text' (its UTF-8 bytes)",
    "date32": "'YYYY-MM-DD'",
    "timestamp[us]": "'YYYY-MM-DD HH:MM:SS[.ffffff]' without a time zone",
}
