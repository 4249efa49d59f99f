"""docs/configuration.md is what raypack/config/ renders (raypack.config.reference), and every key and
section there has a description: a key added without a docstring under its field fails here."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from raypack.config import InputConfig, JobConfig, SourceConfig
from raypack.config.reference import PAGE, descriptions, main, render, sections


def test_the_committed_page_is_what_the_code_renders() -> None:
    assert PAGE.read_text() == render(), "run: python -m raypack.config.reference --write"


def test_every_section_and_key_has_a_description() -> None:
    missing = [f"{s.name} (the section)" for s in sections() if not s.description]
    missing += [f"{s.name}.{k.name}" for s in sections() for k in s.keys if not k.description]
    assert missing == [], "give each a docstring under its field (or the class's, for a section)"


def test_every_key_of_every_section_is_on_the_page() -> None:
    """The sections are JobConfig's fields and the entries of its lists of sections, so a new
    section or key appears without a line anywhere else."""
    hints = typing.get_type_hints(JobConfig)
    want = {
        (f.name, k.name) for f in dataclasses.fields(JobConfig) for k in dataclasses.fields(hints[f.name])
    }
    want |= {("input.sources[]", k.name) for k in dataclasses.fields(SourceConfig)}
    assert {(s.name, k.name) for s in sections() for k in s.keys} == want
    page = render()
    assert all(f"| `{key}` |" in page for _, key in want)


def test_a_field_without_a_docstring_is_found() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Said:
        """A section."""

        plain: int = 0
        told: int = 1
        """What told is."""

    assert descriptions(Said) == {"": "A section.", "plain": "", "told": "What told is."}


def test_descriptions_are_the_docstrings_under_the_fields() -> None:
    said = descriptions(InputConfig)
    assert said["text_field"] == "The field (jsonl) or column (parquet) holding the document text."
    assert set(said) == {"", *(f.name for f in dataclasses.fields(InputConfig))}


def test_allowed_values_and_defaults_are_the_codes(tmp_path: Path) -> None:
    page = render()
    assert "| `format` | string | `jsonl` | `jsonl`, `parquet`, `text` |" in page
    assert "| `path` | string | required |" in page
    assert "`268435456 (256 MiB)`" in page


def test_check_says_when_the_page_is_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "configuration.md"
    assert main(["--check", "--path", str(page)]) == 1  # no page
    assert main(["--write", "--path", str(page)]) == 0
    assert main(["--check", "--path", str(page)]) == 0
    page.write_text(page.read_text().replace("Tokens per pack", "Tokens a pack"))
    assert main(["--check", "--path", str(page)]) == 1
    assert "--write" in capsys.readouterr().err
