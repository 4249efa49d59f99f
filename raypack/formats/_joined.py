"""Parquet files joined into one: the row groups of a file encoded on several threads, each group a
file of its own, then laid end to end under one footer, whose bytes are what one writer gives for
the same row groups in order (tested against pq.write_table).

Why: a file's encoding is one thread's work in pyarrow (its columns in parallel at most, and a
pack's tokens are one column), ~3 s for 10,000 packs of 8,192 tokens on this project's 2-core
machine. A job with fewer files than cores (a 130 MB corpus is one file) left the other cores idle
for that long; the encoding of one file's row groups now spreads over them.

A row group's pages depend only on its rows, so a group written alone has the bytes it has inside a
larger file. What differs is the footer (parquet.thrift's FileMetaData, Thrift's compact protocol):
every column chunk's offsets in the file, each row group's `file_offset` and `ordinal`, and the
file's row count. The footers are decoded as generic Thrift values (field ids, types and values in
the order written), those fields are changed, and the result encoded again the way Thrift's
compact writer encodes; a footer that does not encode back to its own bytes, or that names
structures this does not move (page indexes, bloom filters, encryption), is refused (Unjoinable),
and the caller writes the file on one thread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["Unjoinable", "join_files"]

MAGIC = b"PAR1"

# Thrift compact protocol types.
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)

# parquet.thrift's field ids that this module reads or changes.
_FILE_NUM_ROWS, _FILE_ROW_GROUPS, _FILE_ENCRYPTION = 3, 4, 8
_RG_COLUMNS, _RG_NUM_ROWS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 3, 5, 7
_CC_FILE_PATH, _CC_FILE_OFFSET, _CC_META = 1, 2, 3
_CC_PAGE_INDEX = (4, 5, 6, 7)  # offset index and column index: offsets and lengths
_CC_ENCRYPTED = (8, 9)
_CM_OFFSETS = (9, 10, 11)  # data_page_offset, index_page_offset, dictionary_page_offset
_CM_BLOOM = (14, 15)


class Unjoinable(ValueError):
    """Files this module cannot join exactly: write them as one file with one writer instead."""


@dataclass
class _Field:
    id: int
    type: int
    value: Any  # int, float, bytes, bool, list[_Field] (a struct), _List or _Map


@dataclass
class _List:
    type: int  # the elements' type (a list or a set: `kind`)
    kind: int
    items: list[Any]


@dataclass
class _Map:
    key: int
    value: int
    items: list[tuple[Any, Any]]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        b = self.data[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int) -> Any:
        if kind in (_TRUE, _FALSE):  # inside a list or map: a byte of its own
            return self.byte() == _TRUE
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            (d,) = struct.unpack_from("<d", self.data, self.at)
            self.at += 8
            return d
        if kind == _BINARY:
            n = self.varint()
            self.at += n
            return self.data[self.at - n : self.at]
        if kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4
            if size == 15:
                size = self.varint()
            elem = head & 0x0F
            return _List(elem, kind, [self.value(elem) for _ in range(size)])
        if kind == _MAP:
            size = self.varint()
            if size == 0:
                return _Map(0, 0, [])
            types = self.byte()
            k, v = types >> 4, types & 0x0F
            return _Map(k, v, [(self.value(k), self.value(v)) for _ in range(size)])
        if kind == _STRUCT:
            return self.struct()
        raise Unjoinable(f"a Thrift value of unknown type {kind}")

    def struct(self) -> list[_Field]:
        fields: list[_Field] = []
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == _STOP:
                return fields
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            value = kind == _TRUE if kind in (_TRUE, _FALSE) else self.value(kind)
            fields.append(_Field(fid, kind, value))
            last = fid


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while n > 0x7F:
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7
        self.out.append(n)

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, kind: int, value: Any) -> None:
        if kind in (_TRUE, _FALSE):
            self.out.append(_TRUE if value else _FALSE)
        elif kind == _BYTE:
            self.out.append(value)
        elif kind in (_I16, _I32, _I64):
            self.zigzag(value)
        elif kind == _DOUBLE:
            self.out += struct.pack("<d", value)
        elif kind == _BINARY:
            self.varint(len(value))
            self.out += value
        elif kind in (_LIST, _SET):
            size = len(value.items)
            if size < 15:
                self.out.append(size << 4 | value.type)
            else:
                self.out.append(0xF0 | value.type)
                self.varint(size)
            for item in value.items:
                self.value(value.type, item)
        elif kind == _MAP:
            self.varint(len(value.items))
            if value.items:
                self.out.append(value.key << 4 | value.value)
                for k, v in value.items:
                    self.value(value.key, k)
                    self.value(value.value, v)
        elif kind == _STRUCT:
            self.struct(value)
        else:
            raise Unjoinable(f"a Thrift value of unknown type {kind}")

    def struct(self, fields: list[_Field]) -> None:
        last = 0
        for f in fields:
            kind = (_TRUE if f.value else _FALSE) if f.type in (_TRUE, _FALSE) else f.type
            if 0 < f.id - last <= 15:
                self.out.append((f.id - last) << 4 | kind)
            else:
                self.out.append(kind)
                self.zigzag(f.id)
            if kind not in (_TRUE, _FALSE):
                self.value(kind, f.value)
            last = f.id
        self.out.append(_STOP)


def _encode(fields: list[_Field]) -> bytes:
    w = _Writer()
    w.struct(fields)
    return bytes(w.out)


def _get(fields: list[_Field], fid: int) -> _Field | None:
    return next((f for f in fields if f.id == fid), None)


def _split(data: bytes | memoryview) -> tuple[memoryview, list[_Field]]:
    """A file's bytes → its body (every byte between the leading magic and the footer) and its
    decoded footer."""
    view = memoryview(data)
    if len(view) < 12 or view[:4] != MAGIC or view[-4:] != MAGIC:
        raise Unjoinable("not a Parquet file")
    (length,) = struct.unpack("<i", view[-8:-4])
    footer = bytes(view[-8 - length : -8])
    fields = _Reader(footer).struct()
    if _encode(fields) != footer:
        raise Unjoinable("a footer that does not encode back to its own bytes")
    if _get(fields, _FILE_ENCRYPTION) is not None:
        raise Unjoinable("an encrypted file")
    return view[4 : len(view) - 8 - length], fields


def _move(group: list[_Field], shift: int, ordinal: int) -> None:
    """A row group's offsets moved `shift` bytes further into the file, and its ordinal set."""
    for f in group:
        if f.id == _RG_FILE_OFFSET:
            f.value += shift
        elif f.id == _RG_ORDINAL:
            f.value = ordinal
        elif f.id == _RG_COLUMNS:
            for chunk in f.value.items:
                for c in chunk:
                    if c.id in (_CC_FILE_PATH, *_CC_PAGE_INDEX, *_CC_ENCRYPTED):
                        raise Unjoinable(f"a column chunk's field {c.id} (page index, encryption)")
                    if c.id == _CC_FILE_OFFSET and c.value:  # pyarrow writes 0: not set
                        c.value += shift
                    elif c.id == _CC_META:
                        for m in c.value:
                            if m.id in _CM_BLOOM:
                                raise Unjoinable("a bloom filter")
                            if m.id in _CM_OFFSETS:
                                m.value += shift


def join_files(files: list[bytes | memoryview]) -> bytes:
    """Parquet files of one schema and the same writer settings → one file of all their row groups in
    order, byte for byte what one writer writes for those row groups (Unjoinable otherwise)."""
    if not files:
        raise Unjoinable("no files")
    bodies, footers = zip(*(_split(f) for f in files), strict=True)
    head = footers[0]
    rest = [f for f in head if f.id not in (_FILE_NUM_ROWS, _FILE_ROW_GROUPS)]
    for other in footers[1:]:
        if [f for f in other if f.id not in (_FILE_NUM_ROWS, _FILE_ROW_GROUPS)] != rest:
            raise Unjoinable("files of other schemas or writers")
    groups: list[Any] = []
    rows, shift = 0, 0
    for body, footer in zip(bodies, footers, strict=True):
        row_groups = _get(footer, _FILE_ROW_GROUPS)
        num_rows = _get(footer, _FILE_NUM_ROWS)
        if row_groups is None or num_rows is None:
            raise Unjoinable("a footer without row groups")
        for group in row_groups.value.items:
            _move(group, shift, len(groups))
            groups.append(group)
        rows += num_rows.value
        shift += len(body)
    joined = []
    for f in head:
        if f.id == _FILE_NUM_ROWS:
            joined.append(_Field(f.id, f.type, rows))
        elif f.id == _FILE_ROW_GROUPS:
            joined.append(_Field(f.id, f.type, _List(f.value.type, f.value.kind, groups)))
        else:
            joined.append(f)
    footer = _encode(joined)
    return b"".join([MAGIC, *bodies, footer, struct.pack("<i", len(footer)), MAGIC])
