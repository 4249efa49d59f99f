"""What the SFT formats (trl, bridge) share: packs stored unpadded, a row a pack, in Parquet files
whose row groups are the pack index's (PARQUET_SETTINGS: 1,024 packs), so the reader's ranged read
of one row group of packs is one row group of data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.formats import PARQUET_SETTINGS, Packs, Settings, Spec
from raypack.storage import resolve

ROW_GROUP = int(str(PARQUET_SETTINGS["row_group_size"]))

__all__ = ["Unpadded", "item_starts", "padded", "per_item", "read_group", "table_bytes", "unpadded"]


class Unpadded:
    """What trl and bridge share as formats: a mask always, `input_ids` unpadded in the data file,
    read back padded with the Spec's pad_id. A subclass names itself and writes its own columns."""

    name: str
    holds_index = False
    eos_bounded = False
    keeps_mask = True
    aligns = False

    def spec(self, settings: Settings) -> Spec:
        return Spec(self.name, settings.pad_id, "int32", settings.eos_id, loss_mask=True)

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        table = read_group(path, first, count, ["input_ids"], storage)
        return padded(table.column("input_ids"), capacity, spec.pad_id)

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        table = pq.read_table(pa.BufferReader(data), columns=["input_ids"])
        return padded(table.column("input_ids"), capacity, spec.pad_id)


def per_item(packs: Packs, values: np.ndarray) -> pa.ListArray:
    """A list a pack of one int32 value per item (values in pack order, as Packs.item_bounds)."""
    per_pack = np.diff(packs.index.column("doc_ids").combine_chunks().offsets.to_numpy())
    offsets = np.r_[0, np.cumsum(per_pack)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))


def unpadded(packs: Packs, values: np.ndarray, dtype: pa.DataType) -> pa.ListArray:
    """(packs, capacity) `values` → a list a pack, its first num_tokens values."""
    fill = packs.index.column("num_tokens").to_numpy().astype(np.int64)
    real = np.arange(packs.capacity)[None, :] < fill[:, None]
    offsets = np.r_[0, np.cumsum(fill)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values[real], dtype))


def padded(
    column: pa.ChunkedArray | pa.ListArray, capacity: int, pad: int, dtype: Any = np.int32
) -> np.ndarray:
    """A list column of at most `capacity` values a row → (rows, capacity), padded with `pad`."""
    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = lists.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(offsets)
    if np.any(lengths > capacity):
        raise ValueError(f"a pack holds more than {capacity} tokens")
    out = np.full((len(lengths), capacity), pad, dtype=dtype)
    real = np.arange(capacity)[None, :] < lengths[:, None]
    out[real] = lists.values.to_numpy()[offsets[0] : offsets[-1]]
    return out


def item_starts(starts: pa.ListArray, capacity: int) -> np.ndarray:
    """Positions (row × capacity + start) of every item's first token, from a list of starts a row."""
    lengths = np.diff(starts.offsets.to_numpy())
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return rows * capacity + starts.flatten().to_numpy().astype(np.int64)


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **PARQUET_SETTINGS)
    return sink.getvalue().to_pybytes()


def read_group(path: str, first: int, count: int, columns: list[str], storage: Any) -> pa.Table:
    """Rows first .. first + count - 1 of a data file written by table_bytes, reading only the row
    groups that hold them."""
    fs, inner = resolve(path, storage)
    with fs.open_input_file(inner) as handle:
        parquet = pq.ParquetFile(handle)
        size = ROW_GROUP
        groups = list(range(first // size, (first + count - 1) // size + 1))
        table = parquet.read_row_groups(groups, columns=columns)
    return table.slice(first - groups[0] * size, count)
