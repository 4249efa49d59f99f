"""Input readers, one module a format behind one interface (as raypack.formats is for outputs): a
reader streams one work unit as Batches of documents, every record that is not one a Reject in the
batch where it was met (records.py). READERS is the only registry; a new input format is a module
here, a line in READERS, and its name in config.INPUT_FORMATS.

    jsonl.py     one JSON object a line; .gz/.zst/... by suffix; byte ranges of large files
    parquet.py   a row a document; runs of row groups of large files
    text.py      a file a document
    chat.py      the chat record (conversations, prompt/completion pairs) inside a jsonl or parquet row
    fields.py    a decoded record → its document and id (jsonl and parquet)
    records.py   Batch, Reject (bad records and lost files), the errors that are the data's

Reading happens inside the tokenize task, so no shard is ever held whole: a batch ends at
`batch_size` documents or records.MAX_BATCH_BYTES of text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow.fs as pafs

from raypack.config import INPUT_FORMATS, Reading, StorageConfig
from raypack.pipeline.readers import jsonl, parquet, text
from raypack.pipeline.readers.chat import Chat
from raypack.pipeline.readers.records import Batch, Reject
from raypack.pipeline.units import WorkUnit
from raypack.storage import Shard, resolve

__all__ = ["READERS", "READ_VERSION", "Batch", "Chat", "Reader", "Reject", "read_unit"]

Reader = Callable[[pafs.FileSystem, str, Shard, Reading, int], Iterator[Batch]]
"""(filesystem, path in it, the unit, how to read it, batch size) → its batches."""

READERS: dict[str, Reader] = {"jsonl": jsonl.read, "parquet": parquet.read, "text": text.read}
if tuple(READERS) != INPUT_FORMATS:  # a format added in one place and not the other
    raise ImportError(f"readers {tuple(READERS)} and config.INPUT_FORMATS {INPUT_FORMATS} differ")

# The readers' code version, in every token file's cache key: a change to what a reader makes of the
# same bytes (documents, ids, rejects) must never reuse token files the old code wrote. Bump it with
# any such change. 2: a mixture source's own format and fields are used (issue 31; before, every
# file was read with the top-level input settings) and a truncated text file is a lost file.
READ_VERSION = 2


def read_unit(unit: WorkUnit, batch_size: int, storage: StorageConfig | None = None) -> Iterator[Batch]:
    """Documents of one work unit in batches of up to `batch_size`; rejects ride along with the batch
    in which they were met (a batch may hold only rejects). A storage failure is raised as the
    OSError it is; the task that met it is retried (raypack.pipeline.exchange.transient)."""
    fs, inner = resolve(unit.shard.path, storage)
    yield from READERS[unit.reading.format](fs, inner, unit.shard, unit.reading, batch_size)
