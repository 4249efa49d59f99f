"""bridge: Megatron-Bridge's packed SFT Parquet (data/part-NNNNN.idx.parquet, the `*.idx.parquet`
names its GPTSFTPackedParquetDataset globs for): `input_ids` list<int32> (the pack's tokens,
unpadded), `seq_start_id` list<int32> (each item's start) and `loss_mask` list<int8>, which in
Bridge's convention belongs to the label: within an item that starts at s and ends at e, Bridge trains
input_ids[s:e-1] to predict input_ids[s+1:e] with loss_mask[s:e-1], so loss_mask[j] = 1 when token
j+1 is trained (our Packs.loss_mask shifted left by one, 0 at each item's last position). Beside the
data, pack_metadata.json for `pack_metadata_file_path` (dataset_max_seqlen, max_samples_per_bin,
min_packed_seqlen: what Bridge pads cu_seqlens to for CUDA graphs), from the manifest's entries."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.formats import Packs, Spec, _unpadded

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


class Bridge(_unpadded.Unpadded):
    name = "bridge"
    suffix = ".idx.parquet"

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        if packs.loss_mask is None:
            raise ValueError("bridge packs need a loss mask")
        starts, _ = packs.item_bounds()
        label_mask = to_label_mask(packs.loss_mask, starts)
        table = pa.table(
            {
                "input_ids": _unpadded.unpadded(packs, packs.input_ids, pa.int32()),
                "loss_mask": _unpadded.unpadded(packs, label_mask, pa.int8()),
                "seq_start_id": _unpadded.per_item(packs, starts % packs.capacity),
            }
        )
        return {f"data/{packs.stem}.idx.parquet": _unpadded.table_bytes(table)}

    def read_mask(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        return self._mask(
            _unpadded.read_group(path, first, count, ["loss_mask", "seq_start_id"], storage), capacity
        )

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        return self._mask(
            pq.read_table(pa.BufferReader(data), columns=["loss_mask", "seq_start_id"]), capacity
        )

    def _mask(self, table: pa.Table, capacity: int) -> np.ndarray:
        label_mask = _unpadded.padded(table.column("loss_mask"), capacity, 0, np.int8)
        starts = _unpadded.item_starts(table.column("seq_start_id").combine_chunks(), capacity)
        return from_label_mask(label_mask, starts)

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
                    "dataset_max_seqlen": max(int(f["longest_item"]) for f in same),
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
        offsets = packs.index.column("doc_offsets").to_pylist()
        if table.column("seq_start_id").to_pylist() != [o[:-1] for o in offsets]:
            return [f"{path}: seq_start_id differs from the pack index's items"]
        ids = np.diff(table.column("input_ids").combine_chunks().offsets.to_numpy())
        mask = np.diff(table.column("loss_mask").combine_chunks().offsets.to_numpy())
        if not np.array_equal(ids, mask):
            return [f"{path}: loss_mask and input_ids differ in length"]
        return []


FORMAT = Bridge()
