"""Longest-pack-first histogram packing (Krell et al., "Efficient sequence packing without
cross-contamination", Graphcore 2021).

Walks the histogram from the longest length down; each length goes into the strategy (group of
identical packs) with the least room that fits it, several copies per pack when they fit, and packs
that reach `max_depth` sequences are closed. With no depth cap this is exactly best-fit-decreasing on
the histogram, so it makes as many packs as `bfd`; with a cap it trades efficiency for fewer documents
per pack (at depth 3 and seq_len 8192 most of each pack stays empty on web-like length distributions).
"""

from __future__ import annotations

import numpy as np

from raypack.packing._groups import fit_histogram
from raypack.packing.plan import Plan

__all__ = ["plan"]


def plan(hist: np.ndarray, seq_len: int, *, max_depth: int | None = None) -> Plan:
    return fit_histogram(hist, seq_len, best=True, stack=True, max_depth=max_depth)
