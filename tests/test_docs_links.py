"""The README and docs/*.md point at things that exist: every relative link resolves (a file, or a
heading's anchor as GitHub makes it), and every repository path they write in backticks
(`raypack/...`, `tests/...`, `benchmarks/...`, `jobs/...`, `cluster/...`, `docs/...`) is there.
A page that moves or a module that is renamed fails here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Paths a page names that are gone, left to that page's owner: docs/benchmarks.md's run notes name
# the modules as they were when each run was measured (it is being condensed, its history moved
# to docs/history/).
STALE = {
    "docs/benchmarks.md": {"raypack/pipeline/runners.py", "raypack/pipeline/zygote.py"},
}

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
REPO_PATH = re.compile(r"(?<![\w./~@:-])((?:raypack|tests|benchmarks|jobs|cluster|docs)/[\w./*\[\]-]*)")
ANCHOR_TAG = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose_and_code(text: str) -> tuple[list[str], list[str]]:
    """The page's lines outside fenced code blocks, and those inside them."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (links by their text, no markup),
    lowercased, without punctuation but `-` and `_`, each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    kept = "".join(ch for ch in text if (ch.isalnum() and ch.isascii()) or ch.isalpha() or ch in "-_ ")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = prose_and_code(page.read_text())
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose:
        found.update(ANCHOR_TAG.findall(line))
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def outside_code_spans(line: str) -> str:
    return CODE_SPAN.sub("", line)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(page: Path) -> list[str]:
    prose, _ = prose_and_code(page.read_text())
    problems = []
    for line in prose:
        for target in LINK.findall(outside_code_spans(line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                problems.append(f"{target}: no {shown(file)}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                problems.append(f"{target}: no heading #{anchor} in {shown(file)}")
    return problems


def repo_paths(page: Path) -> set[str]:
    """Repository paths the page writes in backticks: in code spans and in fenced blocks."""
    prose, code = prose_and_code(page.read_text())
    spans = [m.group(2) for line in prose for m in CODE_SPAN.finditer(line)]
    return {p.rstrip(".,:;)") for text in spans + code for p in REPO_PATH.findall(text)}


def missing_paths(page: Path) -> list[str]:
    stale = STALE.get(shown(page), set())
    missing = []
    for path in sorted(repo_paths(page) - stale):
        if any(ch in path for ch in "*?["):
            if not list(ROOT.glob(path)):
                missing.append(path)
        elif not (ROOT / path).exists():
            missing.append(path)
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_in_backticks_exists(page: Path) -> None:
    assert missing_paths(page) == []


def test_github_anchors() -> None:
    assert slug("Chat data: `parquet` with `loss_mask`, `trl`, `bridge`") == (
        "chat-data-parquet-with-loss_mask-trl-bridge"
    )
    assert slug("On a schedule (incremental rebuilds)") == "on-a-schedule-incremental-rebuilds"
    assert slug("Trainer formats: `output.format`") == "trainer-formats-outputformat"
    assert slug("`input.sources[]`") == "inputsources"
    assert slug("See [the page](x.md) now") == "see-the-page-now"


def test_a_broken_link_anchor_or_path_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "## Here\n\n[a](gone.md) [b](#nowhere) [c](#here) [d](page.md#here) [e](https://x.org/#y)\n"
        "`raypack/no_such_module.py`, `raypack/config/`, `tests/packing/*.py`\n"
        "```bash\npython benchmarks/no_such_bench.py  # [f](also-gone.md) is code\n```\n"
    )
    assert [p.split(":")[0] for p in broken_links(page)] == ["gone.md", "#nowhere"]
    assert missing_paths(page) == ["benchmarks/no_such_bench.py", "raypack/no_such_module.py"]


def test_the_runtime_env_lists_name_every_runtime_dependency() -> None:
    """jobs/README.md's and cluster/README.md's `--runtime-env-json` pip lists (a cluster that runs
    raypack from an uploaded checkout) name every dependency of pyproject.toml beyond Ray Data's own:
    a node without one fails at its first import."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\[<>=;,\s]", d, maxsplit=1)[0].lower() for d in deps} - {"ray", "numpy", "pyarrow"}
    for doc in ("jobs/README.md", "cluster/README.md"):
        text = (ROOT / doc).read_text()
        lists = re.findall(r'"pip": \[([^\]]*)\]', text.replace("\n", " "))
        assert lists, doc
        for listed in lists:
            if "raypack" in listed:
                continue  # {"pip": ["raypack"]}: the package itself, once published
            named = set(re.findall(r'"([^"]+)"', listed))
            assert names <= named, (doc, sorted(names - named))
