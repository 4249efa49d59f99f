"""Attention-balanced global steps: packs' costs in, the (step, rank) of every pack out. Pure numpy,
no I/O (raypack.reader reads the costs and calls `balanced_steps` with balance="attention").

Why: packs of equal tokens are not equal work. Attention over a document of l tokens costs ~l²
(causal: 2·d·l² FLOPs a layer at hidden size d), the rest of the model ~24·d² a token, so a pack's
cost is Σ l² + per_token · Σ l over its documents. In data-parallel training every rank waits for the
slowest one at each step, so a step lasts as long as its dearest rank's packs.

How, for the packs of an epoch read in global steps of `world` ranks × `batch` packs, each rank's
share of them (a contiguous range of the reader's seeded order, as the unbalanced reader splits it)
cut into windows of `RANK_WINDOW_PACKS` packs' worth of steps, the same steps on every rank:
1. the ranks form neighbourhoods of consecutive ranks, enough of them that a window pools
   `WINDOW_PACKS` packs (`neighbourhood`); a pack goes only to a rank of its own share's
   neighbourhood, so a rank reads its neighbourhood's shares, not every rank's: at 1,024 packs a
   rank a window, 4 ranks' (where a rank's share is smaller, more ranks, about WINDOW_PACKS packs);
2. each neighbourhood's packs of the window go to `steps × ranks` bins of `batch` packs each, a
   round at a time: the round's packs (the next `bins` of them, dearest first) to the bins, the
   dearest pack to the cheapest bin so far (LPT's rule, every bin taking one pack a round); the
   bins, dearest first, are cut into steps of one bin a rank of the neighbourhood: where bins cannot
   cost alike (a pack of one 64k-token document outweighs any two packs of short ones), the bins
   holding such packs share steps, so each step's ranks still cost alike;
3. the neighbourhoods' steps are matched by rank in cost order (quantile matching: the window's
   dearest step takes every neighbourhood's dearest), the steps' order within the window and the
   ranks' order within a neighbourhood's step are seeded permutations. No cost decides the
   matching's permutation, so a neighbourhood's steps depend on its own packs' costs alone: a rank
   plans from its neighbourhood's (`neighbourhood_steps`), not from every pack's.
Windows follow the seeded order, and a step's packs are all of its window, so the epoch stays a
shuffle at the window's scale: no step's mean cost trends with its index. Deterministic: the same
costs and key give the same steps.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np

from raypack.packing import PackPermutation

__all__ = [
    "ATTENTION_PER_TOKEN",
    "BALANCE",
    "RANK_WINDOW_PACKS",
    "WINDOW_PACKS",
    "Balance",
    "balanced_steps",
    "imbalance",
    "neighbourhood",
    "neighbourhood_steps",
    "neighbourhoods",
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

# The packs a neighbourhood pools a window: large enough that the packs of long documents fill
# whole steps together (docs/benchmarks.md, 64 ranks × 2 at 64k, attention alone: max/mean 1.025
# pooling ~4,100 packs, 1.06 pooling ~1,500, 1.11 ~760), small enough that a rank reads few shares.
WINDOW_PACKS = 4096

# A rank's packs a window, which its reader keeps decoded (1,024 packs of 32k int32 tokens: 128 MiB);
# a rank reads its neighbourhood's WINDOW_PACKS / RANK_WINDOW_PACKS = 4 shares where its share is
# at least this.
RANK_WINDOW_PACKS = 1024


@dataclass(frozen=True, slots=True)
class Balance:
    """How a reader balances its steps: by attention cost, with this per-token weight, in windows of
    these sizes (module docstring; a test's small dataset may ask for small ones)."""

    per_token: float = ATTENTION_PER_TOKEN
    window: int = WINDOW_PACKS
    """The packs a neighbourhood pools a window."""
    rank_window: int = RANK_WINDOW_PACKS
    """A rank's packs a window."""

    def __post_init__(self) -> None:
        if not np.isfinite(self.per_token) or self.per_token < 0:
            raise ValueError(f"the balance's per_token must be a finite number >= 0, got {self.per_token!r}")
        for name in ("window", "rank_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"the balance's {name} must be an integer >= 1, got {value!r}")

    def cost(self, squares: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Each pack's cost from pack_terms' (Σ l², Σ l)."""
        return squares + self.per_token * tokens

    def steps(
        self, costs: np.ndarray, shares: np.ndarray, batch: int, key: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """balanced_steps in this balance's windows."""
        return balanced_steps(costs, shares, batch, key, self.window, self.rank_window)

    def neighbourhoods(self, shares: np.ndarray, batch: int) -> list[np.ndarray]:
        """`neighbourhoods` in this balance's windows."""
        return neighbourhoods(shares, batch, self.window, self.rank_window)

    def neighbourhood_steps(
        self, costs: np.ndarray, shares: np.ndarray, g: int, batch: int, key: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """neighbourhood_steps in this balance's windows."""
        return neighbourhood_steps(costs, shares, g, batch, key, self.window, self.rank_window)

    def neighbourhood(self, world: int, batch: int, full: int) -> int:
        """`neighbourhood` in this balance's windows."""
        return neighbourhood(world, batch, full, self.window, self.rank_window)

    def to_state(self) -> dict[str, object]:
        return {
            "kind": "attention",
            "per_token": self.per_token,
            "window": self.window,
            "rank_window": self.rank_window,
        }

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
        """A run's balance as a state records it (to_state; None: none). ValueError for a state of a
        balance that dealt every window to every rank (no `rank_window`: an earlier raypack's), whose
        steps this one cannot tell again."""
        if state is None:
            return None
        if not isinstance(state, dict) or state.get("kind") != "attention":
            raise ValueError(f"not a raypack balance: {state!r}")
        if "rank_window" not in state:
            raise ValueError(
                "the state is of a balanced run by an earlier raypack, which dealt each window to "
                "every rank: resume it with that raypack, or start the epoch afresh"
            )
        per_token = cls.attention(state.get("per_token")).per_token  # type: ignore[arg-type]
        return cls(per_token, state.get("window"), state.get("rank_window"))  # type: ignore[arg-type]


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


def _key(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


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


def neighbourhood(
    world: int, batch: int, full: int, window: int = WINDOW_PACKS, rank_window: int = RANK_WINDOW_PACKS
) -> int:
    """How many consecutive ranks pool their packs in a window (module docstring), for `full` steps
    that every rank fills: enough that a window pools `window` packs, at most `world`."""
    steps = min(full, max(1, rank_window // batch))
    return min(world, max(1, -(-window // max(1, steps * batch))))


def _groups(world: int, size: int) -> list[np.ndarray]:
    """The ranks of each neighbourhood: consecutive, as even in size as `size` allows."""
    count = -(-world // size)
    cuts = [world * g // count for g in range(count + 1)]
    return [np.arange(a, b) for a, b in itertools.pairwise(cuts)]


def _pool(costs: np.ndarray, ranks: int, steps: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """(step in the pool's cost order, place among its `ranks`) of each pack of one neighbourhood's
    window (module docstring, 2)."""
    bins = ranks * steps
    of = _bins(costs, bins)
    load = np.bincount(of, weights=costs, minlength=bins)
    slot = np.empty(bins, dtype=np.int64)
    slot[np.argsort(-load, kind="stable")] = np.arange(bins)  # // ranks: its step; % ranks: its place
    place = PackPermutation(bins, key)(np.arange(bins)).reshape(steps, ranks)
    rank_of_place = np.argsort(np.argsort(place, axis=1, kind="stable"), axis=1, kind="stable").reshape(-1)
    return slot[of] // ranks, rank_of_place[slot[of]]


def _check(costs: np.ndarray, shares: np.ndarray, batch: int) -> None:
    if len(shares) < 1 or batch < 1 or (shares < 0).any() or shares.sum() != len(costs):
        raise ValueError(f"need shares >= 0 summing to the {len(costs)} costs and batch >= 1")


def neighbourhoods(
    shares: np.ndarray, batch: int, window: int = WINDOW_PACKS, rank_window: int = RANK_WINDOW_PACKS
) -> list[np.ndarray]:
    """The ranks of each neighbourhood (module docstring, 1) for ranks of these `shares` (packs a
    rank) in steps of `batch` packs a rank: from the shares' sizes alone, no cost."""
    shares = np.asarray(shares, dtype=np.int64)
    if len(shares) < 1 or batch < 1:
        raise ValueError(f"need at least one rank's share and batch >= 1, got {len(shares)} and {batch}")
    full = int(shares.min()) // batch
    return _groups(len(shares), neighbourhood(len(shares), batch, full, window, rank_window))


def neighbourhood_steps(
    costs: np.ndarray,
    shares: np.ndarray,
    g: int,
    batch: int,
    key: int,
    window: int = WINDOW_PACKS,
    rank_window: int = RANK_WINDOW_PACKS,
) -> tuple[np.ndarray, np.ndarray]:
    """balanced_steps' (global step, rank) of the packs of neighbourhood `g` alone (its ranks'
    shares, `costs` theirs only, rank after rank): what balanced_steps gives them, from their costs
    and every rank's share's size (`shares`), not from other neighbourhoods' costs. A neighbourhood's
    steps are matched to the others' by their place in its own cost order, through a permutation of
    the window's steps that no cost decides, so its packs' steps depend on its packs alone."""
    costs = np.asarray(costs, dtype=np.float64)
    shares = np.asarray(shares, dtype=np.int64)
    ranks = neighbourhoods(shares, batch, window, rank_window)[g]
    _check(costs, shares[ranks], batch)
    first = np.r_[0, np.cumsum(shares[ranks])[:-1]]
    full = int(shares.min()) // batch
    per_window = max(1, rank_window // batch)
    step = np.empty(len(costs), dtype=np.int64)
    rank = np.empty(len(costs), dtype=np.int64)
    for k, lo in enumerate(range(0, full, per_window)):
        steps = min(per_window, full - lo)
        order = PackPermutation(steps, _key(key, k))(np.arange(steps))
        packs = (first[:, None] + lo * batch + np.arange(steps * batch)).reshape(-1)
        at, place = _pool(costs[packs], len(ranks), steps, _key(key, k, g))
        step[packs] = lo + order[at]
        rank[packs] = ranks[place]
    for i, r in enumerate(ranks.tolist()):  # a short last step: each rank's rest of its own share
        rest = np.arange(first[i] + full * batch, first[i] + shares[r])
        step[rest] = full + np.arange(len(rest)) // batch
        rank[rest] = r
    return step, rank


def balanced_steps(
    costs: np.ndarray,
    shares: np.ndarray,
    batch: int,
    key: int,
    window: int = WINDOW_PACKS,
    rank_window: int = RANK_WINDOW_PACKS,
) -> tuple[np.ndarray, np.ndarray]:
    """(global step, rank) of each pack of `costs` for steps of `batch` packs a rank: `costs` holds
    each rank's unbalanced share (`shares[r]` packs of rank r, rank after rank, in its reading
    order). Every step but the last holds `batch` packs a rank; where shares differ (by one pack,
    last_batch="short"), the last step takes each rank's rest of its own share. A pack goes only to
    a rank of its own rank's neighbourhood (module docstring), so a rank reads at most its
    neighbourhood's shares; each step's ranks' costs are as even as the windows make them (`window`
    packs a neighbourhood, `rank_window` a rank: module docstring). `key` seeds the permutations;
    the same costs, shares and key give the same steps. Each neighbourhood's part is
    neighbourhood_steps' of its own packs (a rank plans from its neighbourhood's costs alone)."""
    costs = np.asarray(costs, dtype=np.float64)
    shares = np.asarray(shares, dtype=np.int64)
    _check(costs, shares, batch)
    first = np.r_[0, np.cumsum(shares)]
    step = np.empty(len(costs), dtype=np.int64)
    rank = np.empty(len(costs), dtype=np.int64)
    for g, ranks in enumerate(neighbourhoods(shares, batch, window, rank_window)):
        lo, hi = first[ranks[0]], first[ranks[-1] + 1]
        step[lo:hi], rank[lo:hi] = neighbourhood_steps(
            costs[lo:hi], shares, g, batch, key, window, rank_window
        )
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
