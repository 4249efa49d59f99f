"""Best-fit-decreasing, as in Ding et al., "Fewer truncations improve language modeling" (ICML 2024).

Items are taken longest first; each goes into the open pack with the least room that still fits it,
found with a segment tree over remaining capacities (plus a capacity → packs table), so the cost does
not grow with the number of packs. Documents longer than seq_len were already cut into seq_len chunks
plus a remainder by the overflow policy, so nothing else is ever cut. We run it on the length histogram
by groups of identical packs (see _groups.py): the packs are the ones item-level BFD produces, up to
which of several equally full packs an item lands in. 10M lognormal documents at seq_len 2048: the plan
takes 4 ms, the whole pack() (chunking, histogram, plan, per-item expansion) ~0.5 s, for 99.9988%
efficiency (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from raypack.packing._groups import fit_histogram
from raypack.packing.plan import Plan

__all__ = ["plan"]


def plan(hist: np.ndarray, seq_len: int, *, max_depth: int | None = None) -> Plan:
    return fit_histogram(hist, seq_len, best=True, stack=True, max_depth=max_depth)
