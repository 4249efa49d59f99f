"""Stage 5, assign: each worker places the items of its own run of shards from the plan, the run's rank
base (items of each length in earlier shards) and each item's rank within its length in the run.
No list of all documents exists anywhere; the driver sent only the plan (O(seq_len²)) and one rank
base per run.

Output rows are items with their tokens, keyed by the output file they belong to; pack ids are local
to a bucket (one bucket unless the algorithm is `bucket`) and shuffled by a seeded permutation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from raypack import schema
from raypack.config import JobConfig
from raypack.corpus.units import WorkUnit
from raypack.packing import Items, PackPermutation, Plan, copy_runs, expand, item_histogram
from raypack.pipeline.tokenize.token_files import token_batches

if TYPE_CHECKING:
    from raypack.pipeline.place.select import Selection

__all__ = ["Buckets", "assign_items", "file_key", "file_of", "file_rows", "items_table", "warm_assign"]

_KEY_SHIFT = 32  # file_key = bucket << 32 | file number within the bucket


def file_key(bucket: np.ndarray, part: np.ndarray) -> np.ndarray:
    return (bucket.astype(np.int64) << _KEY_SHIFT) | part


def split_file_key(key: int) -> tuple[int, int]:
    return key >> _KEY_SHIFT, key & ((1 << _KEY_SHIFT) - 1)


def file_rows(packs: int, shard_rows: int) -> list[int]:
    """Packs in each file of a bucket (or shard group) of `packs`: ceil(packs / shard_rows) files,
    as even as can be (the first packs % files hold one pack more), not shard_rows each and a short
    last one. Write tasks take whole files, so a short last file leaves a core idle at the end:
    even files make a 500 MB repack on 2 cores ~6% faster."""
    files = -(-packs // shard_rows)
    if files == 0:
        return []
    base, extra = divmod(packs, files)
    return [base + 1] * extra + [base] * (files - extra)


def file_of(local: np.ndarray, packs: np.ndarray | int, shard_rows: int) -> np.ndarray:
    """Each pack's file within its bucket (the index into file_rows(packs, shard_rows)), from its
    place `local` among its bucket's `packs` (an array beside `local`, or one count for all)."""
    local = np.asarray(local, dtype=np.int64)
    packs = np.asarray(packs, dtype=np.int64)
    files = np.maximum(-(-packs // shard_rows), 1)
    base, extra = packs // files, packs % files
    cut = extra * (base + 1)  # the packs of the files one pack longer
    return np.where(local < cut, local // (base + 1), extra + (local - cut) // np.maximum(base, 1))


@dataclass(frozen=True, slots=True)
class Buckets:
    """Plan pack id → (bucket, pack id within the bucket, capacity), from the plan's capacity runs."""

    lengths: tuple[int, ...]
    """Distinct capacities, ascending: bucket b holds packs of lengths[b] tokens."""
    sizes: tuple[int, ...]
    """Packs per bucket."""
    run_start: np.ndarray
    run_bucket: np.ndarray
    run_base: np.ndarray
    """Packs of the same bucket in earlier capacity runs."""

    @classmethod
    def of(cls, plan: Plan) -> Buckets:
        starts, values = plan.capacity_start, plan.capacity_value
        ends = np.append(starts[1:], plan.num_packs)
        lengths = tuple(sorted({int(v) for v in values})) if len(values) else (plan.seq_len,)
        bucket = np.searchsorted(np.array(lengths), values).astype(np.int64)
        run_base = np.zeros(len(values), dtype=np.int64)
        seen = np.zeros(len(lengths), dtype=np.int64)
        for i in range(len(values)):
            run_base[i] = seen[bucket[i]]
            seen[bucket[i]] += ends[i] - starts[i]
        return cls(lengths, tuple(int(x) for x in seen), starts, bucket, run_base)

    def locate(self, pack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        run = np.searchsorted(self.run_start, pack, side="right") - 1
        return self.run_bucket[run], self.run_base[run] + (pack - self.run_start[run])


def assign_items(
    shards: list[WorkUnit],
    cfg: JobConfig,
    plan: Plan,
    rank_base: np.ndarray,
    on_docs: Callable[[pa.Array], None] | None = None,
    selection: Selection | None = None,
    in_place: bool = False,
) -> Iterator[pa.Table]:
    """Item tables (schema.ITEMS) of a run of shards, in shard order, one table per record batch of
    their token files and copy layer. `rank_base` (layers, seq_len + 1): items of each length ranked
    before this run's, a row a copy layer (raypack.pipeline.place.histogram.Totals.rank_bases); each
    batch's items move it on, so no per-shard base is ever needed. `selection`: a mixture's rules:
    the documents of copy layer c are those with more than c copies, ranked in that layer. `on_docs`
    sees every document's id (dropped documents' too), batch by batch, once whatever its copies.
    `in_place`: items name their tokens in their unit's token file (source, start) instead of
    carrying a copy (schema.ITEMS), for write tasks that map the token files."""
    buckets = Buckets.of(plan)
    perms = [PackPermutation(n, cfg.pack.seed) if cfg.pack.shuffle else None for n in buckets.sizes]
    seq_len, rows = cfg.pack.seq_len, cfg.output.shard_rows
    base = np.atleast_2d(rank_base).astype(np.int64, copy=True)
    sizes = np.asarray(buckets.sizes, dtype=np.int64)
    for shard in shards:
        before = 0  # token values of the unit's earlier record batches (an in-place item's start)
        for record_batch in token_batches(shard.token_file, cfg.storage):
            batch = pa.Table.from_batches([record_batch])
            tokens = record_batch.column(record_batch.schema.get_field_index("tokens"))
            starts = tokens.offsets.to_numpy()[:-1].astype(np.int64) + before
            before += len(tokens.values)
            if on_docs is not None:
                on_docs(batch.column("doc_id").combine_chunks())
            copies = None if selection is None else selection.copies(shard, batch)
            if in_place:  # the tokens stay where they lie: a filter would copy them for nothing
                batch = batch.drop_columns(["tokens"])
            for layer in range(len(base)):
                if copies is None:
                    keep, docs, lengths = None, batch, batch.column("length").to_numpy()
                else:  # the documents with a copy in this layer, each copy's tokens (one may be partial)
                    keep, lengths = copies.layer(layer)
                    docs = batch.take(pa.array(keep))
                if not docs.num_rows:
                    continue
                place = (shard.index, starts if keep is None else starts[keep]) if in_place else None
                items = cfg.pack.make_items(lengths)
                span = items.span  # the plan places spans, ranked among spans of their length
                pack, slot, _ = expand(plan, span, base[layer])
                base[layer] += item_histogram(span, seq_len)
                bucket, local = buckets.locate(pack.astype(np.int64))
                for b, perm in enumerate(perms):
                    if perm is not None:
                        mask = bucket == b
                        local[mask] = perm(local[mask])
                keys = file_key(bucket, file_of(local, sizes[bucket], rows))
                capacity = np.asarray(buckets.lengths, dtype=np.int32)[bucket]
                yield items_table(docs, items, keys, local, slot, capacity, place)


def warm_assign(cfg: JobConfig) -> None:
    """assign_items' compiled functions loaded (numba reads them from its cache on first use: 0.44 s
    in a process that has not, at the start of each assign task otherwise), on a plan of no runs and
    two items, the dtypes of a real call. A local runner's workers call it while idle at the end of
    the tokenize stage (raypack.pipeline.tokenize.pool.LocalTokenizePool); an error is the real
    assign task's to raise."""
    seq_len = cfg.pack.seq_len
    with suppress(Exception):
        items = cfg.pack.make_items(np.asarray([1, 2], dtype=np.int64))
        plan = Plan.build(seq_len, 0, np.zeros((0, 8), dtype=np.int64))
        expand(plan, items.length[:0], np.zeros(seq_len + 1, dtype=np.int64))
        item_histogram(items.length, seq_len)
        values = np.empty(3, dtype=np.int32)
        offsets, lengths = np.zeros(2, dtype=np.int64), np.asarray([1, 2], dtype=np.int64)
        copy_runs(values, offsets, np.arange(3, dtype=np.int32), offsets, lengths)
        PackPermutation(5, cfg.pack.seed)(np.arange(5, dtype=np.int64))


def items_table(
    docs: pa.Table,
    items: Items,
    keys: np.ndarray,
    pack: np.ndarray,
    slot: np.ndarray,
    capacity: np.ndarray,
    place: tuple[int, np.ndarray] | None = None,
) -> pa.Table:
    """Item rows (schema.ITEMS) with each item's slice of its document's tokens, in file_key order
    (stable): the exchange then splits a batch's items among writers by slicing, where a take of
    the table would copy every token again (0.7 s of an assign task's 2.9 s at 68M tokens).
    `place`: (the unit's index, each document's first token among its token file's values): the
    items name their tokens there (source, start) and carry none."""
    doc_of_item = items.doc_of_item()
    chunk = items.chunk_index()
    if place is not None:
        source, doc_start = place
        start = doc_start[doc_of_item] + items.start_in_doc()
        if np.any(keys[1:] < keys[:-1]):
            order = np.argsort(keys, kind="stable")
            keys, pack, slot, capacity = keys[order], pack[order], slot[order], capacity[order]
            doc_of_item, chunk, start = doc_of_item[order], chunk[order], start[order]
            length = items.length[order]
        else:
            length = items.length
        n = len(keys)
        none = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.int32()))
        return _items(
            docs, keys, pack, slot, capacity, doc_of_item, chunk, length, np.full(n, source), start, none
        )
    # A batch of one token file is one chunk: its array as it lies (memory-mapped), where
    # combine_chunks would copy every token into fresh memory first (0.5 s of a 500 MB job's assign
    # tasks on 2 cores, mostly the page faults of that copy).
    column = docs.column("tokens")
    tokens = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    flat = tokens.flatten().to_numpy()
    doc_token_start = tokens.offsets.to_numpy()[:-1].astype(np.int64)
    start = doc_token_start[doc_of_item] + items.start_in_doc()
    length = items.length.astype(np.int64)
    if np.any(keys[1:] < keys[:-1]):  # the gather below writes the items in this order
        order = np.argsort(keys, kind="stable")
        keys, pack, slot, capacity = keys[order], pack[order], slot[order], capacity[order]
        doc_of_item, chunk, start, length = doc_of_item[order], chunk[order], start[order], length[order]
    out_offsets = np.concatenate(([0], np.cumsum(length)))
    # Every item's tokens, a run of its document's, back to back (numba: no per-token index arrays).
    values = np.empty(int(out_offsets[-1]), dtype=flat.dtype)
    copy_runs(values, out_offsets[:-1], flat, start, length)
    item_tokens = pa.ListArray.from_arrays(pa.array(out_offsets.astype(np.int32)), pa.array(values))
    n = len(keys)
    return _items(
        docs, keys, pack, slot, capacity, doc_of_item, chunk, length, np.full(n, -1), np.zeros(n), item_tokens
    )


def _items(
    docs: pa.Table,
    keys: np.ndarray,
    pack: np.ndarray,
    slot: np.ndarray,
    capacity: np.ndarray,
    doc_of_item: np.ndarray,
    chunk: np.ndarray,
    length: np.ndarray,
    source: np.ndarray,
    start: np.ndarray,
    tokens: pa.Array,
) -> pa.Table:
    return pa.table(
        {
            "file_key": keys,
            "pack": pack.astype(np.int64),
            "slot": slot.astype(np.int32),
            "capacity": capacity.astype(np.int32),
            "doc_id": docs.column("doc_id").take(pa.array(doc_of_item)),
            "chunk": chunk,
            "length": length.astype(np.int32),
            "source": source.astype(np.int32),
            "start": start.astype(np.int64),
            "tokens": tokens,
        },
        schema=schema.ITEMS,
    )
