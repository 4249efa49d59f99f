"""Ray Datasets as input (raypack.pack(config, dataset=...)): a Dataset's rows, in its order, cut
into work units of input.unit_rows consecutive rows, each read by its tokenize task from the files
(or blocks) that hold it. Everything after reading is what files get.

    Dataset ─its columns, its order kept, Ray Data's streaming write─▶ Parquet files in the job's
            staging area, named in the Dataset's order (the driver holds a path and a row count
            per file, never the rows)
            ─dataset_units─▶ a WorkUnit of unit_rows rows: (file, first row, end row) slices
            ─readers.dataset (in the task)─▶ Batches, as a Parquet file's rows give them

Why units of rows, not of files or blocks: a unit's rows, its document ids (`<name>:<row>`, the
row's place in the dataset, where no id column is named) and so the output are then the same
whatever the blocks: a Dataset repartitioned, or read by more tasks, packs to the same bytes.

Why the rows are written out first (not streamed into the tokenize tasks): the stage reads units
more than once (the backend self-check's sample on the driver; every unit again when a fast backend
gave other ids), and a row's place needs the rows of every block before it. Ray Data's streaming
write holds a few blocks at a time (its backpressure), so memory is bounded as for files, whatever
the Dataset's size: the staged files (the needed columns only, zstd) sit where the output goes, are
read once more by the tokenize tasks, and go with the staging area. `raypack verify` re-reads a
sample from the Dataset's blocks in Ray's object store instead (`stage=None`: its own process
holds no staging area; the object store spills to disk beyond its memory).

No token store (cache.path) for a Dataset: a store keys a unit by its files' content, and a
Dataset's rows have no key short of reading them all.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from raypack.config import InputConfig, Reading, StorageConfig
from raypack.corpus.cut import MAX_SPLIT_UNITS
from raypack.corpus.readers.chat import chat_fields
from raypack.corpus.readers.parquet import is_scalar, is_text
from raypack.corpus.units import WorkUnit
from raypack.errors import ConfigError
from raypack.storage import Shard, join, list_dir, resolve

__all__ = [
    "DATASET_SCHEME",
    "as_datasets",
    "check_dataset",
    "dataset_name",
    "dataset_units",
    "without_blocks",
]

DATASET_SCHEME = "ray-dataset://"
"""A Dataset unit's Shard.path: names it in messages; nothing opens it."""


def as_datasets(dataset: Any) -> dict[str, Any]:
    """raypack.pack's `dataset` as {source name: Dataset}: one Dataset is the whole input (""), a
    mapping names sources of input.sources. A TypeError (a caller's programming error) for what is
    neither."""
    from ray.data import Dataset

    given = dict(dataset) if isinstance(dataset, Mapping) else {"": dataset}
    for name, ds in given.items():
        if not isinstance(name, str) or (not name and len(given) > 1):
            raise TypeError(f"raypack.pack(dataset=...): a source name is a non-empty string, not {name!r}")
        if not isinstance(ds, Dataset):
            what = f"dataset[{name!r}]" if name else "dataset"
            raise TypeError(f"raypack.pack({what}=...) takes a ray.data.Dataset, not {type(ds).__name__}")
    if not given:
        raise TypeError("raypack.pack(dataset={}): give at least one Dataset")
    return given


def dataset_name(source: str) -> str:
    """The name a Dataset's documents carry in their ids (`<name>:<row>`): its source's, or
    `dataset` for the whole input."""
    return source or "dataset"


def _columns(reading: Reading, names: list[str]) -> list[str]:
    """The columns read: those a row needs (text or chat fields, id), and the text_fields and
    metadata columns the Dataset has (the others are missing in every row, as in a Parquet file)."""
    wanted = chat_fields(reading) if reading.chat else [] if reading.text_fields else [reading.text_field]
    columns = [*wanted, *([reading.id_field] if reading.id_field else [])]
    if reading.messages_field is not None and "tools" in names and "tools" not in columns:
        columns.append("tools")
    optional = [c for c in (*reading.text_fields, *reading.metadata_fields) if c in names]
    return list(dict.fromkeys(columns + optional))


def check_dataset(cfg: InputConfig, source: str, ds: Any) -> list[str]:
    """The columns of `ds` the job reads; a ConfigError, before any work, where one is missing (of
    text_fields, all of them), a text column holds no strings or a metadata column no scalars (a
    Dataset is one source: a wrong field would reject every row)."""
    reading = cfg.reading(source)
    schema = ds.schema()
    what = f"the Dataset of source {source!r}" if source else "the Dataset"
    if schema is None:
        raise ConfigError(f"{what} has no schema (no rows, or rows that are not records)")
    names = list(schema.names)
    columns = _columns(reading, names)
    missing = [c for c in columns if c not in names]
    if reading.text_fields and not any(c in names for c in reading.text_fields):
        missing = [reading.text_fields[0]]
    if missing:
        fields = {reading.id_field: "input.id_field", reading.text_field: "input.text_field"}
        fields |= {reading.messages_field: "input.messages_field", reading.prompt_field: "input.prompt_field"}
        fields |= {reading.completion_field: "input.completion_field"}
        fields |= dict.fromkeys(reading.text_fields, "input.text_fields: none of them is there")
        raise ConfigError(
            f"{what} has no column {missing[0]!r} ({fields.get(missing[0], 'input')}); its columns: "
            f"{', '.join(names)}"
        )
    _check_types(reading, schema, names, what)
    return columns


def _check_types(reading: Reading, schema: Any, names: list[str], what: str) -> None:
    """A ConfigError for a text column of no strings, or a metadata column of no scalars (a
    column whose type Ray does not give, of Python objects, is judged a row at a time)."""
    for column in () if reading.chat else reading.text_fields or (reading.text_field,):
        kind = _arrow_type(schema, column) if column in names else None
        if kind is not None and not is_text(kind) and not (reading.text_fields and pa.types.is_null(kind)):
            key = "input.text_fields" if reading.text_fields else "input.text_field"
            raise ConfigError(f"{what}'s column {column!r} is {kind}, not a string ({key})")
    for column in reading.metadata_fields:
        kind = _arrow_type(schema, column) if column in names else None
        if kind is not None and not is_scalar(kind):
            raise ConfigError(
                f"{what}'s column {column!r} is {kind}, not a string, number or bool (input.metadata_fields)"
            )


def dataset_units(
    cfg: InputConfig,
    datasets: dict[str, Any],
    first_index: int,
    stage: str | None = None,
    storage: StorageConfig | None = None,
) -> list[WorkUnit]:
    """Every Dataset's work units, sources by name, numbered from `first_index`: each Dataset's
    columns in its own order, written as Parquet files under `stage` (None: materialized in Ray's
    object store), then cut into runs of input.unit_rows rows."""
    units: list[WorkUnit] = []
    for source in sorted(datasets):
        ds = datasets[source]
        columns = check_dataset(cfg, source, ds)
        ordered = _ordered(ds.select_columns(columns))
        if stage is None:
            blocks = _blocks(ordered)
        else:
            blocks = _staged(ordered, join(stage, dataset_name(source)), storage)
        rows = sum(n for _, n, _ in blocks)
        if -(-rows // cfg.unit_rows) + len(units) > MAX_SPLIT_UNITS:
            raise ConfigError(
                f"input.unit_rows={cfg.unit_rows:,} would cut {rows:,} rows into more than "
                f"{MAX_SPLIT_UNITS:,} work units (a task and files each): set input.unit_rows >= "
                f"{-(-rows // MAX_SPLIT_UNITS):,}"
            )
        units += _cut(cfg.reading(source), source, blocks, cfg.unit_rows, first_index + len(units))
    return units


def _ordered(ds: Any) -> Any:
    """`ds` executed in its order: preserve_order on a copy of its context (the caller's Dataset
    keeps its own)."""
    from ray.data import Dataset

    # Dataset.copy is Ray's own (not public API): select_columns' Dataset shares its DataContext
    # with the caller's, so setting preserve_order there would change how their Dataset runs.
    ordered = Dataset.copy(ds, _deep_copy=True)
    ordered.context.execution_options.preserve_order = True
    return ordered


def _blocks(ordered: Any) -> list[tuple[Any, int, int]]:
    """(reference, rows, bytes) of each block of `ordered`, materialized."""
    found = []
    for bundle in ordered.materialize().iter_internal_ref_bundles():
        for entry in bundle.blocks:
            ref, meta = (entry.ref, entry.metadata) if hasattr(entry, "ref") else entry
            if meta.num_rows:
                found.append((ref, int(meta.num_rows), int(meta.size_bytes or 0)))
    return found


def _staged(ordered: Any, folder: str, storage: StorageConfig | None) -> list[tuple[str, int, int]]:
    """(path, rows, bytes) of each Parquet file the streaming write of `ordered` makes under
    `folder` (a file a block, its rows in order), in the Dataset's order."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    ordered.write_datasink(_stage_sink(folder, storage))
    fs, _ = resolve(folder, storage)
    found = []
    names = sorted(info.base_name for info in list_dir(folder, storage) if info.type == pafs.FileType.File)
    for name in names:
        path = join(folder, name)
        with fs.open_input_file(resolve(path, storage)[1]) as f:
            meta = pq.ParquetFile(f).metadata
        if meta.num_rows:
            size = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
            found.append((path, int(meta.num_rows), int(size)))
    return found


def _stage_sink(folder: str, storage: StorageConfig | None) -> Any:
    """A Ray Data Datasink writing each block of a write task to `part-<task>-<block>.parquet`
    under `folder`, its rows in order. Not write_parquet: it writes through pyarrow's
    write_dataset with use_threads=True, which may reorder a task's rows (two jobs on one Dataset
    would then pack other bytes), and names files by a random id. Write tasks are numbered in the
    Dataset's order under preserve_order, so the names sort as the rows run."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from ray.data.block import BlockAccessor
    from ray.data.datasource import Datasink

    class StageSink(Datasink[None]):
        def write(self, blocks: Any, ctx: Any) -> None:
            fs, inner = resolve(folder, storage)
            if isinstance(fs, pafs.LocalFileSystem):  # object stores have no directories to make
                fs.create_dir(inner, recursive=True)
            for number, block in enumerate(blocks):
                table = BlockAccessor.for_block(block).to_arrow()
                if not table.num_rows:
                    continue
                name = f"{inner}/part-{ctx.task_idx:09d}-{number:06d}.parquet"
                with fs.open_output_stream(name) as sink:
                    pq.write_table(table, sink, compression="zstd")

    return StageSink()


def _cut(
    reading: Reading, source: str, blocks: list[tuple[Any, int, int]], unit_rows: int, first: int
) -> list[WorkUnit]:
    """Units of `unit_rows` consecutive rows over `blocks` (the last one shorter), each with the
    block slices that hold its rows and its bytes estimated from theirs."""
    name = dataset_name(source)
    ends = list(itertools.accumulate(rows for _, rows, _ in blocks))
    total = ends[-1] if ends else 0
    units: list[WorkUnit] = []
    for start in range(0, total, unit_rows):
        stop = min(start + unit_rows, total)
        slices: list[tuple[Any, int, int]] = []
        size = 0
        j = bisect.bisect_right(ends, start)  # the block holding row `start`
        while j < len(blocks) and ends[j] - blocks[j][1] < stop:
            ref, rows, nbytes = blocks[j]
            at = ends[j] - rows  # the block's first row in the dataset
            a, b = max(start, at) - at, min(stop, ends[j]) - at
            slices.append((ref, a, b))
            size += nbytes * (b - a) // rows
            j += 1
        shard = Shard(
            index=first + len(units),
            path=f"{DATASET_SCHEME}{name}",
            relpath=name,
            size=max(size, 1),
            mtime_ns=0,
            unit_start=start,
            unit_stop=stop,
            first_row=start,
            source=source,
        )
        units.append(WorkUnit(shard, reading, blocks=tuple(slices)))
    return units


def without_blocks(units: list[WorkUnit]) -> list[WorkUnit]:
    """The units with their slices dropped (the tokenize stage is over: what follows reads token
    files), so Ray may free the Dataset's blocks (verify's), and no unit names a staged file."""
    return [dataclasses.replace(u, blocks=()) if u.blocks else u for u in units]


def _arrow_type(schema: Any, name: str) -> pa.DataType | None:
    """A column's Arrow type in a Ray Data schema (None where Ray keeps Python objects)."""
    try:
        kind = schema.base_schema.field(name).type
    except (AttributeError, KeyError):
        return None
    return kind if isinstance(kind, pa.DataType) else None
