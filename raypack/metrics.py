"""Packing quality, as the papers define it, from an assignment.

- efficiency = real tokens / pack slots, and padding_ratio = 1 - efficiency (Liu et al.'s r_pad:
  padding tokens over all tokens of the training samples).
- truncation_ratio: share of documents that do not reach training whole: cut into chunks, shortened by
  `truncate`, or dropped (Liu et al.'s r_tru counts truncated documents over all documents).
- concatenation_ratio: Liu et al.'s r_cat = M / C, M the original documents (all of them, dropped ones
  included, as Liu defines it) and C the training samples (packs). It is not documents per pack: one
  document cut into 10 chunks gives r_cat 0.1 with one document in every pack.
- packing_factor: sequences (items) per pack, Krell et al.'s speed-up over one-sequence-per-row
  padding. It is also the mean number of documents per pack (the chunks of one document never share
  a pack: every chunk but the remainder fills one), which the summary shows beside r_cat.
- truncations per document by length band (Ding et al., figure 1): a document cut into k pieces has had
  k - 1 truncations; one shortened or dropped counts one more.
- lower_bound = ceil(tokens / seq_len): no packer can use fewer packs of seq_len tokens.
- the slots hold three things, counted apart: real tokens, alignment padding (pack.pad_multiple:
  each item's positions up to the next multiple) and end padding (each pack's positions after its
  last item). Efficiency counts real tokens only, so aligning for context parallelism shows as the
  padding it costs.

Two distributions for the report (raypack.report), both counts that add up across shards and files:
documents by length in bins of 1/8 octave (LENGTH_BINS_PER_OCTAVE; a 1..2^20 token range in 160
bins, fine enough to show a mode, coarse enough to be a few hundred integers per shard), and packs by
fill, in whole percent of their capacity (fill_percent_counts).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from raypack.packing.assignment import Assignment
from raypack.packing.items import Items

__all__ = [
    "FILL_BINS",
    "LENGTH_BINS_PER_OCTAVE",
    "DocStats",
    "LengthBand",
    "PackingMetrics",
    "compute_metrics",
    "fill_percent_counts",
    "finalize_metrics",
    "length_bins",
    "slots_line",
]

N_BANDS = 64  # power-of-two length bands: 2^63 tokens is more than any document
LENGTH_BINS_PER_OCTAVE = 8
N_LENGTH_BINS = N_BANDS * LENGTH_BINS_PER_OCTAVE
FILL_BINS = 101  # whole percent 0..99, and 100 for a full pack


def length_bins(lengths: np.ndarray) -> np.ndarray:
    """Bin of each length (>= 1): floor(8 * log2(length)); bin b holds [2^(b/8), 2^((b+1)/8))."""
    return np.floor(LENGTH_BINS_PER_OCTAVE * np.log2(np.maximum(lengths, 1))).astype(np.int64)


def fill_percent_counts(fill: np.ndarray, capacity: np.ndarray | int) -> np.ndarray:
    """int64[FILL_BINS]: packs by floor(100 * fill / capacity); a pack 99.9% full is in bin 99, only a
    full one in bin 100."""
    percent = (np.asarray(fill, dtype=np.int64) * 100) // np.asarray(capacity, dtype=np.int64)
    return np.bincount(percent, minlength=FILL_BINS).astype(np.int64)


@dataclass(frozen=True, slots=True)
class LengthBand:
    """Documents with lo <= length < hi (powers of two)."""

    lo: int
    hi: int
    documents: int
    truncations_per_doc: float


@dataclass(frozen=True, slots=True)
class PackingMetrics:
    algorithm: str
    seq_len: int
    documents: int
    items: int
    packs: int
    lower_bound: int
    tokens: int
    """Tokens placed in packs."""
    slots: int
    """Token positions in all packs (packs × seq_len, or the sum of bucket lengths)."""
    efficiency: float
    padding_ratio: float
    truncation_ratio: float
    concatenation_ratio: float
    packing_factor: float
    tokens_dropped: int
    documents_dropped: int
    truncation_bands: tuple[LengthBand, ...]
    max_depth: int = 0
    """The most items (documents, or chunks of one) in any one pack: what pack.max_depth caps."""
    alignment_padding: int = 0
    """Padding positions after items, each item rounded up to pack.pad_multiple (0 without it)."""

    @property
    def end_padding(self) -> int:
        """Padding positions at the end of packs, after their last item: the rest of the padding."""
        return self.slots - self.tokens - self.alignment_padding

    @property
    def documents_per_pack(self) -> float:
        """Mean documents (or chunks of one) per pack: the packing factor, under its plain name."""
        return self.packing_factor

    @property
    def packs_over_lower_bound(self) -> float:
        return self.packs / self.lower_bound if self.lower_bound else 1.0

    @property
    def lengths_vary(self) -> bool:
        """Packs of several lengths (buckets, decompose's chunks): lower_bound counts packs of
        seq_len, which says nothing of them; their positions (slots) and efficiency do."""
        return self.slots != self.packs * self.seq_len

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["truncation_bands"] = [asdict(b) for b in self.truncation_bands]
        d["end_padding"] = self.end_padding  # read back as the property it is
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PackingMetrics:
        """The inverse of to_dict (metrics.json's "metrics")."""
        values = {f.name: d[f.name] for f in fields(cls) if f.name in d}  # max_depth: newer
        values["truncation_bands"] = tuple(LengthBand(**b) for b in d["truncation_bands"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class DocStats:
    """Per-document counts that add up across shards: what the metrics need besides the packs."""

    documents: int = 0
    documents_present: int = 0
    truncated: int = 0
    items: int = 0
    tokens: int = 0
    """Tokens placed (after truncate/drop)."""
    input_tokens: int = 0
    spans: int = 0
    """Positions the placed items take: tokens, plus their alignment padding (pack.pad_multiple)."""
    band_documents: tuple[int, ...] = (0,) * N_BANDS
    band_truncations: tuple[int, ...] = (0,) * N_BANDS
    length_bins: tuple[int, ...] = (0,) * N_LENGTH_BINS
    """Documents by length_bins() (input lengths, before any cut)."""

    @classmethod
    def from_items(cls, it: Items, cut: np.ndarray | None = None) -> DocStats:
        """`cut`: documents that are themselves a cut (a mixture's partial copy: its first tokens), so
        truncated whatever overflow did to them."""
        pieces = np.diff(it.doc_start)
        placed = it.placed_per_doc()
        truncations = np.maximum(pieces - 1, 0) + (placed < it.doc_length)
        if cut is not None:
            truncations = truncations + np.asarray(cut, dtype=truncations.dtype)
        band = np.floor(np.log2(np.maximum(it.doc_length, 1))).astype(np.int64)  # lengths are >= 1
        return cls(
            documents=it.num_docs,
            documents_present=int(np.count_nonzero(pieces)),
            truncated=int(np.count_nonzero(truncations)),
            items=it.num_items,
            tokens=int(it.length.sum(dtype=np.int64)),
            input_tokens=int(it.doc_length.sum(dtype=np.int64)),
            spans=int(it.span.sum(dtype=np.int64)),
            band_documents=tuple(np.bincount(band, minlength=N_BANDS)[:N_BANDS].tolist()),
            band_truncations=tuple(
                np.bincount(band, weights=truncations, minlength=N_BANDS)[:N_BANDS].astype(np.int64).tolist()
            ),
            length_bins=tuple(
                np.bincount(length_bins(it.doc_length), minlength=N_LENGTH_BINS)[:N_LENGTH_BINS].tolist()
            ),
        )

    def to_json(self) -> str:
        # Not asdict, which copies every tuple element by element (~650 a row: 0.11 s of a worker's
        # 40 units at 500 MB); json writes a tuple as the list it would have made.
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> DocStats:
        d = json.loads(text)
        return cls(
            documents=int(d["documents"]),
            documents_present=int(d["documents_present"]),
            truncated=int(d["truncated"]),
            items=int(d["items"]),
            tokens=int(d["tokens"]),
            input_tokens=int(d["input_tokens"]),
            spans=int(d.get("spans", d["tokens"])),  # counts written before alignment: no padding
            band_documents=tuple(int(x) for x in d["band_documents"]),
            band_truncations=tuple(int(x) for x in d["band_truncations"]),
            length_bins=tuple(int(x) for x in d["length_bins"]),
        )

    def __add__(self, other: DocStats) -> DocStats:
        return DocStats(
            documents=self.documents + other.documents,
            documents_present=self.documents_present + other.documents_present,
            truncated=self.truncated + other.truncated,
            items=self.items + other.items,
            tokens=self.tokens + other.tokens,
            input_tokens=self.input_tokens + other.input_tokens,
            spans=self.spans + other.spans,
            band_documents=tuple(
                a + b for a, b in zip(self.band_documents, other.band_documents, strict=True)
            ),
            band_truncations=tuple(
                a + b for a, b in zip(self.band_truncations, other.band_truncations, strict=True)
            ),
            length_bins=tuple(a + b for a, b in zip(self.length_bins, other.length_bins, strict=True)),
        )


def slots_line(m: PackingMetrics) -> str:
    """The pack positions split three ways, for the summary and the report."""
    share = (lambda n: f" ({100 * n / m.slots:.2f}%)") if m.slots else (lambda n: "")
    return (
        f"{m.slots:,}: {m.tokens:,} real tokens{share(m.tokens)}, {m.alignment_padding:,} alignment "
        f"padding{share(m.alignment_padding)}, {m.end_padding:,} end padding{share(m.end_padding)}"
    )


def compute_metrics(a: Assignment) -> PackingMetrics:
    slots = int(a.capacities().sum()) if a.num_packs else 0
    depth = int(np.bincount(a.pack).max()) if len(a.pack) else 0
    return finalize_metrics(DocStats.from_items(a.items), a.algorithm, a.seq_len, a.num_packs, slots, depth)


def finalize_metrics(
    stats: DocStats, algorithm: str, seq_len: int, packs: int, slots: int, max_depth: int = 0
) -> PackingMetrics:
    """Metrics from summed document counts, the plan's packs and slots, and the most items a pack
    holds."""
    docs, tokens = stats.documents, stats.tokens
    return PackingMetrics(
        algorithm=algorithm,
        seq_len=seq_len,
        documents=docs,
        items=stats.items,
        packs=packs,
        lower_bound=-(-tokens // seq_len),
        tokens=tokens,
        slots=slots,
        efficiency=tokens / slots if slots else 1.0,
        padding_ratio=(slots - tokens) / slots if slots else 0.0,
        truncation_ratio=stats.truncated / docs if docs else 0.0,
        concatenation_ratio=docs / packs if packs else 0.0,
        packing_factor=stats.items / packs if packs else 0.0,
        tokens_dropped=stats.input_tokens - tokens,
        documents_dropped=docs - stats.documents_present,
        truncation_bands=tuple(
            LengthBand(
                lo=1 << b, hi=1 << (b + 1), documents=n, truncations_per_doc=stats.band_truncations[b] / n
            )
            for b, n in enumerate(stats.band_documents)
            if n
        ),
        max_depth=max_depth,
        alignment_padding=stats.spans - tokens,
    )
