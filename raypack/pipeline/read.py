"""Stage 1, read: stream one input shard as documents, recording every record that is not one.

We read shards ourselves (through pyarrow filesystems, compression detected from the suffix) rather
than with Ray Data's read_json: a bad line must become a recorded reject, not fail the whole file;
generated ids need the line number; and reading inside the tokenizer actor streams a shard in batches
of `batch_size` documents, so no shard is ever held whole in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raypack.config import StorageConfig
from raypack.storage import Shard, resolve

__all__ = ["Batch", "Reject", "read_shard"]

RAW_PREFIX = 200
# A batch ends at batch_size documents or this much text, whichever comes first. tokenizers keeps
# ~100 bytes per token in an Encoding (ids, offsets, token strings, masks), so a batch bounded by
# count alone grows with the longest documents it happens to meet: the tokenizer actor's peak then
# rose with the corpus (629 → 925 MiB from 50 to 200 MB, benchmarks/bench_job.py).
MAX_BATCH_BYTES = 4 << 20
_CHUNK = 256 << 10  # small enough that a corrupt stream loses at most this much before the break


@dataclass(frozen=True, slots=True)
class Reject:
    row: int
    reason: str
    raw: str


@dataclass(slots=True)
class Batch:
    rows: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    text_bytes: int = 0

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: int, doc_id: str, text: str) -> None:
        self.rows.append(row)
        self.ids.append(doc_id)
        self.texts.append(text)
        self.text_bytes += len(text)

    def full(self, batch_size: int) -> bool:
        return len(self.rows) >= batch_size or self.text_bytes >= MAX_BATCH_BYTES


def read_shard(
    shard: Shard,
    fmt: str,
    text_field: str,
    id_field: str | None,
    batch_size: int,
    storage: StorageConfig | None = None,
) -> Iterator[Batch]:
    """Documents of one shard in batches of up to `batch_size`; rejects ride along with the batch in
    which they were met (a batch may hold only rejects)."""
    fs, inner = resolve(shard.path, storage)
    if fmt == "jsonl":
        yield from _read_jsonl(fs, inner, shard, text_field, id_field, batch_size)
    elif fmt == "parquet":
        yield from _read_parquet(fs, inner, shard, text_field, id_field, batch_size)
    elif fmt == "text":
        yield _read_text(fs, inner, shard)
    else:
        raise ValueError(f"unknown input format {fmt!r}")


def _raw(data: bytes | str) -> str:
    if isinstance(data, bytes):
        data = data[: RAW_PREFIX * 4].decode("utf-8", errors="replace")
    return data[:RAW_PREFIX]


def _lines(fs: pafs.FileSystem, inner: str) -> Iterator[tuple[int, bytes]]:
    with fs.open_input_stream(inner, compression="detect") as stream:
        tail = b""
        lineno = 0
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            parts = (tail + chunk).split(b"\n")
            tail = parts.pop()
            for part in parts:
                lineno += 1
                yield lineno, part
        if tail:
            yield lineno + 1, tail


def _read_jsonl(
    fs: pafs.FileSystem, inner: str, shard: Shard, text_field: str, id_field: str | None, batch_size: int
) -> Iterator[Batch]:
    batch = Batch()
    last = 0
    try:
        for lineno, line in _lines(fs, inner):
            last = lineno
            if not line.strip():
                continue  # a blank line is not a record
            doc = _parse_json_line(line, lineno, text_field, id_field, shard.relpath, batch)
            if doc is not None:
                batch.add(lineno, doc[0], doc[1])
            if batch.full(batch_size):
                yield batch
                batch = Batch()
    except (OSError, pa.ArrowInvalid, EOFError) as e:
        # A truncated or corrupt compressed stream: keep what was read, record where it broke.
        batch.rejects.append(Reject(last + 1, f"unreadable shard after line {last}: {_one_line(e)}", ""))
    if len(batch) or batch.rejects:
        yield batch


def _parse_json_line(
    line: bytes, lineno: int, text_field: str, id_field: str | None, relpath: str, batch: Batch
) -> tuple[str, str] | None:
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as e:
        batch.rejects.append(Reject(lineno, f"invalid UTF-8 at byte {e.start}", _raw(line)))
        return None
    try:
        record = json.loads(decoded)
    except json.JSONDecodeError as e:
        batch.rejects.append(Reject(lineno, f"malformed JSON: {e.msg} at column {e.colno}", _raw(decoded)))
        return None
    if not isinstance(record, dict):
        batch.rejects.append(Reject(lineno, f"not a JSON object but {type(record).__name__}", _raw(decoded)))
        return None
    return _document(record, lineno, text_field, id_field, f"{relpath}:{lineno}", batch, decoded)


def _document(
    record: dict[str, object],
    row: int,
    text_field: str,
    id_field: str | None,
    default_id: str,
    batch: Batch,
    raw: str,
) -> tuple[str, str] | None:
    if text_field not in record or record[text_field] is None:
        batch.rejects.append(Reject(row, f"missing text field {text_field!r}", _raw(raw)))
        return None
    text = record[text_field]
    if not isinstance(text, str):
        batch.rejects.append(
            Reject(row, f"text field {text_field!r} is {type(text).__name__}, not a string", _raw(raw))
        )
        return None
    if not text.strip():
        batch.rejects.append(Reject(row, "empty document", _raw(raw)))
        return None
    if id_field is None:
        return default_id, text
    doc_id = record.get(id_field)
    if doc_id is None or isinstance(doc_id, (dict, list)):
        batch.rejects.append(Reject(row, f"missing or non-scalar id field {id_field!r}", _raw(raw)))
        return None
    return str(doc_id), text


def _read_parquet(
    fs: pafs.FileSystem, inner: str, shard: Shard, text_field: str, id_field: str | None, batch_size: int
) -> Iterator[Batch]:
    try:
        pf = pq.ParquetFile(fs.open_input_file(inner))
    except (OSError, pa.ArrowInvalid) as e:
        yield Batch(rejects=[Reject(-1, f"unreadable Parquet file: {_one_line(e)}", "")])
        return
    names = pf.schema_arrow.names
    missing = [c for c in (text_field, id_field) if c is not None and c not in names]
    if missing:
        reason = f"Parquet file has no column {missing[0]!r} (columns: {', '.join(names)})"
        yield Batch(rejects=[Reject(-1, reason, "")])
        return
    columns = [text_field] + ([id_field] if id_field else [])
    row = 0
    try:
        for record_batch in pf.iter_batches(batch_size=batch_size, columns=columns):
            batch = Batch()
            texts = record_batch.column(text_field)
            if not pa.types.is_string(texts.type) and not pa.types.is_large_string(texts.type):
                batch.rejects.append(Reject(-1, f"column {text_field!r} is {texts.type}, not a string", ""))
                yield batch
                return
            ids = record_batch.column(id_field).to_pylist() if id_field else None
            for i, text in enumerate(texts.to_pylist()):
                record: dict[str, object] = {text_field: text}
                if ids is not None and id_field is not None:
                    record[id_field] = ids[i]
                doc = _document(
                    record, row, text_field, id_field, f"{shard.relpath}:{row}", batch, text or ""
                )
                if doc is not None:
                    batch.add(row, doc[0], doc[1])
                row += 1
            yield batch
    except (OSError, pa.ArrowInvalid) as e:
        yield Batch(rejects=[Reject(row, f"unreadable Parquet data after row {row - 1}: {_one_line(e)}", "")])


def _read_text(fs: pafs.FileSystem, inner: str, shard: Shard) -> Batch:
    batch = Batch()
    try:
        with fs.open_input_stream(inner, compression="detect") as f:
            data = f.read()
    except (OSError, pa.ArrowInvalid) as e:
        batch.rejects.append(Reject(-1, f"unreadable file: {_one_line(e)}", ""))
        return batch
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        batch.rejects.append(Reject(0, f"invalid UTF-8 at byte {e.start}", _raw(data)))
        return batch
    if not text.strip():
        batch.rejects.append(Reject(0, "empty document", _raw(text)))
        return batch
    batch.add(0, shard.relpath, text)
    return batch


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
