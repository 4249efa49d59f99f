"""Stages 6-7, materialize and write: all items of one output file reach one write task (the
exchange's pieces for its file range, raypack.pipeline.exchange; in sharded mode, the group's own
items), become pack rows (schema.PACKED) in pack-id order, and are written as one Parquet file whose
name, rows and bytes depend only on the plan, the seed and the corpus: never on how many workers ran
or how the pieces were cut.

Memory of a write task: its file's items (≈ 4 bytes a token) plus the packed rows (4 bytes a slot) and
one int64 scatter index per token; the token column is never reordered (a copy of the largest column
saved: items are placed by index instead).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import StorageConfig
from raypack.metrics import fill_percent_counts
from raypack.packing import copy_runs
from raypack.pipeline.assign import split_file_key
from raypack.storage import join, write_bytes

__all__ = ["data_file", "write_pack_file", "write_pack_files"]

# Fixed writer settings: the same rows give the same bytes.
_PARQUET = {"compression": "zstd", "compression_level": 3, "row_group_size": 1024, "write_statistics": True}


def data_file(bucket_length: int | None, part: int, group: int | None = None) -> str:
    name = f"part-{part:05d}.parquet" if group is None else f"part-{group:05d}-{part:05d}.parquet"
    return f"data/{name}" if bucket_length is None else f"data/bucket={bucket_length}/{name}"


def write_pack_files(
    block: pa.Table,
    output: str,
    pad_id: int,
    bucketed: bool,
    group: int | None = None,
    storage: StorageConfig | None = None,
) -> pa.Table:
    """Items sorted by file_key → one file written, and one WRITTEN row, per key (one key a block in the
    global job, whose sort's boundaries are the plan's file keys; every file of a group in sharded
    mode)."""
    if block.num_rows == 0:
        return schema.WRITTEN.empty_table()
    keys = block.column("file_key").to_numpy()
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    if np.any(np.diff(keys) < 0):
        raise RuntimeError("items reached the writer unsorted by file: the shuffle is inconsistent")
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(keys)]
    return pa.concat_tables(
        write_pack_file(block.slice(s, e - s), output, pad_id, bucketed, group, storage)
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    )


def write_pack_file(
    items: pa.Table,
    output: str,
    pad_id: int,
    bucketed: bool,
    group: int | None = None,
    storage: StorageConfig | None = None,
) -> pa.Table:
    """The items of one output file, in any order → the file written; returns its WRITTEN row.
    `group`: the shard group in sharded mode, whose packs are numbered on their own."""
    _, part = split_file_key(int(items.column("file_key")[0].as_py()))
    capacity = int(items.column("capacity")[0].as_py())
    pack = items.column("pack").to_numpy()
    order = np.lexsort((items.column("slot").to_numpy(), pack))  # items in (pack, slot) order
    tokens = items.column("tokens").combine_chunks()
    src = tokens.offsets.to_numpy().astype(np.int64)
    values = tokens.values.to_numpy()[src[0] : src[-1]]
    length = np.diff(src)
    pack, length = pack[order], length[order]
    first = np.flatnonzero(np.r_[True, pack[1:] != pack[:-1]])
    n_packs = len(first)
    counts = np.diff(np.r_[first, len(pack)])
    row_of_item = np.repeat(np.arange(n_packs), counts)
    # Items lie back to back in slot order: offset = tokens of the pack's earlier items.
    cum = np.cumsum(length) - length
    offset = cum - cum[first][row_of_item]
    fill = np.bincount(row_of_item, weights=length, minlength=n_packs).astype(np.int64)
    if np.any(fill > capacity):
        raise RuntimeError(
            f"a pack of file {part} holds more than {capacity} tokens: the plan is inconsistent"
        )
    # Each item's tokens (a run of the value buffer, items in arrival order) go to its slot.
    dst = np.empty(len(order), dtype=np.int64)
    dst[order] = row_of_item * capacity + offset
    input_ids = np.full(n_packs * capacity, pad_id, dtype=np.int32)
    copy_runs(input_ids, dst, values, src[:-1] - src[0], np.diff(src))
    # doc_offsets per pack: 0, then the end of each item (cu_seqlens).
    ends = (offset + length).astype(np.int32)
    offsets_values = np.insert(ends, first, np.zeros(n_packs, dtype=np.int32))
    offsets_list = np.r_[0, np.cumsum(counts + 1)].astype(np.int32)
    item_list = np.r_[0, np.cumsum(counts)].astype(np.int32)
    take = pa.array(order)
    table = pa.table(
        {
            "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(input_ids), capacity).cast(
                pa.list_(pa.int32())
            ),
            "doc_offsets": pa.ListArray.from_arrays(pa.array(offsets_list), pa.array(offsets_values)),
            "doc_ids": pa.ListArray.from_arrays(
                pa.array(item_list), items.column("doc_id").take(take).combine_chunks()
            ),
            "chunk_index": pa.ListArray.from_arrays(
                pa.array(item_list), items.column("chunk").take(take).combine_chunks()
            ),
            "num_tokens": pa.array(fill.astype(np.int32)),
        },
        schema=schema.PACKED,
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **_PARQUET)
    data = sink.getvalue()
    row_groups = schema.row_group_rows(pq.ParquetFile(pa.BufferReader(data)).metadata)  # in memory
    rel = data_file(capacity if bucketed else None, part, group)
    write_bytes(join(output, rel), data, storage)
    return pa.table(
        {
            "path": [rel],
            "bucket_length": pa.array([capacity], pa.int32()),
            "rows": [n_packs],
            "tokens": [int(fill.sum())],
            "items": [len(pack)],
            "bytes": [data.size],
            "sha256": [hashlib.sha256(data).hexdigest()],
            "row_groups": [row_groups],
            "fill_percent": [fill_percent_counts(fill, capacity)],
        },
        schema=schema.WRITTEN,
    )
