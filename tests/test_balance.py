"""raypack.balance: every pack gets one (step, rank) slot, every step's ranks cost alike, the order
stays a shuffle, and the costs come from doc_offsets as the reader gives documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.balance import (
    RANK_WINDOW_PACKS,
    WINDOW_PACKS,
    Balance,
    balanced_steps,
    imbalance,
    neighbourhood,
    neighbourhood_steps,
    neighbourhoods,
    pack_terms,
    step_costs,
)
from raypack.packing import pack


def _unbalanced(costs: np.ndarray, world: int, batch: int) -> np.ndarray:
    """(steps, world) rank costs of the reader's unbalanced split of whole rounds: rank r reads the
    r-th world-th of the order, batch packs a step."""
    steps = len(costs) // (world * batch)
    return costs[: steps * world * batch].reshape(world, steps, batch).sum(axis=2).T


def _heavy_tailed(docs: int, seq_len: int, seed: int = 0) -> np.ndarray:
    """Pack costs (Σ l² a pack) of a long-document corpus packed by raypack's bfd: a lognormal body
    (median 1,024 tokens, σ 1.5) and 3% of documents from a Pareto tail (from 8k, α 1.1, up to 256k),
    documents past seq_len cut into chunks; packs in a seeded order."""
    rng = np.random.default_rng(seed)
    body = rng.lognormal(np.log(1024), 1.5, docs)
    tail = 8192 * (1 + rng.pareto(1.1, docs))
    lengths = np.clip(np.where(rng.random(docs) < 0.03, tail, body), 16, 262_144).astype(np.int64)
    a = pack(lengths, seq_len, "bfd", seed=seed)
    item = a.items.length.astype(np.float64)
    return np.bincount(a.pack, weights=item * item, minlength=a.num_packs)


def _shares(total: int, world: int) -> np.ndarray:
    """The reader's last_batch="short" split: rank r's share, the counts a pack apart at most."""
    return np.diff([total * r // world for r in range(world + 1)])


@settings(max_examples=80, deadline=None)
@given(
    costs=st.lists(st.integers(0, 10**6), min_size=0, max_size=300),
    world=st.integers(1, 9),
    batch=st.integers(1, 4),
    key=st.integers(0, 2**62),
    windows=st.sampled_from([(WINDOW_PACKS, RANK_WINDOW_PACKS), (8, 4), (12, 2), (5, 5)]),
)
def test_every_pack_takes_one_slot_of_its_neighbourhood_and_every_step_but_the_last_is_full(
    costs: list[int], world: int, batch: int, key: int, windows: tuple[int, int]
) -> None:
    """Each pack one (step, rank); every step but the last has `batch` packs on each rank; the last
    holds each rank's rest of its own share; a pack goes only to a rank of its share's
    neighbourhood (consecutive ranks, `neighbourhood` of them at most), so a rank takes packs of that
    many shares at most; the same key gives the same steps."""
    c = np.array(costs, dtype=np.float64)
    shares = _shares(len(c), world)
    step, rank = balanced_steps(c, shares, batch, key, *windows)
    assert len(step) == len(rank) == len(c)
    if not len(c):
        return
    steps = -(-int(shares.max()) // batch)
    assert step.min() == 0 and step.max() == steps - 1
    assert rank.min() >= 0 and rank.max() < world
    counts = np.bincount(step * world + rank, minlength=steps * world).reshape(steps, world)
    full = int(shares.min()) // batch
    assert (counts[:full] == batch).all()
    assert (counts[full:].sum(axis=0) == shares - full * batch).all()
    owner = np.repeat(np.arange(world), shares)
    size = neighbourhood(world, batch, full, *windows)
    assert (np.abs(rank - owner) < size).all()
    for r in range(world):
        assert len(np.unique(owner[rank == r])) <= size
    again = balanced_steps(c, shares, batch, key, *windows)
    assert np.array_equal(again[0], step) and np.array_equal(again[1], rank)


@settings(max_examples=80, deadline=None)
@given(
    costs=st.lists(st.integers(0, 10**6), min_size=1, max_size=300),
    world=st.integers(1, 12),
    batch=st.integers(1, 4),
    key=st.integers(0, 2**62),
    windows=st.sampled_from([(WINDOW_PACKS, RANK_WINDOW_PACKS), (8, 4), (12, 2), (5, 5), (20, 3)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_neighbourhoods_steps_come_from_its_own_packs_costs_alone(
    costs: list[int], world: int, batch: int, key: int, windows: tuple[int, int], seed: int
) -> None:
    """neighbourhood_steps of one neighbourhood's packs, given their costs alone, are balanced_steps'
    for them, whatever every other pack costs (redrawn here): a rank needs its neighbourhood's
    costs only."""
    c = np.array(costs, dtype=np.float64)
    shares = _shares(len(c), world)
    first = np.r_[0, np.cumsum(shares)]
    groups = neighbourhoods(shares, batch, *windows)
    assert np.array_equal(np.concatenate(groups), np.arange(world))
    step, rank = balanced_steps(c, shares, batch, key, *windows)
    rng = np.random.default_rng(seed)
    for g, ranks in enumerate(groups):
        lo, hi = first[ranks[0]], first[ranks[-1] + 1]
        mine = neighbourhood_steps(c[lo:hi], shares, g, batch, key, *windows)
        assert np.array_equal(mine[0], step[lo:hi]) and np.array_equal(mine[1], rank[lo:hi])
        other = rng.integers(0, 10**6, len(c)).astype(np.float64)
        other[lo:hi] = c[lo:hi]
        again = balanced_steps(other, shares, batch, key, *windows)
        assert np.array_equal(again[0][lo:hi], step[lo:hi]) and np.array_equal(again[1][lo:hi], rank[lo:hi])


@pytest.mark.parametrize("world", [8, 64, 1_000, 100_000])
def test_a_rank_reads_four_shares_at_most_whatever_the_world_size(world: int) -> None:
    """Where a rank's share is at least a rank's window, a neighbourhood is WINDOW_PACKS /
    RANK_WINDOW_PACKS = 4 ranks at any world size (the old balance dealt every window to all)."""
    assert neighbourhood(world, 2, 10**6) == WINDOW_PACKS // RANK_WINDOW_PACKS == 4
    assert neighbourhood(world, 2, RANK_WINDOW_PACKS // 2) == 4
    assert neighbourhood(world, 1, 10) == min(world, -(-WINDOW_PACKS // 10))  # a small share: ~4,096 packs


def test_balanced_beats_a_split_that_is_provably_uneven() -> None:
    """Packs in an order whose first half costs 100 each and second half 1: the unbalanced reader
    gives rank 0 of 2 the dear packs at every step (max/mean 200/101); balanced, the ranks of every
    step cost alike (1.0 exactly: each window's packs pair equal costs)."""
    n = 4 * WINDOW_PACKS
    costs = np.r_[np.full(n // 2, 100.0), np.full(n // 2, 1.0)]
    assert imbalance(_unbalanced(costs, 2, 1)) == pytest.approx(200 / 101)
    step, rank = balanced_steps(costs, _shares(n, 2), 1, key=5)
    assert imbalance(step_costs(costs, step, rank, 2)) == 1.0


@pytest.mark.parametrize(("world", "batch"), [(8, 2), (64, 2)])
def test_a_long_document_corpus_meets_the_goal(world: int, batch: int) -> None:
    """bfd at 32k on the heavy-tailed corpus: unbalanced, a step's dearest rank costs 1.5-2× the
    mean; balanced, at most 1.05 (the goal)."""
    costs = _heavy_tailed(40_000, 32_768)
    before = imbalance(_unbalanced(costs, world, batch))
    n = len(costs) // (world * batch) * world * batch
    step, rank = balanced_steps(costs[:n], _shares(n, world), batch, key=1)
    after = imbalance(step_costs(costs[:n], step, rank, world))
    assert before > 1.4
    assert after <= 1.05


def test_neighbourhoods_of_four_meet_the_goal_where_shares_are_large() -> None:
    """64 ranks × 2 at 16k, ~1,500 packs a rank: 4 ranks a neighbourhood (a rank reads 4 shares, as
    at any world size where a rank's share exceeds 1,024 packs); max/mean still at most 1.05
    (unbalanced: over 1.4)."""
    world, batch = 64, 2
    costs = _heavy_tailed(400_000, 16_384, seed=2)
    n = len(costs) // (world * batch) * world * batch
    shares = _shares(n, world)
    assert neighbourhood(world, batch, n // world // batch) == 4
    step, rank = balanced_steps(costs[:n], shares, batch, key=4)
    assert imbalance(_unbalanced(costs, world, batch)) > 1.4
    assert imbalance(step_costs(costs[:n], step, rank, world)) <= 1.05


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


@pytest.mark.parametrize("windows", [(WINDOW_PACKS, RANK_WINDOW_PACKS), (512, 128)])
def test_the_order_stays_a_shuffle(windows: tuple[int, int]) -> None:
    """No trend of a step's mean cost with its index (|Spearman ρ| within 4 standard errors, which a
    length-sorted order far exceeds); every pack is read in the steps of its window (the steps its
    share's unbalanced rank reads it in, cut at a rank's window), and the dear packs are not put
    first within a window; in one window (the default sizes) and in 5 (a rank's window 128 packs)."""
    world, batch = 8, 2
    costs = _heavy_tailed(40_000, 32_768, seed=3)
    n = len(costs) // (world * batch) * world * batch
    costs = costs[:n]
    step, rank = balanced_steps(costs, _shares(n, world), batch, 9, *windows)
    means = step_costs(costs, step, rank, world).mean(axis=1)
    bound = 4 / np.sqrt(len(means))
    assert abs(_spearman(np.arange(len(means)), means)) < bound
    curriculum = np.sort(costs).reshape(-1, world * batch).mean(axis=1)  # what must not happen
    assert abs(_spearman(np.arange(len(curriculum)), curriculum)) > bound
    window_steps = windows[1] // batch
    read_at = np.arange(n) % (n // world) // batch  # the step its own rank reads it at unbalanced
    assert (step // window_steps == read_at // window_steps).all()
    total = int(step.max()) + 1
    size = np.minimum(window_steps, total - step // window_steps * window_steps)  # each pack's window's
    first = step % window_steps < size // 2
    dear = costs >= np.quantile(costs, 0.9)
    assert 0.4 < first[dear].mean() < 0.6


def test_pack_terms_are_the_documents_squares_and_tokens() -> None:
    """From doc_offsets as Arrow lays them out: each pack's documents' Σ l² and Σ l, the padding
    tail no document, an empty pack nothing."""
    packs = [[0, 3, 10], [0, 256], [0], [0, 1, 2, 3]]
    flat = np.array([o for p in packs for o in p])
    squares, tokens = pack_terms(flat, np.array([len(p) for p in packs]))
    assert squares.tolist() == [9 + 49, 256**2, 0, 3]
    assert tokens.tolist() == [10, 256, 0, 3]
    assert Balance(per_token=2.0).cost(squares, tokens).tolist() == [78, 256**2 + 512, 0, 9]


def test_a_balance_a_reader_cannot_follow_is_refused() -> None:
    with pytest.raises(ValueError, match="balance must be one of attention"):
        Balance.of("flops")
    with pytest.raises(ValueError, match="per_token must be a finite number >= 0"):
        Balance.of("attention", -1.0)
    with pytest.raises(ValueError, match="balance_per_token must be a number"):
        Balance.of("attention", "big")  # type: ignore[arg-type]
    assert Balance.of(None) is None
    assert Balance.of_state(Balance(7.0).to_state()) == Balance(7.0)
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        Balance(window=0)
    with pytest.raises(ValueError, match="by an earlier raypack, which dealt each window to every rank"):
        Balance.of_state({"kind": "attention", "per_token": 7.0})
    small = Balance(7.0, window=64, rank_window=16)
    assert Balance.of_state(small.to_state()) == small
