"""Each input file's content digest (raypack.dataset.store.file_digest), the token store's keys are
made of: computed before the units are keyed, by the runner's tasks (files grouped into about
DIGEST_TASKS_PER_CPU tasks a CPU by size), or on this machine by the driver's threads."""

from __future__ import annotations

import numpy as np

from raypack.config import StorageConfig
from raypack.corpus.units import WorkUnit
from raypack.dataset.store import file_digest
from raypack.engine import Runner, transient
from raypack.pipeline.tokenize.summary import weighted_parts
from raypack.storage import Shard

__all__ = ["content_digests", "digest_task"]

# Tasks a CPU for the digests: files differ in size, so a few tasks a CPU keep the cores busy to
# the end without a task a file (10,000 small files would be 10,000 tasks).
DIGEST_TASKS_PER_CPU = 4


def digest_task(
    shards: list[Shard], storage: StorageConfig | None, patterns: tuple[str, ...] | None
) -> list[str]:
    """Task: the digest of each of a group of files, in order."""
    with transient(patterns):
        return [file_digest(s, storage) for s in shards]


def content_digests(files: list[WorkUnit], storage: StorageConfig, runner: Runner) -> dict[str, str]:
    """Every input file's digest, by its path: file_digest on the runner's tasks, or on a local
    run in the driver's threads (hashlib and the reads release the GIL): a local pool's workers
    are ready only once the zygote has loaded the tokenizers (2.5 s into a 500 MB repack on 2
    cores, whose 127 MB of input hash in 0.12 s), and a local run's input is small
    (run.local_max_bytes)."""
    shards = list({u.shard.path: u.shard for u in files}.values())
    if not shards:
        return {}
    if runner.shares_disk:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(runner.width, thread_name_prefix="raypack-digest") as threads:
            found = list(threads.map(lambda s: file_digest(s, storage), shards))
        return {s.path: d for s, d in zip(shards, found, strict=True)}
    tasks = min(len(shards), max(1, runner.width * DIGEST_TASKS_PER_CPU))
    # Consecutive files of about equal bytes a group.
    parts = weighted_parts(np.asarray([max(s.size, 1) for s in shards], dtype=np.float64), tasks)
    grouped: dict[int, list[Shard]] = {}
    for shard, part in zip(shards, parts.tolist(), strict=True):
        grouped.setdefault(part, []).append(shard)
    groups = [grouped[k] for k in sorted(grouped)]
    found = runner.map(digest_task, [(g, storage, runner.patterns) for g in groups])
    pairs = (zip(g, digests, strict=True) for g, digests in zip(groups, found, strict=True))
    return {s.path: d for pair in pairs for s, d in pair}
