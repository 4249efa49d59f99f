"""A Ray Dataset's rows (raypack.pipeline.datasets): a work unit's block slices, fetched from Ray's
object store in the task, their rows read as a Parquet file's are (parquet.record_batch_documents),
numbered by their place in the dataset."""

from __future__ import annotations

from collections.abc import Iterator

from raypack.pipeline.readers.parquet import record_batch_documents
from raypack.pipeline.readers.records import Batch
from raypack.pipeline.units import WorkUnit

__all__ = ["read"]


def read(unit: WorkUnit, batch_size: int) -> Iterator[Batch]:
    import ray
    from ray.data.block import BlockAccessor

    row = unit.shard.first_row
    for ref, start, stop in unit.blocks:
        # One block at a time: a unit holds at most its own rows and what its first and last
        # blocks hold beyond them.
        table = BlockAccessor.for_block(ray.get(ref)).to_arrow().slice(start, stop - start)
        for record_batch in table.to_batches(max_chunksize=batch_size):
            yield record_batch_documents(record_batch, row, unit.reading, unit.relpath)
            row += record_batch.num_rows
