"""Parquet files joined into one: the row groups of a file encoded on several threads, each group a
file of its own, then laid end to end under one footer, whose bytes are what one writer gives for
the same row groups in order (tested against pq.write_table).

Why: a file's encoding is one thread's work in pyarrow (its columns in parallel at most, and a
pack's tokens are one column), ~3 s for 10,000 packs of 8,192 tokens on this project's 2-core
machine. A job with fewer files than cores (a 130 MB corpus is one file) would leave the other cores
idle for that long; joined, the encoding of one file's row groups spreads over them.

A row group's pages depend only on its rows, so a group written alone has the bytes it has inside a
larger file. What differs is the footer (parquet.thrift's FileMetaData, Thrift's compact protocol):
every column chunk's offsets in the file, each row group's `file_offset` and `ordinal`, and the
file's row count. The footers are decoded as generic Thrift values (raypack.formats._footers),
those fields are changed, and the result encoded again the way Thrift's compact writer encodes; a
footer that does not encode back to its own bytes, or that names
structures this does not move (page indexes, bloom filters, encryption), is refused (Unjoinable),
and the caller writes the file on one thread.
"""

from __future__ import annotations

import struct
from typing import Any

from raypack.formats._footers import (
    CC_META,
    FILE_NUM_ROWS,
    FILE_ROW_GROUPS,
    MAGIC,
    RG_COLUMNS,
    RG_FILE_OFFSET,
    RG_ORDINAL,
    Field,
    List,
    Unknown,
    encode,
    get,
    move_chunk,
    split,
)

__all__ = ["Unjoinable", "join_files"]

# parquet.thrift's field ids that this module refuses to move (the others: _footers).
_CC_FILE_PATH = 1
_CC_PAGE_INDEX = (4, 5, 6, 7)  # offset index and column index: offsets and lengths
_CC_ENCRYPTED = (8, 9)
_CM_BLOOM = (14, 15)


class Unjoinable(Unknown):
    """Files this module cannot join exactly: write them as one file with one writer instead."""


def _move(group: list[Field], shift: int, ordinal: int) -> None:
    """A row group's offsets moved `shift` bytes further into the file, and its ordinal set."""
    for f in group:
        if f.id == RG_FILE_OFFSET:
            f.value += shift
        elif f.id == RG_ORDINAL:
            f.value = ordinal
        elif f.id == RG_COLUMNS:
            for chunk in f.value.items:
                for c in chunk:
                    if c.id in (_CC_FILE_PATH, *_CC_PAGE_INDEX, *_CC_ENCRYPTED):
                        raise Unjoinable(f"a column chunk's field {c.id} (page index, encryption)")
                    if c.id == CC_META and any(m.id in _CM_BLOOM for m in c.value):
                        raise Unjoinable("a bloom filter")
                move_chunk(chunk, shift)


def join_files(files: list[bytes | memoryview]) -> bytes:
    """Parquet files of one schema and the same writer settings → one file of all their row groups in
    order, byte for byte what one writer writes for those row groups (Unjoinable otherwise)."""
    if not files:
        raise Unjoinable("no files")
    try:
        bodies, footers = zip(*(split(f) for f in files), strict=True)
    except Unjoinable:
        raise
    except Unknown as e:
        raise Unjoinable(str(e)) from None
    head = footers[0]
    rest = [f for f in head if f.id not in (FILE_NUM_ROWS, FILE_ROW_GROUPS)]
    for other in footers[1:]:
        if [f for f in other if f.id not in (FILE_NUM_ROWS, FILE_ROW_GROUPS)] != rest:
            raise Unjoinable("files of other schemas or writers")
    groups: list[Any] = []
    rows, shift = 0, 0
    for body, footer in zip(bodies, footers, strict=True):
        row_groups = get(footer, FILE_ROW_GROUPS)
        num_rows = get(footer, FILE_NUM_ROWS)
        if row_groups is None or num_rows is None:
            raise Unjoinable("a footer without row groups")
        for group in row_groups.value.items:
            _move(group, shift, len(groups))
            groups.append(group)
        rows += num_rows.value
        shift += len(body)
    joined = []
    for f in head:
        if f.id == FILE_NUM_ROWS:
            joined.append(Field(f.id, f.type, rows))
        elif f.id == FILE_ROW_GROUPS:
            joined.append(Field(f.id, f.type, List(f.value.type, f.value.kind, groups)))
        else:
            joined.append(f)
    footer = encode(joined)
    return b"".join([MAGIC, *bodies, footer, struct.pack("<i", len(footer)), MAGIC])
