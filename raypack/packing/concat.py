"""Concatenate-and-chunk: the standard practice the other packers are measured against.

All documents are laid end to end in corpus order and the stream is cut every seq_len tokens, so every
pack but the last is full (no padding) and any document that straddles a cut is split there, wherever
that falls: 31% of documents are cut at seq_len 2048 on lognormal(6, 1.2) lengths, against 8.8% for
bfd, which only cuts documents longer than the context (Ding et al. 2024, figure 1).
"""

from __future__ import annotations

import numpy as np

from raypack.packing._jit import njit
from raypack.packing.items import Items, kept_lengths

__all__ = ["assign", "make_concat_items"]


def make_concat_items(lengths: np.ndarray, seq_len: int, overflow: str) -> Items:
    """Items are the pieces the stream cuts make. `truncate`/`drop` still apply first, so a user who
    asked for them gets the same tokens as with any other packer; `split` adds nothing (cuts do)."""
    doc_length, stream = kept_lengths(lengths, seq_len, overflow)
    n_items = _count_pieces(stream, seq_len)
    doc_start = np.empty(len(stream) + 1, dtype=np.int64)
    length = np.empty(n_items, dtype=np.int32)
    _cut(stream, seq_len, doc_start, length)
    return Items(doc_length=doc_length, doc_start=doc_start, length=length)


def assign(items: Items, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The pieces are already cut at pack boundaries: pack k holds tokens [k·seq_len, (k+1)·seq_len)."""
    starts = np.cumsum(items.length, dtype=np.int64) - items.length
    pack = starts // seq_len
    offset = (starts - pack * seq_len).astype(np.int32)
    num_packs = int(pack[-1]) + 1 if len(pack) else 0
    first = np.searchsorted(pack, pack, side="left")
    slot = (np.arange(len(pack)) - first).astype(np.int32)
    return pack.astype(np.int32 if num_packs < 2**31 else np.int64), slot, offset, num_packs


@njit
def _count_pieces(stream, seq_len):
    pos, total = 0, 0
    for d in range(len(stream)):
        if stream[d] > 0:
            total += (pos + stream[d] - 1) // seq_len - pos // seq_len + 1
            pos += stream[d]
    return total


@njit
def _cut(stream, seq_len, doc_start, out_length):
    pos, k = 0, 0
    doc_start[0] = 0
    for d in range(len(stream)):
        left = stream[d]
        while left > 0:
            room = seq_len - pos % seq_len
            take = left if left < room else room
            out_length[k] = take
            k += 1
            pos += take
            left -= take
        doc_start[d + 1] = k
