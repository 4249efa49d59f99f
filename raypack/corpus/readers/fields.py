"""A decoded record (a JSONL object, a Parquet row) → its document: the text (or chat record), id
and metadata its Reading names, or a Reject saying why not. Shared by the JSONL and Parquet readers.

The text is one field (text_field), or several joined (text_fields): the fields present, in their
order, with text_separator between them; a field a record lacks, or holds null or "", is left out.
A record none of whose text fields is there (all missing or null) is a reject, and so is one where
a text field holds something other than a string, or a metadata field a list or an object. A
metadata field a record lacks is null (raypack.corpus.metadata)."""

from __future__ import annotations

from typing import Any

from raypack.config import Reading
from raypack.corpus.metadata import not_scalar
from raypack.corpus.readers.chat import chat_record
from raypack.corpus.readers.records import Batch, Raw, Reject, empty_reason

__all__ = ["Document", "document", "read_fields"]

Document = tuple[str, Any, tuple[Any, ...]]
"""(id, text or Chat, metadata values in the Reading's order)."""


def read_fields(reading: Reading) -> tuple[str, ...]:
    """Every field a plain-text record is read from: its text, id and metadata."""
    text = reading.text_fields or (reading.text_field,)
    return (*text, *((reading.id_field,) if reading.id_field else ()), *reading.metadata_fields)


def document(
    record: dict[str, object], row: int, reading: Reading, default_id: str, batch: Batch, raw: Raw
) -> Document | None:
    """The (id, text or Chat, metadata) of one decoded record, or None with its Reject added to
    `batch`."""
    if reading.chat:
        chat = chat_record(record, row, reading, batch, raw)
        if chat is None:
            return None
        # A Parquet or Dataset row over the limit (a JSONL line is measured as it is read): the
        # record as JSON (its reader's raw), in UTF-8 bytes, as a JSONL line of it would be.
        limit = reading.max_document_bytes
        if isinstance(raw, str) and (size := _bytes_over(raw, limit)):
            why = f"record of {size:,} bytes, over input.max_document_bytes ({limit:,})"
            batch.rejects.append(Reject.bad(row, why, raw))
            return None
        return _with_id(record, row, reading, default_id, batch, raw, chat)
    text: object
    if reading.text_fields:
        text = _joined(record, row, reading, batch, raw)
        if text is None:
            return None
    else:  # (inline: a call a record costs ~3% of the JSONL read path)
        text_field = reading.text_field
        if text_field not in record:
            batch.rejects.append(Reject.bad(row, f"missing text field {text_field!r}", raw))
            return None
        text = record[text_field]
        if text is None:  # JSON null, a Parquet or Dataset null: there, but empty
            batch.rejects.append(Reject.bad(row, f"text field {text_field!r} is null", raw))
            return None
        if not isinstance(text, str):
            what = f"text field {text_field!r} is {type(text).__name__}, not a string"
            batch.rejects.append(Reject.bad(row, what, raw))
            return None
    if (empty := empty_reason(text, reading)) is not None:
        batch.rejects.append(Reject.bad(row, empty, raw))
        return None
    # A Parquet cell or a Dataset's row over the limit (jsonl lines never get here).
    limit = reading.max_document_bytes
    if size := _bytes_over(text, limit):
        reason = f"text of {size:,} bytes, over input.max_document_bytes ({limit:,})"
        batch.rejects.append(Reject.bad(row, reason, raw))
        return None
    return _with_id(record, row, reading, default_id, batch, raw, text)


def _bytes_over(text: str, limit: int) -> int:
    """`text`'s UTF-8 bytes where they are over `limit`, else 0: encoded only where its characters
    could be that many (a character is at most 4 bytes)."""
    if len(text) * 4 <= limit:
        return 0
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > limit else 0


def _joined(record: dict[str, object], row: int, reading: Reading, batch: Batch, raw: Raw) -> str | None:
    """text_fields' strings joined (those present and not empty), or None with a reject: none of
    them present (missing or null), or one that is not a string."""
    parts = []
    present = False
    for name in reading.text_fields:
        value = record.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            what = f"text field {name!r} is {type(value).__name__}, not a string"
            batch.rejects.append(Reject.bad(row, what, raw))
            return None
        present = True
        if value:
            parts.append(value)
    if not present:
        names = ", ".join(map(repr, reading.text_fields))
        batch.rejects.append(Reject.bad(row, f"no text field present (all missing or null: {names})", raw))
        return None
    return reading.text_separator.join(parts)


def _metadata(
    record: dict[str, object], row: int, reading: Reading, batch: Batch, raw: Raw
) -> tuple[Any, ...] | None:
    """The record's metadata values (None for a field it lacks), or None with a reject for one
    that is a list or an object."""
    values = tuple(record.get(name) for name in reading.metadata_fields)
    for name, value in zip(reading.metadata_fields, values, strict=True):
        if (kind := not_scalar(value)) is not None:
            what = f"metadata field {name!r} is {kind}, not a string, number or bool"
            batch.rejects.append(Reject.bad(row, what, raw))
            return None
    return values


def _with_id(
    record: dict[str, object],
    row: int,
    reading: Reading,
    default_id: str,
    batch: Batch,
    raw: Raw,
    doc: Any,
) -> Document | None:
    id_field = reading.id_field
    if id_field is None and not reading.metadata_fields:
        return default_id, doc, ()
    doc_id: object = default_id
    if id_field is not None:
        doc_id = record.get(id_field)
        if doc_id is None or isinstance(doc_id, (dict, list)):
            batch.rejects.append(Reject.bad(row, f"missing or non-scalar id field {id_field!r}", raw))
            return None
    meta = _metadata(record, row, reading, batch, raw) if reading.metadata_fields else ()
    return None if meta is None else (str(doc_id), doc, meta)
