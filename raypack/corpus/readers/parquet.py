"""Parquet: a row a document, the text (or chat fields) and id from the Reading's columns; a whole
file, or a run of its row groups (a work unit of a large file, cut.work_units, cut here by
row_group_runs). Ids are `<relpath>:<row>` (rows from 0) unless the Reading names an id column.

A file that is not Parquet, lacks a column or holds the text in a column that is not a string is
lost whole (recorded once, in its first unit), counted as the rows its footer gives, so the reject
ratio sees 100k lost records, not one. Text may be string, large_string, string_view or a dictionary
of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypack.config import Reading, StorageConfig
from raypack.corpus.readers.chat import chat_fields
from raypack.corpus.readers.fields import document, read_fields
from raypack.corpus.readers.records import Batch, Reject, is_bad_data, one_line
from raypack.storage import Shard, resolve

__all__ = ["is_scalar", "is_text", "read", "record_batch_documents", "row_group_runs"]


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
    """Why a file with this schema is lost whole: a column the Reading names that it lacks (of
    text_fields, all of them), a text column that is not a string, or a metadata column that holds
    no scalars; "" when it can be read."""
    names = arrow_schema.names
    wanted = chat_fields(reading) if reading.chat else [] if reading.text_fields else [reading.text_field]
    missing = [c for c in (*wanted, reading.id_field) if c is not None and c not in names]
    if missing:
        return f"Parquet file has no column {missing[0]!r} (columns: {', '.join(names)})"
    if reading.text_fields and not any(c in names for c in reading.text_fields):
        given = ", ".join(reading.text_fields)
        return f"Parquet file has none of the columns {given} (columns: {', '.join(names)})"
    if not reading.chat:
        for column in reading.text_fields or (reading.text_field,):
            kind = arrow_schema.field(column).type if column in names else pa.null()
            if not is_text(kind) and not (reading.text_fields and pa.types.is_null(kind)):
                return f"column {column!r} is {kind}, not a string"
    for column in reading.metadata_fields:
        if column in names and not is_scalar(kind := arrow_schema.field(column).type):
            return f"column {column!r} is {kind}, not a string, number or bool (input.metadata_fields)"
    return ""


def _columns(names: list[str], reading: Reading) -> list[str]:
    """The columns read: the text (or chat fields), the id, and a conversation's tools where the
    file has them, and the metadata and text_fields columns it has (the others are missing in every
    row)."""
    wanted = chat_fields(reading) if reading.chat else [reading.text_field] if not reading.text_fields else []
    columns = wanted + ([reading.id_field] if reading.id_field else [])
    if reading.messages_field is not None and "tools" in names and "tools" not in columns:
        columns.append("tools")
    optional = [*reading.text_fields, *reading.metadata_fields]
    return list(dict.fromkeys(columns + [c for c in optional if c in names]))


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
    raypack.corpus.readers.dataset); a text_fields or metadata column they lack is missing in
    every row."""
    batch = Batch()
    if reading.chat:  # conversations: a Python object a record (the template renders them anyway)
        for rec in record_batch.to_pylist():
            # Its raw: the record as JSON, what the size limit measures and a reject shows.
            raw = json.dumps(rec, ensure_ascii=False, default=str)
            doc = document(rec, row, reading, f"{relpath}:{row}", batch, raw)
            if doc is not None:
                batch.add(row, doc[0], doc[1], meta=doc[2])
            row += 1
        return batch
    values = _values(record_batch, reading)
    if not reading.text_fields and not reading.metadata_fields:
        # One text column and maybe an id: a record of those alone, as fast as before text_fields
        # and metadata existed (200k short rows: 0.19 CPU-s; the loop below, with one metadata
        # field, 0.40).
        text_field, id_field = reading.text_field, reading.id_field
        ids = values[id_field] if id_field is not None else None
        for i, text in enumerate(values[text_field]):
            record: dict[str, object] = {text_field: text}
            if ids is not None and id_field is not None:
                record[id_field] = ids[i]
            raw = text if isinstance(text, str) else str(text)
            if (doc := document(record, row, reading, f"{relpath}:{row}", batch, raw)) is not None:
                batch.add(row, doc[0], doc[1])
            row += 1
        return batch
    for i in range(record_batch.num_rows):
        record = {name: column[i] for name, column in values.items()}
        shown = record if reading.text_fields else record.get(reading.text_field)
        if (doc := document(record, row, reading, f"{relpath}:{row}", batch, str(shown))) is not None:
            batch.add(row, doc[0], doc[1], meta=doc[2])
        row += 1
    return batch


def _values(record_batch: pa.RecordBatch, reading: Reading) -> dict[str, list[object]]:
    """The values of each column the Reading reads that the rows hold (text ones as strings)."""
    names = record_batch.schema.names
    text_columns = [c for c in reading.text_fields or (reading.text_field,) if c in names]
    values: dict[str, list[object]] = {}
    for name in dict.fromkeys([*text_columns, *read_fields(reading)]):
        if name in names:
            column = record_batch.column(name)
            plain = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
            if name in text_columns and is_text(column.type) and not plain:
                column = column.cast(pa.large_string())  # dictionary-encoded or string_view
            # (A column that is not text, a Ray Dataset's of Python objects, mixed str and numbers
            # from pandas, is read as it is: document() judges each value, a number a reject.)
            values[name] = column.to_pylist()
    return values


def is_scalar(t: pa.DataType) -> bool:
    """A column whose values metadata keeps: null, bool, a number, or text (raypack.corpus.metadata)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    kinds = (pa.types.is_null, pa.types.is_boolean, pa.types.is_integer, pa.types.is_floating)
    return is_text(t) or any(k(t) for k in kinds)


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
