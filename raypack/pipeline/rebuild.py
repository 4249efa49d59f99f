"""`raypack rebuild`: a scheduled, incremental, atomic rebuild of a packed dataset.

Each run writes a new version under the output root (raypack.versions) with the ordinary job, whose
token files live in `<root>/_cache/tokens/` keyed by each shard's fingerprint and the tokenization
settings: unchanged shards are read from the cache, new or changed ones tokenized, removed ones drop out.
Packing always runs over the whole corpus (it takes seconds), so a rebuild's data files are byte for byte
those of a from-scratch run on the same inputs. Only then does LATEST move to the new version; old
versions beyond output.keep_versions and cache entries no version uses are deleted last.

A crash at any point leaves LATEST on the previous complete version. The next run deletes the crashed
version's directory and reuses every token file that was finished (the key its footer gets last says so;
an unfinished one is tokenized again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from raypack.config import JobConfig
from raypack.errors import ConfigError
from raypack.pipeline.job import JobResult, run_job
from raypack.storage import TMP_PREFIX, exists, join, list_dir, remove
from raypack.versions import (
    CACHE,
    MANIFEST,
    next_version,
    prune_versions,
    remove_incomplete,
    set_latest,
    version_name,
)

__all__ = ["RebuildResult", "cache_dir", "run_rebuild"]


@dataclass
class RebuildResult:
    job: JobResult
    version: str
    """The new version's directory name (v=NNNNNN), which LATEST now names."""
    removed_versions: list[int]
    """Old complete versions deleted beyond output.keep_versions."""
    swept_versions: list[int]
    """Crashed runs' incomplete versions deleted before this run."""
    cache_entries_removed: int


def cache_dir(root: str) -> str:
    return join(root, CACHE, "tokens")


def run_rebuild(cfg: JobConfig, *, log: Callable[[str], None] = print) -> RebuildResult:
    root, storage = cfg.output.path, cfg.storage
    try:
        if exists(join(root, MANIFEST), storage):
            raise ConfigError(
                f"{root} holds a dataset written by `raypack pack`; a rebuild needs its own output root"
            )
        number = next_version(root, storage)  # before the sweep: a crashed run's number is never reused
        swept = remove_incomplete(root, storage)
    except OSError as e:
        raise ConfigError(f"cannot reach output {root}: {str(e).strip().splitlines()[0]}") from None
    name = version_name(number)
    version_cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, path=join(root, name)))
    job = run_job(version_cfg, cache=cache_dir(root), log=log)
    set_latest(root, number, storage)
    removed = prune_versions(root, cfg.output.keep_versions, storage)
    dropped = _prune_cache(cache_dir(root), set(job.token_keys), cfg)
    return RebuildResult(job, name, removed, swept, dropped)


def _prune_cache(directory: str, keep: set[str], cfg: JobConfig) -> int:
    """Delete token files (and their rejects) that this version does not use, and leftover temporary
    files: the cache holds exactly the current corpus, so it never grows past one tokenized copy."""
    removed = 0
    for info in list_dir(directory, cfg.storage):
        if info.type != pafs.FileType.File:
            continue
        key = info.base_name.split(".", 1)[0]
        if info.base_name.startswith(TMP_PREFIX) or key not in keep:
            remove(join(directory, info.base_name), cfg.storage)
            removed += 1
    return removed
