"""The commit: the record of the run written as the dataset's files, manifest.json last (a dataset
is complete only once its manifest exists). report.html follows (raypack.report.write_report_safely):
the dataset does not need it, and `raypack report` makes it again from the manifest and metrics.json."""

from __future__ import annotations

import json

from raypack.config import StorageConfig
from raypack.dataset.layout import MANIFEST, METRICS
from raypack.pipeline.record import RunRecord, manifest, metrics_document
from raypack.storage import join, remove, write_bytes, write_bytes_atomic

__all__ = ["commit"]


def commit(record: RunRecord, storage: StorageConfig) -> None:
    """The staging area removed, metrics.json, the format's dataset files, and manifest.json last."""
    out = record.output
    remove(join(out, "_staging"), storage)
    write_bytes(join(out, METRICS), json.dumps(metrics_document(record), indent=2).encode(), storage)
    for path, data in record.format_files.items():
        write_bytes(join(out, path), data, storage)
    write_bytes_atomic(join(out, MANIFEST), json.dumps(manifest(record), indent=2).encode(), storage)
