"""Stage 1, read: the job's input files cut into work units (raypack.corpus.cut), the line scans
of large JSONL files run as the runner's tasks. The readers run later, inside the tokenize tasks
(raypack.corpus.readers)."""

from __future__ import annotations

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
    (32 for 8 GiB at the default unit_bytes), retried as every storage task is (raypack.engine.tasks).
    Before the tokenize tasks start: behind them, the scans would wait for a free CPU. A trial
    (input.limit_bytes) samples whole files first, so that only they are cut (and scanned), then
    the units cut from them, at most an eighth of the limit each; `seed` orders both samples."""

    def scan(ranges: list[tuple[Shard, int, int]]) -> list[tuple[int, int]]:
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
