"""pysyncobj's private state is touched by the Raft adapter's modules only, and every
private name they touch is listed, with why, in `ShardRaft`'s docstring (STYLE.md: "one
adapter that alone touches pysyncobj, each reach-in listed with why").

How: every module of logsvc/ and spark_jobs/ is parsed (ast, so a docstring naming a
private does not count); the name-mangled privates of pysyncobj's classes (`_SyncObj__x`,
`_TcpConnection__x`, `_TcpServer__x`, `_FastQueue__x`) it reads, writes, defines or
declares are collected; outside the adapter's modules there must be none, and inside each
must be listed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from logsvc.shard.raft.adapter import ShardRaft

ROOT = Path(__file__).resolve().parents[3]
_PARTS = (
    "adapter",
    "adapter_base",
    "elections",
    "listener",
    "message_fixes",
    "quiet",
    "snapshot_points",
)
ADAPTER_MODULES = frozenset(f"logsvc/shard/raft/{name}.py" for name in _PARTS)
_MANGLED = re.compile(r"^_(SyncObj|TcpConnection|TcpServer|FastQueue)__\w+$")


def _privates(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.append(node.name)
        found.update(name for name in names if _MANGLED.match(name))
    return found


def _by_module() -> dict[str, set[str]]:
    result = {}
    for top in ("logsvc", "spark_jobs", "engine", "tae_driver"):
        for path in sorted((ROOT / top).rglob("*.py")):
            privates = _privates(path)
            if privates:
                result[str(path.relative_to(ROOT))] = privates
    return result


def test_only_the_adapter_modules_touch_pysyncobj_privates() -> None:
    outside = {m: sorted(p) for m, p in _by_module().items() if m not in ADAPTER_MODULES}
    assert outside == {}


def test_every_private_the_adapter_touches_is_listed_in_its_docstring() -> None:
    doc = ShardRaft.__doc__ or ""
    touched = set().union(*(p for m, p in _by_module().items() if m in ADAPTER_MODULES))
    assert touched, "the scan found nothing: it is broken"
    unlisted = sorted(
        name
        for name in touched
        # Listed as `__name` (SyncObj's) or in full (the connection's and queue's).
        if f"`__{name.split('__', 1)[1]}" not in doc and name not in doc
    )
    assert unlisted == []
