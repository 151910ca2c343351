"""The import graph of a package, every import counted (module level and inside functions), and
the imports that run inside a function body (the lazy ones)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, *also: Path) -> dict[str, Path]:
    return {module_name(base, p): p for base in (root, *also) for p in base.rglob("*.py")}


def _import_targets(node: ast.Import | ast.ImportFrom, package: str) -> list[tuple[str, str]]:
    """(the module `from base import name` names if name is a module, else base) per alias; a
    plain `import a.b` names a.b either way."""
    if isinstance(node, ast.Import):
        return [(alias.name, alias.name) for alias in node.names]
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return [(f"{base}.{alias.name}", base) for alias in node.names]


@lru_cache(maxsize=4096)
def _statements(source: str, package: str) -> tuple[tuple[str, str, bool], ...]:
    """Every import statement of one module's source: (target if a module, fallback, whether it
    runs inside a function). Parsed once per source text: the graph tests and the room-order test
    read the same files many times in one run, and a changed file is a different key."""
    found: list[tuple[str, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((first, second, in_function)
                             for first, second in _import_targets(child, package))
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, inside)

    visit(ast.parse(source), False)
    return tuple(found)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, bool]]:
    """(imported module of the package, whether the import runs inside a function) for each
    import statement of one module (a `from pkg import name` counts as importing pkg.name when
    that is a module, else pkg)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for first, fallback, in_function in _statements(path.read_text(encoding="utf-8"), package):
        target = first if first in modules else fallback
        if target in modules and target != name:
            yield target, in_function


def imports_of(root: Path, *also: Path) -> dict[str, set[str]]:
    """module of the package → the modules of the same package (and of the packages `also`) it
    imports, wherever the import statement is."""
    own = _modules(root)
    modules = _modules(root, *also)
    return {name: {target for target, _ in _imports(name, path, modules)}
            for name, path in own.items()}


def function_level_imports(root: Path) -> set[tuple[str, str]]:
    """(importing module, imported module) for every import of the package inside a function."""
    modules = _modules(root)
    return {(name, target) for name, path in modules.items()
            for target, lazy in _imports(name, path, modules) if lazy}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found

