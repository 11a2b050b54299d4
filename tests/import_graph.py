"""Which modules of the repository import which: read from the source with `ast`, nothing run.

The rules of docs/design.md ("Layout") are checked against this graph by
tests/test_import_graph.py. Every import counts, those inside functions and under
`TYPE_CHECKING` included: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Folders that hold no importable code of the project (or not ours).
SKIPPED = {".venv", ".git", "node_modules", "__pycache__", "build", "dist"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted ("scheduler_svc.core.tracker")
    path: Path
    line: int
    target: str  # the imported module, dotted and absolute ("grpc", "worker.runner.batch")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of a `from ... import` source (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(root: Path, path: Path) -> Iterator[Import]:
    """Every module one file imports. `from a import b` yields `a.b` where `b` is a submodule
    of `a` in the repository (a file or a package under root), else `a`."""
    module = module_name(root, path)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, path.name == "__init__.py", node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                folder = root.joinpath(*sub.split("."))
                is_sub = folder.with_suffix(".py").is_file() or (folder / "__init__.py").is_file()
                yield Import(module, path, node.lineno, sub if is_sub else source)


def python_files(root: Path, package: str) -> list[Path]:
    folder = root.joinpath(*package.split("."))
    return sorted(p for p in folder.rglob("*.py") if not SKIPPED & set(p.parts))


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"


@dataclass(frozen=True)
class Rule:
    """`package` may import only the standard library and `allowed` (when `only` is set), and
    never anything in `forbidden`."""

    package: str
    why: str
    forbidden: tuple[str, ...] = ()
    only: bool = False
    allowed: tuple[str, ...] = ()

    def refuses(self, target: str) -> bool:
        if any(within(target, f) for f in self.forbidden):
            return True
        if not self.only:
            return False
        return not is_stdlib(target) and not any(within(target, a) for a in self.allowed)


def violations(root: Path, rules: list[Rule]) -> list[str]:
    """One line per import that breaks a rule: file, line, what it imports, and the rule."""
    found = []
    for rule in rules:
        for path in python_files(root, rule.package):
            for imp in imports_of(root, path):
                if rule.refuses(imp.target):
                    where = f"{path.relative_to(root)}:{imp.line}"
                    found.append(f"{where} imports {imp.target}: {rule.why}")
    return found


def graph_of(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the repository modules it imports (lazy imports included), within `packages`."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path in python_files(root, package):
            graph[module_name(root, path)] = {i.target for i in imports_of(root, path)}
    return {
        name: {t for t in targets if t in graph and t != name} for name, targets in graph.items()
    }


def cycles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """Each set of modules that import one another in a circle (a strongly connected
    component of more than one module), sorted: an import inside a function hides a circle
    from Python's import machinery, not from the design."""
    graph = graph_of(root, packages)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        order[name] = low[name] = len(order)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in order:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], order[target])
        if low[name] == order[name]:
            component = stack[stack.index(name) :]
            del stack[stack.index(name) :]
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return sorted(found)
