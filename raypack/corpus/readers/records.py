"""What every reader yields: batches of documents, and a Reject for each record that is not one.

Bad data is never an exception out of a reader: a bad record (malformed JSON, a missing or mistyped
field, bad UTF-8, an empty or oversized document) is a Reject of one record; a file that cannot be
read whole (a truncated or corrupt compressed stream, a file that is not Parquet, a missing text
column) is a *lost* Reject, counted as the records it held, which input.max_lost_files gates. A
storage failure (network, permissions) is raised as the OSError it is: it says nothing about the data.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from raypack.config import Reading

__all__ = [
    "CUT_KINDS",
    "MAX_BATCH_BYTES",
    "RAW_PREFIX",
    "Batch",
    "Raw",
    "Reject",
    "empty_reason",
    "is_bad_data",
    "one_line",
    "raw_prefix",
    "reason_counts",
    "reject_advice",
]

RAW_PREFIX = 200
Raw = bytes | memoryview | str
"""A record as read (a JSONL line: a view of the reader's chunk, or bytes), or its decoded text:
what a Reject keeps the first RAW_PREFIX characters of."""
# A batch ends at batch_size documents or this much text, whichever comes first. tokenizers keeps
# ~100 bytes per token in an Encoding (ids, offsets, token strings, masks), so a batch bounded by
# count alone grows with the longest documents it happens to meet, and a worker's peak memory with
# the corpus (at 4 MiB it still does: the worst batch met grows with the batches met). 1 MiB (~250k
# tokens, ~35 MB of Encodings) encodes as fast as larger batches on two cores (~0.55 Mtok/s).
MAX_BATCH_BYTES = 1 << 20
# How pyarrow words a broken compressed stream (it raises OSError, as for a lost connection).
_CORRUPT_STREAM = ("Truncated compressed stream", "inflate failed", "decompress", "Corrupt", "corrupt")


@dataclass(frozen=True, slots=True)
class Reject:
    """An input record that is not a document, with why. Made by `bad` (one record) or `lost` (a
    file, or its unread rest), never field by field: a lost file is always marked so."""

    row: int
    """Its line (jsonl, from 1) or row (parquet, from 0); -1: the whole file."""
    reason: str
    raw: str
    """The first RAW_PREFIX characters of the record, as read."""
    records: int = 1
    """Input records this reject stands for: 1 for a bad record; for a lost file (or the unread rest
    of one), its rows as its Parquet footer counts them, or 1 (at least) where nothing says more."""
    lost_file: bool = False
    """A whole file, or its rest, could not be read: a corpus problem, not a bad record. The job
    fails on one unless input.max_lost_files allows it."""
    file: int = 0
    """Its file's number within its work unit (a run of small files: units.WorkUnit.files)."""

    @classmethod
    def bad(cls, row: int, reason: str, raw: Raw = "") -> Reject:
        """A record that is not a document."""
        return cls(row, reason, raw_prefix(raw))

    @classmethod
    def cut(cls, row: int, reason: str, raw: Raw = "") -> Reject:
        """Tokens of a record that no pack holds by the job's rule (pack.overflow's truncate or drop,
        decompose's tail below pack.min_seq_len): the record is a document of the index, so the
        reject stands for no record."""
        return cls(row, reason, raw_prefix(raw), records=0)

    @classmethod
    def lost(cls, row: int, reason: str, records: int = 1) -> Reject:
        """A file, or its rest from `row` on, that could not be read: `records` it held (at least 1)."""
        return cls(row, reason, "", records=max(1, records), lost_file=True)

    def as_row(self, relpaths: list[str]) -> dict[str, Any]:
        """Its row of a rejects file (schema.REJECTS); `relpaths`: its unit's files'."""
        return {
            "source": relpaths[self.file],
            "row": self.row,
            "reason": self.reason,
            "raw": self.raw,
            "records": self.records,
            "lost_file": self.lost_file,
        }


@dataclass(slots=True)
class Batch:
    rows: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    texts: list[Any] = field(default_factory=list)
    """Each document's text (str), or for chat data its readers.chat.Chat."""
    rejects: list[Reject] = field(default_factory=list)
    text_bytes: int = 0
    files: list[int] | None = None
    """Each document's file number within its unit (read_unit of a run of small files joins the
    files' batches); None: every document is of file 0 (a reader's own batches)."""
    meta: list[tuple[Any, ...]] = field(default_factory=list)
    """Each document's metadata (input.metadata_fields): its values in the Reading's order, ()
    where none is kept."""

    def __len__(self) -> int:
        return len(self.rows)

    def add(
        self, row: int, doc_id: str, text: Any, size: int | None = None, meta: tuple[Any, ...] = ()
    ) -> None:
        """`text`: the document's text, or for chat data (input.messages_field / prompt_field) its
        Chat record, rendered and masked by the tokenize stage (raypack.text.chat)."""
        self.rows.append(row)
        self.ids.append(doc_id)
        self.texts.append(text)
        self.meta.append(meta)
        self.text_bytes += len(text) if size is None else size

    def full(self, batch_size: int) -> bool:
        return len(self.rows) >= batch_size or self.text_bytes >= MAX_BATCH_BYTES


def empty_reason(text: str, reading: Reading) -> str | None:
    """Why an empty or whitespace-only text is rejected, or None (not empty, or input.empty: keep)."""
    if (text and not text.isspace()) or reading.empty == "keep":  # strip() would copy the text
        return None
    return "empty document" if not text else "whitespace-only document"


def is_bad_data(e: BaseException) -> bool:
    """True for errors that describe the bytes (record them as rejects), False for storage failures."""
    if isinstance(e, (pa.ArrowInvalid, EOFError, UnicodeDecodeError)):
        return True
    return isinstance(e, OSError) and any(m in str(e) for m in _CORRUPT_STREAM)


def raw_prefix(data: Raw) -> str:
    if not isinstance(data, str):
        data = bytes(data[: RAW_PREFIX * 4]).decode("utf-8", errors="replace")
    return data[:RAW_PREFIX]


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# A number that stands alone ("byte 13", "(4,096)", "22.5%"), not one inside a word or a path:
# UTF-8 stays UTF-8, and /tmp/run-154/model0/ stays as it is. Thousands separators are part of it
# (a size written "3,600" and one written "600" are one kind).
_NUMBER = re.compile(r"(?<![\w/.-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w/-])")


# The kinds of rejects (reason_counts) that stand for no record: a document of the index whose
# tokens the packing left out in part or whole (Reject.cut: pack.overflow, decompose's tails).
CUT_KINDS = ("overflow ", "decompose")


def reason_counts(reasons: list[str]) -> dict[str, int]:
    """Rejects by kind: the reason up to its first colon outside parentheses, numbers replaced by N
    ("malformed JSON",
    "invalid UTF-8 at byte N", "record of N bytes, over input.max_document_bytes (N)")."""
    kinds = Counter(_NUMBER.sub("N", _kind(r)) for r in reasons)
    return dict(sorted(kinds.items()))


def reasons_text(kinds: dict[str, int], most: int | None = None) -> str:
    """Rejects by kind as the job's messages give them, the most frequent first, ties by name (the
    same words whatever order the units finished in), apart by "; " (a kind may hold commas):
    "empty document (12); malformed JSON (1)"; past `most` kinds, how many more there are (not a
    hidden kind: they are in rejects/)."""
    common = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    text = "; ".join(f"{kind} ({n:,})" for kind, n in common[:most]) or "none"
    if most is not None and len(common) > most:
        more = len(common) - most
        text += f" and {more} more kind{'s' if more > 1 else ''}"
    return text


def reject_advice(kinds: dict[str, int], limit: int | None = None) -> str:
    """What to change where too many records were rejected: the size limit where more than half of
    them are over it, else the reading (most corpora that fail so are read wrong), naming how many
    are over the limit where some are."""
    over = sum(n for kind, n in kinds.items() if "over input.max_document_bytes" in kind)
    now = f" ({limit:,})" if limit is not None else ""
    if over * 2 > sum(kinds.values()):
        return f"most are over input.max_document_bytes{now}: raise it where such records are wanted"
    advice = "most such corpora have a wrong input.format or text field"
    if over:
        advice += f"; {over:,} of the records are over input.max_document_bytes{now}"
    return advice


def _kind(reason: str) -> str:
    """A reason up to its first colon outside parentheses and angle brackets: "no trained token
    (pack.loss assistant: no assistant turn)" whole, not cut inside its parenthesis, nor "column
    'url' is list<element: string>, ..." inside its Arrow type."""
    depth = 0
    for i, c in enumerate(reason):
        depth += (c in "(<") - (c in ")>")
        if c == ":" and depth <= 0:
            return reason[:i]
    return reason
