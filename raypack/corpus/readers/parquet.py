"""Parquet: a row a document, the text (or chat fields) and id from the Reading's columns; a whole
file, or a run of its row groups (a work unit of a large file, cut.work_units, cut here by
row_group_runs). Ids are `<relpath>:<row>` (rows from 0) unless the Reading names an id column.

A file that is not Parquet, lacks a column or holds the text in a column that is not a string is
lost whole (recorded once, in its first unit), counted as the rows its footer gives, so the reject
ratio sees 100k lost records, not one. Text may be string, large_string, string_view or a dictionary
of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypack.config import Reading, StorageConfig
from raypack.corpus.readers.chat import chat_fields
from raypack.corpus.readers.fields import document
from raypack.corpus.readers.records import Batch, Reject, is_bad_data, one_line
from raypack.storage import Shard, resolve

__all__ = ["is_text", "read", "record_batch_documents", "row_group_runs"]


def read(fs: pafs.FileSystem, inner: str, shard: Shard, reading: Reading, batch_size: int) -> Iterator[Batch]:
    """The documents of the file, or of the run of its row groups the Shard names, up to
    `batch_size` rows a Batch; a file that cannot be read as the Reading says is lost whole."""
    # A file split into work units (work_units) records a whole-file reject once, in its first unit.
    first_unit = shard.unit_start == 0
    try:
        pf = pq.ParquetFile(fs.open_input_file(inner))
    except (OSError, pa.ArrowInvalid) as e:
        if not is_bad_data(e):
            raise
        if first_unit:
            yield Batch(rejects=[Reject.lost(-1, f"unreadable Parquet file: {one_line(e)}")])
        return
    groups = None if shard.unit_stop < 0 else list(range(shard.unit_start, shard.unit_stop))
    meta = pf.metadata
    unit_rows = meta.num_rows if groups is None else sum(meta.row_group(g).num_rows for g in groups)
    lost = _columns_lost(pf.schema_arrow, reading)
    if lost:
        if first_unit:
            yield Batch(rejects=[Reject.lost(-1, lost, meta.num_rows)])
        return
    yield from _read_rows(
        pf, _columns(pf.schema_arrow.names, reading), groups, shard, reading, batch_size, unit_rows
    )


def _columns_lost(arrow_schema: pa.Schema, reading: Reading) -> str:
    """Why a file with this schema is lost whole: a column the Reading names that it lacks, or a
    text column that is not a string; "" when it can be read."""
    names = arrow_schema.names
    wanted = chat_fields(reading) if reading.chat else [reading.text_field]
    missing = [c for c in (*wanted, reading.id_field) if c is not None and c not in names]
    if missing:
        return f"Parquet file has no column {missing[0]!r} (columns: {', '.join(names)})"
    if not reading.chat:
        text_type = arrow_schema.field(reading.text_field).type
        if not is_text(text_type):
            return f"column {reading.text_field!r} is {text_type}, not a string"
    return ""


def _columns(names: list[str], reading: Reading) -> list[str]:
    """The columns read: the text (or chat fields), the id, and a conversation's tools where the
    file has them."""
    wanted = chat_fields(reading) if reading.chat else [reading.text_field]
    columns = wanted + ([reading.id_field] if reading.id_field else [])
    if reading.messages_field is not None and "tools" in names and "tools" not in columns:
        columns.append("tools")
    return columns


def _read_rows(
    pf: pq.ParquetFile,
    columns: list[str],
    groups: list[int] | None,
    shard: Shard,
    reading: Reading,
    batch_size: int,
    unit_rows: int,
) -> Iterator[Batch]:
    """The unit's documents, batch by batch; the rest of its rows lost (one reject) where the data
    turns out unreadable."""
    row = shard.first_row
    try:
        for record_batch in pf.iter_batches(batch_size=batch_size, columns=columns, row_groups=groups):
            yield record_batch_documents(record_batch, row, reading, shard.relpath)
            row += record_batch.num_rows
    except (OSError, pa.ArrowInvalid) as e:
        if not is_bad_data(e):
            raise
        reason = f"unreadable Parquet data after row {row - 1}: {one_line(e)}"
        yield Batch(rejects=[Reject.lost(row, reason, shard.first_row + unit_rows - row)])


def record_batch_documents(record_batch: pa.RecordBatch, row: int, reading: Reading, relpath: str) -> Batch:
    """The documents (and rejects) of Arrow rows whose first is row `row` of `relpath`, read with
    the Reading's columns, which the rows hold (a Parquet file's, or a Ray Dataset's blocks:
    raypack.corpus.readers.dataset)."""
    batch = Batch()
    if reading.chat:  # conversations: a Python object a record (the template renders them anyway)
        for rec in record_batch.to_pylist():
            doc = document(rec, row, reading, f"{relpath}:{row}", batch, str(rec)[:1000])
            if doc is not None:
                batch.add(row, doc[0], doc[1])
            row += 1
        return batch
    text_field, id_field = reading.text_field, reading.id_field
    texts = record_batch.column(text_field)
    if is_text(texts.type) and not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        texts = texts.cast(pa.large_string())  # dictionary-encoded or string_view
    # (A column that is not text, a Ray Dataset's of Python objects, mixed str and numbers from
    # pandas, is read as it is: document() judges each value, a number a reject.)
    ids = record_batch.column(id_field).to_pylist() if id_field else None
    for i, text in enumerate(texts.to_pylist()):
        record: dict[str, object] = {text_field: text}
        if ids is not None and id_field is not None:
            record[id_field] = ids[i]
        doc = document(
            record, row, reading, f"{relpath}:{row}", batch, text if isinstance(text, str) else str(text)
        )
        if doc is not None:
            batch.add(row, doc[0], doc[1])
        row += 1
    return batch


def is_text(t: pa.DataType) -> bool:
    """A column raypack reads as text: string, large_string, string_view, or a dictionary of them
    (pyarrow writes categorical columns so)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def row_group_runs(
    shard: Shard, unit_bytes: int, storage: StorageConfig | None
) -> list[tuple[int, int, int]]:
    """(first row group, end row group, first row) of each unit of a large Parquet file; [] if its
    footer is unreadable or it has one row group."""
    fs, inner = resolve(shard.path, storage)
    try:
        with fs.open_input_file(inner) as f:
            meta = pq.ParquetFile(f).metadata
    except (OSError, pa.ArrowInvalid) as e:
        if not is_bad_data(e):
            raise
        return []
    if meta.num_row_groups < 2:
        return []
    runs, start, size, row, first_row = [], 0, 0, 0, 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        row += group.num_rows
        if size >= unit_bytes or i == meta.num_row_groups - 1:
            runs.append((start, i + 1, first_row))
            start, size, first_row = i + 1, 0, row
    return runs if len(runs) > 1 else []
