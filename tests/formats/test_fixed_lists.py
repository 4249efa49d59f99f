"""A row group's token ids written by raypack.formats._fixed_lists, not by pyarrow's per-value
encoder: the bytes pq.write_table writes, for any rows, capacities it takes, a loss mask or none,
and whole files of many row groups through the parquet format; capacities it does not take are
pyarrow's, to the same bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack import schema
from raypack.formats import FORMATS, PARQUET_SETTINGS, Packs, Settings, make_spec
from raypack.formats import _fixed_lists as fixed_lists
from raypack.formats import parquet as parquet_format
from raypack.formats._fixed_lists import PAGE_VALUES, fits, write_row_group

WRITER = {k: v for k, v in PARQUET_SETTINGS.items() if k != "row_group_size"}


def _packs(rng: np.random.Generator, rows: int, capacity: int, masked: bool) -> Packs:
    """Packs as a write task makes them: ids (some padding), items' offsets, ids and chunks."""
    ids = rng.integers(0, 130_000, (rows, capacity)).astype(np.int32)
    fill = rng.integers(1, capacity + 1, rows)
    ids[np.arange(capacity)[None, :] >= fill[:, None]] = 0
    offsets, doc_ids = [], []
    for r in range(rows):
        cuts = np.unique(rng.integers(1, int(fill[r]) + 1, int(rng.integers(0, 4))))
        offsets.append([0, *sorted(set(cuts.tolist()) - {int(fill[r])}), int(fill[r])])
        doc_ids.append([f"file-{r}.jsonl:{k}" for k in range(len(offsets[-1]) - 1)])
    index = pa.table(
        {
            "doc_offsets": pa.array(offsets, pa.list_(pa.int32())),
            "doc_ids": pa.array(doc_ids, pa.list_(pa.string())),
            "chunk_index": pa.array([[0] * len(d) for d in doc_ids], pa.list_(pa.int32())),
            "num_tokens": pa.array(fill.astype(np.int32)),
        },
        schema=schema.PACK_INDEX,
    )
    mask = (rng.random((rows, capacity)) < 0.7).astype(np.int8) if masked else None
    return Packs("part-00000", ids, index, mask)


def _fixed(packs: Packs, table: pa.Table) -> dict[int, np.ndarray]:
    fixed = {0: packs.input_ids}
    if packs.loss_mask is not None:
        fixed[table.schema.get_field_index("loss_mask")] = packs.loss_mask
    return fixed


def _pyarrow(table: pa.Table, row_group: int) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group, **WRITER)
    return sink.getvalue().to_pybytes()


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 1_100),
    log_capacity=st.integers(4, 11),
    masked=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_row_group_is_the_bytes_pyarrow_writes(
    rows: int, log_capacity: int, masked: bool, seed: int
) -> None:
    packs = _packs(np.random.default_rng(seed), rows, 1 << log_capacity, masked)
    table = packs.table()
    assert fits(packs.capacity, WRITER)
    assert write_row_group(table, _fixed(packs, table), WRITER) == _pyarrow(table, rows)


@pytest.mark.parametrize(("rows", "capacity"), [(3, PAGE_VALUES), (5, PAGE_VALUES // 2), (130, 8192)])
def test_pages_of_whole_rows_and_rows_of_a_whole_page(rows: int, capacity: int) -> None:
    """A page a row, two rows a page, and several pages a row group with a last one part full."""
    packs = _packs(np.random.default_rng(rows), rows, capacity, masked=False)
    table = packs.table()
    assert write_row_group(table, _fixed(packs, table), WRITER) == _pyarrow(table, rows)


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 2_600),
    capacity=st.sampled_from([16, 24, 64, 100, 256]),
    threads=st.integers(1, 3),
    masked=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_file_of_row_groups_is_the_bytes_of_one_writer(
    rows: int, capacity: int, threads: int, masked: bool, seed: int
) -> None:
    """The parquet format's files through encode_blocks, block by block on any threads, whether this
    module writes the ids (powers of two) or pyarrow does (24, 100): pq.write_table's bytes."""
    packs = _packs(np.random.default_rng(seed), rows, capacity, masked)
    spec = make_spec("parquet", Settings(capacity, False, False, None, 130_000, 0, rows, masked))
    fmt = FORMATS["parquet"]
    size = fmt.block_rows  # type: ignore[attr-defined]
    blocks = [packs.slice(lo, lo + size) for lo in range(0, rows, size)]
    got = fmt.encode_blocks("part-00000", iter(blocks), spec, threads)  # type: ignore[attr-defined]
    assert got == {"data/part-00000.parquet": _pyarrow(packs.table(), size)}


def test_capacities_and_settings_it_does_not_take_are_pyarrows(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not fits(8, WRITER) and not fits(24, WRITER) and not fits(2 * PAGE_VALUES, WRITER)
    assert fits(4096, WRITER)
    assert not fits(4096, {**WRITER, "compression": "snappy"})
    assert not fits(4096, {**WRITER, "write_statistics": True})
    assert not fits(
        4096, {**WRITER, "write_statistics": ["loss_mask.list.element"]}, ("input_ids", "loss_mask")
    )
    assert not fits(4096, {**WRITER, "data_page_size": 1 << 16})
    # A stand-in footer it does not know (a pyarrow that writes more): pyarrow writes the block.
    packs = _packs(np.random.default_rng(5), 40, 64, masked=False)

    def refuse(*args: object) -> bytes:
        raise fixed_lists.Unknown("a footer this does not know")

    monkeypatch.setattr(parquet_format, "write_row_group", refuse)
    spec = make_spec("parquet", Settings(64, False, False, None, 130_000, 0, 40, False))
    got = FORMATS["parquet"].encode_blocks("part-00000", iter([packs]), spec)  # type: ignore[attr-defined]
    assert got == {"data/part-00000.parquet": _pyarrow(packs.table(), 40)}
