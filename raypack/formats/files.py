"""One output file's packs written in its format (raypack.formats), and the row the manifest keeps of
the file (schema.WRITTEN: its path, size, sha256, counts, fill): what the write tasks
(raypack.pipeline.write.materialize) and `raypack convert` both write."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import StorageConfig
from raypack.formats import Packs, Spec, encode_index, index_path, real_positions
from raypack.metrics import fill_percent_counts
from raypack.storage import join, write_bytes

__all__ = ["loss_mask_of", "stray_eos", "write_packs", "written_row"]


def loss_mask_of(
    input_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, spec: Spec, part: int
) -> np.ndarray | None:
    """Turn staged ids (untrained tokens as -(id + 1): raypack.pipeline.tokenize) back into
    ids, in place ((packs, capacity); `starts`, `ends`: every item's first and past-last flat
    position); the packs' loss mask when the dataset keeps one: 1 where the token is trained and
    not an item's first (its label would be the previous item's), 0 elsewhere and on padding."""
    if not spec.loss_mask:  # a min, not a boolean array of the packs: 0.05 s, not 0.2, at 82M tokens
        if input_ids.size and int(input_ids.min()) < 0:
            raise RuntimeError(f"file {part}: masked tokens reached a dataset without a loss mask")
        return None
    untrained = input_ids < 0
    input_ids[untrained] = -input_ids[untrained] - 1
    real = real_positions(input_ids.shape[0], input_ids.shape[1], starts, ends)
    mask = (~untrained & real).astype(np.int8)
    mask.reshape(-1)[starts] = 0
    return mask


def write_packs(packs: Packs, output: str, spec: Spec, storage: StorageConfig | None = None) -> pa.Table:
    """One output file's packs → its files written in spec's format; its WRITTEN row."""
    fmt = spec.format
    files = fmt.encode(packs, spec)
    if not fmt.holds_index:
        files[index_path(packs.stem)] = encode_index(packs.index)
    starts, ends = packs.item_bounds()
    trained = packs.loss_mask.sum(axis=1, dtype=np.int64) if packs.loss_mask is not None else None
    stray = stray_eos(packs, spec.eos_id) if fmt.eos_bounded else 0
    lengths = ends - starts
    return written_row(
        files, spec, packs.stem, packs.index, packs.capacity, trained, lengths, stray, output, storage
    )


def written_row(
    files: dict[str, bytes],
    spec: Spec,
    stem: str,
    index: pa.Table,
    capacity: int,
    trained: np.ndarray | None,
    item_lengths: np.ndarray,
    stray: int,
    output: str,
    storage: StorageConfig | None,
) -> pa.Table:
    """`files` (the data file first) written under `output`; the file's WRITTEN row. `trained`: the
    trained targets of each pack (its loss mask's ones), None without a mask (then every token but
    each item's first); `item_lengths`: every item's tokens; `stray`: stray_eos's count."""
    rel = next(iter(files))
    index_file = rel if spec.format.holds_index else index_path(stem)
    row_groups = schema.row_group_rows(pq.ParquetFile(pa.BufferReader(files[index_file])).metadata)
    companions = []
    for path, data in files.items():
        write_bytes(join(output, path), data, storage)
        if path != rel:
            companions.append({"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    fill = index.column("num_tokens").to_numpy().astype(np.int64)
    per_pack = np.diff(index.column("doc_ids").combine_chunks().offsets.to_numpy())
    if trained is None:
        trained = fill - per_pack
    return pa.table(
        {
            "path": [rel],
            "bucket_length": pa.array([capacity], pa.int32()),
            "rows": [index.num_rows],
            "tokens": [int(fill.sum())],
            "items": [int(per_pack.sum())],
            "bytes": [len(files[rel])],
            "sha256": [hashlib.sha256(files[rel]).hexdigest()],
            "row_groups": [row_groups],
            "index": [index_file],
            "companions": [companions],
            "fill_percent": [fill_percent_counts(fill, capacity)],
            "stray_eos": [stray],
            "max_items": [int(per_pack.max(initial=0))],
            "longest_item": [int(item_lengths.max(initial=0))],
            "fewest_tokens": [int(fill.min()) if len(fill) else 0],
            "trained": [int(trained.sum())],
            "trained_percent": [fill_percent_counts(trained, capacity)],
        },
        schema=schema.WRITTEN,
    )


def stray_eos(packs: Packs, eos_id: int | None) -> int:
    """EOS tokens inside items (not an item's last token): where a trainer that finds documents by EOS
    cuts one document in two (a document whose text holds the EOS token's own text, say)."""
    if eos_id is None:
        return 0
    starts, ends = packs.item_bounds()
    real = real_positions(packs.rows, packs.capacity, starts, ends)
    found = int(np.count_nonzero((packs.input_ids == eos_id) & real))
    at_ends = int(np.count_nonzero(packs.input_ids.reshape(-1)[ends - 1] == eos_id))
    return found - at_ends
