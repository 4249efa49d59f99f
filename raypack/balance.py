"""Attention-balanced global steps: packs' costs in, the (step, rank) of every pack out. Pure numpy,
no I/O (raypack.reader reads the costs and calls `balanced_steps` with balance="attention").

Why: packs of equal tokens are not equal work. Attention over a document of l tokens costs ~l²
(causal: 2·d·l² FLOPs a layer at hidden size d), the rest of the model ~24·d² a token, so a pack's
cost is Σ l² + per_token · Σ l over its documents. In data-parallel training every rank waits for the
slowest one at each step, so a step lasts as long as its dearest rank's packs.

How, for `n` packs in a seeded order (the reader's shuffle) read in global steps of `world` ranks ×
`batch` packs: the steps are cut into windows of `WINDOW_PACKS` packs' worth of steps, consecutive in
that order, and each window is balanced on its own:
1. its packs go to `steps × world` bins of `batch` packs each, a round at a time: the round's packs
   (the next `bins` of them, dearest first) to the bins, the dearest pack to the cheapest bin so far
   (LPT's rule, every bin taking one pack a round);
2. the bins, dearest first, are cut into the window's steps, `world` bins a step: where bins cannot
   cost alike (a pack of one 64k-token document outweighs any two packs of short ones), the bins
   holding such packs share steps, so each step's ranks still cost alike;
3. the steps' order within the window and the ranks' order within a step are seeded permutations.
Windows follow the seeded order, and a step's packs are all of its window, so the epoch stays a
shuffle at the window's scale: no step's mean cost trends with its index. Deterministic: the same
costs and key give the same steps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from raypack.packing import PackPermutation

__all__ = [
    "ATTENTION_PER_TOKEN",
    "BALANCE",
    "WINDOW_PACKS",
    "Balance",
    "balanced_steps",
    "imbalance",
    "pack_terms",
    "positions_of",
    "spans_of",
    "step_costs",
]

BALANCE = ("attention",)

# cost = Σ l² + per_token · Σ l: causal attention over a document of l tokens costs 2·d·l² FLOPs a
# layer, the rest of the layer (projections, MLP) ~24·d² a token, so per_token = 12·d; the default is
# a 7-8B model's (d = 4,096). Pass 12 × another model's d, or 0 for attention alone.
ATTENTION_PER_TOKEN = 49_152.0

# Large enough that the packs of long documents fill whole steps together (64 ranks × 1 pack, the
# hardest case, on docs/benchmarks.md's corpus at 32k: max/mean 1.04), small enough that a reader
# keeps a window's row groups decoded.
WINDOW_PACKS = 4096


@dataclass(frozen=True, slots=True)
class Balance:
    """How a reader balances its steps: by attention cost, with this per-token weight."""

    per_token: float = ATTENTION_PER_TOKEN

    def __post_init__(self) -> None:
        if not np.isfinite(self.per_token) or self.per_token < 0:
            raise ValueError(f"the balance's per_token must be a finite number >= 0, got {self.per_token!r}")

    def cost(self, squares: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Each pack's cost from pack_terms' (Σ l², Σ l)."""
        return squares + self.per_token * tokens

    def to_state(self) -> dict[str, object]:
        return {"kind": "attention", "per_token": self.per_token}

    @classmethod
    def of(cls, balance: str | None, per_token: float = ATTENTION_PER_TOKEN) -> Balance | None:
        """The balance a reader's `balance=` asks for (None: none); ValueError for another name."""
        if balance is None:
            return None
        if balance not in BALANCE:
            raise ValueError(f"balance must be one of {', '.join(BALANCE)} or None, got {balance!r}")
        return cls.attention(per_token)

    @classmethod
    def attention(cls, per_token: float = ATTENTION_PER_TOKEN) -> Balance:
        """Balance by attention cost with this per-token weight; ValueError for one that is no number."""
        if isinstance(per_token, bool) or not isinstance(per_token, (int, float)):
            raise ValueError(f"balance_per_token must be a number, got {per_token!r}")
        return cls(float(per_token))

    @classmethod
    def of_state(cls, state: object) -> Balance | None:
        """A run's balance as a state records it (to_state; None: none)."""
        if state is None:
            return None
        if not isinstance(state, dict) or state.get("kind") != "attention":
            raise ValueError(f"not a raypack balance: {state!r}")
        return cls.of("attention", state.get("per_token"))  # type: ignore[arg-type]


def pack_terms(offsets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ l², Σ l) over each pack's documents, float64, from doc_offsets as Arrow lays a list column
    out: `offsets` every pack's boundaries one pack after another (each pack's from 0 to its
    num_tokens), `counts` how many boundaries each pack has. A pack's cost is Balance.cost of them."""
    offsets = np.asarray(offsets, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    packs = len(counts)
    pack_of = np.repeat(np.arange(packs), counts)
    within = pack_of[1:] == pack_of[:-1]  # a difference across two packs' boundaries is no document
    docs = np.diff(offsets)[within].astype(np.float64)
    owner = pack_of[1:][within]
    squares = np.bincount(owner, weights=docs * docs, minlength=packs)
    return squares, np.bincount(owner, weights=docs, minlength=packs)


def _bins(costs: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each of `costs`, `bins` bins filled a round at a time: the round's packs (dearest
    first) each to a bin, the dearest to the cheapest bin so far; a last round short of `bins` packs
    goes to the cheapest bins. Ties go by index, so the result is deterministic."""
    order = np.argsort(-costs, kind="stable")
    load = np.zeros(bins, dtype=np.float64)
    out = np.empty(len(costs), dtype=np.int64)
    for start in range(0, len(order), bins):
        packs = order[start : start + bins]
        cheapest = np.argsort(load, kind="stable")[: len(packs)]
        out[packs] = cheapest
        load[cheapest] += costs[packs]
    return out


def _window(costs: np.ndarray, world: int, batch: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """(step within the window, rank) of each pack of one window (module docstring, 1-3)."""
    steps = -(-len(costs) // (world * batch))  # a short step is a window of its own: 1 step
    bins = steps * world
    of = _bins(costs, bins)
    load = np.bincount(of, weights=costs, minlength=bins)
    dearest = np.argsort(-load, kind="stable")
    slot = np.empty(bins, dtype=np.int64)
    slot[dearest] = np.arange(bins)  # slot // world: the bin's step in cost order; % world: its place
    step_order = PackPermutation(steps, key)(np.arange(steps)) if steps > 1 else np.zeros(1, np.int64)
    place = PackPermutation(bins, key + 1)(np.arange(bins)).reshape(steps, world)
    rank_of_place = np.argsort(np.argsort(place, axis=1, kind="stable"), axis=1, kind="stable").reshape(-1)
    return step_order[slot[of] // world], rank_of_place[slot[of]]


def balanced_steps(costs: np.ndarray, world: int, batch: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """(global step, rank) of each pack of `costs` (in the order read unbalanced) for steps of `world`
    ranks × `batch` packs: every step but the last holds world × batch packs, `batch` a rank; a
    last step short of that gives each rank its share within one pack. Each step's ranks' costs are as
    even as the module docstring's windows make them; `key` seeds the permutations."""
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if world < 1 or batch < 1:
        raise ValueError(f"need world >= 1 and batch >= 1, got {world} and {batch}")
    step = np.empty(n, dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    per_step = world * batch
    window = max(1, WINDOW_PACKS // per_step) * per_step
    full = n // per_step * per_step
    cuts = [*range(0, full, window), full] + ([n] if n > full else [])
    for k, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        s, r = _window(costs[lo:hi], world, batch, key + 2 * k)
        step[lo:hi] = s + lo // per_step
        rank[lo:hi] = r
    return step, rank


def positions_of(spans: list[tuple[int, int]], virtual: np.ndarray) -> np.ndarray:
    """The position each of `virtual` names in `spans` ([start, end) ranges whose positions, one
    after another, are virtual positions 0, 1, ...; past the last, from the first again)."""
    sizes = np.array([b - a for a, b in spans], dtype=np.int64)
    if not len(virtual) or not sizes.sum():
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(sizes)
    v = np.asarray(virtual, dtype=np.int64) % ends[-1]
    k = np.searchsorted(ends, v, side="right")
    return np.array([a for a, _ in spans], dtype=np.int64)[k] + v - (ends[k] - sizes[k])


def spans_of(positions: np.ndarray) -> list[tuple[int, int]]:
    """Positions, in their order, as [start, end) ranges, consecutive ones merged."""
    if not len(positions):
        return []
    cuts = np.flatnonzero(np.diff(positions) != 1) + 1
    lo = positions[np.r_[0, cuts]]
    hi = positions[np.r_[cuts - 1, len(positions) - 1]] + 1
    return list(zip(lo.tolist(), hi.tolist(), strict=True))


def step_costs(costs: np.ndarray, step: np.ndarray, rank: np.ndarray, world: int) -> np.ndarray:
    """(steps, world) float64: each rank's cost at each step (a rank with no pack in a step: 0)."""
    steps = int(step.max()) + 1 if len(step) else 0
    flat = np.bincount(step * world + rank, weights=costs, minlength=steps * world)
    return flat.reshape(steps, world)


def imbalance(per_rank: np.ndarray) -> float:
    """The mean over steps of max / mean rank cost (1.0: every rank of every step costs alike)."""
    per_rank = np.asarray(per_rank, dtype=np.float64)
    mean = per_rank.mean(axis=1)
    ok = mean > 0
    if not ok.any():
        return 1.0
    return float((per_rank.max(axis=1)[ok] / mean[ok]).mean())
