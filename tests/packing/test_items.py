from __future__ import annotations

import numpy as np
import pytest

from raypack.packing.items import check_lengths, item_histogram, make_items


def test_split_truncate_drop() -> None:
    lengths = np.array([10, 4, 9])
    split = make_items(lengths, 4, "split")
    assert split.length.tolist() == [4, 4, 2, 4, 4, 4, 1]
    assert split.doc_start.tolist() == [0, 3, 4, 7]
    assert split.doc_of_item().tolist() == [0, 0, 0, 1, 2, 2, 2]
    trunc = make_items(lengths, 4, "truncate")
    assert trunc.length.tolist() == [4, 4, 4]
    assert trunc.placed_per_doc().tolist() == [4, 4, 4]
    drop = make_items(lengths, 4, "drop")
    assert drop.length.tolist() == [4]
    assert drop.doc_start.tolist() == [0, 0, 1, 1]
    assert drop.placed_per_doc().tolist() == [0, 4, 0]


def test_histogram_counts_item_lengths() -> None:
    h = item_histogram(make_items(np.array([10, 4, 9]), 4).length, 4)
    assert h.tolist() == [0, 1, 1, 0, 5]


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([3, 0, 2], "document 1 has length 0"),
        ([3, -5], "document 1 has length -5"),
        ([1.5, 2.0], "document 0 has length 1.5"),
        ([[1, 2]], "1-D"),
        (["a"], "integers"),
    ],
)
def test_bad_lengths_are_named(lengths: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_lengths(np.array(lengths))


def test_float_lengths_that_are_whole_are_accepted() -> None:
    assert check_lengths(np.array([3.0, 7.0])).tolist() == [3, 7]


@pytest.mark.parametrize("seq_len", [0, -3])
def test_seq_len_must_be_positive(seq_len: int) -> None:
    with pytest.raises(ValueError, match="seq_len"):
        make_items(np.array([1]), seq_len)


def test_unknown_overflow_policy() -> None:
    with pytest.raises(ValueError, match="overflow must be one of"):
        make_items(np.array([1]), 4, "wrap")
