"""Stage 5, plan: the packer of pack.algorithm (raypack.packing.ALGORITHMS) run once over the item
histogram, O(seq_len²) whatever the corpus, in one of the runner's tasks; the plans of
pack.compare beside it for the report; and what the plan says of the output files (their keys,
their packs).

In a task, not the driver: the packers are numba's compiled functions, and a process's first load of
one loads numba's registry (0.5-0.7 s of a CPU, scipy's import included, while the workers
tokenize on them). A worker that summarized a unit has it already (its first planner function then
loads in ~0.01 s), and the driver never loads it.

Sharded mode packs each group inside its task; the global bfd plan is made anyway, to report the
efficiency the sharding costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from raypack.config import JobConfig, PackConfig
from raypack.engine import Runner
from raypack.errors import ConfigError, task_raised
from raypack.formats import Spec, part_file
from raypack.metrics import DocStats, fill_percent_counts, finalize_metrics
from raypack.packing import ALGORITHMS, Plan
from raypack.pipeline.place.assign import Buckets, file_key, file_rows

__all__ = [
    "compare",
    "compare_in_task",
    "file_keys",
    "plan",
    "plan_in_task",
    "plan_slots",
    "planned_files",
]


def planner(pack: PackConfig) -> Callable[[np.ndarray], Plan]:
    """The plan stage's planner, histogram → Plan."""
    name = pack.algorithm if pack.mode == "global" else "bfd"
    planner = ALGORITHMS[name].plan
    if planner is None:  # JobConfig admits histogram packers only in global mode
        raise ConfigError(f"{name} cannot plan from a histogram")
    options = pack.algorithm_options() if pack.mode == "global" else {}
    return partial(planner, seq_len=pack.seq_len, **options)


def plan(pack: PackConfig, hist: np.ndarray) -> Plan:
    return planner(pack)(hist)


def plan_in_task(runner: Runner, pack: PackConfig, hist: np.ndarray) -> Plan:
    """plan(pack, hist), in one of the runner's tasks (the module's docstring says why)."""
    return _in_task(runner, plan, (pack, hist))


def compare_in_task(
    runner: Runner, pack: PackConfig, hist: np.ndarray, stats: DocStats
) -> list[dict[str, Any]]:
    """compare(pack, hist, stats), in one of the runner's tasks."""
    return _in_task(runner, compare, (pack, hist, stats))


def _in_task(runner: Runner, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return runner.map(fn, [args])[0]
    except Exception as e:
        raised = task_raised(e)  # a planner's ConfigError, not Ray's header for it
        if raised is e:
            raise
        raise raised from None


def compare(pack: PackConfig, hist: np.ndarray, stats: DocStats) -> list[dict[str, Any]]:
    """Plan every packer of pack.compare on the job's item histogram (plans only: nothing is written),
    for the comparison table. Each costs a plan, seconds at most, and O(packs) driver memory for the
    fill of its packs (8 bytes a pack: ~100 MB for 12M packs), freed before the next."""
    out = []
    for c in pack.compared():
        packer = ALGORITHMS[c.algorithm].plan
        if packer is None:  # PackConfig.compared admits histogram packers only
            raise ConfigError(f"pack.compare: {c.algorithm} cannot plan from a histogram")
        t0 = time.perf_counter()
        p = packer(hist, c.seq_len, **c.algorithm_options())
        seconds = time.perf_counter() - t0
        depth = int(p.pack_depth().max(initial=0))
        metrics = finalize_metrics(stats, c.algorithm, c.seq_len, p.num_packs, plan_slots(p), depth)
        fill = fill_percent_counts(p.pack_load(), p.pack_capacity())
        out.append(
            {"metrics": metrics.to_dict(), "pack_fill_percent": fill.tolist(), "plan_seconds": seconds}
        )
    return out


def plan_slots(p: Plan) -> int:
    """Token positions of every pack of the plan."""
    ends = np.append(p.capacity_start[1:], p.num_packs)
    return int(((ends - p.capacity_start) * p.capacity_value).sum())


def file_keys(p: Plan, shard_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Every output file's key, ascending (files 0..ceil(packs / shard_rows) - 1 of each bucket, as
    file_rows sizes them), and its token slots."""
    keys, slots = [], []
    buckets = Buckets.of(p)
    for b, (length, n) in enumerate(zip(buckets.lengths, buckets.sizes, strict=True)):
        rows = np.asarray(file_rows(n, shard_rows), dtype=np.int64)
        keys.append(file_key(np.full(len(rows), b), np.arange(len(rows))))
        slots.append(rows * length)
    key, slot = np.concatenate(keys), np.concatenate(slots)
    order = np.argsort(key, kind="stable")
    return key[order], slot[order]


def planned_files(cfg: JobConfig, spec: Spec, p: Plan) -> dict[str, int]:
    """Every file the global plan makes, with its packs: bucket b's packs in files of at most
    shard_rows, as even as can be (file_rows)."""
    rows, buckets = cfg.output.shard_rows, Buckets.of(p)
    bucketed = cfg.pack.bucketed
    return {
        part_file(spec, length if bucketed else None, part): count
        for length, n in zip(buckets.lengths, buckets.sizes, strict=True)
        for part, count in enumerate(file_rows(n, rows))
    }
