"""`raypack rebuild`: a scheduled, incremental, atomic rebuild of a packed dataset.

Each run writes a new version under the output root (raypack.dataset.layout) with the ordinary job, whose
token files live in a token store (raypack.dataset.store: `<root>/_cache/tokens/`, or cache.path)
keyed by each shard's content and the tokenization settings: unchanged shards are read from the
store, new or changed ones tokenized, removed ones drop out.
Packing always runs over the whole corpus (it takes seconds), so a rebuild's data files are byte for byte
those of a from-scratch run on the same inputs. Only then does LATEST move to the new version; old
versions beyond output.keep_versions and cache entries no version uses are deleted last.

A crash at any point leaves LATEST on the previous complete version. The next run deletes the crashed
version's directory and reuses every token file that was finished (the key its footer gets last says so;
an unfinished one is tokenized again).

One rebuild at a time: each holds the root's lease (raypack.dataset.lease) from before it lists versions until
after it prunes, so the sweeps below only ever meet what a finished or dead run left; a second rebuild
waits (`wait_s`) or exits 2 naming the holder. LATEST never moves to an older version (set_latest).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import pyarrow.fs as pafs

from raypack.config import JobConfig
from raypack.dataset.failover import memory_of
from raypack.dataset.layout import (
    CACHE,
    MANIFEST,
    complete_versions,
    latest_version,
    next_version,
    prune_versions,
    remove_incomplete,
    set_latest,
    version_name,
)
from raypack.dataset.lease import Lease
from raypack.engine import Runner
from raypack.errors import ConfigError
from raypack.pipeline.job import JobResult, run_job
from raypack.storage import TMP_PREFIX, exists, join, list_dir, read_bytes, remove, remove_temporaries

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
    waited_s: float = 0.0
    """How long it waited for another rebuild's lease (--wait)."""


def cache_dir(root: str) -> str:
    return join(root, CACHE, "tokens")


def run_rebuild(
    cfg: JobConfig,
    *,
    wait_s: float = 0.0,
    log: Callable[[str], None] = print,
    progress: TextIO | None = None,
    started: float | None = None,
    local: Runner | None = None,
) -> RebuildResult:
    """One rebuild of cfg.output.path. `wait_s`: how long to wait for another rebuild of the same root
    to finish (0: exit at once, LeaseHeld, naming it); `progress`, `started`, `local`: as run_job's."""
    root, storage = cfg.output.path, cfg.storage.from_environment()
    try:
        if exists(join(root, MANIFEST), storage):
            raise ConfigError(
                f"{root} holds a dataset written by `raypack pack`; a rebuild needs its own output root"
            )
        lease = Lease(root, storage)
        waited = lease.acquire(wait_s, say=log)
    except OSError as e:
        raise ConfigError(f"cannot reach output {root}: {str(e).strip().splitlines()[0]}") from None
    try:
        number = next_version(root, storage)  # before the sweep: a crashed run's number is never reused
        lease.set_version(number)
        swept = remove_incomplete(root, storage)
        _sweep_temporaries(root, cfg)
        name = version_name(number)
        version_cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, path=join(root, name)))
        version_cfg = _keep_chat_date(version_cfg, root)
        memory = memory_of(root)
        store = cfg.cache.path or cache_dir(root)
        job = run_job(
            version_cfg,
            cache=store,
            log=log,
            memory=memory,
            progress=progress,
            started=None if started is None else started + waited,  # the wait is said apart
            local=local,
        )
        lease.check()  # a rebuild that lost its lease (paused past its expiry) commits nothing
        set_latest(root, number, storage)
        removed = prune_versions(root, cfg.output.keep_versions, storage)
        # The root's own store holds this corpus alone; a named one (cache.path) may serve other
        # jobs too, and is pruned by `raypack cache prune` only.
        dropped = _prune_cache(store, set(job.token_keys), cfg) if cfg.cache.path is None else 0
    finally:
        lease.release()
    return RebuildResult(job, name, removed, swept, dropped, waited)


def _keep_chat_date(cfg: JobConfig, root: str) -> JobConfig:
    """A chat template that prints the date renders the date the root's versions were packed with
    (tokenizer.chat_date unset): a rebuild on another day would otherwise render its new shards with
    another date than the cached ones."""
    latest = latest_version(root, cfg.storage)
    if cfg.tokenizer.chat_date is not None or latest is None:
        return cfg
    manifest = json.loads(read_bytes(join(root, version_name(latest), MANIFEST), cfg.storage))
    date = (manifest.get("chat") or {}).get("date")
    if date is None:
        return cfg
    return dataclasses.replace(cfg, tokenizer=dataclasses.replace(cfg.tokenizer, chat_date=date))


def _sweep_temporaries(root: str, cfg: JobConfig) -> None:
    """Delete `.tmp-*` files a killed run left beside LATEST or in a version's top level (its
    manifest's, report's): with the lease held, no live run is writing them."""
    for directory in [root] + [join(root, version_name(n)) for n in complete_versions(root, cfg.storage)]:
        remove_temporaries(directory, cfg.storage)


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
