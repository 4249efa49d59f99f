"""Growable row buffers for numba loops that cannot know their output size in advance."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["grow_rows"]


@numba.njit(cache=True, nogil=True)
def grow_rows(a, used):
    """`a`, or a copy with twice the rows when row `used` does not exist yet (amortized O(1) appends)."""
    if used < a.shape[0]:
        return a
    b = np.empty((a.shape[0] * 2,) + a.shape[1:], dtype=a.dtype)  # noqa: RUF005 (numba: no star-unpacking)
    b[: a.shape[0]] = a
    return b
