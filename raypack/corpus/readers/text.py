"""Text: each file is one document (plain, or compressed by its suffix), its id the file's relpath.
A file over input.max_document_bytes is counted as it streams by, never held; a file whose stream
breaks (a truncated .txt.gz) is lost, as a broken JSONL stream is."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from raypack.config import Reading
from raypack.corpus.readers.jsonl import CHUNK
from raypack.corpus.readers.records import RAW_PREFIX, Batch, Reject, empty_reason, is_bad_data, one_line
from raypack.storage import Shard

__all__ = ["read"]


def read(fs: pafs.FileSystem, inner: str, shard: Shard, reading: Reading, batch_size: int) -> Iterator[Batch]:
    batch = Batch()
    limit = reading.max_document_bytes
    try:
        with fs.open_input_stream(inner, compression="detect") as f:
            data = f.read(limit + 1)
            size = 0  # the whole size, counted without holding it, when over the limit
            if len(data) > limit:
                size = len(data)
                while chunk := f.read(CHUNK):
                    size += len(chunk)
                data = data[: RAW_PREFIX * 4]
    except (OSError, pa.ArrowInvalid) as e:
        if not is_bad_data(e):
            raise
        batch.rejects.append(Reject.lost(-1, f"unreadable file: {one_line(e)}"))
        yield batch
        return
    if size:
        batch.rejects.append(
            Reject.bad(0, f"file of {size:,} bytes, over input.max_document_bytes ({limit:,})", data)
        )
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            batch.rejects.append(Reject.bad(0, f"invalid UTF-8 at byte {e.start}", data))
        else:
            if (reason := empty_reason(text, reading)) is not None:
                batch.rejects.append(Reject.bad(0, reason, text))
            else:
                batch.add(0, shard.relpath, text)
    yield batch
