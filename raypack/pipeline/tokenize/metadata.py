"""The index's metadata (input.metadata_fields) typed alike in every file, once the tokenize stage is
over: each unit's task wrote its documents' metadata typed by its own values (a unit whose records
lack a field has it null; one of integers, int), and only the driver sees every unit's kinds
(Totals.metadata_kinds). Their union (raypack.corpus.metadata.unify) is the dataset's type of each
field, which the manifest records; the index files of units whose kinds differ from it are written
again with it, a task a run of them, so that index/ reads as one table (pyarrow, pandas, Spark)
without a cast. In a mixture the select tasks write the final index, with these kinds, instead.

What this costs: a unit's index is a row a document (~100 bytes with a few short fields); units
whose values already have the dataset's kinds (a field every record has, of one type) are not
touched.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.corpus.metadata import conform
from raypack.corpus.units import WorkUnit
from raypack.dataset.layout import index_path
from raypack.engine import Runner, transient
from raypack.pipeline.tokenize.summary import Totals
from raypack.storage import atomic_output, resolve

__all__ = ["retype_index", "unify_metadata"]

# Index files a task writes again: a few ms each (a unit's index is small), so that a corpus of
# 10,000 units whose kinds all differ takes ~40 tasks, not 10,000.
UNITS_PER_TASK = 256


def unify_metadata(cfg: JobConfig, units: list[WorkUnit], totals: Totals, runner: Runner) -> dict[str, str]:
    """The dataset's kind of each metadata field ({} where none is kept); outside a mixture, every
    index file of another kind written again with them."""
    fields = cfg.input.metadata_columns
    if not fields:
        return {}
    kinds = totals.metadata(fields)
    if cfg.input.mixture:
        return kinds
    differ = [u.index for u in units if totals.metadata_kinds[u.index] != kinds]
    runs = [differ[i : i + UNITS_PER_TASK] for i in range(0, len(differ), UNITS_PER_TASK)]
    runner.map(retype_index, [(cfg, run, kinds, runner.patterns) for run in runs])
    return kinds


def retype_index(
    cfg: JobConfig, shards: list[int], kinds: dict[str, str], patterns: tuple[str, ...] | None
) -> None:
    """Task: the index files of `shards` with their metadata of `kinds` (written whole, or not at
    all: a retried task reads either)."""
    with transient(patterns):
        for shard in shards:
            path = index_path(cfg.output.path, shard)
            fs, inner = resolve(path, cfg.storage)
            with fs.open_input_file(inner) as f:
                table = pq.read_table(f)
            at = table.schema.get_field_index(schema.METADATA)
            column = table.column(at) if at >= 0 else None
            typed = conform(column, table.num_rows, kinds)
            if at >= 0:
                table = table.set_column(at, schema.METADATA, typed)
            else:  # (a unit of a source that keeps none of the fields)
                table = table.append_column(schema.METADATA, typed)
            buffer = pa.BufferOutputStream()
            pq.write_table(table, buffer, compression="zstd")
            with atomic_output(path, cfg.storage) as sink:
                sink.write(buffer.getvalue())
