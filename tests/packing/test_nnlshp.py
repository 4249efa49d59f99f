from __future__ import annotations

import numpy as np
import pytest

from raypack.packing import check_assignment, item_histogram, make_items, pack
from raypack.packing.nnlshp import _fit_to_supply, _strategies, plan


@pytest.mark.parametrize("k_max", [1, 2, 7, 30])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_strategies_fill_exactly_and_are_all_there(k_max: int, depth: int) -> None:
    s = _strategies(k_max, depth)
    assert np.all(s.sum(axis=1) == k_max)
    assert np.all((s > 0).sum(axis=1) <= depth)
    assert np.all(np.diff(s, axis=1)[:, :1] <= 0)  # descending where present
    brute = {
        tuple(sorted((a, b, c), reverse=True))
        for a in range(k_max + 1)
        for b in range(k_max + 1)
        for c in range(k_max + 1)
        if a + b + c == k_max and sum(v > 0 for v in (a, b, c)) <= depth
    }
    assert {tuple(r) for r in s.tolist()} == brute
    assert len(s) == len(brute)


def test_rounded_strategies_never_ask_for_more_than_exists() -> None:
    strategies = np.array([[3, 1, 0], [2, 2, 0], [4, 0, 0]])
    supply = np.array([5, 4, 1, 2])  # classes 1..4
    out = _fit_to_supply(strategies, np.array([4, 3, 9]), supply)
    use = np.zeros(5, dtype=np.int64)
    for row, r in zip(strategies, out, strict=True):
        for c in row[row > 0]:
            use[c] += r
    assert np.all(use[1:] <= supply)
    # Largest request first: [4]×9 gets the 2 fours; [3,1]×4 the one three; [2,2]×3 the four twos.
    assert out.tolist() == [1, 2, 2]


def test_exact_fills_are_found_and_leftovers_go_to_bfd() -> None:
    # 300 pairs that fill 100 exactly, plus odd lengths: NNLS must pack the pairs in full packs.
    lengths = np.array([60] * 300 + [40] * 300 + [7, 13, 29])
    a = pack(lengths, 100, "nnlshp", bin_width=1)
    check_assignment(a)
    full = a.pack_fill() == 100
    assert full.sum() >= 300
    assert a.num_packs == 301  # 7 + 13 + 29 share one more pack


def test_nnls_packs_respect_depth_and_efficiency_on_lognormal() -> None:
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(6.0, 1.2, 50_000)).astype(np.int64)
    items = make_items(lengths, 2048)
    p = plan(item_histogram(items.length, 2048), 2048)
    nnls_packs = p.runs[p.runs[:, 7] < 0]  # NNLS runs leave offsets to slot order
    assert len(nnls_packs) > 0
    assert np.all(nnls_packs[:, 6] + nnls_packs[:, 3] - 1 <= 2)  # last slot used <= 2: depth <= 3
    a = pack(lengths, 2048, "nnlshp")
    assert a.items.length.sum() / (a.num_packs * 2048) > 0.99


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="max_depth must be >= 1"):
        pack([5], 10, "nnlshp", max_depth=0)
    with pytest.raises(ValueError, match="bin_width"):
        pack([5], 10, "nnlshp", bin_width=11)
