"""Documents → packable items: the overflow policy, and the item-length histogram.

An *item* is what a packer places: a whole document, or one chunk of a document longer than `seq_len`.
With a `pad_multiple` k above 1 (pack.pad_multiple, for context parallelism) an item takes its
`span`, its length rounded up to a multiple of k, in its pack: its padding lies right after it, so
every item starts at a multiple of k. The packers place spans; `length` stays the real tokens.
Items of one document are contiguous and in order, so a CSR offset array (`doc_start`) is the whole
item→document map: 8 bytes per document instead of 8 per item plus a chunk column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raypack.packing._jit import njit

__all__ = [
    "OVERFLOW_POLICIES",
    "Items",
    "check_depth",
    "check_lengths",
    "check_pad_multiple",
    "item_histogram",
    "make_items",
]

OVERFLOW_POLICIES = ("split", "truncate", "drop")


@dataclass(frozen=True, slots=True)
class Items:
    """The items made from a list of documents, in document order then chunk order."""

    doc_length: np.ndarray
    """int64[documents]: the original document lengths, in tokens."""
    doc_start: np.ndarray
    """int64[documents + 1]: items of document d are `doc_start[d]:doc_start[d + 1]` (none if dropped)."""
    length: np.ndarray
    """int32[items]: tokens in each item."""
    pad_multiple: int = 1
    """Each item takes a multiple of this many positions in its pack (1: its length)."""

    @property
    def num_docs(self) -> int:
        return len(self.doc_length)

    @property
    def num_items(self) -> int:
        return len(self.length)

    @property
    def span(self) -> np.ndarray:
        """int32[items]: positions each item takes in its pack, its length rounded up to a multiple of
        pad_multiple (the length array itself when that is 1)."""
        k = self.pad_multiple
        if k == 1:
            return self.length
        return ((self.length.astype(np.int64) + k - 1) // k * k).astype(np.int32)

    def doc_of_item(self) -> np.ndarray:
        """int64[items]: the document each item comes from."""
        counts = np.diff(self.doc_start)
        return np.repeat(np.arange(self.num_docs, dtype=np.int64), counts)

    def _first_item_of_own_doc(self) -> np.ndarray:
        return np.repeat(self.doc_start[:-1], np.diff(self.doc_start))

    def chunk_index(self) -> np.ndarray:
        """int32[items]: 0 for a whole document or its first chunk, then 1, 2, ..."""
        idx = np.arange(self.num_items, dtype=np.int64)
        return (idx - self._first_item_of_own_doc()).astype(np.int32)

    def start_in_doc(self) -> np.ndarray:
        """int64[items]: token offset of each item inside its document (chunks are contiguous)."""
        cum = np.cumsum(self.length, dtype=np.int64) - self.length
        return cum - cum[self._first_item_of_own_doc()]

    def placed_per_doc(self) -> np.ndarray:
        """int64[documents]: tokens of each document that made it into items."""
        cum = np.concatenate(([0], np.cumsum(self.length, dtype=np.int64)))
        return cum[self.doc_start[1:]] - cum[self.doc_start[:-1]]


def check_depth(max_depth: int | None, no_cap: int) -> int:
    """A packer's cap on items per pack: `max_depth`, or `no_cap` (anything at least the item count)
    when it is None; ValueError below 1."""
    if max_depth is None:
        return max(int(no_cap), 1)
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return int(max_depth)


def check_lengths(lengths: np.ndarray | list[int]) -> np.ndarray:
    """Validate document lengths and return them as int64; raise ValueError naming the first bad one."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ValueError(f"lengths must be integers; document {bad[0]} has length {arr[bad[0]].item()!r}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        # An empty document has nothing to pack; the pipeline rejects it before it gets here.
        raise ValueError(f"lengths must be >= 1; document {bad[0]} has length {arr[bad[0]]}")
    return arr


def make_items(lengths: np.ndarray, seq_len: int, overflow: str = "split", pad_multiple: int = 1) -> Items:
    """Apply the overflow policy to documents longer than `seq_len`.

    split:    cut into `seq_len` chunks plus a remainder (Ding et al. 2024); the remainder is packed
              like any document, so only documents longer than the context are ever cut.
    truncate: keep the first `seq_len` tokens; the rest counts as dropped.
    drop:     leave the document out entirely; it counts as dropped.

    `pad_multiple` k: every item's span is a multiple of k. seq_len must be one too, so a chunk of
    seq_len tokens spans exactly seq_len and no split changes.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    check_pad_multiple(pad_multiple, seq_len)
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {overflow!r}")
    doc_length = check_lengths(lengths)
    n = len(doc_length)
    doc_start = np.zeros(n + 1, dtype=np.int64)
    if overflow == "split":
        # One numba pass, no temporaries: at 10M documents numpy's intermediates (chunk counts, last
        # positions, remainders) would push the peak from 25.6 to 36.6 bytes per document.
        total = _count_chunks(doc_length, seq_len)
        length = np.empty(total, dtype=np.int32)
        _split(doc_length, seq_len, doc_start, length)
    elif overflow == "truncate":
        doc_start[1:] = np.arange(1, n + 1)
        length = np.minimum(doc_length, seq_len).astype(np.int32)
    else:
        keep = doc_length <= seq_len
        np.cumsum(keep, out=doc_start[1:])
        length = doc_length[keep].astype(np.int32)
    return Items(doc_length=doc_length, doc_start=doc_start, length=length, pad_multiple=pad_multiple)


def kept_lengths(lengths: np.ndarray, seq_len: int, overflow: str) -> tuple[np.ndarray, np.ndarray]:
    """(every document's length, the tokens of each that `overflow` keeps) for a packer that cuts
    documents its own way: truncate and drop apply first, as for any packer; split keeps every
    token (the packer's own cuts split)."""
    if overflow == "split":
        doc_length = check_lengths(lengths)
        return doc_length, doc_length
    base = make_items(lengths, seq_len, overflow)
    return base.doc_length, base.placed_per_doc()


def check_pad_multiple(pad_multiple: int, seq_len: int) -> None:
    """ValueError unless pad_multiple is at least 1 and divides seq_len."""
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
    if seq_len % pad_multiple:
        raise ValueError(f"seq_len={seq_len} is not a multiple of pad_multiple={pad_multiple}")


@njit
def _count_chunks(doc_length, seq_len):
    total = 0
    for n in doc_length:
        total += (n + seq_len - 1) // seq_len
    return total


@njit
def _split(doc_length, seq_len, doc_start, out_length):
    k = 0
    for d in range(len(doc_length)):
        left = doc_length[d]
        while left > seq_len:
            out_length[k] = seq_len
            k += 1
            left -= seq_len
        out_length[k] = left
        k += 1
        doc_start[d + 1] = k


def item_histogram(item_length: np.ndarray, seq_len: int) -> np.ndarray:
    """int64[seq_len + 1]: how many items have each length (index 0 is always 0)."""
    hist = np.bincount(item_length, minlength=seq_len + 1).astype(np.int64, copy=False)
    if len(hist) > seq_len + 1:
        raise ValueError(f"an item is longer than seq_len={seq_len}")
    return hist
