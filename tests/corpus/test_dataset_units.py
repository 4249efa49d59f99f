"""A Ray Dataset's work units (raypack.corpus.datasets._cut), from its blocks' row counts alone:
units of unit_rows consecutive rows that tile the rows whatever the blocks, each the slices of the
blocks that hold it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.config import InputConfig
from raypack.corpus.datasets import _cut
from raypack.corpus.readers.dataset import _rows


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


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    groups=st.lists(st.integers(1, 30), min_size=1, max_size=8),
    bounds=st.tuples(st.integers(0, 240), st.integers(0, 240)),
)
def test_a_staged_files_rows_are_read_by_their_row_groups(
    tmp_path_factory: pytest.TempPathFactory, groups: list[int], bounds: tuple[int, int]
) -> None:
    """A unit's slice [start, stop) of a staged Parquet file (raypack.corpus.readers.dataset._rows)
    is those rows, whatever row groups the Dataset's write made."""
    total = sum(groups)
    start, stop = sorted(min(b, total) for b in bounds)
    if start == stop:
        return
    path = tmp_path_factory.mktemp("staged") / "part.parquet"
    table = pa.table({"text": [f"row {i}" for i in range(total)]})
    with pq.ParquetWriter(path, table.schema) as writer:
        at = 0
        for n in groups:
            writer.write_table(table.slice(at, n))
            at += n
    assert pq.ParquetFile(path).metadata.num_row_groups == len(groups)
    assert _rows(str(path), start, stop, None).column("text").to_pylist() == [
        f"row {i}" for i in range(start, stop)
    ]
