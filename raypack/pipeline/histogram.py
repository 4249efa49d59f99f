"""Stage 3, histogram: per shard, the item-length histogram and document counts, folded by the driver
into one histogram per run of shards (the one reduce of the job); and the documents index that
`raypack verify` checks against.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.metrics import DocStats
from raypack.packing import Items, item_histogram, make_items
from raypack.storage import join, open_output

__all__ = ["Totals", "index_path", "summarize_shard"]


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


class Totals:
    """The tokenize stage's per-shard summaries, folded as they arrive (never all held at once): the
    item histogram of each run of shards (the exchange's assign tasks, see raypack.pipeline.exchange),
    each shard's items and tokens, and the summed counts.

    Driver memory: runs × (seq_len + 1) int64 for the histograms (runs <= the cluster's CPUs: 1,024 ×
    32,769 × 8 B = 268 MB at most) and 16 bytes a shard; a shard's sparse histogram is dropped once
    added. Summing every shard's dense rank base instead is O(shards × seq_len): 10,000 × 32,769 × 8 B
    = 2.6 GB."""

    def __init__(self, run_of_shard: np.ndarray, runs: int, seq_len: int) -> None:
        self.run_of_shard = run_of_shard
        self.hists = np.zeros((runs, seq_len + 1), dtype=np.int64)
        self.items = np.zeros(len(run_of_shard), dtype=np.int64)
        self.tokens = np.zeros(len(run_of_shard), dtype=np.int64)
        self.stats = DocStats()
        self.documents = self.rejects = self.reused = 0
        self.rejected_records = 0
        """Input records the rejects stand for: a lost file counts as its rows (read.Reject)."""
        self.lost_files = 0
        self.encoded_by: Counter[str] = Counter()
        """Units by what encoded them (a backend's name, or "cache")."""
        self.checked_texts = self.checked_bytes = 0
        """Texts (and their UTF-8 bytes) a fast backend's ids were re-checked on, with tokenizers."""
        self.failovers: list[str] = []
        self.reasons: Counter[str] = Counter()
        self._seen = np.zeros(len(run_of_shard), dtype=bool)
        self.nodes = [""] * len(run_of_shard)
        """The Ray node that tokenized each shard (or work unit)."""

    def add(self, row: dict[str, Any]) -> None:
        shard = int(row["shard"])
        if self._seen[shard]:
            raise RuntimeError(f"shard {shard} was summarized twice: the tokenize stage is inconsistent")
        self._seen[shard] = True
        lengths = np.asarray(row["lengths"], dtype=np.int64)
        counts = np.asarray(row["counts"], dtype=np.int64)
        np.add.at(self.hists[self.run_of_shard[shard]], lengths, counts)
        stats = DocStats.from_json(row["stats"])
        self.items[shard], self.tokens[shard] = stats.items, stats.tokens
        self.stats = self.stats + stats
        self.documents += int(row["documents"])
        self.rejects += int(row["rejects"])
        self.rejected_records += int(row["rejected_records"])
        self.lost_files += int(row["lost_files"])
        self.encoded_by[str(row.get("backend", "tokenizers"))] += 1
        self.checked_texts += int(row.get("checked_texts", 0))
        self.checked_bytes += int(row.get("checked_bytes", 0))
        failover = str(row.get("failover", ""))
        if failover and failover not in self.failovers and len(self.failovers) < 20:
            self.failovers.append(failover)
        self.reused += bool(row["cached"])
        self.nodes[shard] = str(row.get("node", ""))
        self.reasons.update(json.loads(row["reasons"]))

    def check_complete(self) -> None:
        if not self._seen.all():
            missing = np.flatnonzero(~self._seen)
            raise RuntimeError(f"{len(missing)} shards (first: {missing[0]}) were never summarized")

    def histogram(self) -> np.ndarray:
        """The global item histogram, int64[seq_len + 1]."""
        return self.hists.sum(axis=0)

    def rank_bases(self) -> Iterator[tuple[int, np.ndarray]]:
        """(run, items of each length in earlier runs), run by run: one array alive at a time."""
        running = np.zeros(self.hists.shape[1], dtype=np.int64)
        for run in range(len(self.hists)):
            yield run, running.copy()
            running += self.hists[run]
