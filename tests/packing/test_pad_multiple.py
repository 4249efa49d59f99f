"""pack.pad_multiple: every item takes its length rounded up to a multiple of k, starts at a multiple
of k, and its real tokens come out unchanged (hypothesis, over lengths, k and every aligning packer)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.packing import ALGORITHMS, check_assignment, make_items, pack

ALIGNING = [name for name, a in ALGORITHMS.items() if a.aligns]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def aligned_corpora(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    k = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    seq_len = k * draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, 3 * seq_len + 5), min_size=0, max_size=60))
    return np.array(lengths, dtype=np.int64), seq_len, k


def laid_out(lengths: np.ndarray, a: object) -> tuple[np.ndarray, np.ndarray]:
    """The packs as a writer fills them: every document's tokens numbered by (document, position)
    copied to its items' offsets, -1 elsewhere; and the position of every item's first token."""
    it = a.items  # type: ignore[attr-defined]
    capacity = int(a.seq_len)  # type: ignore[attr-defined]
    packs = np.full((a.num_packs, capacity), -1, dtype=np.int64)  # type: ignore[attr-defined]
    doc = it.doc_of_item()
    start = it.start_in_doc()
    for i in range(it.num_items):
        p, o, n = int(a.pack[i]), int(a.offset[i]), int(it.length[i])  # type: ignore[attr-defined]
        assert np.all(packs[p, o : o + it.span[i]] == -1), "two items overlap"
        packs[p, o : o + n] = doc[i] * 1_000_000 + start[i] + np.arange(n)
    return packs, a.offset  # type: ignore[attr-defined]


@pytest.mark.parametrize("algorithm", ALIGNING)
@pytest.mark.parametrize("overflow", ["split", "truncate", "drop"])
@SETTINGS
@given(corpus=aligned_corpora())
def test_aligned_items_start_at_multiples_fit_and_keep_every_real_token(
    algorithm: str, overflow: str, corpus: tuple[np.ndarray, int, int]
) -> None:
    lengths, seq_len, k = corpus
    options = {"bucket_lengths": (seq_len,)} if algorithm == "bucket" else {}
    a = pack(lengths, seq_len, algorithm, overflow=overflow, seed=3, pad_multiple=k, **options)
    check_assignment(a)
    it = a.items
    # Every item placed exactly once: one pack, one slot, slots 0..n-1 in each pack.
    assert len(a.pack) == len(a.slot) == len(a.offset) == it.num_items
    pairs = set(zip(a.pack.tolist(), a.slot.tolist(), strict=True))
    assert len(pairs) == it.num_items
    # Every item starts at a multiple of k and takes its length rounded up to one.
    assert np.all(a.offset % k == 0)
    assert np.array_equal(it.span, -(-it.length // k) * k)
    # No pack over capacity, padding included.
    assert np.all(a.offset + it.span <= seq_len)
    assert np.all(np.bincount(a.pack, weights=it.span, minlength=a.num_packs) <= seq_len)
    # Every document's real tokens, read back from the packs at its items' offsets, in chunk order,
    # are its tokens (its first seq_len under truncate, none when dropped).
    packs, offset = laid_out(lengths, a)
    doc = it.doc_of_item()
    order = np.lexsort((it.chunk_index(), doc))
    got: dict[int, list[int]] = {}
    for i in order.tolist():
        p, o, n = int(a.pack[i]), int(offset[i]), int(it.length[i])
        got.setdefault(int(doc[i]), []).extend(packs[p, o : o + n].tolist())
    for d, n in enumerate(lengths.tolist()):
        kept = n if overflow == "split" else min(n, seq_len) if overflow == "truncate" else n * (n <= seq_len)
        assert got.get(d, []) == [d * 1_000_000 + t for t in range(kept)]
    # Everything else is padding: positions = real tokens + padding.
    assert int((packs >= 0).sum()) == int(it.length.sum())


@pytest.mark.parametrize("k", [2, 8])
def test_a_split_document_gives_chunks_whose_padded_size_fits(k: int) -> None:
    seq_len = 16
    it = make_items(np.array([16 * 3 + 5, 16, 15, 1]), seq_len, "split", pad_multiple=k)
    assert it.length.tolist() == [16, 16, 16, 5, 16, 15, 1]
    assert it.span.tolist() == [16, 16, 16, -(-5 // k) * k, 16, 16, k]
    assert it.span.max() <= seq_len


def test_alignment_is_refused_where_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="not a multiple of pad_multiple=3"):
        make_items(np.array([5]), 16, pad_multiple=3)
    with pytest.raises(ValueError, match="pad_multiple must be >= 1"):
        pack([5], 16, pad_multiple=0)
    with pytest.raises(ValueError, match="concat cannot pad its items"):
        pack([5, 7], 16, "concat", pad_multiple=4)
    with pytest.raises(ValueError, match="decompose cannot pad its items"):
        pack([5, 7], 16, "decompose", pad_multiple=4)


def test_alignment_costs_packs_only_through_padding() -> None:
    # 8 documents of 5 tokens in packs of 24: 2 packs unaligned; aligned to 8 each takes 8, 3 a pack.
    assert pack([5] * 8, 24, "bfd").num_packs == 2
    a = pack([5] * 8, 24, "bfd", pad_multiple=8)
    assert a.num_packs == 3
    assert sorted(a.pack_fill().tolist()) == [10, 15, 15]
    assert sorted(a.pack_span().tolist()) == [16, 24, 24]
