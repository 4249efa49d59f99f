"""Sharded mode: each group of input shards is packed on its own, by the one task that reads its
tokens, and written straight away: no shuffle of tokens between workers. The price is efficiency:
packs cannot mix documents of different groups, so every group leaves its own partly filled packs
(the job reports the global plan's efficiency next to it). Memory per task: one group's tokens.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from raypack import schema
from raypack.config import JobConfig
from raypack.formats import Spec
from raypack.packing import pack
from raypack.pipeline.assign import TokenShard, items_table
from raypack.pipeline.materialize import write_pack_files
from raypack.pipeline.select import Selection
from raypack.pipeline.tokenize import forget, read_tokens, token_file

__all__ = ["pack_groups"]


def pack_groups(
    batch: dict[str, np.ndarray], cfg: JobConfig, spec: Spec, selection: Selection | None = None
) -> pa.Table:
    """map_batches function over group rows (group, its shards as TokenShard dicts) → WRITTEN rows.
    With a mixture's `selection`, a document comes as many times as it has copies: every first copy
    of the group, then every second, ... (so that greedy, which keeps input order, does not put two
    copies side by side)."""
    forget()  # a process that tokenized (Ray reuses them) drops its tokenizers first
    out = []
    p = cfg.pack
    for group, shards in zip(batch["group"], batch["shards"], strict=True):
        layers = selection.layers if selection is not None else 1
        by_layer: list[list[pa.Table]] = [[] for _ in range(layers)]
        for shard in (TokenShard(**s) for s in shards):
            table = read_tokens(token_file(shard.token_dir, shard.key), cfg.storage)
            if selection is None:
                by_layer[0].append(table)
                continue
            n = selection.copies(shard.source, shard.relpath, table.column("row").to_numpy())
            for c in range(layers):
                by_layer[c].append(table.filter(pa.array(n > c)))
        tables = [t for layer in by_layer for t in layer]  # every first copy, then every second...
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
