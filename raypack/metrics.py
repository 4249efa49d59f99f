"""Packing quality, as the papers define it, from an assignment.

- efficiency = real tokens / pack slots, and padding_ratio = 1 - efficiency (Liu et al.'s r_pad:
  padding tokens over all tokens of the training samples).
- truncation_ratio: share of documents that do not reach training whole: cut into chunks, shortened by
  `truncate`, or dropped (Liu et al.'s r_tru counts truncated documents over all documents).
- concatenation_ratio: documents per pack (Liu et al.'s r_cat = M / C, M counting the documents that
  reach the output).
- packing_factor: sequences (items) per pack, Krell et al.'s speed-up over one-sequence-per-row padding.
- truncations per document by length band (Ding et al., figure 1): a document cut into k pieces has had
  k - 1 truncations; one shortened or dropped counts one more.
- lower_bound = ceil(tokens / seq_len): no packer can use fewer packs of seq_len tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from raypack.packing.assignment import Assignment

__all__ = ["LengthBand", "PackingMetrics", "compute_metrics"]


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

    @property
    def packs_over_lower_bound(self) -> float:
        return self.packs / self.lower_bound if self.lower_bound else 1.0

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["truncation_bands"] = [asdict(b) for b in self.truncation_bands]
        return d


def compute_metrics(a: Assignment) -> PackingMetrics:
    it = a.items
    docs = it.num_docs
    tokens = int(it.length.sum(dtype=np.int64))
    slots = int(a.capacities().sum()) if a.num_packs else 0
    pieces = np.diff(it.doc_start)
    placed = it.placed_per_doc()
    shortened = placed < it.doc_length
    truncations = np.maximum(pieces - 1, 0) + shortened
    present = int(np.count_nonzero(pieces))
    return PackingMetrics(
        algorithm=a.algorithm,
        seq_len=a.seq_len,
        documents=docs,
        items=it.num_items,
        packs=a.num_packs,
        lower_bound=-(-tokens // a.seq_len),
        tokens=tokens,
        slots=slots,
        efficiency=tokens / slots if slots else 1.0,
        padding_ratio=(slots - tokens) / slots if slots else 0.0,
        truncation_ratio=float(np.count_nonzero(truncations)) / docs if docs else 0.0,
        concatenation_ratio=present / a.num_packs if a.num_packs else 0.0,
        packing_factor=it.num_items / a.num_packs if a.num_packs else 0.0,
        tokens_dropped=int(it.doc_length.sum(dtype=np.int64)) - tokens,
        documents_dropped=docs - present,
        truncation_bands=_bands(it.doc_length, truncations),
    )


def _bands(doc_length: np.ndarray, truncations: np.ndarray) -> tuple[LengthBand, ...]:
    if not len(doc_length):
        return ()
    band = np.floor(np.log2(doc_length)).astype(np.int64)  # lengths are >= 1
    docs = np.bincount(band)
    cuts = np.bincount(band, weights=truncations)
    return tuple(
        LengthBand(lo=1 << b, hi=1 << (b + 1), documents=int(docs[b]), truncations_per_doc=cuts[b] / docs[b])
        for b in np.flatnonzero(docs).tolist()
    )
