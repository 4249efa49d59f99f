"""Properties every packer must have, on arbitrary lengths (hypothesis)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.packing import ALGORITHMS, check_assignment, expand, item_histogram, make_items, pack

# decompose plans its own chunks, never another packer's items: its plan is tested in test_decompose.py.
HISTOGRAM = [name for name, a in ALGORITHMS.items() if a.is_histogram and a.compared]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def corpora(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    seq_len = draw(st.integers(1, 64))
    lengths = draw(st.lists(st.integers(1, 3 * seq_len + 5), min_size=0, max_size=80))
    return np.array(lengths, dtype=np.int64), seq_len


def fit(algorithm: str, seq_len: int) -> int:
    """seq_len as the packer takes it: decompose's is a power of two (the largest below)."""
    return 1 << (seq_len.bit_length() - 1) if algorithm == "decompose" else seq_len


def assert_sound(lengths: np.ndarray, seq_len: int, algorithm: str, overflow: str, **options: object) -> None:
    seq_len = fit(algorithm, seq_len)
    a = pack(lengths, seq_len, algorithm, overflow=overflow, **options)
    check_assignment(a)
    it = a.items
    # Each item exactly once, in a real pack.
    assert len(a.pack) == it.num_items
    assert a.num_packs == (len(np.unique(a.pack)) if it.num_items else 0)
    # No pack over capacity.
    fill = np.bincount(a.pack, weights=it.length, minlength=a.num_packs)
    assert np.all(fill <= a.capacities())
    # Conservation of tokens, document by document.
    placed = it.placed_per_doc()
    if overflow == "split":
        assert np.array_equal(placed, lengths)
    elif overflow == "truncate":
        assert np.array_equal(placed, np.minimum(lengths, seq_len))
    else:
        assert np.array_equal(placed, np.where(lengths <= seq_len, lengths, 0))
    # Chunks are contiguous and in order: chunk starts add up.
    starts = it.start_in_doc()
    assert np.all(starts + it.length <= np.repeat(lengths, np.diff(it.doc_start)))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("overflow", ["split", "truncate", "drop"])
@SETTINGS
@given(corpus=corpora())
def test_every_item_placed_once_within_capacity_and_tokens_conserved(
    algorithm: str, overflow: str, corpus: tuple[np.ndarray, int]
) -> None:
    lengths, seq_len = corpus
    assert_sound(lengths, seq_len, algorithm, overflow)


DEPTH_CAPPED = [name for name, a in ALGORITHMS.items() if "max_depth" in a.options]


def test_every_packer_but_concat_takes_a_depth_cap() -> None:
    assert [name for name in ALGORITHMS if name != "concat"] == DEPTH_CAPPED
    with pytest.raises(ValueError, match="does not take option"):
        pack([5, 6], 8, "concat", max_depth=1)


@pytest.mark.parametrize("algorithm", DEPTH_CAPPED)
@pytest.mark.parametrize("overflow", ["split", "truncate"])
@SETTINGS
@given(corpus=corpora(), depth=st.integers(1, 5))
def test_depth_cap_respected(
    algorithm: str, overflow: str, corpus: tuple[np.ndarray, int], depth: int
) -> None:
    """No pack holds more than max_depth items, and everything else every packer promises still holds
    (each item once, capacity, tokens conserved)."""
    lengths, seq_len = corpus[0], fit(algorithm, corpus[1])
    assert_sound(lengths, seq_len, algorithm, overflow, max_depth=depth)
    a = pack(lengths, seq_len, algorithm, overflow=overflow, max_depth=depth)
    assert np.bincount(a.pack).max(initial=0) <= depth
    if ALGORITHMS[algorithm].is_histogram and a.items.num_items:
        plan = ALGORITHMS[algorithm].plan(  # type: ignore[misc]
            item_histogram(a.items.length, seq_len), seq_len, max_depth=depth
        )
        assert plan.pack_depth().max() <= depth
        pack_id, _, _ = expand(plan, a.items.length)
        assert np.array_equal(plan.pack_depth(), np.bincount(pack_id, minlength=plan.num_packs))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@SETTINGS
@given(corpus=corpora(), seed=st.none() | st.integers(0, 2**32))
def test_deterministic_for_a_seed(algorithm: str, corpus: tuple[np.ndarray, int], seed: int | None) -> None:
    lengths, seq_len = corpus[0], fit(algorithm, corpus[1])
    a = pack(lengths, seq_len, algorithm, seed=seed)
    b = pack(lengths.copy(), seq_len, algorithm, seed=seed)
    check_assignment(a)
    for name in ("pack", "slot", "offset"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert a.num_packs == b.num_packs


@pytest.mark.parametrize("algorithm", HISTOGRAM)
@SETTINGS
@given(corpus=corpora(), cuts=st.lists(st.integers(0, 200), max_size=5))
def test_shards_expand_alone_to_the_global_assignment(
    algorithm: str, corpus: tuple[np.ndarray, int], cuts: list[int]
) -> None:
    """What the distributed job does: each shard places its own items from the plan, its items' lengths
    and the counts of each length in earlier shards; the result must equal the one-process expansion."""
    lengths, seq_len = corpus
    items = make_items(lengths, seq_len)
    hist = item_histogram(items.length, seq_len)
    plan = ALGORITHMS[algorithm].plan(hist, seq_len)  # type: ignore[misc]
    whole = expand(plan, items.length)
    bounds = sorted({0, items.num_items, *(c for c in cuts if c <= items.num_items)})
    parts = []
    rank_base = np.zeros(seq_len + 1, dtype=np.int64)
    for lo, hi in itertools.pairwise(bounds):
        shard = items.length[lo:hi]
        parts.append(expand(plan, shard, rank_base))
        rank_base = rank_base + item_histogram(shard, seq_len)
    for k in range(3):
        joined = np.concatenate([p[k] for p in parts]) if parts else whole[k][:0]
        assert np.array_equal(joined, whole[k])


@pytest.mark.parametrize("algorithm", HISTOGRAM)
def test_plan_covers_exactly_the_histogram(algorithm: str) -> None:
    rng = np.random.default_rng(1)
    lengths = np.maximum(1, rng.lognormal(4.0, 1.0, 5000)).astype(np.int64)
    items = make_items(lengths, 256)
    hist = item_histogram(items.length, 256)
    plan = ALGORITHMS[algorithm].plan(hist, 256)  # type: ignore[misc]
    assert np.array_equal(plan.coverage(), hist)


@pytest.mark.parametrize("algorithm", HISTOGRAM)
@SETTINGS
@given(corpus=corpora())
def test_pack_load_from_the_runs_equals_the_expanded_items(
    algorithm: str, corpus: tuple[np.ndarray, int]
) -> None:
    assert_pack_load_matches_expand(algorithm, *corpus)


@pytest.mark.parametrize("algorithm", HISTOGRAM)
def test_pack_load_with_runs_that_start_and_end_inside_a_pack(algorithm: str) -> None:
    # Small property corpora rarely give such runs; on 20k lognormal documents nnlshp has ~250 runs
    # that start mid-pack (phase > 0) and ~30 that end in a partly filled one.
    lengths = np.maximum(1, np.random.default_rng(0).lognormal(5.0, 1.2, 20_000)).astype(np.int64)
    assert_pack_load_matches_expand(algorithm, lengths, 512)


def assert_pack_load_matches_expand(algorithm: str, lengths: np.ndarray, seq_len: int) -> None:
    items = make_items(lengths, seq_len)
    plan = ALGORITHMS[algorithm].plan(item_histogram(items.length, seq_len), seq_len)  # type: ignore[misc]
    pack_id, _, _ = expand(plan, items.length)
    expected = np.bincount(pack_id, weights=items.length, minlength=plan.num_packs).astype(np.int64)
    assert np.array_equal(plan.pack_load(), expected)


def test_expand_rejects_items_the_plan_does_not_cover() -> None:
    items = make_items(np.array([3, 3, 5]), 8)
    plan = ALGORITHMS["bfd"].plan(item_histogram(items.length, 8), 8)  # type: ignore[misc]
    with pytest.raises(ValueError, match="not covered by the plan"):
        expand(plan, np.array([3, 3, 3], dtype=np.int32))
