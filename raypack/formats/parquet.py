"""parquet: raypack's own format, a row a pack (schema.PACKED) in data/part-NNNNN.parquet, read by
raypack.reader, `datasets`, Ray Data or any Parquet reader (docs/output-format.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.formats import PARQUET_SETTINGS, Packs, Settings, Spec
from raypack.storage import resolve

__all__ = ["FORMAT"]


class Parquet:
    name = "parquet"
    suffix = ".parquet"
    holds_index = True
    eos_bounded = False
    keeps_mask = True

    def spec(self, settings: Settings) -> Spec:
        return Spec(self.name, settings.pad_id, "int32", settings.eos_id, settings.masked)

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        sink = pa.BufferOutputStream()
        pq.write_table(packs.table(), sink, **PARQUET_SETTINGS)
        return {f"data/{packs.stem}.parquet": sink.getvalue().to_pybytes()}

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        fs, inner = resolve(path, storage)
        with fs.open_input_file(inner) as handle:
            ids = pq.read_table(handle, columns=["input_ids"]).column("input_ids")
        flat = ids.slice(first, count).combine_chunks().flatten().to_numpy()
        return flat.reshape(count, capacity)

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        ids = pq.read_table(pa.BufferReader(data), columns=["input_ids"]).column("input_ids").combine_chunks()
        if np.any(np.diff(ids.offsets.to_numpy()) != capacity):
            raise ValueError(f"a pack's input_ids is not {capacity} tokens long")
        return ids.flatten().to_numpy().reshape(-1, capacity)

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray | None:
        table = pq.read_table(pa.BufferReader(data))
        if "loss_mask" not in table.column_names:
            return None
        return table.column("loss_mask").combine_chunks().flatten().to_numpy().reshape(-1, capacity)

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        return {}

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        return []


FORMAT = Parquet()
