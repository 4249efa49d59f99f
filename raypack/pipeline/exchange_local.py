"""The exchange on a local runner's processes: the same assign, write and id-count functions as on
Ray (raypack.pipeline.exchange), their pieces passed through Arrow IPC files in the staging area
instead of Ray's object store, so the files written are the same bytes.

    runs of units ─assign_to_files (a task a run)─▶ staging/exchange/<run>-<k>.arrow, a file a piece
    ─write_from_files (a task a range of output files, memory-mapping its pieces)─▶ data/
    id pieces ─count_from_files (a task a hash part)─▶ ids carried by more than one document

One hop always (a piece file costs nothing to keep, unlike an object the driver owns); a task holds
what it does on Ray: an assign task a round of items, a writer one file, its pieces mapped, not read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raypack.config import JobConfig, StorageConfig
from raypack.formats import Spec
from raypack.packing import Plan
from raypack.pipeline.exchange import (
    Exchanged,
    Layout,
    assign_run,
    count_ids,
    index_ids,
    return_kinds,
    shared_ids,
    write_files,
)
from raypack.pipeline.histogram import Totals
from raypack.pipeline.runners import LocalRunner
from raypack.pipeline.select import Selection
from raypack.pipeline.units import WorkUnit
from raypack.progress import Progress
from raypack.storage import join, remove

__all__ = ["check_index_ids_local", "run_exchange_local"]


def assign_to_files(
    directory: str, run: int, kinds: list[tuple[str, int]], args: tuple[Any, ...]
) -> dict[str, Any]:
    """Task: assign_run(*args), each piece it yields written to an Arrow IPC file; the files by
    partition and by id part, and its counts."""
    import os

    os.makedirs(directory, exist_ok=True)
    parts: dict[int, list[str]] = {}
    ids: dict[int, list[str]] = {}
    counts: dict[str, int] = {}
    for k, (value, (kind, index)) in enumerate(zip(assign_run(*args), kinds, strict=True)):
        if kind == "counts":
            counts = value
            continue
        path = os.path.join(directory, f"run-{run:05d}-{k:06d}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, value.schema) as writer:
            writer.write_table(value)
        (parts if kind == "part" else ids).setdefault(index, []).append(path)
    return {"parts": parts, "ids": ids, "counts": counts}


def _mapped(paths: list[str]) -> list[pa.Table]:
    """The pieces in these files, memory-mapped (read by the page cache, not copied into the heap)."""
    return [pa.ipc.open_file(pa.memory_map(p)).read_all() for p in paths]


def write_from_files(
    keys: np.ndarray,
    output: str,
    spec: Spec,
    bucketed: bool,
    storage: StorageConfig,
    paths: list[str],
) -> pa.Table:
    """Task: write_files over the pieces in `paths`."""
    return write_files(keys, output, spec, bucketed, storage, None, *_mapped(paths))


def count_from_files(examples: int, paths: list[str]) -> dict[str, Any]:
    """Task: count_ids over the id pieces in `paths`."""
    return count_ids(examples, *_mapped(paths))


def run_exchange_local(
    runner: LocalRunner,
    cfg: JobConfig,
    plan: Plan,
    lay: Layout,
    totals: Totals,
    units: list[WorkUnit],
    file_keys: np.ndarray,
    spec: Spec,
    examples: int,
    selection: Selection | None = None,
    progress: Progress | None = None,
) -> Exchanged:
    """run_exchange's result, from tasks on `runner`'s processes."""
    directory = join(cfg.output.path, "_staging", "exchange")
    part_first_key = file_keys[lay.writer_first[lay.part_first[:-1]]]
    calls = []
    for run, base in totals.rank_bases():
        rounds = int(lay.rounds[run])
        if rounds == 0 and not lay.id_parts:
            continue
        members = [units[s] for s in np.flatnonzero(lay.run_of_shard == run).tolist()]
        args = (
            cfg,
            plan,
            base,
            members,
            rounds,
            lay.round_ends[run],
            part_first_key,
            lay.id_parts,
            None,
            selection,
        )
        calls.append((directory, run, return_kinds(lay, run), args))
    assigned = runner.map(assign_to_files, calls)
    to_writer: list[list[str]] = [[] for _ in range(lay.writers)]
    to_ids: list[list[str]] = [[] for _ in range(lay.id_parts)]
    for done in assigned:  # in run order: each writer's pieces in the order Ray would give them
        for p, paths in done["parts"].items():
            to_writer[p] += paths
        for q, paths in done["ids"].items():
            to_ids[q] += paths
    bucketed = cfg.pack.algorithm == "bucket"
    writes = [
        (
            file_keys[lay.writer_first[w] : lay.writer_first[w + 1]],
            cfg.output.path,
            spec,
            bucketed,
            cfg.storage,
            to_writer[w],
        )
        for w in range(lay.writers)
    ]
    written = []
    for w, table in runner.unordered(write_from_files, writes):
        written += table.to_pylist()
        if progress is not None:
            tokens = int(pc.sum(table.column("tokens")).as_py() or 0)
            progress.advance(int(lay.writer_first[w + 1] - lay.writer_first[w]), tokens * 4)
    found = runner.map(count_from_files, [(examples, paths) for paths in to_ids])
    remove(directory, cfg.storage)
    return Exchanged(
        written,
        sum(int(d["counts"]["items"]) for d in assigned),
        sum(int(d["counts"]["tokens"]) for d in assigned),
        **shared_ids(found, examples),
    )


def check_index_ids_local(
    runner: LocalRunner, cfg: JobConfig, run_of_shard: np.ndarray, examples: int
) -> Exchanged:
    """check_index_ids on `runner`'s processes (sharded mode's id check)."""
    runs = int(run_of_shard.max()) + 1 if len(run_of_shard) else 0
    parts = max(1, min(runner.width, runs))
    calls = [
        (cfg.output.path, cfg.storage, members, parts, None)
        for members in (np.flatnonzero(run_of_shard == run).tolist() for run in range(runs))
        if members
    ]
    to_part: list[list[pa.Table]] = [[] for _ in range(parts)]
    for pieces in runner.map(index_ids, calls):
        for p, piece in enumerate(pieces if parts > 1 else (pieces,)):
            to_part[p].append(piece)
    found = runner.map(count_ids, [(examples, *tables) for tables in to_part])
    return Exchanged([], 0, 0, **shared_ids(found, examples))
