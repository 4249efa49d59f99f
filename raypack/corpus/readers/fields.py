"""A decoded record (a JSONL object, a Parquet row) → its document: the text (or chat record) and id
its Reading names, or a Reject saying why not. Shared by the JSONL and Parquet readers."""

from __future__ import annotations

from typing import Any

from raypack.config import Reading
from raypack.corpus.readers.chat import chat_record
from raypack.corpus.readers.records import Batch, Reject, empty_reason

__all__ = ["document"]


def document(
    record: dict[str, object], row: int, reading: Reading, default_id: str, batch: Batch, raw: bytes | str
) -> tuple[str, Any] | None:
    """The (id, text or Chat) of one decoded record, or None with its Reject added to `batch`."""
    text_field = reading.text_field
    if reading.chat:
        chat = chat_record(record, row, reading, batch, raw)
        if chat is None:
            return None
        if (
            len(chat) > reading.max_document_bytes
        ):  # parquet: a cell over the limit (jsonl lines never get here)
            limit = reading.max_document_bytes
            why = f"conversation of {len(chat)} characters, over input.max_document_bytes ({limit})"
            batch.rejects.append(Reject.bad(row, why, raw))
            return None
        return _with_id(record, row, reading, default_id, batch, raw, chat)
    if text_field not in record:
        batch.rejects.append(Reject.bad(row, f"missing text field {text_field!r}", raw))
        return None
    if record[text_field] is None:  # JSON null, a Parquet or Dataset null: there, but empty
        batch.rejects.append(Reject.bad(row, f"text field {text_field!r} is null", raw))
        return None
    text = record[text_field]
    if not isinstance(text, str):
        what = f"text field {text_field!r} is {type(text).__name__}, not a string"
        batch.rejects.append(Reject.bad(row, what, raw))
        return None
    if (empty := empty_reason(text, reading)) is not None:
        batch.rejects.append(Reject.bad(row, empty, raw))
        return None
    # A Parquet cell or a Dataset's row over the limit (jsonl lines never get here): its UTF-8 bytes,
    # encoded only where its characters could be that many (a character is at most 4 bytes).
    limit = reading.max_document_bytes
    if len(text) * 4 > limit and (size := len(text.encode("utf-8", "surrogatepass"))) > limit:
        reason = f"text of {size:,} bytes, over input.max_document_bytes ({limit:,})"
        batch.rejects.append(Reject.bad(row, reason, raw))
        return None
    return _with_id(record, row, reading, default_id, batch, raw, text)


def _with_id(
    record: dict[str, object],
    row: int,
    reading: Reading,
    default_id: str,
    batch: Batch,
    raw: bytes | str,
    doc: Any,
) -> tuple[str, Any] | None:
    id_field = reading.id_field
    if id_field is None:
        return default_id, doc
    doc_id = record.get(id_field)
    if doc_id is None or isinstance(doc_id, (dict, list)):
        batch.rejects.append(Reject.bad(row, f"missing or non-scalar id field {id_field!r}", raw))
        return None
    return str(doc_id), doc
