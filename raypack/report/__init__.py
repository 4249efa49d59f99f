"""The HTML report of a packing job or a dry run: what went in, how full the packs are, what was cut,
where the time went, what was rejected (docs/output-format.md shows it)."""

from __future__ import annotations

from collections.abc import Callable

from raypack.config import StorageConfig
from raypack.dataset.layout import REPORT
from raypack.report.model import Report, Run, from_dataset, from_dry_run
from raypack.report.page import render
from raypack.storage import join, write_bytes_atomic

__all__ = [
    "REPORT",
    "Report",
    "Run",
    "from_dataset",
    "from_dry_run",
    "render",
    "write_report",
    "write_report_safely",
]


def write_report(report: Report, directory: str, storage: StorageConfig | None = None) -> str:
    """Render `report` into directory/report.html (whole or not at all); returns the path."""
    path = join(directory, REPORT)
    write_bytes_atomic(path, render(report).encode("utf-8"), storage)
    return path


def write_report_safely(out: str, storage: StorageConfig | None, log: Callable[[str], None]) -> str | None:
    """report.html, from the committed dataset as `raypack report` makes it. After the manifest: the
    dataset is complete without it, and a failure here must not cost the packed data (the page can be
    made again from manifest.json and metrics.json alone)."""
    try:
        return write_report(from_dataset(out, storage), out, storage)
    except Exception as e:  # any failure: the data is committed; say so and carry on
        log(f"[raypack] warning: report.html not written ({type(e).__name__}: {e}); `raypack report {out}`")
        return None
