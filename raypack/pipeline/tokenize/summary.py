"""What the tokenize stage hands on besides its token files: each unit's summary (its item
histogram, document counts and documents index, made by the task that tokenized it, so the lengths
are never read back) and the driver's Totals, into which the summaries are folded as they arrive:
one histogram per run of units, the one reduce of the job (raypack.pipeline.place.histogram reads
it)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import mixture, schema
from raypack.config import JobConfig
from raypack.corpus.metadata import kinds_of, unify
from raypack.corpus.units import WorkUnit
from raypack.dataset.layout import index_path
from raypack.metrics import DocStats
from raypack.mixture import BINS, document_keys, token_bins, unit_keys
from raypack.packing import item_histogram
from raypack.storage import Shard, open_output

__all__ = ["Totals", "shard_runs", "summarize_shard", "summarize_shard_warm", "weighted_parts", "write_index"]


def summarize_shard(
    cfg: JobConfig,
    unit: WorkUnit,
    doc_ids: pa.Array,
    rows: pa.Array,
    files: pa.Array,
    doc_length: np.ndarray,
    metadata: pa.StructArray | None = None,
) -> dict[str, Any]:
    """The shard's sparse item histogram and document counts (for the driver's reduce), and its
    documents index file (with its documents' `metadata`, input.metadata_fields, typed by the
    unit's values: the kinds the summary gives, which the driver unifies). Called by the tokenize
    worker as soon as the shard is tokenized, so the lengths are never read back. In a mixture,
    also its tokens by key bin (raypack.mixture), from which the driver places each source's cut."""
    items = cfg.pack.make_items(doc_length)
    hist = item_histogram(items.span, cfg.pack.seq_len)  # what the packer places: spans
    nonzero = np.flatnonzero(hist)
    write_index(
        cfg,
        unit.shard,
        doc_ids,
        rows,
        pa.array(doc_length, pa.int64()),
        np.diff(items.doc_start),
        items.placed_per_doc(),
        np.zeros(len(doc_length), dtype=np.int32),
        files,
        staged=cfg.input.mixture,
        metadata=metadata,
    )
    summary = {
        "lengths": nonzero.astype(np.int64),
        "counts": hist[nonzero],
        "stats": DocStats.from_items(items).to_json(),
        "key_bins": np.zeros(0, dtype=np.int64),
        "key_tokens": np.zeros(0, dtype=np.int64),
        "metadata_kinds": json.dumps(kinds_of(metadata) if metadata is not None else {}),
    }
    if cfg.input.mixture:
        keys = unit_keys(
            cfg.pack.seed,
            unit.relpaths,
            files.to_numpy(zero_copy_only=False),
            rows.to_numpy(zero_copy_only=False),
        )
        # Kept tokens: targets and shares count what the output holds (raypack.mixture.kept).
        summary["key_bins"], summary["key_tokens"] = token_bins(
            keys, mixture.kept(doc_length, cfg.pack.seq_len, cfg.pack.overflow)
        )
    return summary


def summarize_shard_warm(cfg: JobConfig) -> None:
    """summarize_shard's compiled functions loaded (numba reads them from its cache on first use), on
    three made-up documents, with no file written: tokenize.preload does this in each worker."""
    lengths = np.asarray([1, cfg.pack.seq_len, cfg.pack.seq_len + 1], dtype=np.int64)
    items = cfg.pack.make_items(lengths)
    item_histogram(items.span, cfg.pack.seq_len)
    items.placed_per_doc()
    DocStats.from_items(items)
    if cfg.input.mixture:
        token_bins(document_keys(cfg.pack.seed, "warm", np.arange(3)), lengths)


def write_index(
    cfg: JobConfig,
    shard: Shard,
    doc_ids: pa.Array,
    rows: pa.Array,
    lengths: pa.Array,
    chunks: np.ndarray,
    placed: np.ndarray,
    copy: np.ndarray,
    files: pa.Array,
    staged: bool = False,
    metadata: pa.StructArray | None = None,
) -> None:
    """The shard's index file: a row per document (per copy of one, `copy` -1 for one left out)
    with its items and tokens in the output, and its `metadata` (input.metadata_fields) as a last
    column. `staged`: into the staging area (the tokenize stage's index, in a mixture)."""
    index = pa.table(
        {
            "doc_id": doc_ids,
            "shard": pa.array(np.full(len(lengths), shard.index, dtype=np.int32)),
            "row": rows,
            "length": lengths,
            "chunks": pa.array(np.asarray(chunks, dtype=np.int32)),
            "placed": pa.array(np.asarray(placed, dtype=np.int64)),
            "source": pa.array([shard.source] * len(lengths), pa.string()),
            "copy": pa.array(np.asarray(copy, dtype=np.int32)),
            "file": files,
        },
        schema=schema.DOCUMENTS,
    )
    if metadata is not None:
        index = index.append_column(schema.METADATA, metadata)
    with open_output(index_path(cfg.output.path, shard.index, staged), cfg.storage) as sink:
        pq.write_table(index, sink, compression="zstd")


class Totals:
    """The tokenize stage's per-shard summaries, folded as they arrive (never all held at once): the
    item histogram of each run of shards (the exchange's assign tasks, see raypack.pipeline.write.exchange),
    each shard's items and tokens, and the summed counts; in a mixture, each source's tokens by key
    bin (raypack.mixture), and then the selection's histograms in their place (select).

    Histograms are per (run, copy layer): a mixture gives the k-th copies of documents ranks of their
    own, after every (k-1)-th copy of the corpus, so that two copies of one document do not land side
    by side in one pack (bfd places items of one length by rank, neighbours together). Without a
    mixture there is one layer.

    Driver memory: runs × layers × (seq_len + 1) int64 for the histograms (runs <= the cluster's
    CPUs: 1,024 × 32,769 × 8 B = 268 MB a layer at most), 16 bytes a shard, and 512 KB a source in
    a mixture; a shard's sparse histogram is dropped once added. Summing every shard's dense rank
    base instead is O(shards × seq_len): 10,000 × 32,769 × 8 B = 2.6 GB."""

    def __init__(
        self, run_of_shard: np.ndarray, runs: int, seq_len: int, sources: list[str] | None = None
    ) -> None:
        self.run_of_shard = run_of_shard
        self.hists = np.zeros((runs, 1, seq_len + 1), dtype=np.int64)
        self.items = np.zeros(len(run_of_shard), dtype=np.int64)
        self.tokens = np.zeros(len(run_of_shard), dtype=np.int64)
        self.source_of = list(sources) if sources is not None else [""] * len(run_of_shard)
        """Each shard's input source."""
        self.key_tokens = {s: np.zeros(BINS, dtype=np.int64) for s in sorted(set(self.source_of)) if s}
        self.stats = DocStats()
        self.documents = self.rejects = self.reused = 0
        self.rejected_records = 0
        """Input records the rejects stand for: a lost file counts as its rows (read.Reject)."""
        self.lost_files = 0
        self.encoded_by: Counter[str] = Counter()
        """Units by what encoded them (a backend's name, or "cache")."""
        self.checked_texts = self.checked_segments = self.checked_bytes = 0
        """Texts, and segments of longer ones (and their UTF-8 bytes), a fast backend's ids were
        re-checked on, with tokenizers."""
        self.routed_texts = self.routed_bytes = 0
        """Texts (and UTF-8 bytes) that fastokens' copy of the tokenizer does not encode as the
        tokenizer does (an NFKC change, a Metaspace text that starts with a space): tokenizers'."""
        self.cuts = self.cuts_refused = self.long_whole = 0
        """Where long texts were cut for encoding, the candidate cuts a check refused, and the long
        texts with a piece over PIECE_CHARS (encoded whole, or no cut passed near a piece's end)."""
        self.long_texts: int | None = 0
        """Texts over PIECE_CHARS (encoded in pieces where they could be cut); None where a unit
        from a token store entry written before they were counted has some unknown number."""
        self.cut_rule = ""
        """The rule that allowed the cuts, and its proof, as a worker said it ("" where none did)."""
        self.long_unrecorded = 0
        """Units read from token store entries written before their long texts' cuts were kept."""
        self.trained = 0
        """Trained tokens the documents hold (all of plain text's; chat data's loss mask)."""
        self.failovers: list[str] = []
        """Why units found the fast backend's ids differ (the first 20)."""
        self.notes: list[str] = []
        """What else the tasks said of their backend (fastokens missing on a node; the first 20)."""
        self.reasons: Counter[str] = Counter()
        self.metadata_kinds: list[dict[str, str]] = [{} for _ in run_of_shard]
        """Each shard's index's metadata kinds (raypack.corpus.metadata), as its values made them."""
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
        np.add.at(self.hists[self.run_of_shard[shard], 0], lengths, counts)
        stats = DocStats.from_json(row["stats"])
        self.items[shard], self.tokens[shard] = stats.items, stats.tokens
        self.stats = self.stats + stats
        source = self.source_of[shard]
        if source in self.key_tokens:
            bins = np.asarray(row.get("key_bins", []), dtype=np.int64)
            np.add.at(self.key_tokens[source], bins, np.asarray(row.get("key_tokens", []), dtype=np.int64))
        self.documents += int(row["documents"])
        self.rejects += int(row["rejects"])
        self.rejected_records += int(row["rejected_records"])
        self.lost_files += int(row["lost_files"])
        self.encoded_by[str(row.get("backend", "tokenizers"))] += 1
        self.checked_texts += int(row.get("checked_texts", 0))
        self.checked_segments += int(row.get("checked_segments", 0))
        self.trained += int(row.get("trained", row["tokens"]))
        self.checked_bytes += int(row.get("checked_bytes", 0))
        self.cuts += int(row.get("cuts", 0))
        self.cuts_refused += int(row.get("cuts_refused", 0))
        self.long_whole += int(row.get("long_whole", 0))
        long_texts = int(row.get("long_texts", 0))
        self.long_texts = None if self.long_texts is None or long_texts < 0 else self.long_texts + long_texts
        self.cut_rule = self.cut_rule or str(row.get("cut_rule", ""))
        self.long_unrecorded += int(row.get("long_unrecorded", 0))
        self.routed_texts += int(row.get("routed_texts", 0))
        self.routed_bytes += int(row.get("routed_bytes", 0))
        for said, kept in (
            (str(row.get("failover", "")), self.failovers),
            (str(row.get("note", "")), self.notes),
        ):
            if said and said not in kept and len(kept) < 20:
                kept.append(said)
        self.reused += bool(row["cached"])
        self.nodes[shard] = str(row.get("node", ""))
        self.reasons.update(json.loads(row["reasons"]))
        self.metadata_kinds[shard] = json.loads(row.get("metadata_kinds", "{}"))

    def check_complete(self) -> None:
        if not self._seen.all():
            missing = np.flatnonzero(~self._seen)
            raise RuntimeError(f"{len(missing)} shards (first: {missing[0]}) were never summarized")

    def metadata(self, fields: tuple[str, ...]) -> dict[str, str]:
        """The dataset's kind of each metadata field (input.metadata_columns): what every shard's
        values make together (raypack.corpus.metadata.unify); null where none has a value."""
        kinds = dict.fromkeys(fields, "null")
        for shard in self.metadata_kinds:
            for name, kind in shard.items():
                kinds[name] = unify(kinds[name], kind)
        return kinds

    def source_tokens(self) -> dict[str, int]:
        """Each source's kept tokens (raypack.mixture.kept), before any selection."""
        return {s: int(t.sum()) for s, t in self.key_tokens.items()}

    def histogram(self) -> np.ndarray:
        """The global item histogram, int64[seq_len + 1]."""
        return self.hists.sum(axis=(0, 1))

    @property
    def layers(self) -> int:
        return int(self.hists.shape[1])

    def rank_bases(self) -> Iterator[tuple[int, np.ndarray]]:
        """(run, items of each length ranked before the run's, a row a copy layer: every earlier
        layer's, and its own layer's in earlier runs), run by run: one array alive at a time."""
        layer_totals = self.hists.sum(axis=0)
        running = np.cumsum(layer_totals, axis=0) - layer_totals  # earlier layers, every run
        for run in range(len(self.hists)):
            yield run, running.copy()
            running += self.hists[run]

    def selected(self, hists: np.ndarray, stats: DocStats, items: np.ndarray, tokens: np.ndarray) -> None:
        """Replace the tokenize stage's counts by a mixture's selection: hists (runs, layers,
        seq_len + 1), the selected copies' stats, and each shard's items and tokens."""
        self.hists, self.stats, self.items, self.tokens = hists, stats, items, tokens


def weighted_parts(weights: np.ndarray, parts: int) -> np.ndarray:
    """The part of each entry: `parts` runs of consecutive entries of about equal weight, by where each
    entry's middle falls (an entry heavier than a part's share takes one to itself; some parts may then
    be empty). All weights zero: equal counts."""
    n = len(weights)
    total = float(np.sum(weights))
    if n == 0 or total <= 0:
        return np.arange(n, dtype=np.int64) * parts // max(n, 1)
    middle = np.cumsum(weights, dtype=np.float64) - np.asarray(weights, dtype=np.float64) / 2
    return np.minimum((middle * parts / total).astype(np.int64), parts - 1)


def shard_runs(sizes: list[int], runs: int) -> np.ndarray:
    """The run (assign task) of each shard, by input bytes: known before tokenizing, so the driver can
    fold each shard's histogram into its run's as the summaries arrive."""
    return weighted_parts(np.asarray(sizes, dtype=np.float64), runs)
