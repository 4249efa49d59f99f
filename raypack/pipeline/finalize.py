"""Stage 8, finalize: the record of the run written as the dataset's files, manifest.json last (a
dataset is complete only once its manifest exists), then report.html, which the dataset does not
need (made again by `raypack report` from the manifest and metrics.json alone)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from raypack.config import StorageConfig
from raypack.dataset.layout import MANIFEST, METRICS
from raypack.formats import Spec
from raypack.pipeline.record import (
    RunRecord,
    dataset_files,
    format_entry,
    manifest,
    metrics_document,
)
from raypack.storage import join, remove, write_bytes, write_bytes_atomic

__all__ = ["commit", "write_dataset_files", "write_report_safely"]


def commit(record: RunRecord, storage: StorageConfig) -> None:
    """The staging area removed, metrics.json, the format's dataset files, and manifest.json last."""
    out = record.output
    remove(join(out, "_staging"), storage)
    write_bytes(join(out, METRICS), json.dumps(metrics_document(record), indent=2).encode(), storage)
    for path, data in record.format_files.items():
        write_bytes(join(out, path), data, storage)
    write_bytes_atomic(join(out, MANIFEST), json.dumps(manifest(record), indent=2).encode(), storage)


def write_dataset_files(
    files: Sequence[dict[str, Any]], spec: Spec, out: str, storage: StorageConfig | None
) -> dict[str, Any]:
    """The format's files of a whole dataset written (raypack convert), and the manifest's `format`."""
    made = dataset_files(files, spec, out)
    for path, data in made.items():
        write_bytes(join(out, path), data, storage)
    return format_entry(files, spec, made)


def write_report_safely(out: str, storage: StorageConfig | None, log: Callable[[str], None]) -> str | None:
    """report.html, from the committed dataset as `raypack report` makes it. After the manifest: the
    dataset is complete without it, and a failure here must not cost the packed data (the page can be
    made again from manifest.json and metrics.json alone)."""
    from raypack.report import from_dataset, write_report

    try:
        return write_report(from_dataset(out, storage), out, storage)
    except Exception as e:  # any failure: the data is committed; say so and carry on
        log(f"[raypack] warning: report.html not written ({type(e).__name__}: {e}); `raypack report {out}`")
        return None
