"""The engine's shell (engine/engine.py) is in no import cycle (issue 21).

How: every module under engine/ is parsed (ast, nothing imported); each `import` and
`from ... import` becomes an edge, those under `if TYPE_CHECKING:` included (a type-only
import of `Engine` is the same coupling), with `from engine import limits` resolved to the
submodule `engine.limits`. The test then asks which modules both reach engine.engine and are
reached from it. Before issue 21 that was thirteen (replay, maintenance, the checkpointer,
rewrites, spill, scan, txn, waiter, writeset, standby, time travel, sql): each imported
`Engine` to reach into its private members. They now declare the small Protocol they need,
which `EngineCore` (engine/core.py) implements; it is in no cycle either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import engine

ENGINE_DIR = Path(engine.__file__).parent
SHELL = "engine.engine"

HOSTED = (
    "engine.core",
    "engine.txn",
    "engine.workspace",
    "engine.snapshot_reads",
    "engine.scan",
    "engine.spill",
    "engine.waiter",
    "engine.replay",
    "engine.standby",
    "engine.maintenance",
    "engine.rewrite_commit",
    "engine.writeset",
    "engine.time_travel",
    "engine.checkpoint.runner",
    "engine.cn.node",
)
"""Modules the engine hosts: each names what it needs as a Protocol, never `Engine`."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in ENGINE_DIR.rglob("*.py"):
        parts = ("engine", *path.relative_to(ENGINE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The engine modules `name` imports (type-only imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                named.add(submodule if submodule in modules else base)
    edges = set()
    for target in named:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_sees_type_only_and_package_imports() -> None:
    graph = _graph()
    # engine/__init__.py imports Engine only under TYPE_CHECKING (its __getattr__ is lazy).
    assert SHELL in graph["engine"]
    # `from engine import limits, replay`, not an edge to the package.
    assert "engine.replay" in graph[SHELL]
    assert "engine.limits" in graph[SHELL]


def test_no_import_cycle_through_the_engine_shell_or_its_core() -> None:
    graph = _graph()
    for hub in (SHELL, "engine.core"):
        in_cycle = sorted(m for m in _reachable(graph, hub) if hub in _reachable(graph, m))
        assert in_cycle == [], f"modules in an import cycle with {hub}: {in_cycle}"


def test_hosted_modules_do_not_import_the_shell() -> None:
    graph = _graph()
    importing = [name for name in HOSTED if SHELL in graph[name]]
    assert importing == [], f"import engine.engine (use their host Protocol): {importing}"
