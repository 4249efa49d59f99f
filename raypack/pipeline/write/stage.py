"""Stages 6-7, assign + write: every item placed by the plan and written into its output file, on
the runner's tasks (global mode: raypack.pipeline.write.exchange; sharded mode:
raypack.pipeline.write.sharded), with the
duplicate-id check folded in; then the commit check: the written files must be exactly the planned
ones and hold every item and token, or nothing is committed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from raypack.config import JobConfig
from raypack.corpus.units import WorkUnit
from raypack.engine import Runner
from raypack.formats import Spec, group_of, part_file, stem_of_file
from raypack.packing import Plan
from raypack.pipeline.place.assign import file_rows
from raypack.pipeline.place.plan import file_keys, planned_files
from raypack.pipeline.place.select import Selection
from raypack.pipeline.tokenize.summary import Totals
from raypack.pipeline.write.exchange import ITEM_BYTES, check_index_ids, layout, run_exchange
from raypack.pipeline.write.sharded import write_sharded
from raypack.progress import Progress

__all__ = ["DUPLICATE_EXAMPLES", "Duplicates", "Written", "check_commit", "write"]

DUPLICATE_EXAMPLES = 20


@dataclass(frozen=True)
class Duplicates:
    """Document ids (input.id_field) that more than one document carries: reported, all packed."""

    ids: int = 0
    documents: int = 0
    """Documents carrying one of those ids."""
    examples: tuple[str, ...] = ()
    """The first DUPLICATE_EXAMPLES of them, in id order (every occurrence is in index/)."""


@dataclass(frozen=True)
class Written:
    files: list[dict[str, Any]]
    """The write tasks' WRITTEN rows, a row a file, by path."""
    planned: dict[str, int] = field(default_factory=dict)
    """Every file the plan (or, in sharded mode, the groups' packs) makes, with its packs."""
    duplicates: Duplicates = Duplicates()

    @property
    def packs(self) -> int:
        return sum(self.planned.values())


def write(
    cfg: JobConfig,
    spec: Spec,
    plan: Plan,
    totals: Totals,
    units: list[WorkUnit],
    runner: Runner,
    selection: Selection | None,
    log: Callable[[str], None],
    stream: TextIO | None = None,
) -> Written:
    """Every item into its file, and the commit check (RuntimeError when it fails: a bug, not the
    input's fault). `stream`: where the stage's progress goes (files written, MB/s, ETA)."""
    if cfg.pack.mode == "sharded":
        groups = -(-len(units) // cfg.pack.shards_per_group)
        progress = Progress("assign+write", groups, "groups", 4 * int(totals.tokens.sum()), stream)
        files = write_sharded(cfg, spec, units, selection, runner, progress)
        duplicates = Duplicates()
        if cfg.input.id_fields:  # each run's index files hashed into parts, counted part by part
            found = check_index_ids(runner, cfg, totals.run_of_shard, DUPLICATE_EXAMPLES)
            duplicates = Duplicates(found.duplicate_ids, found.duplicate_documents, found.examples)
        planned = _sharded_files(cfg, spec, files)
    else:
        keys, _ = file_keys(plan, cfg.output.shard_rows)
        progress = Progress("assign+write", len(keys), "files", 4 * totals.stats.tokens, stream)
        files, duplicates = _write_global(cfg, spec, plan, totals, units, runner, log, selection, progress)
        planned = planned_files(cfg, spec, plan)
    progress.close()
    if duplicates.ids:
        log(f"[raypack] note: {duplicates.ids:,} ids are carried by {duplicates.documents:,} documents")
    files = sorted(files, key=lambda f: f["path"])
    check_commit(files, planned, totals.stats.items, totals.stats.tokens)
    return Written(files, planned, duplicates)


def _write_global(
    cfg: JobConfig,
    spec: Spec,
    plan: Plan,
    totals: Totals,
    units: list[WorkUnit],
    runner: Runner,
    log: Callable[[str], None],
    selection: Selection | None,
    progress: Progress,
) -> tuple[list[dict[str, Any]], Duplicates]:
    """Assign, exchange and write on tasks of bounded fan-out (raypack.pipeline.write.exchange)."""
    keys, slots = file_keys(plan, cfg.output.shard_rows)
    unit_bytes = totals.tokens * 4 + totals.items * ITEM_BYTES
    runs = totals.hists.shape[0]
    ids = cfg.input.id_fields
    lay = layout(totals.run_of_shard, runs, unit_bytes, slots * 4, runner.width, totals.documents, ids)
    n = lay.counts()
    log(
        f"[raypack] exchange: {n['assign_tasks']} assign, {n['merge_tasks']} merge, {n['write_tasks']} "
        f"write tasks; {lay.hops} hop(s), {n['objects']:,} objects"
    )
    done = run_exchange(
        runner, cfg, plan, lay, totals, units, keys, spec, DUPLICATE_EXAMPLES, selection, progress
    )
    if (done.items, done.tokens) != (totals.stats.items, totals.stats.tokens):
        raise RuntimeError(
            f"assign placed (items, tokens) = {(done.items, done.tokens)}, the histogram holds "
            f"{(totals.stats.items, totals.stats.tokens)}: refusing to commit"
        )
    return done.written, Duplicates(done.duplicate_ids, done.duplicate_documents, done.examples)


def _sharded_files(cfg: JobConfig, spec: Spec, files: list[dict[str, Any]]) -> dict[str, int]:
    """The files sharded mode must have written, given the packs each group reports: parts
    0..ceil(packs / shard_rows) - 1 of every group that has packs (its packs are numbered alone)."""
    rows = cfg.output.shard_rows
    packs: Counter[int] = Counter()
    for f in files:
        group = group_of(stem_of_file(str(f["path"]), spec.format.suffix))
        if group is None:
            raise RuntimeError(f"{f['path']} is not a sharded mode's file: refusing to commit")
        packs[group] += int(f["rows"])
    return {
        part_file(spec, None, part, group): count
        for group, n in sorted(packs.items())
        for part, count in enumerate(file_rows(n, rows))
    }


def check_commit(files: list[dict[str, Any]], planned: dict[str, int], items: int, tokens: int) -> None:
    """The written files must be exactly the planned ones, each once and with its planned packs, and
    hold every item and every token (their fill counts one entry per pack). Totals alone are not
    enough: two blocks of one file would overwrite each other and still add up."""
    paths = Counter(str(f["path"]) for f in files)
    twice = sorted(p for p, n in paths.items() if n > 1)
    if twice:
        raise RuntimeError(f"{twice[0]} was written by {paths[twice[0]]} tasks: refusing to commit")
    written = {str(f["path"]): int(f["rows"]) for f in files}
    if written != planned:
        missing = sorted(set(planned) - set(written))
        extra = sorted(set(written) - set(planned))
        wrong = sorted(p for p in set(planned) & set(written) if planned[p] != written[p])
        raise RuntimeError(
            f"the written files are not the planned ones (missing {missing[:3]}, unplanned {extra[:3]}, "
            f"wrong row counts {wrong[:3]}): refusing to commit"
        )
    packs = sum(planned.values())
    got = (sum(f["items"] for f in files), sum(f["tokens"] for f in files))
    filled = sum(int(np.sum(f["fill_percent"])) for f in files)
    if filled != packs:
        raise RuntimeError(
            f"the files' fill counts cover {filled} packs, planned {packs}: refusing to commit"
        )
    if got != (items, tokens):
        raise RuntimeError(f"written (items, tokens) = {got}, planned {(items, tokens)}: refusing to commit")
