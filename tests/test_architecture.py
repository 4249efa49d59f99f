"""The house's rules, checked on the source (no imports run): no import circle between raypack's
modules (imports inside functions count: a lazy import is still a dependency), no module importing
another's private names, nothing importing upward across the rooms, no runner named outside the
engine, the dataset's tools apart from the pipeline, and job.py an executor of a few hundred lines
(docs/architecture.md).

`python -m tests.test_architecture [PACKAGE_DIR]` prints the structure's figures (of another
checkout's raypack/ when given: what the rules measure, before and after a change)."""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

PACKAGE = Path(os.environ.get("RAYPACK_PACKAGE_DIR") or Path(__file__).resolve().parents[1] / "raypack")


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


# The rooms in the order data flows through them, lowest first: a module imports only from its own
# room or from rooms below it (docs/architecture.md). A room is a package (raypack/text/, ...), a
# stage folder of the pipeline, or a top-level module.
LAYERS: list[set[str]] = [
    {"errors", "paths", "schema", "progress", "_version"},
    {"packing", "balance"},
    {"metrics", "config"},
    {"mixture", "storage"},
    {"text"},
    {"corpus", "formats"},
    {"dataset"},
    {"engine", "report"},
    {"pipeline.read"},
    {"pipeline.tokenize"},
    {"pipeline.place"},
    {"pipeline.write"},
    {"pipeline"},
    {
        "verifier",
        "convert",
        "dryrun",
        "plan_sample",
        "summary",
        "demo",
        "reader",
        "torch_data",
        "shared_groups",
        "inspector",
    },
    {"raypack", "cli"},
]
STAGES = ("read", "tokenize", "place", "write")


def room(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "raypack"
    if parts[0] == "pipeline" and len(parts) > 1 and parts[1] in STAGES:
        return f"pipeline.{parts[1]}"
    return parts[0]


def layer(module: str) -> int:
    found = [k for k, rooms in enumerate(LAYERS) if room(module) in rooms]
    assert found, f"{module} is in no room of LAYERS: give its room a place"
    return found[0]


def test_nothing_imports_upward() -> None:
    upward = [
        f"{a} ({room(a)}) imports {b} ({room(b)})"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert upward == []


def test_no_runner_is_named_outside_the_engine() -> None:
    """What differs between runners is declared (Runner.shares_disk, inherits_preload, where) or a
    method of the protocol: no module outside raypack/engine/ names a runner's class or asks which
    one it has."""
    named = re.compile(r"\b(LocalRunner|RayRunner|LocalPool)\b|runner\.name\s*[=!]=")
    found = [
        f"{name}: {line.strip()}"
        for name, path in modules().items()
        if room(name) != "engine"
        for line in path.read_text().splitlines()
        if named.search(line)
    ]
    assert found == []


def test_the_tools_around_a_dataset_read_through_dataset_not_the_pipeline() -> None:
    """verify, convert, the report, the reader and the rooms below the pipeline import nothing of
    raypack.pipeline: what a finished dataset is lives in raypack.dataset."""
    edges = graph()
    tools = {
        "verifier",
        "convert",
        "report",
        "reader",
        "torch_data",
        "shared_groups",
        "dryrun",
        "plan_sample",
        "inspector",
    }
    below = {"text", "corpus", "dataset", "engine", "formats", "packing", "config", "storage"}
    found = [
        f"{a} imports {b}"
        for a, targets in edges.items()
        if room(a) in tools | below
        for b in targets
        if b.startswith("raypack.pipeline")
    ]
    assert found == []


def test_text_reads_storage_in_one_module() -> None:
    """raypack.text is text in, ids out: only text/files.py reads the tokenizer's and the chat
    template's files from storage."""
    found = [
        a
        for a, targets in graph().items()
        if room(a) == "text" and a != "raypack.text.files" and "raypack.storage" in targets
    ]
    assert found == []


# Lines a function may hold, and the cyclomatic complexity it may reach (radon's grade C; D starts at
# 21), without a comment on the line above its `def` that says why it is not split (`# one piece:`).
MAX_LINES = 80
MAX_COMPLEXITY = 20


def test_long_or_branchy_functions_say_why_they_are_one_piece() -> None:
    from radon.complexity import cc_visit

    found = []
    for name, path in modules().items():
        source = path.read_text()
        lines = source.splitlines()
        blocks = cc_visit(source)
        functions = {
            f.lineno: f for b in blocks for f in getattr(b, "methods", [b]) if hasattr(f, "closures")
        }
        for fn in functions.values():
            size = fn.endline - fn.lineno + 1
            if size <= MAX_LINES and fn.complexity <= MAX_COMPLEXITY:
                continue
            if True:
                start = fn.lineno - 1
                while start > 0 and lines[start - 1].lstrip().startswith("@"):
                    start -= 1
                above = lines[start - 1].strip() if start > 0 else ""
                if not above.startswith("# one piece:"):
                    found.append(
                        f"{name}:{fn.lineno} {fn.fullname}: {size} lines, complexity {fn.complexity}"
                    )
    assert found == [], "\n".join(found)


def figures() -> dict[str, object]:
    """The structure in numbers: import circles, modules that import the package's face (raypack),
    the biggest room's share of the lines, modules that name a runner class or branch on its kind,
    and functions over MAX_LINES lines or MAX_COMPLEXITY."""
    from radon.complexity import cc_visit

    found, edges = modules(), graph()
    lines = {name: path.read_text().count("\n") for name, path in found.items()}
    rooms: dict[str, int] = {}
    for name, n in lines.items():
        parts = name.split(".")
        key = (
            ".".join(parts[:2])
            if len(parts) > 2 or (len(parts) == 2 and found[name].name == "__init__.py")
            else "raypack (top-level modules)"
        )
        rooms[key] = rooms.get(key, 0) + n
    biggest = max(rooms, key=lambda r: rooms[r])
    named = re.compile(r"\b(LocalRunner|RayRunner|LocalPool)\b|runner\.name\s*[=!]=|isinstance\(runner")
    runner_names = sorted(
        name
        for name, path in found.items()
        if ".engine" not in name
        and ".pipeline.runners" not in name
        and "local_pool" not in name
        and "zygote" not in name
        and named.search(path.read_text())
    )
    long = []
    for name, path in found.items():
        for b in cc_visit(path.read_text()):
            for fn in getattr(b, "methods", [b]):
                if hasattr(fn, "closures") and (
                    fn.endline - fn.lineno + 1 > MAX_LINES or fn.complexity > MAX_COMPLEXITY
                ):
                    long.append(f"{name}.{fn.fullname}")
    return {
        "modules": len(found),
        "lines": sum(lines.values()),
        "import circles": len(cycles(edges)),
        "modules importing the package's face": sorted(
            name
            for name, path in found.items()
            if any(t == "raypack" for t, _ in imports(name, path, set(found)))
        ),
        "rooms' lines": dict(sorted(rooms.items(), key=lambda kv: -kv[1])),
        "biggest room": f"{biggest}: {rooms[biggest]:,} lines, {rooms[biggest] / sum(lines.values()):.0%}",
        "modules naming a runner": runner_names,
        f"functions over {MAX_LINES} lines or complexity {MAX_COMPLEXITY}": len(long),
    }


if __name__ == "__main__":
    if len(sys.argv) > 1:
        PACKAGE = Path(sys.argv[1]).resolve()
    for key, value in figures().items():
        print(f"{key}: {value}")
