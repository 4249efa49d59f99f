"""Stage 3, histogram: per shard, the item-length histogram and document counts (then summed by the
driver: the one reduce of the job), and the documents index that `raypack verify` checks against.

Only the `length` column of a staged token file is read here, not the tokens.
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
from raypack.pipeline.tokenize import tokens_path
from raypack.storage import join, resolve

__all__ = ["index_path", "shard_histograms", "sum_histograms"]


def index_path(output: str, shard: int) -> str:
    return join(output, "index", f"shard-{shard:06d}.parquet")


def shard_histograms(batch: dict[str, np.ndarray], cfg: JobConfig, staging: str) -> dict[str, Any]:
    """map_batches function over shard rows → per-shard sparse histogram and DocStats (as JSON)."""
    out: dict[str, list[Any]] = {"shard": [], "lengths": [], "counts": [], "stats": []}
    seq_len, overflow = cfg.pack.seq_len, cfg.pack.overflow
    for shard in batch["index"].tolist():
        fs, inner = resolve(tokens_path(staging, shard))
        with fs.open_input_file(inner) as f:
            table = pq.read_table(f, columns=["row", "doc_id", "length"])
        doc_length = table.column("length").to_numpy()
        items = make_items(doc_length, seq_len, overflow)
        hist = item_histogram(items.length, seq_len)
        nonzero = np.flatnonzero(hist)
        _write_index(cfg.output.path, shard, table, items)
        out["shard"].append(shard)
        out["lengths"].append(nonzero.astype(np.int64))
        out["counts"].append(hist[nonzero])
        out["stats"].append(DocStats.from_items(items).to_json())
    return {
        "shard": np.asarray(out["shard"], dtype=np.int64),
        "lengths": out["lengths"],
        "counts": out["counts"],
        "stats": np.asarray(out["stats"], dtype=object),
    }


def _write_index(output: str, shard: int, table: pa.Table, items: Items) -> None:
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
    fs, inner = resolve(index_path(output, shard))
    fs.create_dir(inner.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(inner) as sink:
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
