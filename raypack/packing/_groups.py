"""Fit-decreasing packing on a length histogram, by groups of identical packs.

Item-level best-fit-decreasing (Ding et al. 2024) keeps, per remaining capacity, the list of open packs
with that much room, and a segment tree over capacities to find the tightest one that fits. Processing
the c items of one length L in a row, every choice is determined by the capacity table alone, so packs
that were opened together and received the same items stay interchangeable: we keep them as one *group*
(a contiguous range of pack ids with one content pattern). A step then places many items at once:

- the tightest group with room r >= L takes q = r // L items per pack (after one item, the same pack has
  room r - L, which is the new tightest fit while >= L, so item-level BFD stacks exactly q there);
- m = min(packs in group, items left // q) packs take q each, and one pack may take the remainder;
- the group splits into at most three contiguous pack ranges; none are ever merged, so pack ids stay
  fixed from the step that opened them.

Each step ends a length or consumes a group, so the work is O(steps · log seq_len) with steps bounded by
O(seq_len²) and in practice ~3 per distinct length: independent of the number of items. The same engine
with "worst fit, one item per pack per step" is Krell et al.'s SPFHP, and with a depth cap it is LPFHP.
"""

from __future__ import annotations

import numpy as np

from raypack.packing._buffers import grow_rows
from raypack.packing._jit import njit
from raypack.packing._segtree import tree_first_ge, tree_new, tree_set
from raypack.packing.plan import Plan

__all__ = ["fit_histogram"]

# Group table columns.
G_BASE, G_COUNT, G_USED, G_DEPTH, G_NEXT = range(5)


def fit_histogram(hist: np.ndarray, seq_len: int, *, best: bool, stack: bool, max_depth: int | None) -> Plan:
    """Plan for the item-length histogram `hist` (int[seq_len + 1]).

    best:  tightest fitting pack (best fit) if True, roomiest (worst fit, Krell's SPFHP) if False.
    stack: put as many items of one length into a pack as fit in one step (BFD/LPFHP), else one.
    max_depth: at most this many items per pack (None: unlimited).
    """
    depth = seq_len if max_depth is None else int(max_depth)
    if depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    if len(hist) != seq_len + 1:
        raise ValueError(f"histogram must have seq_len + 1 = {seq_len + 1} entries, got {len(hist)}")
    runs, num_packs = _fit(np.asarray(hist, dtype=np.int64), seq_len, best, stack, depth)
    return Plan.build(seq_len, num_packs, runs)


@njit
def _push(groups, ng, head, tree, room, base, count, used, depth):
    """Add group `ng` (packs base..base+count-1) to the list of groups with `room` left."""
    groups = grow_rows(groups, ng)
    groups[ng, G_BASE] = base
    groups[ng, G_COUNT] = count
    groups[ng, G_USED] = used
    groups[ng, G_DEPTH] = depth
    groups[ng, G_NEXT] = head[room]
    if head[room] < 0:
        tree_set(tree, room, True)
    head[room] = ng
    return groups


@njit
def _fit(hist, seq_len, best, stack, max_depth):
    tree = tree_new(seq_len + 1)
    head = np.full(seq_len + 1, -1, dtype=np.int64)
    groups = np.empty((256, 5), dtype=np.int64)
    ng = 0
    runs = np.empty((256, 8), dtype=np.int64)
    nr = 0
    num_packs = 0
    for length in range(seq_len, 0, -1):
        n = hist[length]
        rank = 0
        while n > 0:
            if best:
                r = tree_first_ge(tree, length)
            else:
                r = tree[1] if tree[1] >= length else -1
            if r < 0:
                # Nothing open fits: open packs, each taking as many of these items as fit.
                base, count, used, depth = num_packs, n, 0, 0
                q = seq_len // length if stack else 1
            else:
                g = head[r]
                head[r] = groups[g, G_NEXT]
                if head[r] < 0:
                    tree_set(tree, r, False)
                base, count = groups[g, G_BASE], groups[g, G_COUNT]
                used, depth = groups[g, G_USED], groups[g, G_DEPTH]
                q = r // length if stack else 1
            if q > max_depth - depth:
                q = max_depth - depth
            m = min(count, n // q)
            # Up to two new groups (m packs with q items, one pack with the remainder), then the rest.
            # Run rows follow plan.RUN_COLUMNS.
            for part in range(2):
                if part == 0:
                    k, per = m, q
                else:
                    k, per = (1, n) if (n > 0 and count > 0) else (0, 0)
                if k == 0:
                    continue
                runs = grow_rows(runs, nr)
                runs[nr, 0] = length
                runs[nr, 1] = rank
                runs[nr, 2] = k * per
                runs[nr, 3] = per
                runs[nr, 4] = 0
                runs[nr, 5] = base
                runs[nr, 6] = depth
                runs[nr, 7] = used
                nr += 1
                new_used = used + per * length
                new_depth = depth + per
                room = seq_len - new_used
                if room > 0 and new_depth < max_depth:
                    groups = _push(groups, ng, head, tree, room, base, k, new_used, new_depth)
                    ng += 1
                if r < 0:
                    num_packs += k
                rank += k * per
                n -= k * per
                base += k
                count -= k
            if r >= 0 and count > 0:
                # The untouched rest of the group keeps its room and stays the tightest fit.
                groups = _push(groups, ng, head, tree, r, base, count, used, depth)
                ng += 1
    return runs[:nr], num_packs
