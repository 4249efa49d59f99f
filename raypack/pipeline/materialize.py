"""Stages 6-7, materialize and write: all items of one output file arrive together (a Ray Data groupby
on file_key: the shuffle of the job), become pack rows (schema.PACKED) in pack-id order, and are
written as one Parquet file whose name, rows and bytes depend only on the plan, the seed and the
corpus: never on how many workers ran or how blocks were cut.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import StorageConfig
from raypack.pipeline.assign import split_file_key
from raypack.storage import join, write_bytes

__all__ = ["data_file", "write_pack_file"]

# Fixed writer settings: the same rows give the same bytes.
_PARQUET = {"compression": "zstd", "compression_level": 3, "row_group_size": 1024, "write_statistics": True}


def data_file(bucket_length: int | None, part: int, group: int | None = None) -> str:
    name = f"part-{part:05d}.parquet" if group is None else f"part-{group:05d}-{part:05d}.parquet"
    return f"data/{name}" if bucket_length is None else f"data/bucket={bucket_length}/{name}"


def write_pack_file(
    items: pa.Table,
    output: str,
    pad_id: int,
    bucketed: bool,
    group: int | None = None,
    storage: StorageConfig | None = None,
) -> pa.Table:
    """map_groups function: one group = the items of one output file; returns its FILES row.
    `group`: the shard group in sharded mode, whose packs are numbered on their own."""
    _, part = split_file_key(int(items.column("file_key")[0].as_py()))
    capacity = int(items.column("capacity")[0].as_py())
    items = items.sort_by([("pack", "ascending"), ("slot", "ascending")])
    pack = items.column("pack").to_numpy()
    tokens = items.column("tokens").combine_chunks()
    length = np.diff(tokens.offsets.to_numpy()).astype(np.int64)
    first = np.flatnonzero(np.r_[True, pack[1:] != pack[:-1]])
    n_packs = len(first)
    row_of_item = np.repeat(np.arange(n_packs), np.diff(np.r_[first, len(pack)]))
    # Items lie back to back in slot order: offset = tokens of the pack's earlier items.
    cum = np.cumsum(length) - length
    offset = cum - cum[first][row_of_item]
    fill = np.bincount(row_of_item, weights=length, minlength=n_packs).astype(np.int64)
    if np.any(fill > capacity):
        raise RuntimeError(
            f"a pack of file {part} holds more than {capacity} tokens: the plan is inconsistent"
        )
    input_ids = np.full(n_packs * capacity, pad_id, dtype=np.int32)
    owner = np.repeat(np.arange(len(length)), length)
    within = np.arange(int(length.sum())) - np.repeat(cum, length)
    input_ids[row_of_item[owner] * capacity + offset[owner] + within] = tokens.flatten().to_numpy()
    # doc_offsets per pack: 0, then the end of each item (cu_seqlens).
    counts = np.diff(np.r_[first, len(pack)])
    ends = (offset + length).astype(np.int32)
    starts_zero = np.zeros(n_packs, dtype=np.int32)
    offsets_values = np.insert(ends, first, starts_zero)
    offsets_list = np.r_[0, np.cumsum(counts + 1)].astype(np.int32)
    item_list = np.r_[0, np.cumsum(counts)].astype(np.int32)
    table = pa.table(
        {
            "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(input_ids), capacity).cast(
                pa.list_(pa.int32())
            ),
            "doc_offsets": pa.ListArray.from_arrays(pa.array(offsets_list), pa.array(offsets_values)),
            "doc_ids": pa.ListArray.from_arrays(pa.array(item_list), items.column("doc_id").combine_chunks()),
            "chunk_index": pa.ListArray.from_arrays(
                pa.array(item_list), items.column("chunk").combine_chunks()
            ),
            "num_tokens": pa.array(fill.astype(np.int32)),
        },
        schema=schema.PACKED,
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **_PARQUET)
    data = sink.getvalue()
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
        },
        schema=schema.FILES,
    )
