"""The HTML report of a packing job or a dry run: what went in, how full the packs are, what was cut,
where the time went, what was rejected (docs/output-format.md shows it)."""

from __future__ import annotations

from raypack.config import StorageConfig
from raypack.report.model import REPORT, Report, Run, from_dataset, from_dry_run
from raypack.report.page import render
from raypack.storage import join, write_bytes_atomic

__all__ = ["REPORT", "Report", "Run", "from_dataset", "from_dry_run", "render", "write_report"]


def write_report(report: Report, directory: str, storage: StorageConfig | None = None) -> str:
    """Render `report` into directory/report.html (whole or not at all); returns the path."""
    path = join(directory, REPORT)
    write_bytes_atomic(path, render(report).encode("utf-8"), storage)
    return path
