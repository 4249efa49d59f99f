"""A Ray Dataset's work units (raypack.pipeline.datasets._cut), from its blocks' row counts alone:
units of unit_rows consecutive rows that tile the rows whatever the blocks, each the slices of the
blocks that hold it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raypack.config import InputConfig
from raypack.pipeline.datasets import _cut


@given(sizes=st.lists(st.integers(0, 40), max_size=12), unit_rows=st.integers(1, 50))
def test_units_tile_the_rows_whatever_the_blocks(sizes: list[int], unit_rows: int) -> None:
    blocks = [(f"block{i}", n, 10 * n) for i, n in enumerate(sizes) if n]
    reading = InputConfig(datasets=("",)).reading()
    units = _cut(reading, "", blocks, unit_rows, first=7)
    total = sum(sizes)
    assert [(u.shard.unit_start, u.shard.unit_stop) for u in units] == [
        (a, min(a + unit_rows, total)) for a in range(0, total, unit_rows)
    ]
    assert [u.index for u in units] == list(range(7, 7 + len(units)))
    # Each unit's slices, in order, are exactly its rows of the blocks laid end to end.
    rows_of = [(name, r) for name, n, _ in blocks for r in range(n)]
    for u in units:
        got = [(ref, r) for ref, a, b in u.blocks for r in range(a, b)]
        assert got == rows_of[u.shard.unit_start : u.shard.unit_stop]
        assert all(0 <= a < b for _, a, b in u.blocks)
        assert u.reading.format == "dataset" and u.relpath == "dataset"


def test_a_unit_is_the_same_whatever_the_blocks() -> None:
    reading = InputConfig(datasets=("",)).reading()
    one = _cut(reading, "", [("a", 100, 1000)], 30, first=0)
    many = _cut(reading, "", [("b", 7, 70), ("c", 50, 500), ("d", 43, 430)], 30, first=0)
    assert [(u.shard.unit_start, u.shard.unit_stop) for u in one] == [
        (u.shard.unit_start, u.shard.unit_stop) for u in many
    ]
    assert [len(u.blocks) for u in many] == [2, 2, 1, 1]  # rows 0-7-57-100 in blocks b, c, d
