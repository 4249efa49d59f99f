"""Stage 1, read: the job's input files cut into work units (raypack.corpus.cut), the line scans
of large JSONL files run as the runner's tasks (a local run's in the driver). The readers run
later, inside the tokenize tasks (raypack.corpus.readers)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from raypack.config import InputConfig, StorageConfig
from raypack.corpus.cut import sample_units, scan_range, work_units
from raypack.corpus.units import WorkUnit
from raypack.engine import Runner, transient
from raypack.storage import Shard

__all__ = ["read", "scan_task"]


def read(
    files: list[WorkUnit], cfg: InputConfig, storage: StorageConfig, runner: Runner, seed: int = 0
) -> list[WorkUnit]:
    """The stage: the job's work units, the line scans of large JSONL files as tasks of a CPU each
    (32 for 8 GiB at the default unit_bytes), retried as every storage task is (raypack.engine.tasks),
    or on a local run in the driver's threads (the reads release the GIL): a local pool's workers
    take tasks only once the zygote has loaded the tokenizer, and the scans waited for that (3.3 s
    of a 40 MB job's 6.2 on 2 cores, for 0.1 s of scanning), where the driver scans beside it.
    Before the tokenize tasks start: behind them, the scans would wait for a free CPU. A trial
    (input.limit_bytes) samples whole files first, so that only they are cut (and scanned), then
    the units cut from them, at most an eighth of the limit each; `seed` orders both samples."""

    def scan(ranges: list[tuple[Shard, int, int]]) -> list[tuple[int, int]]:
        if runner.shares_disk:
            with ThreadPoolExecutor(runner.width, thread_name_prefix="raypack-scan") as threads:
                return list(threads.map(lambda r: scan_range(r[0], r[1], r[2], storage), ranges))
        return runner.map(scan_task, [(s, a, b, storage, runner.patterns) for s, a, b in ranges])

    unit_bytes, limit = cfg.unit_bytes, cfg.limit_bytes
    if limit is not None:
        files = sample_units(files, limit, seed)
        unit_bytes = min(unit_bytes, max(limit // 8, 1 << 20))
    group_bytes = min(cfg.group_bytes, unit_bytes)
    units = work_units(files, unit_bytes, storage, scan=scan, group_bytes=group_bytes)
    return units if limit is None else sample_units(units, limit, seed)


def scan_task(
    shard: Shard, start: int, stop: int, storage: StorageConfig, patterns: tuple[str, ...] | None
) -> tuple[int, int]:
    """Task: scan_range."""
    with transient(patterns):
        return scan_range(shard, start, stop, storage)
