"""bridge: Megatron-Bridge's packed SFT Parquet (data/part-NNNNN.idx.parquet, the `*.idx.parquet`
names its GPTSFTPackedParquetDataset globs for): `input_ids` list<int32> (the pack's tokens,
unpadded), `seq_start_id` list<int32> (each item's start) and `loss_mask` list<int8>, which in
Bridge's convention belongs to the label: within an item that starts at s and ends at e, Bridge trains
input_ids[s:e-1] to predict input_ids[s+1:e] with loss_mask[s:e-1], so loss_mask[j] = 1 when token
j+1 is trained (our Packs.loss_mask shifted left by one, 0 at each item's last position). Beside the
data, pack_metadata.json for `pack_metadata_file_path` (dataset_max_seqlen, max_samples_per_bin,
min_packed_seqlen: what Bridge pads cu_seqlens to for CUDA graphs), from the manifest's entries.

With pack.pad_multiple k (context parallelism: Bridge's pad_seq_to_mult), each item is stored as
Bridge's own preparation stores one: its tokens, padding to the next multiple of k, and one pad more
(Bridge's collate drops every sequence's last token for the label shift, leaving k's multiple),
seq_start_id at those stored starts; the padding is EOS, which Bridge's collate strips to find each
sequence's real length (cu_seqlens_unpadded) and never trains."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.errors import ConfigError
from raypack.formats import Packs, Settings, Spec, _unpadded, item_spans

__all__ = ["FORMAT", "METADATA", "to_label_mask"]

METADATA = "pack_metadata.json"


def to_label_mask(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Packs.loss_mask (rows, capacity) → Bridge's: position j holds token j+1's bit, 0 where j+1
    starts an item (item starts are flat positions row × capacity + start) or lies past the row."""
    flat = np.zeros(mask.size, dtype=np.int8)
    flat[:-1] = mask.reshape(-1)[1:]
    flat[starts[starts > 0] - 1] = 0
    out = flat.reshape(mask.shape)
    out[:, -1] = 0
    return out


def from_label_mask(label_mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Bridge's mask → Packs.loss_mask: token t is trained when position t-1 says so and t is not
    an item's start."""
    flat = np.zeros(label_mask.size, dtype=np.int8)
    flat[1:] = label_mask.reshape(-1)[:-1]
    flat[starts] = 0
    return flat.reshape(label_mask.shape)


def stored_items(packs: Packs, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Aligned packs as Bridge stores them: every item's span (its tokens and padding to a multiple
    of k) and one position more. Returns the flat positions (row × capacity + t) each stored value
    comes from, -1 for the extra one; each pack's stored length; every item's stored start."""
    starts, lengths, per_pack = item_spans(packs.index)
    stored = -(-lengths // k) * k + 1
    item = np.repeat(np.arange(len(stored)), stored)
    within = np.arange(int(stored.sum())) - np.repeat(np.cumsum(stored) - stored, stored)
    base = np.repeat(np.arange(packs.rows, dtype=np.int64) * packs.capacity, per_pack)
    source = np.where(within == stored[item] - 1, -1, base[item] + starts[item] + within)
    pack_of = np.repeat(np.arange(packs.rows), per_pack)
    row_length = np.bincount(pack_of, weights=stored, minlength=packs.rows).astype(np.int64)
    first = np.r_[0, np.cumsum(per_pack)[:-1]]
    at = np.cumsum(stored) - stored
    return source, row_length, at - np.repeat(at[first] if len(at) else at, per_pack)


def realigned(values: pa.ListArray, seq_start_id: pa.ListArray) -> pa.ListArray:
    """Rows of an aligned bridge file with every stored item's extra position dropped: the pack's
    items back at their aligned starts, its end padding left off."""
    starts = seq_start_id.flatten().to_numpy().astype(np.int64)
    per_row = np.diff(seq_start_id.offsets.to_numpy())
    offsets = values.offsets.to_numpy().astype(np.int64)
    row_start = np.repeat(offsets[:-1], per_row)
    row_of = np.repeat(np.arange(len(per_row)), per_row)
    last = np.r_[row_of[1:] != row_of[:-1], True]  # a row's last item ends where its row does
    ends = np.where(last, np.repeat(offsets[1:], per_row), row_start + np.r_[starts[1:], 0])
    keep = np.ones(int(offsets[-1] - offsets[0]), dtype=bool)
    keep[ends - 1 - offsets[0]] = False
    flat = values.values.to_numpy()[offsets[0] : offsets[-1]][keep]
    lengths = np.diff(offsets) - per_row
    return pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32)), pa.array(flat))


class Bridge(_unpadded.Unpadded):
    name = "bridge"
    suffix = ".idx.parquet"
    aligns = True

    def spec(self, settings: Settings) -> Spec:
        if settings.pad_multiple == 1:
            return super().spec(settings)
        if settings.eos_id is None:
            raise ConfigError(
                "output.format bridge with pack.pad_multiple: Bridge's collate finds each sequence's real "
                "length by stripping its EOS padding, and the tokenizer has no EOS; set tokenizer.eos_id"
            )
        return Spec(self.name, settings.eos_id, "int32", settings.eos_id, loss_mask=True)

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        if packs.loss_mask is None:
            raise ValueError("bridge packs need a loss mask")
        starts, _ = packs.item_bounds()
        label_mask = to_label_mask(packs.loss_mask, starts)
        if spec.pad_multiple > 1:
            return {
                f"data/{packs.stem}.idx.parquet": _unpadded.table_bytes(_aligned(packs, label_mask, spec))
            }
        table = pa.table(
            {
                "input_ids": _unpadded.unpadded(packs, packs.input_ids, pa.int32()),
                "loss_mask": _unpadded.unpadded(packs, label_mask, pa.int8()),
                "seq_start_id": _unpadded.per_item(packs, starts % packs.capacity),
            }
        )
        return {f"data/{packs.stem}.idx.parquet": _unpadded.table_bytes(table)}

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        if spec.pad_multiple == 1:
            return super().read_tokens(path, spec, capacity, first, count, storage)
        table = _unpadded.read_group(path, first, count, ["input_ids", "seq_start_id"], storage)
        return self._tokens(table, capacity, spec)

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        if spec.pad_multiple == 1:
            return super().decode(data, spec, capacity)
        table = pq.read_table(pa.BufferReader(data), columns=["input_ids", "seq_start_id"])
        return self._tokens(table, capacity, spec)

    def _tokens(self, table: pa.Table, capacity: int, spec: Spec) -> np.ndarray:
        starts = table.column("seq_start_id").combine_chunks()
        ids = realigned(table.column("input_ids").combine_chunks(), starts)
        return _unpadded.padded(ids, capacity, spec.pad_id)

    def read_mask(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        return self._mask(
            _unpadded.read_group(path, first, count, ["loss_mask", "seq_start_id"], storage), capacity, spec
        )

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        return self._mask(
            pq.read_table(pa.BufferReader(data), columns=["loss_mask", "seq_start_id"]), capacity, spec
        )

    def _mask(self, table: pa.Table, capacity: int, spec: Spec) -> np.ndarray:
        column, starts = table.column("loss_mask"), table.column("seq_start_id").combine_chunks()
        if spec.pad_multiple > 1:  # the stored starts, less the extra position of each earlier item
            column = realigned(column.combine_chunks(), starts)
            per_row = np.diff(starts.offsets.to_numpy())
            rank = np.arange(int(per_row.sum())) - np.repeat(np.cumsum(per_row) - per_row, per_row)
            moved = starts.flatten().to_numpy() - rank
            row_offsets = pa.array(np.r_[0, np.cumsum(per_row)].astype(np.int32))
            starts = pa.ListArray.from_arrays(row_offsets, pa.array(moved.astype(np.int32)))
        label_mask = _unpadded.padded(column, capacity, 0, np.int8)
        return from_label_mask(label_mask, _unpadded.item_starts(starts, capacity))

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        """pack_metadata.json, a list of one entry a pack length (Bridge takes the max or min over
        the list), from the manifest's file entries."""
        entries = []
        for length in sorted({int(f["bucket_length"]) for f in files}):
            same = [f for f in files if int(f["bucket_length"]) == length]
            rows, items = sum(int(f["rows"]) for f in same), sum(int(f["items"]) for f in same)
            tokens = sum(int(f["tokens"]) for f in same)
            entries.append(
                {
                    "dataset_max_seqlen": _padded(max(int(f["longest_item"]) for f in same), spec),
                    "max_samples_per_bin": max(int(f["max_items"]) for f in same),
                    "packing_factor": round(items / max(rows, 1), 2),
                    "packing_efficiency": round(100 * tokens / max(rows * length, 1), 2),
                    "pack_size": length,
                    "min_packed_seqlen": min(int(f["fewest_tokens"]) for f in same),
                }
            )
        return {METADATA: json.dumps(entries, indent=2).encode()}

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        path = next(iter(data))
        table = pq.read_table(pa.BufferReader(data[path]), columns=["seq_start_id", "input_ids", "loss_mask"])
        if spec.pad_multiple > 1:
            _, _, expected = stored_items(packs, spec.pad_multiple)
            got = table.column("seq_start_id").combine_chunks().flatten().to_numpy()
            same = np.array_equal(got, expected)
        else:
            offsets = packs.index.column("doc_offsets").to_pylist()
            same = table.column("seq_start_id").to_pylist() == [o[:-1] for o in offsets]
        if not same:
            return [f"{path}: seq_start_id differs from the pack index's items"]
        ids = np.diff(table.column("input_ids").combine_chunks().offsets.to_numpy())
        mask = np.diff(table.column("loss_mask").combine_chunks().offsets.to_numpy())
        if not np.array_equal(ids, mask):
            return [f"{path}: loss_mask and input_ids differ in length"]
        return []


def _padded(length: int, spec: Spec) -> int:
    """An item's length as its sequence in Bridge's cu_seqlens: padded to pad_multiple."""
    return -(-length // spec.pad_multiple) * spec.pad_multiple


def _aligned(packs: Packs, label_mask: np.ndarray, spec: Spec) -> pa.Table:
    """The data file's table of aligned packs (stored_items)."""
    source, row_length, start = stored_items(packs, spec.pad_multiple)
    extra = source < 0
    at = np.where(extra, 0, source)
    ids, mask = packs.input_ids.reshape(-1)[at], label_mask.reshape(-1)[at]
    ids[extra], mask[extra] = spec.pad_id, 0
    offsets = pa.array(np.r_[0, np.cumsum(row_length)].astype(np.int32))
    return pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(ids, pa.int32())),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask, pa.int8())),
            "seq_start_id": _unpadded.per_item(packs, start),
        }
    )


FORMAT = Bridge()
