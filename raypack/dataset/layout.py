"""The layout of a rebuilt output: versions side by side and a pointer to the newest complete one.

    <root>/v=000001/        a complete dataset (manifest.json present)
    <root>/v=000002/        another; a directory without manifest.json is a crashed run's leftover
    <root>/LATEST           "v=000002": the version readers use; moved only after its manifest exists
    <root>/_cache/tokens/   token files by cache key (raypack.pipeline.tokenize.stage.token_key)

A reader given <root> follows LATEST, so it sees the previous version or the new one, never a part.
One rebuild at a time per root, by the lease in <root>/_lease.json (raypack.dataset.lease).
"""

from __future__ import annotations

import re

import pyarrow.fs as pafs

from raypack.config import StorageConfig
from raypack.errors import ConfigError
from raypack.storage import exists, join, list_dir, read_bytes, remove, write_bytes_atomic

__all__ = [
    "CACHE",
    "LATEST",
    "MANIFEST",
    "METRICS",
    "REJECTS",
    "REPORT",
    "UNIT_INDEX",
    "complete_versions",
    "index_path",
    "latest_version",
    "list_versions",
    "next_version",
    "overflow_rejects_path",
    "prune_versions",
    "rejects_path",
    "remove_incomplete",
    "resolve_dataset",
    "set_latest",
    "version_name",
]

LATEST = "LATEST"
MANIFEST = "manifest.json"
METRICS = "metrics.json"  # beside the manifest in every dataset: how its packing went
REPORT = "report.html"  # beside them: the run's page, made again by `raypack report` from those two
UNIT_INDEX = "index"  # a work unit's documents: where each lies in the packs (index_path)
REJECTS = "rejects"  # a work unit's records that are no document, with the reason (rejects_path)
CACHE = "_cache"
_VERSION = re.compile(r"^v=(\d+)$")


def index_path(output: str, shard: int, staged: bool = False) -> str:
    """A shard's index file; `staged`: the tokenize stage's, in the staging area, from which a
    mixture's select tasks write the final one (so that a retried task reads what it read before)."""
    parts = ("_staging", UNIT_INDEX) if staged else (UNIT_INDEX,)
    return join(output, *parts, f"shard-{shard:06d}.parquet")


def rejects_path(output: str, unit: int) -> str:
    """The rejects file of work unit `unit` in a dataset: every record of it that is not a document,
    with its reason."""
    return join(output, REJECTS, f"shard-{unit:06d}.parquet")


def overflow_rejects_path(output: str, unit: int) -> str:
    """The rejects of work unit `unit` that pack.overflow makes (truncate: a document's tokens past
    seq_len; drop: the whole document), beside its rejects file: written by each job, as they depend
    on its seq_len, where a token store's entry holds only what tokenizing found."""
    return join(output, REJECTS, f"shard-{unit:06d}.overflow.parquet")


def version_name(number: int) -> str:
    return f"v={number:06d}"


def list_versions(root: str, storage: StorageConfig | None = None) -> list[int]:
    """Numbers of every version directory under root, complete or not, ascending."""
    numbers = []
    for info in list_dir(root, storage):
        m = _VERSION.match(info.base_name)
        if m and info.type == pafs.FileType.Directory:
            numbers.append(int(m.group(1)))
    return sorted(numbers)


def complete_versions(root: str, storage: StorageConfig | None = None) -> list[int]:
    return [n for n in list_versions(root, storage) if exists(join(root, version_name(n), MANIFEST), storage)]


def latest_version(root: str, storage: StorageConfig | None = None) -> int | None:
    """The version LATEST points to, or None when there is no LATEST."""
    path = join(root, LATEST)
    if not exists(path, storage):
        return None
    text = read_bytes(path, storage).decode("utf-8", errors="replace").strip()
    m = _VERSION.match(text)
    if m is None:
        raise ConfigError(f"{path} holds {text[:40]!r}, not a version name like v=000001")
    return int(m.group(1))


def next_version(root: str, storage: StorageConfig | None = None) -> int:
    """One past every version ever started here, so a crashed run's number is never reused."""
    numbers = list_versions(root, storage)
    return (numbers[-1] if numbers else 0) + 1


def set_latest(root: str, number: int, storage: StorageConfig | None = None) -> None:
    """Point LATEST at version `number`; never backwards: a LATEST already at `number` or newer is a
    RuntimeError (two rebuilds of one root, one without the lease), and is left as it is."""
    current = latest_version(root, storage)
    if current is not None and current >= number:
        raise RuntimeError(
            f"{join(root, LATEST)} already names {version_name(current)}; not moving it back to "
            f"{version_name(number)}"
        )
    write_bytes_atomic(join(root, LATEST), f"{version_name(number)}\n".encode(), storage)


def remove_incomplete(root: str, storage: StorageConfig | None = None) -> list[int]:
    """Delete version directories without a manifest (a crashed run's); never the one LATEST names."""
    latest = latest_version(root, storage)
    removed = []
    for n in list_versions(root, storage):
        if n != latest and not exists(join(root, version_name(n), MANIFEST), storage):
            remove(join(root, version_name(n)), storage)
            removed.append(n)
    return removed


def prune_versions(root: str, keep: int, storage: StorageConfig | None = None) -> list[int]:
    """Delete the oldest complete versions beyond `keep` (never the one LATEST names); returns them."""
    latest = latest_version(root, storage)
    complete = complete_versions(root, storage)
    old = [n for n in complete[: max(0, len(complete) - keep)] if n != latest]
    for n in old:
        # Manifest first: a crash mid-delete leaves an incomplete version, which the next run sweeps.
        remove(join(root, version_name(n), MANIFEST), storage)
        remove(join(root, version_name(n)), storage)
    return old


def resolve_dataset(path: str, storage: StorageConfig | None = None) -> str:
    """The dataset directory a reader should open: `path` itself when it holds a manifest, else the
    version its LATEST names (a rebuild's root), else `path` (which readers then report incomplete)."""
    if exists(join(path, MANIFEST), storage):
        return path
    latest = latest_version(path, storage)
    return join(path, version_name(latest)) if latest is not None else path
