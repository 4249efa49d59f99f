"""The length curricula (raypack.packing.curriculum): every batch once, deterministic, and the
growing ones step for step the sub-cycles of OLMo-core's own (VSLGrowP2Curriculum,
VSLGrowLinearCurriculum) on the same bucket counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from olmo_core.data import VSLGrowLinearCurriculum, VSLGrowP2Curriculum, VSLNaturalCurriculum

from raypack.packing import PackPermutation
from raypack.packing.curriculum import CURRICULA, Curriculum, bucket_odds, cycle_counts, schedule


def seeded(seed: int):
    def permute(n: int, parts: tuple[object, ...]) -> np.ndarray:
        key = hash((seed, parts)) & (2**62 - 1)
        return np.argsort(PackPermutation(n, key)(np.arange(n)))

    return permute


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.integers(0, 60), min_size=1, max_size=7),
    st.sampled_from(CURRICULA),
    st.integers(1, 9),
    st.integers(0, 2**20),
)
def test_every_batch_of_every_bucket_once_and_the_same_for_a_seed(
    steps: list[int], name: str, cycles: int, seed: int
) -> None:
    curriculum = Curriculum(name, cycles)
    order = schedule(steps, seeded(seed), curriculum)
    assert np.bincount(order, minlength=len(steps)).tolist() == steps
    np.testing.assert_array_equal(order, schedule(list(steps), seeded(seed), curriculum))
    if name != "natural" and len(order):
        assert order[0] == max(b for b, n in enumerate(steps) if n)  # the longest first


def test_grow_p2_odds_are_olmo_core_s() -> None:
    for buckets in range(1, 7):
        for b in range(buckets):
            assert bucket_odds("grow_p2", b, buckets) == VSLGrowP2Curriculum._get_bucket_odds_for_cycle(
                b, buckets
            )
            assert bucket_odds(
                "grow_linear", b, buckets
            ) == VSLGrowLinearCurriculum._get_bucket_odds_for_cycle(b, buckets)


def _windows(order: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Each (cycle, sub-cycle)'s buckets, by the sizes `counts` gives them."""
    sizes = counts.sum(axis=2).ravel()
    ends = np.cumsum(sizes)
    return [order[e - n : e] for e, n in zip(ends, sizes, strict=True)]


@pytest.mark.parametrize(
    ("kind", "olmo", "steps", "cycles"),
    [
        ("grow_p2", VSLGrowP2Curriculum, [400, 240, 96, 40], 8),
        ("grow_p2", VSLGrowP2Curriculum, [70, 33, 17, 9, 4], 3),
        ("grow_linear", VSLGrowLinearCurriculum, [400, 240, 96, 40], 4),
    ],
)
def test_each_sub_cycle_reads_the_lengths_olmo_core_s_reads(
    kind: str, olmo: type, steps: list[int], cycles: int
) -> None:
    """OLMo-core's batch indexes mapped to their buckets: each (cycle, sub-cycle) holds the same
    batches of each length as ours. Both move one batch of the longest bucket to the first step
    (from the first sub-cycle that has one), so those two sub-cycles agree together; the shuffles
    within a sub-cycle are each one's own."""
    lengths = [256 << b for b in range(len(steps))]
    theirs_index = olmo(num_cycles=cycles).get_batch_indices(list(zip(lengths, steps, strict=True)), 17)
    theirs = np.searchsorted(np.cumsum(steps), theirs_index, side="right")
    ours = schedule(steps, seeded(17), Curriculum(kind, cycles))
    counts = cycle_counts(kind, steps, cycles)
    a, b = _windows(ours, counts), _windows(theirs, counts)
    assert len(ours) == len(theirs) == sum(steps)
    longest = len(steps) - 1
    moved = next(
        i
        for i, w in enumerate(_windows(np.repeat(0, sum(steps)), counts))
        if counts.reshape(-1, len(steps))[i, longest]
    )
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if i not in (0, moved):
            assert (
                np.bincount(x, minlength=len(steps)).tolist() == np.bincount(y, minlength=len(steps)).tolist()
            )
    pair = (0, moved)
    assert sorted(np.concatenate([a[i] for i in pair]).tolist()) == sorted(
        np.concatenate([b[i] for i in pair]).tolist()
    )
    assert ours[0] == theirs[0] == longest
    # The curriculum grows: within a cycle, the mean length rises from the first sub-cycle to the last.
    means = [float(np.mean(np.asarray(lengths)[w])) for w in a if len(w)]
    assert means[len(steps) - 1] > means[0]


def test_natural_reads_each_bucket_s_batches_as_olmo_core_s_does() -> None:
    steps = [50, 20, 7]
    lengths = [512, 1024, 2048]
    theirs = np.searchsorted(
        np.cumsum(steps),
        VSLNaturalCurriculum().get_batch_indices(list(zip(lengths, steps, strict=True)), 3),
        side="right",
    )
    ours = schedule(steps, seeded(3), Curriculum("natural"))
    assert np.bincount(ours).tolist() == np.bincount(theirs).tolist() == steps


def test_bad_curricula_are_refused() -> None:
    with pytest.raises(ValueError, match="one of natural"):
        Curriculum("grow_p3")
    with pytest.raises(ValueError, match="num_cycles"):
        Curriculum("grow_p2", 0)
