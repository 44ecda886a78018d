"""No import cycles (STYLE.md), and the engine's shell (engine/engine.py) in none (issue 21).

How: every module under engine/ is parsed (ast, nothing imported); each `import` and
`from ... import` becomes an edge, those under `if TYPE_CHECKING:` included (a type-only
import of `Engine` is the same coupling), with `from engine import limits` resolved to the
submodule `engine.limits`. The test then asks which modules both reach engine.engine and are
reached from it. Before issue 21 that was thirteen (replay, maintenance, the checkpointer,
rewrites, spill, scan, txn, waiter, writeset, standby, time travel, sql): each imported
`Engine` to reach into its private members. They now declare the small Protocol they need,
which `EngineCore` (engine/core.py) implements; it is in no cycle either.

The same graph over every package of ours (engine, logsvc, tae_driver, spark_jobs) must have
no cycle at all: a module importing its own package's `__init__` is not counted (Python
loads the package first either way), every other edge is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import engine

ROOT = Path(engine.__file__).parent.parent
PACKAGES = ("engine", "logsvc", "tae_driver", "spark_jobs")
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


def _modules(packages: tuple[str, ...] = ("engine",)) -> dict[str, Path]:
    found = {}
    for package in packages:
        found.update(_package_modules(package))
    return found


def _package_modules(package: str) -> dict[str, Path]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = (package, *path.relative_to(ROOT / package).with_suffix("").parts)
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


def _graph(packages: tuple[str, ...] = ("engine",)) -> dict[str, set[str]]:
    modules = _modules(packages)
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_package_of_ours_has_an_import_cycle() -> None:
    graph = _graph(PACKAGES)
    assert "logsvc.store.store" in graph  # the walk found every package
    # A module importing its own package (`from engine import limits` resolves to the
    # submodule; a bare `import engine` inside engine/ to the package) is not a cycle.
    for name, edges in graph.items():
        edges.difference_update({e for e in edges if name.startswith(e + ".")})
    assert _cycles(graph) == []
