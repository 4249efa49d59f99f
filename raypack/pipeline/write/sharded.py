"""Sharded mode: each group of input shards is packed on its own, by the one task that reads its
tokens, and written straight away: no shuffle of tokens between workers. The price is efficiency:
packs cannot mix documents of different groups, so every group leaves its own partly filled packs
(the job reports the global plan's efficiency next to it). Memory per task: one group's tokens.

Ray objects: a task and its WRITTEN table (a row a file) a group; the driver holds the work units
(~300 bytes each) and the references. Each task is retried as the exchange's are (a killed worker, a
transient storage error): it writes whole files at names fixed by its group, so a retry writes the
same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from raypack import schema
from raypack.config import JobConfig
from raypack.corpus.units import WorkUnit
from raypack.engine import Runner, transient
from raypack.formats import Spec
from raypack.packing import pack
from raypack.pipeline.place.assign import file_of, items_table
from raypack.pipeline.place.select import Selection
from raypack.pipeline.tokenize.token_files import read_tokens
from raypack.pipeline.tokenize.worker import forget
from raypack.pipeline.write.exchange import encode_threads
from raypack.pipeline.write.materialize import write_pack_files
from raypack.progress import Progress

__all__ = ["pack_group", "write_sharded"]


def write_sharded(
    cfg: JobConfig,
    spec: Spec,
    units: list[WorkUnit],
    selection: Selection | None,
    runner: Runner,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Every group of pack.shards_per_group consecutive units packed and written by a task of its own;
    the WRITTEN rows of every file (`progress` advanced a group at a time)."""
    per = cfg.pack.shards_per_group
    starts = range(0, len(units), per)
    threads = encode_threads(runner.width, len(starts))
    calls = [
        (cfg, spec, g, units[first : first + per], selection, runner.patterns, threads)
        for g, first in enumerate(starts)
    ]
    written = []
    for _, table in runner.unordered(pack_group, calls):
        rows = table.to_pylist()
        written += rows
        if progress is not None:
            progress.advance(1, 4 * sum(int(r["tokens"]) for r in rows))
    return written


def pack_group(
    cfg: JobConfig,
    spec: Spec,
    group: int,
    units: list[WorkUnit],
    selection: Selection | None,
    patterns: tuple[str, ...] | None,
    threads: int = 1,
) -> pa.Table:
    """Task: one group's documents packed alone and written; its WRITTEN rows (a file's blocks
    encoded on `threads` threads, at most this machine's cores). With a mixture's
    `selection`, a document comes as many times as it has copies: every first copy of the group,
    then every second, ... (so that greedy, which keeps input order, does not put two copies side by
    side)."""
    forget()  # a process that tokenized (Ray reuses them) drops its tokenizers first
    with transient(patterns):
        p = cfg.pack
        layers = selection.layers if selection is not None else 1
        by_layer: list[list[pa.Table]] = [[] for _ in range(layers)]
        for unit in units:
            table = read_tokens(unit.token_file, cfg.storage)
            if selection is None:
                by_layer[0].append(table)
                continue
            copies = selection.copies(unit, table)
            for c in range(layers):
                chosen, tokens = copies.layer(c)  # a partial copy holds its first tokens: its length
                layer = table.take(pa.array(chosen))
                at = layer.schema.get_field_index("length")
                by_layer[c].append(layer.set_column(at, "length", pa.array(tokens, pa.int64())))
        tables = [t for layer in by_layer for t in layer]  # every first copy, then every second...
        if not tables:
            return schema.WRITTEN.empty_table()
        docs = pa.concat_tables(tables).combine_chunks()
        a = pack(
            docs.column("length").to_numpy(),
            p.seq_len,
            p.algorithm,
            overflow=p.overflow,
            seed=p.seed if p.shuffle else None,
            pad_multiple=p.pad_multiple,
            **p.algorithm_options(),
        )
        local = a.pack.astype(np.int64)
        keys = file_of(local, a.num_packs, cfg.output.shard_rows)
        capacity = np.full(len(local), p.seq_len, dtype=np.int32)
        items = items_table(docs, a.items, keys, local, a.slot, capacity)
        return write_pack_files(
            items.sort_by("file_key"),
            cfg.output.path,
            spec,
            bucketed=False,
            group=group,
            storage=cfg.storage,
            threads=threads,
        )
