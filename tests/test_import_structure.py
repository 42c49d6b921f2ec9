"""The import graph's house rules that import-linter does not check: no circle inside a room (every import
counts, TYPE_CHECKING and function-level ones too), and a function-level import of our own code, the
standard library or torch says why it is deferred (docs/ARCHITECTURE.md). Optional third-party packages
are imported where they are used, so a missing one fails only its feature."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "portachat"
ALWAYS_NEEDED = {"portachat", "torch", *sys.stdlib_module_names}


def module_names(root: Path) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(name: str, path: Path, node: ast.AST, modules: dict[str, Path]) -> set[str]:
    def nearest(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    if isinstance(node, ast.Import):
        return {nearest(a.name) for a in node.names} - {None}
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    found = set()
    for alias in node.names:
        full = f"{target}.{alias.name}"
        found.add(full if full in modules else nearest(target))
    return found - {None}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    graph = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(name, path, node, modules)
        graph[name] = edges - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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


def unmarked_function_imports(root: Path) -> list[str]:
    hits = set()
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    tops = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    tops = {"portachat"} if node.level else {(node.module or "").split(".")[0]}
                else:
                    continue
                if not tops & ALWAYS_NEEDED:
                    continue  # an optional package, imported where it is used
                said = " ".join(lines[node.lineno - 2 : node.end_lineno])
                if "deferred" not in said:
                    hits.add(f"{path.relative_to(root.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return sorted(hits)


def test_no_import_circle():
    found = circles(import_graph(PACKAGE))
    assert not found, "modules that import each other (move the shared part down):\n" + "\n".join(map(str, found))


def test_function_level_imports_say_why():
    hits = unmarked_function_imports(PACKAGE)
    assert not hits, (
        "imports inside functions without a '# deferred: <why>' note (hoist them, or say why they wait):\n"
        + "\n".join(hits)
    )


def test_checks_catch_a_circle_and_an_unmarked_import(tmp_path):
    pkg = tmp_path / "portachat"
    (pkg / "room").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "room" / "__init__.py").write_text("")
    (pkg / "room" / "a.py").write_text("from portachat.room.b import g\n")
    (pkg / "room" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from portachat.room import a\n"
        "def g():\n    import json\n    return json\n"
        "def h():\n    import numpy  # an optional package: fine\n    return numpy\n"
        "def k():\n    # deferred: loads torch\n    import torch\n    return torch\n"
    )
    assert circles(import_graph(pkg)) == [["portachat.room.a", "portachat.room.b"]]
    assert unmarked_function_imports(pkg) == ["portachat/room/b.py:5: import json"]
