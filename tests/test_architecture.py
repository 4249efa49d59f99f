"""The house's rules, checked on the source (no imports run): no import circle between raypack's
modules (imports inside functions count: a lazy import is still a dependency), no module importing
another's private names, and job.py an executor of a few hundred lines (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "raypack"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every import in the file, resolved to raypack modules."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("raypack")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if not base.startswith("raypack"):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full, []) if full in known else (base, [a.name]))
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges: dict[str, set[str]] = {m: set() for m in found}
    for name, path in found.items():
        for target, _ in imports(name, path, known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name and not name.startswith(target + "."):
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_no_module_imports_another_modules_private_names() -> None:
    found = modules()
    known = set(found)
    private = []
    for name, path in found.items():
        for target, names in imports(name, path, known):
            # (a package's private module, raypack.packing._segtree, is imported as a module: allowed)
            private += [
                f"{name} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")
            ]
    assert private == []


def test_the_job_is_an_executor() -> None:
    lines = (PACKAGE / "pipeline" / "job.py").read_text().count("\n")
    assert lines <= 300, f"pipeline/job.py has {lines} lines: stages belong in rooms of their own"
