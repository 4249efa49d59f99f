"""Stage 4, histogram: the global item histogram the plan is made from, summed from the runs'
histograms the tokenize stage folded (raypack.pipeline.tokenize.summary.Totals) and, in a mixture,
replaced by the selection's."""

from __future__ import annotations

import numpy as np

from raypack.config import PackConfig
from raypack.errors import JobError
from raypack.metrics import DocStats
from raypack.pipeline.tokenize.summary import Totals

__all__ = ["histogram"]


def histogram(pack: PackConfig, totals: Totals, selected_none: bool = False) -> tuple[np.ndarray, DocStats]:
    """The stage: the global item histogram the plan is made from, and the items' stats; a JobError
    when there is nothing to pack (every document dropped by pack.overflow: drop, or a mixture that
    selected no document: `selected_none`)."""
    hist, stats = totals.histogram(), totals.stats
    if stats.items == 0 and selected_none:
        raise JobError(
            "nothing to pack: the mixture selected no document (every source's target is 0 tokens)"
        )
    if stats.items == 0:  # only overflow: drop can place nothing (every document gives an item otherwise)
        raise JobError(
            f"nothing to pack: all {totals.documents:,} documents are longer than pack.seq_len "
            f"({pack.seq_len:,}) and pack.overflow is drop; use overflow: split or truncate, or a "
            "larger seq_len"
        )
    return hist, stats
