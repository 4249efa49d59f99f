"""Parquet files joined under one footer (raypack.formats._joined): the bytes one writer gives for
the same row groups, for any rows and any writer settings it accepts; files it cannot join exactly
are refused, and the parquet format then writes the file on one thread, to the same bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.formats import FORMATS, PARQUET_SETTINGS, Packs, Settings, make_spec
from raypack.formats import parquet as parquet_format
from raypack.formats._joined import Unjoinable, join_files

SCHEMA = pa.schema(
    [
        ("ids", pa.list_(pa.int32())),
        ("name", pa.string()),
        ("score", pa.float64()),
        ("flags", pa.list_(pa.bool_())),
    ]
)


def _table(rng: np.random.Generator, rows: int) -> pa.Table:
    ids = [rng.integers(-5, 300, int(rng.integers(0, 40))).astype(np.int32) for _ in range(rows)]
    names = [None if rng.random() < 0.2 else f"doc-{int(rng.integers(0, 50))}" for _ in range(rows)]
    flags = [[bool(b) for b in rng.random(int(rng.integers(0, 4))) < 0.5] for _ in range(rows)]
    return pa.table(
        {"ids": ids, "name": names, "score": rng.normal(size=rows), "flags": flags}, schema=SCHEMA
    )


def _one_writer(tables: list[pa.Table], **options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, tables[0].schema, **options) as writer:
        for t in tables:
            writer.write_table(t, row_group_size=max(1, t.num_rows))
    return sink.getvalue().to_pybytes()


OPTIONS = [
    {k: v for k, v in PARQUET_SETTINGS.items() if k != "row_group_size"},  # raypack's own
    {"compression": "snappy"},  # pyarrow's defaults: dictionaries (a dictionary page's offset moves)
    {"compression": "none", "use_dictionary": ["name"], "write_statistics": False},
    {"compression": "zstd", "data_page_version": "2.0", "data_page_size": 512},  # many pages a chunk
]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    options=st.sampled_from(range(len(OPTIONS))),
    seed=st.integers(0, 2**32 - 1),
)
def test_joined_files_are_the_bytes_of_one_writer(rows: list[int], options: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tables = [_table(rng, n) for n in rows]
    parts = [_one_writer([t], **OPTIONS[options]) for t in tables]
    joined = join_files(parts)
    assert joined == _one_writer(tables, **OPTIONS[options])
    back = pq.ParquetFile(pa.BufferReader(joined))
    assert [back.metadata.row_group(i).num_rows for i in range(back.num_row_groups)] == rows
    assert back.read().equals(pa.concat_tables(tables))


def test_files_it_cannot_join_exactly_are_refused() -> None:
    rng = np.random.default_rng(1)
    a, b = _table(rng, 10), _table(rng, 12)
    with pytest.raises(Unjoinable, match="other schemas"):
        join_files([_one_writer([a]), _one_writer([b.drop_columns(["flags"])])])
    # Settings a column chunk records itself (its codec) need not agree: still a file that reads.
    mixed = join_files([_one_writer([a]), _one_writer([b], compression="gzip")])
    assert pq.read_table(pa.BufferReader(mixed)).equals(pa.concat_tables([a, b]))
    with pytest.raises(Unjoinable, match="page index"):  # it would have to move the index too
        join_files([_one_writer([t], write_page_index=True) for t in (a, b)])
    with pytest.raises(Unjoinable, match="not a Parquet file"):
        join_files([b"PAR1 not really"])
    with pytest.raises(Unjoinable, match="no files"):
        join_files([])


def test_a_file_that_cannot_be_joined_is_written_on_one_thread_to_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """encode_blocks on several threads, its join refused (a pyarrow whose footers this does not
    know): the row groups are written again by one writer, and the bytes are those of one thread."""
    capacity, rows = 8, 2_500
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 100, (rows, capacity)).astype(np.int32)
    offsets = [[0, capacity]] * rows
    index = pa.table(
        {
            "doc_offsets": pa.array(offsets, pa.list_(pa.int32())),
            "doc_ids": pa.array([[f"d{i}"] for i in range(rows)], pa.list_(pa.string())),
            "chunk_index": pa.array([[0]] * rows, pa.list_(pa.int32())),
            "num_tokens": pa.array(np.full(rows, capacity, np.int32)),
        }
    )
    packs = Packs("part-00000", ids, index, None)
    spec = make_spec("parquet", Settings(capacity, False, False, None, 100, 0, rows, False))
    fmt = FORMATS["parquet"]
    size = fmt.block_rows  # type: ignore[attr-defined]
    blocks = [packs.slice(lo, lo + size) for lo in range(0, rows, size)]
    want = fmt.encode_blocks("part-00000", iter(blocks), spec)  # type: ignore[attr-defined]

    def refuse(parts: list[Any]) -> bytes:
        raise Unjoinable("a footer this does not know")

    monkeypatch.setattr(parquet_format, "join_files", refuse)
    got = fmt.encode_blocks("part-00000", iter(blocks), spec, threads=2)  # type: ignore[attr-defined]
    assert got == want
