"""A row group's lists of the pack's length (a pack's token ids, a chat pack's loss mask) written
with the bytes pyarrow writes for them, without pyarrow's per-value work on those columns.

Why: pyarrow encodes a list column value by value (its repetition and definition levels, and their
histograms), ~45 ms of the ~115 ms a row group of 1,024 packs of 4,096 tokens takes on this
project's 2-core machine; zstd takes the rest. For rows of one length those levels repeat a
pattern a row: this module writes them a row at a time, and the values as they lie (80-86 ms; a
loss mask too: 90-98 ms against 166-168).

What pyarrow writes for such a column (its defaults here: data page v1, PLAIN, no dictionary, no
statistics, zstd): pages of PAGE_VALUES values (its 1 MiB data page size, checked every 1,024
levels), each a PageHeader (Thrift compact) and, compressed: the repetition levels (RLE/bit-packed
hybrid, bit width 1, after a 4-byte length), the definition levels (bit width 2, all 3: the list
and its element present), the values (PLAIN: little-endian int32; an int8 column is INT32 in
Parquet). Where `capacity` is a power of two from 16 to PAGE_VALUES, every page holds whole rows, a
row's repetition levels (0, then capacity - 1 ones) are one bit-packed group of eight (0 and seven
ones) and an RLE run of capacity - 8 ones, and a page's definition levels are one run. Other
capacities are pyarrow's (fits), as are row groups whose footer holds what this does not move
(statistics on those columns, page indexes, bloom filters: Unknown).

The rest of the row group is pyarrow's: it writes the row group with a stand-in for each such
column (a row of 16 zeros each, one page), whose page header and column metadata give the fields
this changes; later columns' offsets move by the difference. Tested byte for byte against
pq.write_table (tests/test_fixed_lists.py).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.formats._footers import (
    CC_FILE_OFFSET,
    CC_META,
    CM_OFFSETS,
    FILE_ROW_GROUPS,
    I32,
    I64,
    MAGIC,
    RG_COLUMNS,
    RG_FILE_OFFSET,
    RG_NUM_ROWS,
    RG_ORDINAL,
    Field,
    Reader,
    Unknown,
    encode,
    get,
    move_chunk,
    split,
)

__all__ = ["PAGE_VALUES", "fits", "write_row_group"]

PAGE_VALUES = 1 << 18  # pyarrow's data_page_size (1 MiB) of int32 values
_STANDIN = 16  # the stand-in's row length: the smallest capacity this writes

# parquet.thrift field ids.
_PH_TYPE, _PH_UNCOMPRESSED, _PH_COMPRESSED, _PH_DATA = 1, 2, 3, 5
_DPH_NUM_VALUES, _DPH_ENCODING, _DPH_DEF, _DPH_REP, _DPH_STATS = 1, 2, 3, 4, 5
_RG_TOTAL_BYTES, _RG_COMPRESSED = 2, 6
_CM_TYPE, _CM_ENCODINGS, _CM_PATH, _CM_CODEC, _CM_NUM_VALUES = 1, 2, 3, 4, 5
_CM_UNCOMPRESSED, _CM_COMPRESSED, _CM_STATISTICS, _CM_ENCODING_STATS, _CM_SIZE_STATS = 6, 7, 12, 13, 16
_SS_REP, _SS_DEF = 2, 3
_PES_COUNT = 3
# The fields this module knows (and moves or sets) in the stand-in's column chunks and metadata.
_CC_KNOWN = {CC_FILE_OFFSET, CC_META}
_CM_KNOWN = {
    _CM_TYPE,
    _CM_ENCODINGS,
    _CM_PATH,
    _CM_CODEC,
    _CM_NUM_VALUES,
    _CM_UNCOMPRESSED,
    _CM_COMPRESSED,
    *CM_OFFSETS,
    _CM_ENCODING_STATS,
    _CM_SIZE_STATS,
}
_RG_KNOWN = {RG_COLUMNS, _RG_TOTAL_BYTES, RG_NUM_ROWS, RG_FILE_OFFSET, _RG_COMPRESSED, RG_ORDINAL}


def fits(capacity: int, settings: dict[str, Any], columns: tuple[str, ...] = ("input_ids",)) -> bool:
    """Whether this writes `columns` (list columns of rows `capacity` long) under these writer
    settings (pyarrow's defaults but for the codec, no dictionary and which columns have
    statistics: not these)."""
    stats = settings.get("write_statistics", True)
    return (
        _STANDIN <= capacity <= PAGE_VALUES
        and capacity & (capacity - 1) == 0
        and settings.get("compression") == "zstd"
        and settings.get("use_dictionary") is False
        and set(settings) <= {"compression", "compression_level", "use_dictionary", "write_statistics"}
        and (
            stats is False
            or (isinstance(stats, list | tuple) and not {f"{c}.list.element" for c in columns} & set(stats))
        )
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _levels(rows: int, capacity: int) -> bytes:
    """A page's repetition and definition levels, as pyarrow's RLE encoder writes them for `rows`
    rows of `capacity` values each."""
    rep = (b"\x03\xfe" + _varint((capacity - 8) << 1) + b"\x01") * rows
    define = _varint((rows * capacity) << 1) + b"\x03"
    return struct.pack("<i", len(rep)) + rep + struct.pack("<i", len(define)) + define


def write_row_group(table: pa.Table, fixed: dict[int, np.ndarray], settings: dict[str, Any]) -> bytes:
    """A Parquet file of one row group holding `table`, byte for byte what pq.write_table(table,
    row_group_size=rows, **settings) writes, the list columns `fixed` names (by position: (rows,
    capacity) arrays of int32 or int8, the column's values) written here; Unknown where the
    stand-in's footer or pages hold what this does not know (then write it with pyarrow)."""
    rows = table.num_rows
    standin = table
    for i, values in fixed.items():
        field = table.schema.field(i)
        zeros = pa.array(np.zeros(rows * _STANDIN, dtype=values.dtype), field.type.value_type)
        starts = pa.array(np.arange(0, (rows + 1) * _STANDIN, _STANDIN, dtype=np.int32))
        standin = standin.set_column(i, field, pa.ListArray.from_arrays(starts, zeros))
    sink = pa.BufferOutputStream()
    pq.write_table(standin, sink, row_group_size=max(rows, 1), **settings)
    body, footer = split(sink.getvalue())
    groups = get(footer, FILE_ROW_GROUPS)
    if groups is None or len(groups.value.items) != 1:
        raise Unknown("a stand-in of other than one row group")
    group: list[Field] = groups.value.items[0]
    if {f.id for f in group} - _RG_KNOWN:
        raise Unknown("a row group field this does not know")
    chunks = get(group, RG_COLUMNS)
    if chunks is None or len(chunks.value.items) != table.num_columns:
        raise Unknown("a row group of other columns")
    codec = pa.Codec("zstd", compression_level=settings.get("compression_level"))
    parts: list[Any] = [MAGIC]
    at = len(MAGIC)  # where the next chunk starts in the stand-in's file
    shift = grown = 0  # how much further on it starts in this one; uncompressed bytes added
    for i, chunk in enumerate(chunks.value.items):
        if {f.id for f in chunk} - _CC_KNOWN:
            raise Unknown("a column chunk field this does not know")
        meta = get(chunk, CC_META)
        stats = {_CM_STATISTICS} if i not in fixed else set()  # (another column's stay as they are)
        if meta is None or {m.id for m in meta.value} - _CM_KNOWN - stats:
            raise Unknown("column metadata this does not know (statistics on a fixed column?)")
        first = min(_value(meta.value, fid) for fid in CM_OFFSETS if get(meta.value, fid) is not None)
        size = _value(meta.value, _CM_COMPRESSED)
        if first != at:
            raise Unknown("column chunks that do not lie end to end")
        old = body[at - len(MAGIC) : at - len(MAGIC) + size]
        at += size
        move_chunk(chunk, shift)
        if i not in fixed:
            parts.append(old)
            continue
        before = _value(meta.value, _CM_UNCOMPRESSED)
        pages = _pages(bytes(old), fixed[i], rows, meta.value, codec)
        parts += pages
        shift += _value(meta.value, _CM_COMPRESSED) - size
        grown += _value(meta.value, _CM_UNCOMPRESSED) - before
    if at != len(MAGIC) + len(body):
        raise Unknown("bytes between the column chunks and the footer")
    _add(group, _RG_TOTAL_BYTES, grown)
    _add(group, _RG_COMPRESSED, shift)
    tail = encode(footer)
    return b"".join([*parts, tail, struct.pack("<i", len(tail)), MAGIC])


def _pages(standin: bytes, values: np.ndarray, rows: int, meta: list[Field], codec: pa.Codec) -> list[Any]:
    """A fixed column's pages (header, compressed body, ...) from its stand-in's chunk (one page,
    whose header is the pattern), its metadata set to theirs."""
    capacity = values.shape[1]
    if _value(meta, _CM_NUM_VALUES) != rows * _STANDIN:
        raise Unknown("a stand-in column not as written")
    reader = Reader(standin)
    header = reader.struct()
    data = get(header, _PH_DATA)
    if (
        reader.at + _value(header, _PH_COMPRESSED) != len(standin)  # more than one page
        or {f.id for f in header} != {_PH_TYPE, _PH_UNCOMPRESSED, _PH_COMPRESSED, _PH_DATA}
        or data is None
        or [(f.id, f.value) for f in data.value if f.id != _DPH_NUM_VALUES]
        != [(_DPH_ENCODING, 0), (_DPH_DEF, 3), (_DPH_REP, 3), (_DPH_STATS, [])]
    ):
        raise Unknown("a stand-in page this does not know")
    flat = values.reshape(-1)
    per_page = PAGE_VALUES // capacity
    parts: list[Any] = []
    uncompressed = compressed = pages = 0
    for lo in range(0, rows, per_page):
        n = min(per_page, rows - lo)
        levels = _levels(n, capacity)
        raw = np.empty(len(levels) + 4 * n * capacity, dtype=np.uint8)
        raw[: len(levels)] = np.frombuffer(levels, dtype=np.uint8)
        # PLAIN int32 (an int8 column's too: Parquet stores it as INT32)
        raw[len(levels) :].view(np.int32)[:] = flat[lo * capacity : (lo + n) * capacity]
        packed = codec.compress(raw)
        _set(data.value, _DPH_NUM_VALUES, n * capacity)
        _set(header, _PH_UNCOMPRESSED, raw.size)
        _set(header, _PH_COMPRESSED, packed.size)
        head = encode(header)
        parts += [head, packed]
        uncompressed += len(head) + raw.size
        compressed += len(head) + packed.size
        pages += 1

    count = rows * capacity
    _set(meta, _CM_NUM_VALUES, count)
    _set(meta, _CM_UNCOMPRESSED, uncompressed)
    _set(meta, _CM_COMPRESSED, compressed)
    stats = get(meta, _CM_ENCODING_STATS)
    if stats is None or len(stats.value.items) != 1 or _value(stats.value.items[0], _PES_COUNT) != 1:
        raise Unknown("page encoding stats this does not know")
    _set(stats.value.items[0], _PES_COUNT, pages)
    sizes = get(meta, _CM_SIZE_STATS)
    if sizes is not None:
        rep, define = get(sizes.value, _SS_REP), get(sizes.value, _SS_DEF)
        if (
            {f.id for f in sizes.value} != {_SS_REP, _SS_DEF}
            or rep is None
            or define is None
            or rep.value.items != [rows, rows * (_STANDIN - 1)]
            or define.value.items != [0, 0, 0, rows * _STANDIN]
        ):
            raise Unknown("level histograms this does not know")
        rep.value.items[:] = [rows, count - rows]
        define.value.items[:] = [0, 0, 0, count]
    return parts


def _value(fields: list[Field], fid: int) -> int:
    found = get(fields, fid)
    if found is None or found.type not in (I32, I64):
        raise Unknown(f"no integer field {fid}")
    return int(found.value)


def _set(fields: list[Field], fid: int, value: int) -> None:
    found = get(fields, fid)
    if found is None:
        raise Unknown(f"no field {fid}")
    found.value = value


def _add(fields: list[Field], fid: int, delta: int) -> None:
    found = get(fields, fid)
    if found is not None:
        found.value += delta
