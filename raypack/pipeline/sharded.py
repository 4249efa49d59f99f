"""Sharded mode: each group of input shards is packed on its own, by the one task that reads its
tokens, and written straight away: no shuffle of tokens between workers. The price is efficiency:
packs cannot mix documents of different groups, so every group leaves its own partly filled packs
(the job reports the global plan's efficiency next to it). Memory per task: one group's tokens.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.packing import pack
from raypack.pipeline.assign import items_table
from raypack.pipeline.materialize import write_pack_file
from raypack.pipeline.tokenize import tokens_path
from raypack.storage import resolve

__all__ = ["pack_groups"]


def pack_groups(batch: dict[str, np.ndarray], cfg: JobConfig, staging: str) -> pa.Table:
    """map_batches function over group rows (group, first shard, shard count) → FILES rows."""
    out = []
    p = cfg.pack
    for group, first, count in zip(batch["group"], batch["first"], batch["count"], strict=True):
        tables = []
        for shard in range(int(first), int(first) + int(count)):
            fs, inner = resolve(tokens_path(staging, shard))
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
        for key in np.unique(keys).tolist():
            part = items.filter(pc.equal(items.column("file_key"), key))
            out.append(
                write_pack_file(part, cfg.output.path, cfg.output.pad_id, bucketed=False, group=int(group))
            )
    return pa.concat_tables(out) if out else schema.FILES.empty_table()
