"""parquet: raypack's own format, a row a pack (schema.PACKED) in data/part-NNNNN.parquet, read by
raypack.reader, `datasets`, Ray Data or any Parquet reader (docs/output-format.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.formats import PARQUET_SETTINGS, ROW_GROUP_ROWS, Packs, Settings, Spec, data_file
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

    block_rows = ROW_GROUP_ROWS

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        rows, size = packs.rows, self.block_rows
        return self.encode_blocks(
            packs.stem, (packs.slice(lo, lo + size) for lo in range(0, rows, size)), spec
        )

    def encode_blocks(self, stem: str, blocks: Iterable[Packs], spec: Spec) -> dict[str, bytes]:
        """A row group a block: the bytes of pq.write_table(packs.table(), **PARQUET_SETTINGS) on the
        packs whole (tested), where the write task holds one row group's packs (1,024 × 8192: 33 MB)
        instead of a file's (10,000 × 8192: 330 MB, whose fresh pages took 0.55-0.63 s of the task)."""
        sink = pa.BufferOutputStream()
        settings = {k: v for k, v in PARQUET_SETTINGS.items() if k != "row_group_size"}
        writer: pq.ParquetWriter | None = None
        for block in blocks:
            table = block.table()
            writer = writer or pq.ParquetWriter(sink, table.schema, **settings)
            writer.write_table(table, row_group_size=self.block_rows)
        if writer is None:  # no packs: the empty table, as write_table writes it
            pq.write_table(schema.PACKED.empty_table(), sink, **PARQUET_SETTINGS)
        else:
            writer.close()
        return {data_file(stem, self.suffix): sink.getvalue().to_pybytes()}

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
