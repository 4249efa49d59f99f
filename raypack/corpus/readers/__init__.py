"""Input readers, one module a format behind one interface (as raypack.formats is for outputs): a
reader streams one work unit as Batches of documents, every record that is not one a Reject in the
batch where it was met (records.py). READERS is the only registry; a new input format is a module
here, a line in READERS, and its name in config.INPUT_FORMATS.

    jsonl.py     one JSON object a line; .gz/.zst/... by suffix; byte ranges of large files
    parquet.py   a row a document; runs of row groups of large files
    text.py      a file a document
    dataset.py   a Ray Dataset's rows (raypack.pack(dataset=...)), from its blocks in Ray's object store
    chat.py      the chat record (conversations, prompt/completion pairs) inside a jsonl or parquet row
    fields.py    a decoded record → its document and id (jsonl and parquet)
    records.py   Batch, Reject (bad records and lost files), the errors that are the data's

Reading happens inside the tokenize task, so no shard is ever held whole: a batch ends at
`batch_size` documents or records.MAX_BATCH_BYTES of text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pyarrow.fs as pafs

from raypack.config import INPUT_FORMATS, Reading, StorageConfig
from raypack.corpus.readers import dataset, jsonl, parquet, text
from raypack.corpus.readers.records import MAX_BATCH_BYTES, Batch, Reject
from raypack.corpus.units import WorkUnit
from raypack.storage import Shard, resolve
from raypack.text.chat import Chat

__all__ = ["READERS", "READ_VERSION", "Batch", "Chat", "Reader", "Reject", "read_unit"]

Reader = Callable[[pafs.FileSystem, str, Shard, Reading, int], Iterator[Batch]]
"""(filesystem, path in it, the unit, how to read it, batch size) → its batches."""

READERS: dict[str, Reader] = {"jsonl": jsonl.read, "parquet": parquet.read, "text": text.read}
if tuple(READERS) != INPUT_FORMATS:  # a format added in one place and not the other
    raise ImportError(f"readers {tuple(READERS)} and config.INPUT_FORMATS {INPUT_FORMATS} differ")

# The readers' code version, in every token file's cache key: a change to what a reader makes of the
# same bytes (documents, ids, rejects) must never reuse token files the old code wrote. Bump it with
# any such change (`git log -G'READ_VERSION ='` says what each bump covered).
READ_VERSION = 4


def read_unit(unit: WorkUnit, batch_size: int, storage: StorageConfig | None = None) -> Iterator[Batch]:
    """Documents of one work unit in batches of up to `batch_size`; rejects ride along with the batch
    in which they were met (a batch may hold only rejects). A storage failure is raised as the
    OSError it is; the task that met it is retried (raypack.pipeline.write.exchange.transient).

    A run of small files is read file after file, their batches joined up to `batch_size` documents
    or MAX_BATCH_BYTES (a file of 6 KB makes a batch of a few documents: encoding and writing batches
    that small costs more than the text), each document and reject marked with its file's number."""
    if unit.blocks:  # a Ray Dataset's rows (raypack.corpus.datasets)
        yield from dataset.read(unit, batch_size, storage)
        return
    read = READERS[unit.reading.format]
    if not unit.more:
        fs, inner = resolve(unit.shard.path, storage)
        yield from read(fs, inner, unit.shard, unit.reading, batch_size)
        return
    numbers: list[int] = []
    joined = Batch(files=numbers)
    for number, shard in enumerate(unit.files):
        fs, inner = resolve(shard.path, storage)
        for batch in read(fs, inner, shard, unit.reading, batch_size):
            if len(joined) and (
                len(joined) + len(batch) > batch_size
                or joined.text_bytes + batch.text_bytes > MAX_BATCH_BYTES
            ):
                yield joined
                numbers = []
                joined = Batch(files=numbers)
            joined.rows += batch.rows
            joined.ids += batch.ids
            joined.texts += batch.texts
            joined.meta += batch.meta
            joined.text_bytes += batch.text_bytes
            numbers += [number] * len(batch)
            joined.rejects += [dataclasses.replace(r, file=number) for r in batch.rejects]
    if len(joined) or joined.rejects:
        yield joined
