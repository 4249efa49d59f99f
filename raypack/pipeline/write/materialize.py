"""Stages 6-7, materialize and write: all items of one output file reach one write task (the
exchange's pieces for its file range, raypack.pipeline.write.exchange; in sharded mode, the group's own
items), become the file's packs (formats.Packs: tokens and pack index) in pack-id order, and are
written in the dataset's output format (raypack.formats; the parquet format, raypack's own, a row
group at a time) under names, rows and bytes that depend only on the plan, the seed and the corpus:
never on how many workers ran or how the pieces were cut.

Memory of a write task: its file's items (≈ 4 bytes a token) plus the packed tokens (4 bytes a slot;
for parquet, one row group's), the encoded files (≤ 4 bytes a slot) and a few int64 indexes per
item; the token column is never reordered (a copy of the largest column saved: items are placed by
index instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from raypack import schema
from raypack.config import StorageConfig
from raypack.engine import local_cpus
from raypack.formats import BlockFormat, Packs, Spec, stem_of
from raypack.formats.files import loss_mask_of, write_packs, written_row
from raypack.packing import copy_runs
from raypack.pipeline.place.assign import split_file_key

if TYPE_CHECKING:
    from raypack.pipeline.tokenize.token_files import MappedTokens

__all__ = ["write_pack_file", "write_pack_files"]


def write_pack_files(
    block: pa.Table,
    output: str,
    spec: Spec,
    bucketed: bool,
    group: int | None = None,
    storage: StorageConfig | None = None,
    threads: int = 1,
) -> pa.Table:
    """Items sorted by file_key → one file written, and one WRITTEN row, per key (one key a block in the
    global job, whose sort's boundaries are the plan's file keys; every file of a group in sharded
    mode), each file's blocks encoded on `threads` threads."""
    if block.num_rows == 0:
        return schema.WRITTEN.empty_table()
    keys = block.column("file_key").to_numpy()
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    if np.any(np.diff(keys) < 0):
        raise RuntimeError("items reached the writer unsorted by file: the shuffle is inconsistent")
    starts, ends = np.r_[0, cuts], np.r_[cuts, len(keys)]
    return pa.concat_tables(
        write_pack_file(block.slice(s, e - s), output, spec, bucketed, group, storage, threads=threads)
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
    )


def write_pack_file(
    items: pa.Table,
    output: str,
    spec: Spec,
    bucketed: bool,
    group: int | None = None,
    storage: StorageConfig | None = None,
    mapped: MappedTokens | None = None,
    threads: int = 1,
) -> pa.Table:
    """The items of one output file, in any order → the file written in spec's format; returns its
    WRITTEN row. `group`: the shard group in sharded mode, whose packs are numbered on their own;
    `mapped`: the token files of the items that name their tokens there (source >= 0); `threads`:
    how many a BlockFormat's blocks may be encoded on at once."""
    _, part = split_file_key(int(items.column("file_key")[0].as_py()))
    capacity = int(items.column("capacity")[0].as_py())
    pack = items.column("pack").to_numpy()
    order = np.lexsort((items.column("slot").to_numpy(), pack))  # items in (pack, slot) order
    # The token column stays in its chunks (a piece per assign task and round): each chunk's runs
    # are copied from where they lie. combine_chunks would copy all of them first, into fresh memory:
    # 0.4-0.6 s of a 10,000 × 8192 file's ~3 s, mostly the kernel's page faults.
    chunks = items.column("tokens").chunks
    offsets = [c.offsets.to_numpy().astype(np.int64) for c in chunks]
    length = items.column("length").to_numpy().astype(np.int64)
    pack, length = pack[order], length[order]
    first = np.flatnonzero(np.r_[True, pack[1:] != pack[:-1]])
    n_packs = len(first)
    counts = np.diff(np.r_[first, len(pack)])
    row_of_item = np.repeat(np.arange(n_packs), counts)
    k = spec.pad_multiple
    span = length if k == 1 else (length + k - 1) // k * k  # an aligned item's padding follows it
    # Items lie back to back in slot order: offset = positions the pack's earlier items take.
    cum = np.cumsum(span) - span
    offset = cum - cum[first][row_of_item]
    fill = np.bincount(row_of_item, weights=length, minlength=n_packs).astype(np.int64)
    if np.any(offset + span > capacity):
        raise RuntimeError(
            f"a pack of file {part} holds more than {capacity} tokens: the plan is inconsistent"
        )
    # Each item's tokens (a run of the value buffer, items in arrival order) go to its slot.
    dst = np.empty(len(order), dtype=np.int64)
    dst[order] = row_of_item * capacity + offset
    real_cum = np.cumsum(length)
    real_end = real_cum - (real_cum - length)[first][row_of_item]  # cumulative real tokens
    padded_end = (offset + span).astype(np.int32) if k > 1 else None
    index = _pack_index(items, order, first, counts, real_end.astype(np.int32), fill, padded_end)
    stem = stem_of(capacity if bucketed else None, part, group)
    starts = dst[order]  # every item's first position, in pack order
    values = [c.values.to_numpy() for c in chunks]
    chunk_of = np.repeat(np.arange(len(chunks)), [len(c) for c in chunks])
    src = np.concatenate([o[:-1] for o in offsets]) if chunks else np.zeros(0, np.int64)
    source = items.column("source").to_numpy()
    in_file = np.flatnonzero(source >= 0)
    if len(in_file):  # items whose tokens stay in their token files: runs of the mapped buffers
        if mapped is None:
            raise RuntimeError(f"file {part}: items name their token files, which were not mapped")
        buffer, at = mapped.locate(source[in_file], items.column("start").to_numpy()[in_file])
        chunk_of[in_file], src[in_file] = buffer + len(values), at
        values = values + mapped.values
    runs = _Runs(values, chunk_of[order], src[order], length, starts, np.r_[first, len(order)])
    if isinstance(spec.format, BlockFormat):
        return _write_blocks(
            spec.format, runs, stem, index, fill, capacity, output, spec, part, storage, threads
        )
    input_ids = runs.fill(0, n_packs, capacity, spec.pad_id, np.empty(n_packs * capacity, dtype=np.int32))
    loss_mask = loss_mask_of(input_ids, starts, starts + length, spec, part)
    packs = Packs(stem, input_ids, index, loss_mask)
    return write_packs(packs, output, spec, storage)


def _pack_index(
    items: pa.Table,
    order: np.ndarray,
    first: np.ndarray,
    counts: np.ndarray,
    ends: np.ndarray,
    fill: np.ndarray,
    padded_ends: np.ndarray | None = None,
) -> pa.Table:
    """The file's pack index (schema.PACK_INDEX): each pack's documents, chunks and tokens, from the
    items in (pack, slot) `order`, each pack's `first` item and item `counts`, the cumulative real
    tokens at every item's end (`ends`) and each pack's `fill`; with `padded_ends` (each aligned
    item's padded end in its pack), padded_offsets after them (schema.PADDED_OFFSETS)."""
    # doc_offsets per pack: 0, then the real tokens up to each item's end (cu_seqlens).
    offsets_values = np.insert(ends, first, np.zeros(len(first), dtype=np.int32))
    offsets_list = pa.array(np.r_[0, np.cumsum(counts + 1)].astype(np.int32))
    item_list = np.r_[0, np.cumsum(counts)].astype(np.int32)
    take = pa.array(order)
    index = pa.table(
        {
            "doc_offsets": pa.ListArray.from_arrays(offsets_list, pa.array(offsets_values)),
            "doc_ids": pa.ListArray.from_arrays(
                pa.array(item_list), items.column("doc_id").take(take).combine_chunks()
            ),
            "chunk_index": pa.ListArray.from_arrays(
                pa.array(item_list), items.column("chunk").take(take).combine_chunks()
            ),
            "num_tokens": pa.array(fill.astype(np.int32)),
        },
        schema=schema.PACK_INDEX,
    )
    if padded_ends is None:
        return index
    padded = np.insert(padded_ends, first, np.zeros(len(first), dtype=np.int32))
    return index.append_column(
        schema.PADDED_OFFSETS, pa.ListArray.from_arrays(offsets_list, pa.array(padded))
    )


@dataclass(frozen=True)
class _Runs:
    """A file's items as runs of their pieces' value buffers, in (pack, slot) order: `values` a
    buffer per piece, and for every item its piece (`chunk`), its start there (`src`), its length,
    its position in the file's token stream (`dst`: pack × capacity + slot offset); `first`: each
    pack's first item, then the item count."""

    values: list[np.ndarray]
    chunk: np.ndarray
    src: np.ndarray
    length: np.ndarray
    dst: np.ndarray
    first: np.ndarray

    def fill(self, lo: int, hi: int, capacity: int, pad_id: int, buffer: np.ndarray) -> np.ndarray:
        """Packs lo..hi-1, (hi - lo, capacity) int32, in `buffer` (at least that many values):
        padding, then every item's tokens copied from where they lie."""
        rows = buffer[: (hi - lo) * capacity].reshape(hi - lo, capacity)
        rows.fill(pad_id)
        a, b = int(self.first[lo]), int(self.first[hi])
        flat, base = rows.reshape(-1), lo * capacity
        for c in np.unique(self.chunk[a:b]).tolist():
            k = a + np.flatnonzero(self.chunk[a:b] == c)
            copy_runs(flat, self.dst[k] - base, self.values[c], self.src[k], self.length[k])
        return rows


def _write_blocks(
    fmt: BlockFormat,
    runs: _Runs,
    stem: str,
    index: pa.Table,
    fill: np.ndarray,
    capacity: int,
    output: str,
    spec: Spec,
    part: int,
    storage: StorageConfig | None,
    threads: int,
) -> pa.Table:
    """A BlockFormat's file (parquet), its packs filled a block at a time into a ring of buffers
    (one a thread the blocks are encoded on, at most one a block) that later blocks reuse; its
    WRITTEN row."""
    rows, size = index.num_rows, fmt.block_rows
    threads = max(1, min(threads, -(-rows // size), local_cpus()))  # no more than this machine has
    ring = [np.empty(min(rows, size) * capacity, dtype=np.int32) for _ in range(threads)]
    trained = np.zeros(rows, dtype=np.int64) if spec.loss_mask else None

    def blocks() -> Iterator[Packs]:
        for j, lo in enumerate(range(0, rows, size)):
            hi = min(lo + size, rows)
            ids = runs.fill(lo, hi, capacity, spec.pad_id, ring[j % threads])
            a, b = int(runs.first[lo]), int(runs.first[hi])
            item_starts = runs.dst[a:b] - lo * capacity
            mask = loss_mask_of(ids, item_starts, item_starts + runs.length[a:b], spec, part)
            if trained is not None and mask is not None:
                trained[lo:hi] = mask.sum(axis=1, dtype=np.int64)
            yield Packs(stem, ids, index.slice(lo, hi - lo), mask)

    files = fmt.encode_blocks(stem, blocks(), spec, threads)
    return written_row(files, spec, stem, index, capacity, trained, runs.length, 0, output, storage)
