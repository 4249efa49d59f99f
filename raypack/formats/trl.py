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

from raypack.formats import Packs, Spec, _unpadded

__all__ = ["FORMAT", "IGNORE"]

IGNORE = -100  # the label of an untrained position (TRL's, and PyTorch cross_entropy's ignore_index)


class Trl(_unpadded.Unpadded):
    name = "trl"
    suffix = ".parquet"

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        if packs.loss_mask is None:
            raise ValueError("trl packs need a loss mask")
        labels = np.where(packs.loss_mask.astype(bool), packs.input_ids, IGNORE).astype(np.int32)
        starts, ends = packs.item_bounds()
        table = pa.table(
            {
                "input_ids": _unpadded.unpadded(packs, packs.input_ids, pa.int32()),
                "labels": _unpadded.unpadded(packs, labels, pa.int32()),
                "seq_lengths": _unpadded.per_item(packs, ends - starts),
            }
        )
        return {f"data/{packs.stem}.parquet": _unpadded.table_bytes(table)}

    def read_mask(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        return _trained(_unpadded.read_group(path, first, count, ["labels"], storage), capacity)

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        return _trained(pq.read_table(pa.BufferReader(data), columns=["labels"]), capacity)

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


def _trained(table: pa.Table, capacity: int) -> np.ndarray:
    """Packs.loss_mask from the labels column: 1 where a label is not IGNORE."""
    return (_unpadded.padded(table.column("labels"), capacity, IGNORE) != IGNORE).astype(np.int8)


FORMAT = Trl()
