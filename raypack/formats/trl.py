"""trl: packs as TRL's SFTTrainer takes pre-packed, padding-free rows (data/part-NNNNN.parquet):
`input_ids` (the pack's tokens, unpadded), `labels` (the token where it is trained, else -100) and
`seq_lengths` (each item's tokens), the columns TRL's own packing makes. Load it with
`datasets.load_dataset("parquet", data_files=...)` and train with `SFTConfig(padding_free=True,
packing=False)`: TRL then keeps the rows, its collator restarts position_ids at each item and sets
-100 at each item's start (tests/test_chat.py trains a model on them and checks the loss)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.formats import Packs, Settings, Spec, _unpadded

__all__ = ["FORMAT", "IGNORE"]

IGNORE = -100  # the label of an untrained position (TRL's, and PyTorch cross_entropy's ignore_index)


class Trl:
    name = "trl"
    suffix = ".parquet"
    holds_index = False
    eos_bounded = False
    keeps_mask = True

    def spec(self, settings: Settings) -> Spec:
        return Spec(self.name, settings.pad_id, "int32", settings.eos_id, loss_mask=True)

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        if packs.loss_mask is None:
            raise ValueError("trl packs need a loss mask")
        labels = np.where(packs.loss_mask.astype(bool), packs.input_ids, IGNORE).astype(np.int32)
        offsets = packs.index.column("doc_offsets").combine_chunks()
        lengths = np.diff(offsets.flatten().to_numpy())
        per_pack = np.diff(offsets.offsets.to_numpy()) - 1  # items a pack: its offsets less one
        table = pa.table(
            {
                "input_ids": _unpadded.unpadded(packs, packs.input_ids, pa.int32()),
                "labels": _unpadded.unpadded(packs, labels, pa.int32()),
                "seq_lengths": pa.ListArray.from_arrays(
                    pa.array(np.r_[0, np.cumsum(per_pack)].astype(np.int32)),
                    pa.array(_item_lengths(lengths, per_pack), pa.int32()),
                ),
            }
        )
        return {f"data/{packs.stem}.parquet": _unpadded.table_bytes(table)}

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        table = _unpadded.read_group(path, first, count, ["input_ids"], storage)
        return _unpadded.padded(table.column("input_ids"), capacity, spec.pad_id)

    def read_mask(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        table = _unpadded.read_group(path, first, count, ["labels"], storage)
        return (_unpadded.padded(table.column("labels"), capacity, IGNORE) != IGNORE).astype(np.int8)

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        table = pq.read_table(pa.BufferReader(data), columns=["input_ids"])
        return _unpadded.padded(table.column("input_ids"), capacity, spec.pad_id)

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        table = pq.read_table(pa.BufferReader(data), columns=["labels"])
        return (_unpadded.padded(table.column("labels"), capacity, IGNORE) != IGNORE).astype(np.int8)

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        return {}

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        path = next(iter(data))
        table = pq.read_table(pa.BufferReader(data[path]), columns=["seq_lengths"])
        offsets = packs.index.column("doc_offsets").to_pylist()
        want = [np.diff(o).tolist() for o in offsets]
        if table.column("seq_lengths").to_pylist() != want:
            return [f"{path}: seq_lengths differ from the pack index's items"]
        return []


def _item_lengths(bounds_diff: np.ndarray, per_pack: np.ndarray) -> np.ndarray:
    """Items' lengths from the flattened doc_offsets' differences, dropping the step from one pack's
    last offset to the next pack's 0."""
    keep = np.ones(len(bounds_diff), dtype=bool)
    ends = np.cumsum(per_pack + 1) - 1  # index of each pack's last offset in the flat list
    keep[ends[:-1]] = False
    return bounds_diff[keep]


FORMAT = Trl()
