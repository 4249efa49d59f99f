"""parquet: raypack's own format, a row a pack (schema.PACKED) in data/part-NNNNN.parquet, read by
raypack.reader, `datasets`, Ray Data or any Parquet reader (docs/output-format.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.formats import PARQUET_SETTINGS, ROW_GROUP_ROWS, Packs, Settings, Spec, data_file
from raypack.formats._fixed_lists import fits, write_row_group
from raypack.formats._footers import Unknown
from raypack.formats._joined import Unjoinable, join_files
from raypack.storage import resolve

__all__ = ["FORMAT"]


class Parquet:
    name = "parquet"
    suffix = ".parquet"
    holds_index = True
    eos_bounded = False
    keeps_mask = True
    aligns = True

    def spec(self, settings: Settings) -> Spec:
        return Spec(self.name, settings.pad_id, "int32", settings.eos_id, settings.masked)

    block_rows = ROW_GROUP_ROWS

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        rows, size = packs.rows, self.block_rows
        return self.encode_blocks(
            packs.stem, (packs.slice(lo, lo + size) for lo in range(0, rows, size)), spec
        )

    def encode_blocks(
        self, stem: str, blocks: Iterable[Packs], spec: Spec, threads: int = 1
    ) -> dict[str, bytes]:
        """A row group a block: the bytes of pq.write_table(packs.table(), **PARQUET_SETTINGS) on the
        packs whole (tested), where the write task holds `threads` row groups' packs (1,024 × 8192:
        33 MB each) instead of a file's (10,000 × 8192: 330 MB, whose fresh pages take 0.55-0.63 s of
        the task). Each row group is encoded as a file of its own (its token ids by _fixed_lists
        where it can: 80 against 113 ms for 1,024 × 4,096 tokens), on `threads` threads when more
        than one, and the files are joined under one footer (raypack.formats._joined: the same
        bytes)."""
        settings = {k: v for k, v in PARQUET_SETTINGS.items() if k != "row_group_size"}
        if threads > 1:
            parts, first = _encode_parallel(blocks, settings, threads)
        else:
            parts, first = [], None
            for block in blocks:
                first = first or block.table().schema
                parts.append(_encode_one(block, settings))
        sink = pa.BufferOutputStream()
        if not parts:  # no packs: the empty table, as write_table writes it
            pq.write_table(schema.PACKED.empty_table(), sink, **PARQUET_SETTINGS)
            return {data_file(stem, self.suffix): sink.getvalue().to_pybytes()}
        if len(parts) == 1:
            return {data_file(stem, self.suffix): parts[0].to_pybytes()}
        with suppress(Unjoinable):  # a footer it cannot move: written again by one writer
            return {data_file(stem, self.suffix): join_files(parts)}
        writer: pq.ParquetWriter | None = None
        for part in parts:
            table = pq.read_table(pa.BufferReader(part)).cast(first)
            writer = writer or pq.ParquetWriter(sink, table.schema, **settings)
            writer.write_table(table, row_group_size=self.block_rows)
        assert writer is not None
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


def _encode_parallel(
    blocks: Iterable[Packs], settings: dict[str, Any], threads: int
) -> tuple[list[pa.Buffer], pa.Schema | None]:
    """Each block's row group as a Parquet file of its own, encoded on `threads` threads (pyarrow and
    zstd let go of the GIL while they encode), in block order; and the first block's schema. A
    block is drawn once fewer than `threads` are being encoded, the oldest waited for first: when
    block j is drawn, blocks j - threads and before are written, so the caller may fill a ring of
    `threads` buffers."""
    done: list[pa.Buffer] = []
    first: pa.Schema | None = None
    pending: deque[Future[pa.Buffer]] = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="raypack-parquet") as pool:
        for block in blocks:
            first = first or block.table().schema
            pending.append(pool.submit(_encode_one, block, settings))
            if len(pending) == threads:
                done.append(pending.popleft().result())
        done.extend(f.result() for f in pending)
    return done, first


def _encode_one(block: Packs, settings: dict[str, Any]) -> pa.Buffer:
    """A block's row group as a Parquet file: pq.write_table's bytes, its token ids (and loss mask)
    written by _fixed_lists where their length and the settings allow."""
    table = block.table()
    fixed = {0: block.input_ids}
    if block.loss_mask is not None:
        fixed[table.schema.get_field_index(schema.LOSS_MASK.name)] = block.loss_mask
    names = tuple(table.schema.field(i).name for i in fixed)
    if fits(block.capacity, settings, names):
        with suppress(Unknown):
            return pa.py_buffer(write_row_group(table, fixed, settings))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=max(table.num_rows, 1), **settings)
    return sink.getvalue()


FORMAT = Parquet()
