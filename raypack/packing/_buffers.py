"""Buffers for numba loops: growable rows for outputs of unknown size, and run copies."""

from __future__ import annotations

import numpy as np

from raypack.packing._jit import njit

__all__ = ["copy_runs", "grow_rows"]


@njit
def grow_rows(a, used):
    """`a`, or a copy with twice the rows when row `used` does not exist yet (amortized O(1) appends)."""
    if used < a.shape[0]:
        return a
    b = np.empty((a.shape[0] * 2,) + a.shape[1:], dtype=a.dtype)  # noqa: RUF005 (numba: no star-unpacking)
    b[: a.shape[0]] = a
    return b


@njit
def copy_runs(dst, dst_start, src, src_start, length):
    """dst[dst_start[i] : dst_start[i] + length[i]] = src[src_start[i] : ...] for every run i: what a
    fancy-index scatter does (dst[index] = src) without its index, 16 bytes a value in int64 for
    the index and its arange (2.6 GB for one 10,000 × 8192 file), at memory speed."""
    for i in range(length.shape[0]):
        d, s, n = dst_start[i], src_start[i], length[i]
        dst[d : d + n] = src[s : s + n]
