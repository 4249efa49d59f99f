"""Sharded mode: each group of input shards is packed on its own, by the one task that reads its
tokens, and written straight away: no shuffle of tokens between workers. The price is efficiency:
packs cannot mix documents of different groups, so every group leaves its own partly filled packs
(the job reports the global plan's efficiency next to it). Memory per task: one group's tokens.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.formats import Spec
from raypack.packing import pack
from raypack.pipeline.assign import items_table
from raypack.pipeline.materialize import write_pack_files
from raypack.storage import resolve

__all__ = ["pack_groups"]


def pack_groups(batch: dict[str, np.ndarray], cfg: JobConfig, spec: Spec) -> pa.Table:
    """map_batches function over group rows (group, token files of its shards) → WRITTEN rows."""
    out = []
    p = cfg.pack
    for group, files in zip(batch["group"], batch["token_files"], strict=True):
        tables = []
        for path in files:
            fs, inner = resolve(str(path), cfg.storage)
            with fs.open_input_file(inner) as f:
                tables.append(pq.read_table(f))
        docs = pa.concat_tables(tables).combine_chunks()
        a = pack(
            docs.column("length").to_numpy(),
            p.seq_len,
            p.algorithm,
            overflow=p.overflow,
            seed=p.seed if p.shuffle else None,
            **p.algorithm_options(),
        )
        local = a.pack.astype(np.int64)
        keys = local // cfg.output.shard_rows
        capacity = np.full(len(local), p.seq_len, dtype=np.int32)
        items = items_table(docs, a.items, keys, local, a.slot, capacity)
        out.append(
            write_pack_files(
                items.sort_by("file_key"),
                cfg.output.path,
                spec,
                bucketed=False,
                group=int(group),
                storage=cfg.storage,
            )
        )
    return pa.concat_tables(out) if out else schema.WRITTEN.empty_table()
