"""Dataset decomposition, after Pouransari et al., "Dataset Decomposition: Faster LLM Training with
Variable Sequence Length Curriculum" (NeurIPS 2024), section 2.2; OLMo-core's NumpyVSLDataset.

Every document is cut into chunks whose lengths are the powers of two of its length's binary
representation, largest first from its start, with every power above seq_len (the largest chunk,
itself a power of two) cut into chunks of seq_len: a document of 1,000 tokens at seq_len 256 gives
256, 256, 256, 128, 64, 32, 8. Chunks shorter than `min_seq_len` (a power of two) are left out: they
are the document's last `length mod min_seq_len` tokens, the rule of OLMo-core's bucket_documents.

Bucket D_i holds the chunks of length 2^i, and each is a sequence of its own: one chunk of one
document, no padding and no packing, so no token attends across documents. The plan is then trivial:
a pack a chunk, its capacity the chunk's length, the packs of a length together (ascending, as
the multi-bucket mode lays out its buckets), so the dataset's files and the reader's per-bucket
machinery are the bucket mode's. What the reader does with the buckets (batches of a fixed token
count, a length curriculum) is raypack.packing.curriculum's.
"""

from __future__ import annotations

import numpy as np

from raypack.packing._jit import njit
from raypack.packing.items import Items, check_depth, kept_lengths
from raypack.packing.plan import Plan

__all__ = ["check_lengths_of", "chunk_lengths", "is_power_of_two", "make_items", "plan"]


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def check_lengths_of(seq_len: int, min_seq_len: int) -> None:
    """ValueError unless both are powers of two with min_seq_len <= seq_len."""
    if not is_power_of_two(seq_len):
        raise ValueError(f"decompose needs seq_len a power of two, got {seq_len}")
    if not is_power_of_two(min_seq_len) or min_seq_len > seq_len:
        raise ValueError(f"min_seq_len must be a power of two <= seq_len={seq_len}, got {min_seq_len}")


def chunk_lengths(length: int, seq_len: int, min_seq_len: int = 1) -> list[int]:
    """One document's chunks, in order from its start (the module's rule): for reading and tests."""
    check_lengths_of(seq_len, min_seq_len)
    whole, rest = divmod(int(length), seq_len)
    bits = [1 << b for b in range(seq_len.bit_length() - 1, -1, -1) if rest >> b & 1]
    return [seq_len] * whole + [b for b in bits if b >= min_seq_len]


def make_items(lengths: np.ndarray, seq_len: int, overflow: str = "split", *, min_seq_len: int = 1) -> Items:
    """Every document's chunks (the module's rule), in document then chunk order. `overflow`
    truncate or drop applies first (as for any packer); split adds nothing: the rule cuts every
    document longer than seq_len already."""
    check_lengths_of(seq_len, min_seq_len)
    doc_length, kept = kept_lengths(lengths, seq_len, overflow)
    shift = seq_len.bit_length() - 1
    low = min_seq_len.bit_length() - 1
    doc_start = np.empty(len(kept) + 1, dtype=np.int64)
    length = np.empty(_count(kept, shift, low), dtype=np.int32)
    _chunk(kept, shift, low, doc_start, length)
    return Items(doc_length=doc_length, doc_start=doc_start, length=length)


@njit
def _count(kept, shift, low):
    total = 0
    mask = (1 << shift) - 1
    for n in kept:
        total += n >> shift
        rest = (n & mask) >> low
        while rest:  # one step a set bit (a chunk), not one a bit
            rest &= rest - 1
            total += 1
    return total


@njit
def _chunk(kept, shift, low, doc_start, out_length):
    k = 0
    doc_start[0] = 0
    seq_len = 1 << shift
    mask = (1 << shift) - 1
    floor = (1 << low) - 1
    for d in range(len(kept)):
        n = kept[d]
        for _ in range(n >> shift):
            out_length[k] = seq_len
            k += 1
        rest = n & mask & ~floor
        bits = 0
        probe = rest
        while probe:
            probe &= probe - 1
            bits += 1
        # The rest's powers of two, largest first: written from the last slot back, lowest bit first.
        at = k + bits - 1
        while rest:
            bit = rest & -rest
            out_length[at] = bit
            at -= 1
            rest ^= bit
        k += bits
        doc_start[d + 1] = k


def plan(hist: np.ndarray, seq_len: int, *, min_seq_len: int = 1, max_depth: int | None = None) -> Plan:
    """A pack a chunk: the chunks of length 2^i are packs of capacity 2^i, one after another, the
    lengths ascending. ValueError for a histogram with any other length (items not made by
    make_items with these settings). `max_depth` holds for any value: a pack holds one item."""
    check_lengths_of(seq_len, min_seq_len)
    check_depth(max_depth, 1)
    hist = np.asarray(hist, dtype=np.int64)
    lengths = np.flatnonzero(hist)
    allowed = [1 << b for b in range(min_seq_len.bit_length() - 1, seq_len.bit_length())]
    stray = np.setdiff1d(lengths, allowed)
    if stray.size:
        raise ValueError(
            f"decompose places chunks of a power of two in [{min_seq_len}, {seq_len}]; the histogram "
            f"has items of length {int(stray[0])}"
        )
    counts = hist[lengths]
    pack0 = np.cumsum(counts) - counts
    runs = np.zeros((len(lengths), 8), dtype=np.int64)
    # Columns of plan.RUN_COLUMNS: length, rank0, count, q, phase, pack0, slot0, offset0.
    runs[:, 0], runs[:, 2], runs[:, 3], runs[:, 5] = lengths, counts, 1, pack0
    return Plan.build(seq_len, int(counts.sum()), runs, pack0, lengths.astype(np.int64))
