"""Multi-bucket composition, after Liu et al., "Bucket pre-training is all you need" (2024), Algorithm 1.

Packs come in several lengths (buckets, e.g. 2048/4096/8192/16384; seq_len is the largest). Documents
longer than the largest bucket were cut into chunks of that size by the overflow policy. Then, until
every item is placed: take the longest remaining item; for each bucket that can hold it, smallest first,
fill a candidate pack greedily (repeatedly the longest remaining item that still fits); keep the first
candidate whose padding ratio is at most `padding_threshold`, or, if none is, the one with the least
padding. Small buckets keep short documents apart (low concatenation ratio); large ones absorb long
documents without cutting them; the threshold bounds the padding either way.

We run this on the length histogram. A candidate's greedy fill depends only on which lengths are still
available, so once a pack pattern is chosen it repeats unchanged while every length it (and every
candidate examined before it) took stays available in the same quantity regime; we emit all those
repeats at once. The loop thus runs per pattern change, not per pack.
"""

from __future__ import annotations

import numpy as np

from raypack.packing._buffers import grow_rows
from raypack.packing._jit import njit
from raypack.packing._segtree import tree_last_le, tree_new, tree_set
from raypack.packing.items import check_depth
from raypack.packing.plan import Plan

__all__ = ["DEFAULT_PADDING_THRESHOLD", "default_buckets", "plan"]

DEFAULT_PADDING_THRESHOLD = 0.01


def default_buckets(seq_len: int) -> tuple[int, ...]:
    """seq_len/8, /4, /2 and seq_len: 2048/4096/8192/16384 for seq_len 16384, as in the paper."""
    return tuple(sorted({max(1, seq_len // d) for d in (8, 4, 2, 1)}))


def plan(
    hist: np.ndarray,
    seq_len: int,
    *,
    bucket_lengths: tuple[int, ...] | None = None,
    padding_threshold: float = DEFAULT_PADDING_THRESHOLD,
    max_depth: int | None = None,
) -> Plan:
    """`max_depth`: at most this many items in a pack of any bucket (None: no cap); a candidate fill
    stops there, and its padding is judged as any other's."""
    buckets = tuple(sorted(set(bucket_lengths))) if bucket_lengths else default_buckets(seq_len)
    if buckets[0] < 1 or buckets[-1] != seq_len:
        raise ValueError(
            f"bucket lengths must be >= 1 with the largest equal to seq_len={seq_len}, got {buckets}"
        )
    if not 0.0 <= padding_threshold < 1.0:
        raise ValueError(f"padding_threshold must be in [0, 1), got {padding_threshold}")
    hist = np.asarray(hist, dtype=np.int64)
    depth = check_depth(max_depth, seq_len)  # a pack holds at most seq_len items of >= 1 token
    runs, cap_start, cap_value, num_packs = _compose(
        hist.copy(), np.array(buckets, dtype=np.int64), float(padding_threshold), depth
    )
    return Plan.build(seq_len, num_packs, runs, cap_start, cap_value)


@njit
def _fill(tree, count, capacity, max_depth, steps):
    """Greedy fill of one pack, at most max_depth items; writes (length, q) rows to steps; returns
    (rows, room)."""
    room = capacity
    nsteps = 0
    bound = room
    depth = 0
    while depth < max_depth:
        x = tree_last_le(tree, bound)
        if x <= 0:
            break
        fit = room // x
        q = fit if fit < count[x] else count[x]
        if q > max_depth - depth:
            q = max_depth - depth
        depth += q
        steps[nsteps, 0] = x
        steps[nsteps, 1] = q
        nsteps += 1
        room -= q * x
        # Lengths strictly decrease: x is either used up or no longer fits.
        bound = room if room < x - 1 else x - 1
    return nsteps, room


@njit
def _compose(count, buckets, threshold, max_depth):
    seq_len = buckets[-1]
    nb = len(buckets)
    tree = tree_new(seq_len + 1)
    for x in range(1, seq_len + 1):
        if count[x] > 0:
            tree_set(tree, x, True)
    consumed = np.zeros(seq_len + 1, dtype=np.int64)
    mult = np.zeros(seq_len + 1, dtype=np.int64)
    steps = np.empty((nb, seq_len + 1, 2), dtype=np.int64)
    nsteps = np.zeros(nb, dtype=np.int64)
    runs = np.empty((256, 8), dtype=np.int64)
    nr = 0
    caps = np.empty((64, 2), dtype=np.int64)
    nc = 0
    num_packs = np.int64(0)
    while tree[1] > 0:
        longest = tree[1]
        chosen, best, best_pad, evaluated = -1, -1, 2.0, 0
        for c in range(nb):
            if buckets[c] < longest:
                continue
            nsteps[c], room = _fill(tree, count, buckets[c], max_depth, steps[c])
            evaluated = c + 1
            pad = room / buckets[c]
            if pad < best_pad:
                best, best_pad = c, pad
            if pad <= threshold:
                chosen = c
                break
        if chosen < 0:
            chosen = best
        for s in range(nsteps[chosen]):
            mult[steps[chosen, s, 0]] = steps[chosen, s, 1]
        # How many times the chosen pattern repeats before any examined candidate's fill would change:
        # a fill that took q of length x is unchanged while at least q of x remain. (A fill limited by
        # the supply of x took all of it, so the bound is then 1.)
        k = np.int64(1) << 62
        for c in range(evaluated):
            if buckets[c] < longest:
                continue
            for s in range(nsteps[c]):
                x, q = steps[c, s, 0], steps[c, s, 1]
                if mult[x] == 0:
                    continue
                bound = 1 + (count[x] - q) // mult[x]
                if bound < k:
                    k = bound
        caps = grow_rows(caps, nc)
        caps[nc, 0] = num_packs
        caps[nc, 1] = buckets[chosen]
        nc += 1
        slot, offset = 0, 0
        for s in range(nsteps[chosen]):
            x, q = steps[chosen, s, 0], steps[chosen, s, 1]
            runs = grow_rows(runs, nr)
            runs[nr, 0] = x
            runs[nr, 1] = consumed[x]
            runs[nr, 2] = k * q
            runs[nr, 3] = q
            runs[nr, 4] = 0
            runs[nr, 5] = num_packs
            runs[nr, 6] = slot
            runs[nr, 7] = offset
            nr += 1
            consumed[x] += k * q
            count[x] -= k * q
            if count[x] == 0:
                tree_set(tree, x, False)
            slot += q
            offset += q * x
            mult[x] = 0
        num_packs += k
    return runs[:nr], caps[:nc, 0].copy(), caps[:nc, 1].copy(), num_packs
