"""Longest-pack-first histogram packing (Krell et al., "Efficient sequence packing without
cross-contamination", Graphcore 2021): an alias of `bfd`, under Krell's name.

Krell's procedure walks the histogram from the longest length down; each length goes into the open
strategy with the least room that fits it, as many copies per pack as fit ("distribute"), and a length
that fits nowhere opens packs of as many copies as fit; packs that are full or reach `max_depth`
sequences close. That is best-fit-decreasing on the histogram, step for step: this module makes the
same call as bfd.py, and tests/packing/test_references.py checks the packs (each a multiset of
lengths, not just the fills) against a plain transcription of Krell's published procedure, with and
without depth caps. Kept as its own name so a config can say which paper it follows.
"""

from __future__ import annotations

import numpy as np

from raypack.packing._groups import fit_histogram
from raypack.packing.plan import Plan

__all__ = ["plan"]


def plan(hist: np.ndarray, seq_len: int, *, max_depth: int | None = None) -> Plan:
    return fit_histogram(hist, seq_len, best=True, stack=True, max_depth=max_depth)
