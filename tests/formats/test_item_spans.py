"""A pack index's items, aligned or not: where each one's real tokens lie (item_spans), and which
positions of the packs are real (real_positions), against a brute-force layout (hypothesis)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack import schema
from raypack.formats import item_spans, real_positions


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, list[list[tuple[int, int]]]]:
    """Packs of `capacity` positions, each a list of (length, padding after it) items."""
    k = draw(st.sampled_from([1, 2, 8]))
    capacity = k * draw(st.integers(1, 8))
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        items, used = [], 0
        while used < capacity:
            n = draw(st.integers(1, capacity - used))
            span = -(-n // k) * k
            if used + span > capacity:
                break
            items.append((n, span - n))
            used += span
            if draw(st.booleans()):
                break
        rows.append(items)
    return k, capacity, rows


@settings(max_examples=60, deadline=None)
@given(layout=layouts())
def test_item_spans_and_real_positions_match_the_layout(
    layout: tuple[int, int, list[list[tuple[int, int]]]],
) -> None:
    k, capacity, rows = layout
    real_offsets, padded_offsets, want = [], [], np.zeros((len(rows), capacity), dtype=bool)
    want_starts, want_lengths = [], []
    for r, items in enumerate(rows):
        real, padded = [0], [0]
        for n, pad in items:
            want[r, padded[-1] : padded[-1] + n] = True
            want_starts.append(padded[-1])
            want_lengths.append(n)
            real.append(real[-1] + n)
            padded.append(padded[-1] + n + pad)
        real_offsets.append(real)
        padded_offsets.append(padded)
    columns = {
        "doc_offsets": pa.array(real_offsets, pa.list_(pa.int32())),
        "num_tokens": pa.array([o[-1] for o in real_offsets], pa.int32()),
    }
    if k > 1:
        columns[schema.PADDED_OFFSETS.name] = pa.array(padded_offsets, pa.list_(pa.int32()))
    starts, lengths, per_row = item_spans(pa.table(columns))
    assert starts.tolist() == want_starts and lengths.tolist() == want_lengths
    assert per_row.tolist() == [len(items) for items in rows]
    base = np.repeat(np.arange(len(rows)) * capacity, per_row)
    assert np.array_equal(real_positions(len(rows), capacity, starts + base, starts + lengths + base), want)
