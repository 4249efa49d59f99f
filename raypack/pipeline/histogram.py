"""Stage 3, histogram: per shard, the item-length histogram and document counts, summed by the driver
(the one reduce of the job); and the documents index that `raypack verify` checks against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.metrics import DocStats
from raypack.packing import Items, item_histogram, make_items
from raypack.storage import join, open_output

__all__ = ["index_path", "sum_histograms", "summarize_shard"]


def index_path(output: str, shard: int) -> str:
    return join(output, "index", f"shard-{shard:06d}.parquet")


def summarize_shard(
    cfg: JobConfig, shard: int, doc_ids: pa.Array, rows: pa.Array, doc_length: np.ndarray
) -> dict[str, Any]:
    """The shard's sparse item histogram and document counts (for the driver's reduce), and its
    documents index file. Called by the tokenizer actor as soon as the shard is tokenized, so the
    lengths are never read back."""
    items = make_items(doc_length, cfg.pack.seq_len, cfg.pack.overflow)
    hist = item_histogram(items.length, cfg.pack.seq_len)
    nonzero = np.flatnonzero(hist)
    table = pa.table({"doc_id": doc_ids, "row": rows, "length": pa.array(doc_length, pa.int64())})
    _write_index(cfg, shard, table, items)
    return {
        "lengths": nonzero.astype(np.int64),
        "counts": hist[nonzero],
        "stats": DocStats.from_items(items).to_json(),
    }


def _write_index(cfg: JobConfig, shard: int, table: pa.Table, items: Items) -> None:
    index = pa.table(
        {
            "doc_id": table.column("doc_id"),
            "shard": pa.array(np.full(table.num_rows, shard, dtype=np.int32)),
            "row": table.column("row"),
            "length": table.column("length"),
            "chunks": pa.array(np.diff(items.doc_start).astype(np.int32)),
            "placed": pa.array(items.placed_per_doc()),
        },
        schema=schema.DOCUMENTS,
    )
    with open_output(index_path(cfg.output.path, shard), cfg.storage) as sink:
        pq.write_table(index, sink, compression="zstd")


def sum_histograms(
    rows: list[dict[str, Any]], seq_len: int
) -> tuple[np.ndarray, dict[int, np.ndarray], DocStats]:
    """Global histogram, each shard's rank base (items of each length in earlier shards), and the
    summed document counts. Driver memory: O(shards × seq_len) for the rank bases."""
    rows = sorted(rows, key=lambda r: int(r["shard"]))
    running = np.zeros(seq_len + 1, dtype=np.int64)
    rank_base: dict[int, np.ndarray] = {}
    stats = DocStats()
    for r in rows:
        rank_base[int(r["shard"])] = running.copy()
        np.add.at(running, np.asarray(r["lengths"], dtype=np.int64), np.asarray(r["counts"], dtype=np.int64))
        stats = stats + DocStats.from_json(r["stats"])
    return running, rank_base, stats
