"""Parquet footers (parquet.thrift's FileMetaData) and page headers as generic Thrift compact values:
decoded (field ids, types and values in the order written), changed, and encoded again the way
Thrift's compact writer encodes them, so that a value left alone keeps its bytes. Used to join row
groups written apart (raypack.formats._joined) and to set the numbers of a column chunk written
here (raypack.formats._fixed_lists); what either does not know it refuses (Unknown), and the caller
writes with pyarrow instead.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BINARY",
    "CC_FILE_OFFSET",
    "CC_META",
    "CM_OFFSETS",
    "FILE_NUM_ROWS",
    "FILE_ROW_GROUPS",
    "I32",
    "I64",
    "LIST",
    "MAGIC",
    "RG_COLUMNS",
    "RG_FILE_OFFSET",
    "RG_NUM_ROWS",
    "RG_ORDINAL",
    "STRUCT",
    "Field",
    "List",
    "Map",
    "Reader",
    "Unknown",
    "Writer",
    "encode",
    "get",
    "move_chunk",
    "split",
]

MAGIC = b"PAR1"

# Thrift compact protocol types.
STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)

# FileMetaData's encryption field: an encrypted file's footer is not read here.
_FILE_ENCRYPTION = 8

# parquet.thrift's field ids that both _joined and _fixed_lists read or change.
FILE_NUM_ROWS, FILE_ROW_GROUPS = 3, 4  # FileMetaData
RG_COLUMNS, RG_NUM_ROWS, RG_FILE_OFFSET, RG_ORDINAL = 1, 3, 5, 7  # RowGroup
CC_FILE_OFFSET, CC_META = 2, 3  # ColumnChunk
CM_OFFSETS = (9, 10, 11)  # ColumnMetaData: data_page_offset, index_page_offset, dictionary_page_offset


class Unknown(ValueError):
    """A file, footer or page this cannot change exactly: write it with pyarrow instead."""


@dataclass
class Field:
    id: int
    type: int
    value: Any  # int, float, bytes, bool, list[Field] (a struct), List or Map


@dataclass
class List:
    type: int  # the elements' type (a list or a set: `kind`)
    kind: int
    items: list[Any]


@dataclass
class Map:
    key: int
    value: int
    items: list[tuple[Any, Any]]


class Reader:
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
        if kind in (TRUE, FALSE):  # inside a list or map: a byte of its own
            return self.byte() == TRUE
        if kind == BYTE:
            return self.byte()
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            (d,) = struct.unpack_from("<d", self.data, self.at)
            self.at += 8
            return d
        if kind == BINARY:
            n = self.varint()
            self.at += n
            return self.data[self.at - n : self.at]
        if kind in (LIST, SET):
            head = self.byte()
            size = head >> 4
            if size == 15:
                size = self.varint()
            elem = head & 0x0F
            return List(elem, kind, [self.value(elem) for _ in range(size)])
        if kind == MAP:
            size = self.varint()
            if size == 0:
                return Map(0, 0, [])
            types = self.byte()
            k, v = types >> 4, types & 0x0F
            return Map(k, v, [(self.value(k), self.value(v)) for _ in range(size)])
        if kind == STRUCT:
            return self.struct()
        raise Unknown(f"a Thrift value of unknown type {kind}")

    def struct(self) -> list[Field]:
        fields: list[Field] = []
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == STOP:
                return fields
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            value = kind == TRUE if kind in (TRUE, FALSE) else self.value(kind)
            fields.append(Field(fid, kind, value))
            last = fid


class Writer:
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
        if kind in (TRUE, FALSE):
            self.out.append(TRUE if value else FALSE)
        elif kind == BYTE:
            self.out.append(value)
        elif kind in (I16, I32, I64):
            self.zigzag(value)
        elif kind == DOUBLE:
            self.out += struct.pack("<d", value)
        elif kind == BINARY:
            self.varint(len(value))
            self.out += value
        elif kind in (LIST, SET):
            size = len(value.items)
            if size < 15:
                self.out.append(size << 4 | value.type)
            else:
                self.out.append(0xF0 | value.type)
                self.varint(size)
            for item in value.items:
                self.value(value.type, item)
        elif kind == MAP:
            self.varint(len(value.items))
            if value.items:
                self.out.append(value.key << 4 | value.value)
                for k, v in value.items:
                    self.value(value.key, k)
                    self.value(value.value, v)
        elif kind == STRUCT:
            self.struct(value)
        else:
            raise Unknown(f"a Thrift value of unknown type {kind}")

    def struct(self, fields: list[Field]) -> None:
        last = 0
        for f in fields:
            kind = (TRUE if f.value else FALSE) if f.type in (TRUE, FALSE) else f.type
            if 0 < f.id - last <= 15:
                self.out.append((f.id - last) << 4 | kind)
            else:
                self.out.append(kind)
                self.zigzag(f.id)
            if kind not in (TRUE, FALSE):
                self.value(kind, f.value)
            last = f.id
        self.out.append(STOP)


def encode(fields: list[Field]) -> bytes:
    w = Writer()
    w.struct(fields)
    return bytes(w.out)


def get(fields: list[Field], fid: int) -> Field | None:
    return next((f for f in fields if f.id == fid), None)


def split(data: bytes | memoryview) -> tuple[memoryview, list[Field]]:
    """A file's bytes → its body (every byte between the leading magic and the footer) and its
    decoded footer."""
    view = memoryview(data)
    if len(view) < 12 or view[:4] != MAGIC or view[-4:] != MAGIC:
        raise Unknown("not a Parquet file")
    (length,) = struct.unpack("<i", view[-8:-4])
    footer = bytes(view[-8 - length : -8])
    fields = Reader(footer).struct()
    if encode(fields) != footer:
        raise Unknown("a footer that does not encode back to its own bytes")
    if get(fields, _FILE_ENCRYPTION) is not None:
        raise Unknown("an encrypted file")
    return view[4 : len(view) - 8 - length], fields


def move_chunk(chunk: list[Field], shift: int) -> None:
    """A column chunk's offsets in its file (its own, where set, and its pages') moved `shift` bytes
    further on."""
    for c in chunk:
        if c.id == CC_FILE_OFFSET and c.value:  # pyarrow writes 0: not set
            c.value += shift
        elif c.id == CC_META:
            for m in c.value:
                if m.id in CM_OFFSETS:
                    m.value += shift
