"""The package structure, computed from the source: no package import cycles anywhere in
tfservo/, and the kernel (`core`) imports nothing of tfservo above it.

Every import counts — at module level, inside functions, under TYPE_CHECKING — since each is a
dependency a reader has to follow. A package is a directory with an `__init__.py`; a module's
imports are its package's."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tfservo

ROOT = Path(tfservo.__file__).parent


def _package(module: str, packages: set[str]) -> str:
    """The package a dotted module name belongs to (a package names itself)."""
    while module not in packages:
        module = module.rpartition(".")[0]
    return module


def _imports(path: Path, root: Path, packages: set[str]) -> Iterator[str]:
    """Every tfservo module `path` imports, as a dotted name."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    here = ".".join(parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from tfservo.x import y`: y may be a module of package tfservo.x
            names = [f"{base}.{alias.name}" for alias in node.names] if base in packages else [base]
        else:
            continue
        yield from (name for name in names if name == "tfservo" or name.startswith("tfservo."))


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Package -> the packages it imports, for the tree at `root` (a `tfservo` directory)."""
    packages = {".".join(p.parent.relative_to(root.parent).parts) for p in root.rglob("__init__.py")}
    graph: dict[str, set[str]] = {package: set() for package in packages}
    for path in root.rglob("*.py"):
        source = _package(".".join(path.relative_to(root.parent).with_suffix("").parts), packages)
        for name in _imports(path, root, packages):
            target = _package(name, packages)
            if target != source:
                graph[source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_package_import_cycles() -> None:
    graph = package_graph()
    found = cycles(graph)
    ties = {
        " <-> ".join(component): sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
        for component in found
    }
    assert not found, f"package import cycles: {ties}"


def test_the_kernel_imports_nothing_above_it() -> None:
    graph = package_graph()
    assert graph["tfservo.core"] == set(), sorted(graph["tfservo.core"])


def test_the_graph_sees_imports_in_functions_and_under_type_checking(tmp_path: Path) -> None:
    """The reader the tests above trust, on a tree of its own: a function-level, a relative and a
    TYPE_CHECKING import each count, and a cycle through them is found."""
    root = tmp_path / "tfservo"
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tfservo.http.app import App\n"
        "def f():\n    from tfservo.grpc import endpoint\n",
        "http/__init__.py": "",
        "http/app.py": "from ..core import a\n",
        "grpc/__init__.py": "",
        "grpc/endpoint.py": "import tfservo.core\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = package_graph(root)
    assert graph["tfservo.core"] == {"tfservo.http", "tfservo.grpc"}
    assert graph["tfservo.http"] == {"tfservo.core"}
    assert cycles(graph) == [["tfservo.core", "tfservo.grpc", "tfservo.http"]]


_ENVIRON = {"environ", "getenv", "putenv", "unsetenv", "environb"}


def _environment_uses(path: Path) -> list[int]:
    """Lines of `path` that read or write the process environment through `os`."""
    tree = ast.parse(path.read_text(), str(path))
    lines = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in _ENVIRON
             and isinstance(node.value, ast.Name) and node.value.id == "os"]
    lines += [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module == "os"
              and any(alias.name in _ENVIRON for alias in node.names)]
    return sorted(lines)


def test_only_the_environment_module_touches_the_process_environment() -> None:
    """Settings and the few other variables are read, and child processes' variables
    exported, in core/environment.py only: one place to find what tfservo reads from the
    environment and what it changes there."""
    owner = ROOT / "core" / "environment.py"
    found = {str(path.relative_to(ROOT)): lines for path in sorted(ROOT.rglob("*.py"))
             if path != owner and (lines := _environment_uses(path))}
    assert found == {}
    assert _environment_uses(owner)  # the check reads what it should
