"""A Ray Dataset's rows (raypack.corpus.datasets): a work unit's slices of the Parquet files the
job staged them in (or of blocks in Ray's object store, for verify), read in the task as a Parquet
file's rows are (parquet.record_batch_documents), numbered by their place in the dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from raypack.config import StorageConfig
from raypack.corpus.readers.parquet import record_batch_documents
from raypack.corpus.readers.records import Batch
from raypack.corpus.units import WorkUnit
from raypack.storage import resolve

__all__ = ["read"]


def read(unit: WorkUnit, batch_size: int, storage: StorageConfig | None = None) -> Iterator[Batch]:
    row = unit.shard.first_row
    for where, start, stop in unit.blocks:
        # One file (or block) at a time: a unit holds at most its own rows and what the row groups
        # (blocks) at its two ends hold beyond them.
        table = _rows(where, start, stop, storage) if isinstance(where, str) else _block(where, start, stop)
        for record_batch in table.to_batches(max_chunksize=batch_size):
            yield record_batch_documents(record_batch, row, unit.reading, unit.relpath)
            row += record_batch.num_rows


def _rows(path: str, start: int, stop: int, storage: StorageConfig | None) -> pa.Table:
    """Rows [start, stop) of a staged Parquet file: the row groups that hold them, sliced."""
    fs, inner = resolve(path, storage)
    with fs.open_input_file(inner) as f:
        parquet = pq.ParquetFile(f)
        groups: list[int] = []
        first = at = 0
        for g in range(parquet.metadata.num_row_groups):
            n = parquet.metadata.row_group(g).num_rows
            if at + n > start and at < stop:
                if not groups:
                    first = at
                groups.append(g)
            at += n
        table = parquet.read_row_groups(groups)
    return table.slice(start - first, stop - start)


def _block(ref: Any, start: int, stop: int) -> pa.Table:
    """Rows [start, stop) of a block in Ray's object store."""
    import ray
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(ray.get(ref)).to_arrow().slice(start, stop - start)
