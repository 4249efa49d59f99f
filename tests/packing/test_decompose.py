"""decompose (dataset decomposition): every document's power-of-two chunks, a pack each, against
its rule and against OLMo-core's own chunking (olmo_core.utils.capped_powers_of_2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from olmo_core.utils import capped_powers_of_2

from raypack.packing import ALGORITHMS, check_assignment, pack
from raypack.packing.decompose import chunk_lengths, make_items, plan

POWERS = st.integers(0, 12).map(lambda b: 1 << b)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[int], int, int]:
    seq_len = draw(POWERS)
    low = draw(st.integers(0, seq_len.bit_length() - 1).map(lambda b: 1 << b))
    lengths = draw(st.lists(st.integers(1, 5 * seq_len + 3), min_size=0, max_size=60))
    return lengths, seq_len, low


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_token_is_in_one_chunk_in_order_but_the_tail_below_the_minimum(
    case: tuple[list[int], int, int],
) -> None:
    lengths, seq_len, low = case
    items = make_items(np.asarray(lengths, dtype=np.int64), seq_len, min_seq_len=low)
    starts = items.start_in_doc()
    for d, n in enumerate(lengths):
        a, b = items.doc_start[d], items.doc_start[d + 1]
        sizes = items.length[a:b].astype(np.int64)
        # Chunks lie back to back from the document's first token: each token once, in order.
        assert starts[a:b].tolist() == (np.cumsum(sizes) - sizes).tolist()
        # What no chunk holds is the last n mod min_seq_len tokens, and nothing else.
        assert int(sizes.sum()) == n - n % low
        assert sizes.tolist() == chunk_lengths(n, seq_len, low)
        # OLMo-core's NumpyVSLDataset: capped_powers_of_2, cut at the first chunk below the minimum.
        olmo = [x for x in capped_powers_of_2(n, seq_len)]
        kept = olmo[: next((i for i, x in enumerate(olmo) if x < low), len(olmo))]
        assert sizes.tolist() == kept


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_chunk_is_a_power_of_two_within_the_bounds_and_a_pack_of_its_own(
    case: tuple[list[int], int, int],
) -> None:
    lengths, seq_len, low = case
    a = pack(lengths, seq_len, "decompose", min_seq_len=low)
    check_assignment(a)
    length = a.items.length
    assert np.all((length & (length - 1)) == 0)
    assert np.all((length >= low) & (length <= seq_len))
    assert a.num_packs == a.items.num_items  # no packing: a chunk a pack
    np.testing.assert_array_equal(a.capacities()[a.pack], length)  # no padding: its length its capacity
    # Packs of a length lie together, the lengths ascending (the bucket layout).
    order = np.argsort(a.pack)
    assert np.all(np.diff(length[order]) >= 0)


@settings(max_examples=60, deadline=None)
@given(cases(), st.integers(0, 2**31))
def test_the_same_lengths_and_seed_give_the_same_packs(case: tuple[list[int], int, int], seed: int) -> None:
    lengths, seq_len, low = case
    first = pack(lengths, seq_len, "decompose", min_seq_len=low, seed=seed)
    again = pack(list(lengths), seq_len, "decompose", min_seq_len=low, seed=seed)
    for name in ("pack", "slot", "offset"):
        np.testing.assert_array_equal(getattr(first, name), getattr(again, name))
    np.testing.assert_array_equal(first.capacities(), again.capacities())


def test_the_paper_s_example_and_the_overflow_policies() -> None:
    assert chunk_lengths(1000, 256) == [256, 256, 256, 128, 64, 32, 8]
    assert chunk_lengths(1000, 256, 16) == [256, 256, 256, 128, 64, 32]
    # truncate keeps the first seq_len tokens (one chunk); drop leaves a longer document out.
    assert make_items(np.array([1000, 100]), 256, "truncate").length.tolist() == [256, 64, 32, 4]
    assert make_items(np.array([1000, 100]), 256, "drop").length.tolist() == [64, 32, 4]


@pytest.mark.parametrize(("seq_len", "low"), [(300, 1), (256, 3), (256, 512)])
def test_lengths_that_are_not_powers_of_two_are_refused(seq_len: int, low: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        make_items(np.array([10]), seq_len, min_seq_len=low)


def test_a_histogram_of_other_items_is_refused() -> None:
    hist = np.zeros(257, dtype=np.int64)
    hist[100] = 1
    with pytest.raises(ValueError, match="length 100"):
        plan(hist, 256)


def test_it_is_never_compared_on_another_packer_s_histogram() -> None:
    assert not ALGORITHMS["decompose"].compared
    assert ALGORITHMS["decompose"].options == ("min_seq_len", "max_depth")
