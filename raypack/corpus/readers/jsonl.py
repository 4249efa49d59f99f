"""JSONL: one JSON object a line, plain or compressed (.gz inflated by ISA-L, .zst/.bz2/.lz4 by
Arrow), a whole file or a byte range of a large uncompressed one (a work unit, cut.work_units).

Ids are `<relpath>:<line>` (lines from 1) unless the Reading names an id field. A line that is not a
document is a Reject with its reason; a stream that breaks mid-way keeps what came before and is a
lost Reject for its rest. Lines over input.max_document_bytes are skipped as they stream by, never
held whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
from isal import isal_zlib

from raypack.config import Reading
from raypack.corpus.readers.fields import Document, document, read_fields
from raypack.corpus.readers.records import RAW_PREFIX, Batch, Reject, is_bad_data, one_line
from raypack.storage import Shard

__all__ = ["CHUNK", "read"]

CHUNK = 256 << 10  # small enough that a corrupt stream loses at most this much before the break


def read(fs: pafs.FileSystem, inner: str, shard: Shard, reading: Reading, batch_size: int) -> Iterator[Batch]:
    batch = Batch()
    last = shard.first_row
    limit = reading.max_document_bytes
    floats = _float_checked(reading)
    try:
        for lineno, line in _lines(_chunks(fs, inner, shard), limit, shard.first_row):
            last = lineno
            if isinstance(line, Oversize):
                reason = f"record of {line.size:,} bytes, over input.max_document_bytes ({limit:,})"
                batch.rejects.append(Reject.bad(lineno, reason, line.prefix))
                continue
            if lineno == 1 and line[:3] == BOM:  # the file's first line: a BOM is no part of the JSON
                line = line[3:]
            if _blank(line):
                continue  # a blank line is not a record (a BOM alone on the first line neither)
            doc = _parse_line(line, lineno, reading, shard.relpath, batch, floats)
            if doc is not None:
                batch.add(lineno, doc[0], doc[1], len(line), doc[2])
            if batch.full(batch_size):
                yield batch
                batch = Batch()
    except (OSError, pa.ArrowInvalid, EOFError) as e:
        if not is_bad_data(e):
            raise
        # A truncated or corrupt compressed stream: keep what was read, record where it broke. How
        # many records the rest held is unknown: at least one.
        batch.rejects.append(Reject.lost(last + 1, f"unreadable shard after line {last}: {one_line(e)}"))
    if len(batch) or batch.rejects:
        yield batch


def _parse_line(
    line: memoryview | bytes,
    lineno: int,
    reading: Reading,
    relpath: str,
    batch: Batch,
    floats: tuple[str, ...],
) -> Document | None:
    default_id = f"{relpath}:{lineno}"
    if not reading.chat:
        # orjson first: half json's time with the decode (39 MB of JSONL: 0.034 s against 0.063).
        # It reads fewer lines than json (NaN, lone surrogate escapes, nesting over 1,024) and reads
        # an integer over 64 bits as a float; such lines, lines that are not objects and records
        # whose text or id came out a float go the json way below, so that documents, ids and
        # rejects' reasons are json's whichever parser read the line. A metadata field's float goes
        # the json way only where it could be such an integer (json keeps all its digits): a
        # float score is common, and would halve the speed of every line.
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        else:
            if isinstance(record, dict) and not _doubtful(record, reading, floats):
                return document(record, lineno, reading, default_id, batch, line)
    try:
        decoded = bytes(line).decode("utf-8")
    except UnicodeDecodeError as e:
        batch.rejects.append(Reject.bad(lineno, f"invalid UTF-8 at byte {e.start}", line))
        return None
    try:
        record = json.loads(decoded)
    except json.JSONDecodeError as e:
        batch.rejects.append(
            Reject.bad(lineno, f"malformed JSON: {e.msg.removesuffix(' at')} at column {e.colno}", decoded)
        )
        return None
    except RecursionError:  # json's parser recurses once a level: [[[[...
        batch.rejects.append(Reject.bad(lineno, "malformed JSON: nested too deeply", decoded))
        return None
    if not isinstance(record, dict):
        batch.rejects.append(Reject.bad(lineno, f"not a JSON object but {type(record).__name__}", decoded))
        return None
    read = (
        *read_fields(reading),
        reading.messages_field,
        reading.prompt_field,
        reading.completion_field,
        "tools",
    )
    if _SURROGATE_ESCAPE.search(decoded) and _lone_surrogate([record.get(f) for f in read if f]):
        # Valid JSON, not text: half a UTF-16 pair escaped alone ("\ud800"), which no encoder
        # takes (tokenizers raises a TypeError that would end the job). orjson refuses such lines.
        reason = "unpaired surrogate escape in the JSON (half a surrogate pair: not text)"
        batch.rejects.append(Reject.bad(lineno, reason, decoded))
        return None
    return document(record, lineno, reading, default_id, batch, decoded)


def _float_checked(reading: Reading) -> tuple[str, ...]:
    """The fields where a float sends a line the json way: the text's and the id's."""
    return tuple(f for f in (*(reading.text_fields or (reading.text_field,)), reading.id_field) if f)


def _doubtful(record: dict[str, Any], reading: Reading, floats: tuple[str, ...]) -> bool:
    """Whether orjson may have read a field of the record otherwise than json: a float in one of
    `floats` (_float_checked), or a metadata float as large as an integer past 64 bits."""
    if any(type(record.get(f)) is float for f in floats):
        return True
    return bool(reading.metadata_fields) and any(
        type(v := record.get(f)) is float and abs(v) >= 2.0**63 for f in reading.metadata_fields
    )


BOM = b"\xef\xbb\xbf"


def _blank(line: memoryview | bytes) -> bool:
    """Whether the line holds only ASCII whitespace (bytes.strip's), looking past its first byte
    only where that is whitespace (a record's line starts with `{`)."""
    return not line or (bytes(line[:1]).isspace() and not bytes(line).strip())


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> bool:
    """Whether any string of a parsed JSON value holds an unpaired surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    items = [*value, *value.values()] if isinstance(value, dict) else value if isinstance(value, list) else []
    return any(_lone_surrogate(item) for item in items)


@dataclass(frozen=True, slots=True)
class Oversize:
    """A line longer than the limit: skipped as it streamed by, never held whole."""

    prefix: bytes
    size: int


def _chunks(fs: pafs.FileSystem, inner: str, shard: Shard) -> Iterator[bytes]:
    """The bytes of a JSONL work unit: a whole file as a stream (decompressed by its suffix), or the
    byte range of a unit of a large uncompressed file (work_units)."""
    if not shard.split and inner.endswith(".gz"):
        with fs.open_input_stream(inner, compression=None) as stream:
            yield from _gunzip(stream)
        return
    if not shard.split:
        with fs.open_input_stream(inner, compression="detect") as stream:
            while chunk := stream.read(CHUNK):
                yield chunk
        return
    with fs.open_input_file(inner) as f:
        f.seek(shard.unit_start)
        left = shard.unit_stop - shard.unit_start
        while left > 0 and (chunk := f.read(min(CHUNK, left))):
            left -= len(chunk)
            yield chunk


# isal's stub declares its error class as an instance of Exception.
_INFLATE_ERROR: type[Exception] = isal_zlib.error  # type: ignore[assignment]


def _gunzip(stream: Any) -> Iterator[bytes]:
    """A gzip file's bytes, every member of it, in pieces of at most CHUNK, inflated by ISA-L (isal):
    80 gzipped shards of 6.25 MB of text inflate in ~0.65 s less of a core than through Arrow's
    zlib (0.049 s against 0.096 for six). Zero bytes after a member are padding, as gzip -t and
    Python's gzip take them (Arrow's stream refuses them). Damage raises what Arrow's stream
    raises, so that is_bad_data makes it the same reject: OSError("Truncated compressed stream")
    for a cut file, OSError("... inflate failed: ...") for corrupt bytes or other bytes after the
    last member."""
    inflate = isal_zlib.decompressobj(31)  # 31: a gzip header and trailer (CRC and size checked)
    member = False  # inside a member: input was given to `inflate` and its end not reached
    ended = False  # a member has ended: zero bytes before the next are padding
    while data := stream.read(CHUNK):
        while data:
            if ended and not member and not (data := data.lstrip(b"\x00")):
                break
            try:
                out = inflate.decompress(data, CHUNK)
            except _INFLATE_ERROR as e:
                raise OSError(f"gzip inflate failed: {e}") from None
            member = True
            if out:
                yield out
            if inflate.eof:  # the member ended; another may start in what is left
                data, member, ended = inflate.unused_data, False, True
                inflate = isal_zlib.decompressobj(31)
            else:
                data = inflate.unconsumed_tail
        while member and not inflate.eof and (out := inflate.decompress(b"", CHUNK)):
            yield out  # output held back by the CHUNK limit once the input ran out
    if member and not inflate.eof:
        raise OSError("Truncated compressed stream")


def _lines(
    chunks: Iterator[bytes], max_bytes: int, lineno: int = 0
) -> Iterator[tuple[int, memoryview | bytes | Oversize]]:
    """(line number, line) for every line, numbered on from `lineno`; a line of more than `max_bytes`
    comes as an Oversize. A line within one chunk is a view of it, not a copy (orjson reads a view:
    splitting 32 MB of JSONL into bytes took 18-24 ms, finding the newlines 5); one spread over many
    chunks is joined once at its end (joining chunk by chunk would copy a 100 MB line ~400 times)."""
    pending: list[bytes] = []  # the start of a line that goes on in the next chunk
    pending_size = 0
    oversize: Oversize | None = None  # the line being skipped
    for chunk in chunks:
        view = memoryview(chunk)
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if oversize is not None:
                oversize = Oversize(oversize.prefix, oversize.size + end - start)
            elif pending_size + end - start > max_bytes:
                head = b"".join([*pending, chunk[start : start + RAW_PREFIX * 4]])[: RAW_PREFIX * 4]
                oversize = Oversize(head, pending_size + end - start)
                pending, pending_size = [], 0
            if newline < 0:  # the chunk's last part goes on in the next chunk
                if oversize is None and end > start:
                    pending.append(chunk[start:end])
                    pending_size += end - start
                break
            lineno += 1
            if oversize is not None:
                yield lineno, oversize
                oversize = None
            elif pending:
                yield lineno, b"".join([*pending, chunk[start:end]])
            else:
                yield lineno, view[start:end]
            pending, pending_size = [], 0
            start = newline + 1
    if oversize is not None:
        yield lineno + 1, oversize
    elif pending_size:
        yield lineno + 1, b"".join(pending)
