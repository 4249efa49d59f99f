"""Non-negative least squares histogram packing (Krell et al., Graphcore 2021).

A *strategy* is a multiset of at most min(`max_depth`, 3) lengths that fills a pack exactly. With A the
length × strategy matrix of multiplicities and b the length histogram, NNLS finds repeat counts x ≥ 0
with A·x ≈ b; x is rounded down, and what the rounded strategies do not take is packed with bfd, so
nothing is lost. As in the paper the residual of very short lengths is weighted down (weight 0.09 below
8 tokens): they are the cheapest to place in the leftover packs.

The exact strategy set has ~seq_len²/12 columns (5.6M at 8192): too many. We coarsen lengths into
classes of `bin_width` tokens (a length L belongs to class ceil(L / bin_width)) and build strategies
over classes that sum to exactly seq_len // bin_width: every length in a class is at most class·width,
so every strategy still fits. The default width keeps 256 classes: ~5.5k strategies, a 1-2 s plan
(10M documents, seq_len 2048-8192), and at most width - 1 tokens of slack per item in the NNLS packs.
"""

from __future__ import annotations

import numpy as np

from raypack.packing import bfd
from raypack.packing.plan import Plan, concat_plans

__all__ = ["MAX_CLASSES", "plan", "too_many_classes"]

SHORT_CUTOFF = 8
SHORT_WEIGHT = 0.09
DEFAULT_CLASSES = 256
# The most classes a plan may have: the matrix and NNLS grow as classes³ (strategies ~ classes²/12, a
# row a class). 512 classes plan in 16-22 s on 2 cores and 1,024 in over 12 minutes (2.3 GB);
# seq_len 8192 at width 1 would need a 342 GiB matrix.
MAX_CLASSES = 512


def plan(
    hist: np.ndarray, seq_len: int, *, max_depth: int | None = None, bin_width: int | None = None
) -> Plan:
    """`max_depth`: the most items in any pack. Strategies hold at most min(max_depth, 3) (3 when
    None, the paper's setting); the bfd packs of what they leave hold at most max_depth (no cap when
    None, as in the paper)."""
    if max_depth is not None and max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    depth = 3 if max_depth is None else min(max_depth, 3)
    width = int(bin_width) if bin_width is not None else max(1, -(-seq_len // DEFAULT_CLASSES))
    if not 1 <= width <= seq_len:
        raise ValueError(f"bin_width must be in 1..seq_len, got {bin_width}")
    too_many = too_many_classes(seq_len, width)
    if too_many:
        raise ValueError(f"bin_width {too_many}")
    hist = np.asarray(hist, dtype=np.int64)
    k_max = seq_len // width
    lengths = np.arange(seq_len + 1)
    cls = -(-lengths // width)  # class of each length; lengths of class > k_max only go to bfd
    in_range = (lengths >= 1) & (cls <= k_max)
    b = np.bincount(cls[in_range], weights=hist[in_range], minlength=k_max + 1)[1:]

    strategies = _strategies(k_max, depth)  # int[n, 3], classes descending, 0 = empty
    a = np.zeros((k_max, len(strategies)))
    for col in range(3):
        used = strategies[:, col] > 0
        np.add.at(a, (strategies[used, col] - 1, np.flatnonzero(used)), 1.0)
    row_weight = np.ones(k_max)
    row_weight[(np.arange(k_max) * width + 1) < SHORT_CUTOFF] = np.sqrt(SHORT_WEIGHT)
    # Imported here: scipy.optimize costs ~0.5-0.8 s to import, paid otherwise by every process that
    # imports the config (the CLI, each tokenize worker), not only by the ones that plan with NNLSHP.
    from scipy import optimize

    x, _ = optimize.nnls(a * row_weight[:, None], b * row_weight, maxiter=50 * k_max)
    repeats = _fit_to_supply(strategies, np.floor(x).astype(np.int64), b.astype(np.int64))

    runs, num_packs, taken = _strategy_runs(strategies, repeats, hist, cls, k_max)
    nnls_plan = Plan.build(seq_len, num_packs, runs)
    leftover = hist - taken
    return concat_plans(nnls_plan, bfd.plan(leftover, seq_len, max_depth=max_depth), taken)


def too_many_classes(seq_len: int, width: int) -> str:
    """Why a bin width gives more classes than MAX_CLASSES ("" where it does not): the planner's
    check, and the config's before any work (raypack.config.pack)."""
    classes = seq_len // width
    if classes <= MAX_CLASSES:
        return ""
    return (
        f"{width} gives {classes} classes of seq_len {seq_len}; nnlshp plans at most {MAX_CLASSES} in "
        f"seconds (its default keeps {DEFAULT_CLASSES}): use a width of at least {-(-seq_len // MAX_CLASSES)}"
    )


def _strategies(k_max: int, max_depth: int) -> np.ndarray:
    """All multisets of <= max_depth classes (descending) summing to exactly k_max."""
    rows = [np.array([[k_max, 0, 0]])]
    if max_depth >= 2:
        small = np.arange(1, k_max // 2 + 1)
        rows.append(np.stack([k_max - small, small, np.zeros_like(small)], axis=1))
    if max_depth >= 3:
        c, bb = np.meshgrid(np.arange(1, k_max // 3 + 1), np.arange(1, k_max // 2 + 1), indexing="ij")
        a = k_max - c - bb
        ok = (bb >= c) & (a >= bb)
        rows.append(np.stack([a[ok], bb[ok], c[ok]], axis=1))
    return np.concatenate(rows).astype(np.int64)


def _fit_to_supply(strategies: np.ndarray, repeats: np.ndarray, supply: np.ndarray) -> np.ndarray:
    """Lower repeat counts until no class is used more often than it occurs (NNLS fits b only
    approximately, and an over-subscribed class would leave empty slots). Largest counts first."""
    left = np.concatenate(([0], supply))
    out = np.zeros_like(repeats)
    for j in np.argsort(-repeats, kind="stable"):
        if repeats[j] == 0:
            break
        need = np.bincount(strategies[j][strategies[j] > 0], minlength=len(left))
        used = need > 0
        out[j] = min(int(repeats[j]), int((left[used] // need[used]).min()))
        left -= out[j] * need
    return out


def _strategy_runs(
    strategies: np.ndarray, repeats: np.ndarray, hist: np.ndarray, cls: np.ndarray, k_max: int
) -> tuple[np.ndarray, int, np.ndarray]:
    """Runs for the rounded strategies. Items of a class are taken in (length, rank) order, so the
    items of length L taken are a prefix of L's ranks, and the leftover ranks start where they stop."""
    seq_len = len(hist) - 1
    taken = np.zeros_like(hist)
    runs: list[tuple[int, ...]] = []
    # cursor[k]: the smallest length of class k that still has untaken items (supply was checked by
    # _fit_to_supply, so a class never runs dry inside a block).
    first_len = np.full(k_max + 2, seq_len + 1, dtype=np.int64)
    for length in range(seq_len, 0, -1):
        if cls[length] <= k_max:
            first_len[cls[length]] = length
    cursor = first_len.copy()
    pack0 = 0
    for j in np.flatnonzero(repeats):
        pattern = [int(c) for c in strategies[j] if c > 0]
        for slot0, k in enumerate(pattern):
            if slot0 > 0 and pattern[slot0 - 1] == k:
                continue  # a repeated class is handled with its first slot, q = multiplicity
            q = pattern.count(k)
            need = int(repeats[j]) * q
            pos = 0  # position inside this (strategy, class) block
            while pos < need:
                length = int(cursor[k])
                while hist[length] - taken[length] == 0:
                    length += 1
                cursor[k] = length
                take = min(need - pos, int(hist[length] - taken[length]))
                runs.append((length, int(taken[length]), take, q, pos, pack0, slot0, -1))
                taken[length] += take
                pos += take
        pack0 += int(repeats[j])
    return np.array(runs, dtype=np.int64).reshape(-1, 8), pack0, taken
