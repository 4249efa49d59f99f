"""An output directory's life around a job or a conversion: checked before any work (check_output),
cleared for the new dataset (clear_output: on a local output, the dataset it replaces set aside,
raypack.dataset.previous), and, where the job fails or was killed, that dataset put back
(restore_output, recover_output)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import suppress

import pyarrow.fs as pafs

from raypack.config import StorageConfig
from raypack.dataset import previous
from raypack.dataset.layout import LATEST, MANIFEST, METRICS, REJECTS, REPORT, UNIT_INDEX
from raypack.errors import ConfigError
from raypack.formats import INDEX_DIR
from raypack.formats.bridge import METADATA as BRIDGE_METADATA
from raypack.formats.megatron import DATA_ARGS
from raypack.formats.olmo import MASK_DIR
from raypack.paths import is_uri
from raypack.storage import exists, join, remove, remove_temporaries, resolve

__all__ = ["OUTPUT_PARTS", "Clearing", "check_output", "clear_output", "recover_output", "restore_output"]

# Everything a job writes under its output (formats' own files included), removed before it starts.
OUTPUT_PARTS = (
    MANIFEST,
    METRICS,
    REPORT,
    "data",
    INDEX_DIR,
    MASK_DIR,
    DATA_ARGS,
    BRIDGE_METADATA,
    UNIT_INDEX,
    REJECTS,
    previous.FAILED_REJECTS,
    "_staging",
)


def check_output(out: str, storage: StorageConfig, overwrite: bool) -> None:
    """Refuse to write over a complete dataset without --overwrite, or into a rebuild's root; an
    unreachable or unauthorized output fails here, before any work."""
    fs, inner = resolve(out, storage)  # a mistyped URI, named as the user wrote it
    try:
        if fs.get_file_info(inner).type == pafs.FileType.File:  # the user's to fix: not a storage error
            raise ConfigError(f"output {out} is a file: name a directory (it is made if it is not there)")
        holds_dataset = exists(join(out, MANIFEST), storage)
        holds_versions = exists(join(out, LATEST), storage)
        bucket = _missing_bucket(out, storage)
    except OSError as e:
        raise ConfigError(f"cannot reach output {out}: {str(e).strip().splitlines()[0]}") from None
    if not is_uri(out):
        _check_writable(out)
    if bucket is not None:
        raise ConfigError(
            f"output {out}: bucket {bucket!r} does not exist; raypack writes into an existing bucket "
            f"(create it first, e.g. `aws s3 mb s3://{bucket}`)"
        )
    if holds_versions:
        raise ConfigError(f"{out} holds versioned datasets (LATEST): use `raypack rebuild`, or another path")
    if holds_dataset and not overwrite:
        raise ConfigError(
            f"{out} already holds a dataset (manifest.json); pass --overwrite (overwrite=True from Python) "
            "to replace it"
        )


def _check_writable(out: str) -> None:
    """ConfigError unless a directory can be made at local path `out` (or in it, where it is one):
    found here, before any work, not by the first write task after the tokenize stage. The test is
    a directory made and removed in the deepest part of the path that exists."""
    path = os.path.abspath(out)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if os.path.islink(path) and not os.path.exists(path):
        raise ConfigError(f"output {out}: {path} is a symbolic link to nothing ({os.readlink(path)})")
    if not os.path.isdir(path):
        raise ConfigError(f"output {out}: {path} is a file, so no directory can be made under it")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".raypack-probe-", dir=path))
    except OSError as e:
        raise ConfigError(
            f"output {out} cannot be written: no directory can be made in {path} ({e.strerror or e})"
        ) from None


def _missing_bucket(out: str, storage: StorageConfig) -> str | None:
    """The bucket (container) of a URI output when it does not exist: the first write would fail
    there, in a task, after the tokenize stage had begun."""
    if not is_uri(out):
        return None
    fs, inner = resolve(out, storage)
    bucket = inner.split("/", 1)[0]
    return bucket if fs.get_file_info(bucket).type == pafs.FileType.NotFound else None


def clear_output(out: str, storage: StorageConfig) -> None:
    """Clear the output for a new dataset: a previous one set aside on a local output (kept until
    the new one is committed: raypack.dataset.previous), else removed, manifest first, so a crash
    mid-way never leaves one that looks complete; and the `.tmp-*` files a killed run's atomic
    writes left (storage.atomic_output)."""
    previous.set_aside(out, OUTPUT_PARTS)
    for part in OUTPUT_PARTS:
        remove(join(out, part), storage)
    remove_temporaries(out, storage)


class Clearing:
    """clear_output of one output, once, when first called: a job clears its output once nothing can
    refuse the job any more, before its first task writes there."""

    def __init__(self, out: str, storage: StorageConfig) -> None:
        self.out, self.storage = out, storage
        self.done = False

    def __call__(self) -> None:
        if not self.done:
            clear_output(self.out, self.storage)
            self.done = True


def restore_output(out: str, log: Callable[[str], None], what: str) -> None:
    """After a job (`what`: "job", "conversion") failed or was stopped: the dataset it was to replace
    put back (previous.restore). Best effort, in the failure's own path: where it cannot be, the
    next job on this output puts it back (recover_output), and the error to see is the job's."""
    with suppress(Exception):
        if previous.restore(out, OUTPUT_PARTS):
            log(f"[raypack] {out} holds the dataset it held before this {what}")


def recover_output(out: str, log: Callable[[str], None]) -> None:
    """Settle what a job killed while replacing the dataset at `out` left (previous.recover)."""
    note = previous.recover(out, OUTPUT_PARTS)
    if note is not None:
        log(f"[raypack] {note}")
