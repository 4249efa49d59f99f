"""A seeded sample of a corpus's documents, read by the job's own readers (`raypack plan --config`):
real documents to tokenize and plan on, without reading the corpus whole.

    places   ceil(N / RUN) byte offsets, one drawn in each of as many equal slices of the corpus
             (its files end to end, in the job's order): the sample spreads over every part of it
    starts   each place moved back to the start of the work unit that holds it, as the job cuts
             units (cut.unit_starts: a file, a byte range of a large JSONL file, a run of a large
             Parquet file's row groups); the places of one unit make one start, with their quotas
    windows  from each start, the documents in the job's order (into the next files where one
             ends) until the start's quota or the next start; the last goes round to the first, so
             a corpus smaller than the sample is read whole, each document once

A compressed stream is read from its start only (the job keeps such a file whole too). Documents of
a JSONL unit after a file's first carry no line numbers (the job counts the lines before a unit by
reading them all): their ids are not the job's unless input.id_field names them (Sample.batches
says which are).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from raypack.config import StorageConfig
from raypack.corpus.cut import COMPRESSED_SUFFIXES, unit_starts
from raypack.corpus.readers import Batch, read_unit
from raypack.corpus.units import WorkUnit
from raypack.storage import Shard, resolve

__all__ = ["RUN", "Drawn", "Sample"]

# Documents read from each place, in a row. A place costs an open (a GET on S3) and a unit's start;
# runs this short keep a sample of 10,000 spread over ~300 places of the corpus: documents next to
# each other (one file's, one crawl's) are alike, and a few long runs would sample few of them.
RUN = 32


@dataclass(frozen=True, order=True, slots=True)
class _Start:
    file: int
    at: int
    """The unit's first byte (JSONL) or row group (Parquet); 0: the file's start."""
    first_row: int | None = field(compare=False)
    """The file's rows before it; None: not known (a JSONL unit past the first)."""


@dataclass(slots=True)
class Drawn:
    """What a sample read, filled in as it reads."""

    files: int
    """Files in the corpus."""
    corpus_bytes: int
    places: int
    starts: int
    files_read: set[int] = field(default_factory=set)
    documents: int = 0
    """Documents the readers gave (before the tokenizer's rejects)."""
    records: int = 0
    """Input records read: documents and rejected records (a lost file: the rows it held)."""
    text_bytes: int = 0
    behind: float = 0.0
    """Bytes on storage the records read came from: a file or unit read to its end, its size; one
    read in part, its share by the bytes of its lines (JSONL; of a compressed file, the bytes those
    decompress from) or by its rows (Parquet)."""
    unknown: set[int] = field(default_factory=set)
    """Compressed files read in part whose stream could not be decompressed again to find where the
    records read end (_compressed_bytes): what share of their bytes they are is not known."""
    cut_short: bool = False
    """A start's quota was met before the next start: the corpus was not read whole."""

    @property
    def whole(self) -> bool:
        """Every document of the corpus was read."""
        return not self.cut_short

    @property
    def scale(self) -> float | None:
        """The corpus's bytes over the bytes behind the sample (a sample's count times it estimates
        the corpus's); 1 for the whole corpus; None where some are not known."""
        if self.whole:
            return 1.0
        if self.unknown or self.behind <= 0:
            return None
        return self.corpus_bytes / self.behind


class Sample:
    """The places of a sample of `documents` documents of `files` (input_files' whole-file units),
    drawn with `seed`, and their units' starts (reading a large file's footer or a few KB where a
    unit of it starts); `batches` reads them."""

    def __init__(
        self,
        files: list[WorkUnit],
        documents: int,
        seed: int,
        unit_bytes: int,
        storage: StorageConfig | None = None,
    ) -> None:
        if documents < 1:
            raise ValueError(f"a sample of {documents} documents")
        self.files, self.storage = files, storage
        sizes = np.array([f.shard.size for f in files], dtype=np.int64)
        total = int(sizes.sum())
        places = math.ceil(documents / RUN)
        # One place in each of `places` equal slices, uniform within it.
        rng = np.random.default_rng(seed)
        offsets = ((np.arange(places) + rng.random(places)) * (total / places)).astype(np.int64)
        ends = np.cumsum(sizes)
        owner = np.minimum(np.searchsorted(ends, offsets, side="right"), len(files) - 1)
        within = offsets - (ends - sizes)[owner]
        quotas = [documents // places + (k < documents % places) for k in range(places)]
        by_file: dict[int, list[int]] = {}
        for i, o in zip(owner.tolist(), within.tolist(), strict=True):
            by_file.setdefault(i, []).append(o)
        quota: Counter[_Start] = Counter()
        k = 0
        for i in sorted(by_file):
            for at, first_row in unit_starts(files[i], by_file[i], unit_bytes, storage):
                quota[_Start(i, at, first_row)] += quotas[k]
                k += 1
        self.starts = sorted(quota)
        self.quotas = [quota[s] for s in self.starts]
        self.drawn = Drawn(len(files), total, places, len(self.starts))
        self._meta: dict[str, tuple[int, int]] = {}

    def batches(self, batch_size: int) -> Iterator[tuple[Batch, bool]]:
        """Each window's documents, in batches of at most `batch_size`, with whether their ids are
        the job's; self.drawn counts what was read."""
        for k, start in enumerate(self.starts):
            end = self.starts[(k + 1) % len(self.starts)]
            yield from self._window(start, end, self.quotas[k], batch_size)

    def _window(
        self, start: _Start, end: _Start, quota: int, batch_size: int
    ) -> Iterator[tuple[Batch, bool]]:
        left = quota
        for file, at, first_row, stop in self._pieces(start, end):
            if left == 0:
                self.drawn.cut_short = True
                return
            f = self.files[file]
            exact = first_row is not None or f.reading.id_field is not None
            self.drawn.files_read.add(file)
            docs = records = text_bytes = 0
            unit = WorkUnit(self._shard(f, at, first_row, stop), f.reading)
            read = read_unit(unit, min(batch_size, left), self.storage)
            ended = True
            for batch in read:
                batch, ended = _first(batch, left)
                docs += len(batch)
                records += len(batch) + sum(r.records for r in batch.rejects)
                text_bytes += batch.text_bytes
                left -= len(batch)
                yield batch, exact
                if ended and left == 0:
                    ended = next(read, None) is None  # (what it holds is past the quota)
                if not ended:
                    break
            del read  # (closes its file, where the quota left some of it unread)
            self.drawn.documents += docs
            self.drawn.records += records
            self.drawn.text_bytes += text_bytes
            self._behind(file, at, stop, ended, docs, records, text_bytes)
            if not ended:
                self.drawn.cut_short = True
                return

    def _pieces(self, start: _Start, end: _Start) -> Iterator[tuple[int, int, int | None, int]]:
        """(file, first byte or row group, rows before it, end: -1 for the file's end) of each
        piece from `start` to `end`, in the job's order, round from the corpus's end to its start."""
        if end.file == start.file and end.at > start.at:
            yield start.file, start.at, start.first_row, end.at
            return
        yield start.file, start.at, start.first_row, -1
        i = (start.file + 1) % len(self.files)
        while i != end.file:
            yield i, 0, 0, -1
            i = (i + 1) % len(self.files)
        if end.at > 0:
            yield end.file, 0, 0, end.at

    def _shard(self, f: WorkUnit, at: int, first_row: int | None, stop: int) -> Shard:
        """The piece as a unit's Shard: the file whole, its bytes [at, stop) or row groups."""
        if at == 0 and stop < 0:
            return f.shard
        if f.reading.format == "parquet":
            stop = stop if stop >= 0 else self._parquet(f)[1]
        else:
            stop = stop if stop >= 0 else f.shard.size
        return replace(f.shard, unit_start=at, unit_stop=stop, first_row=first_row or 0)

    def _behind(self, file: int, at: int, stop: int, ended: bool, docs: int, records: int, text: int) -> None:
        """Adds the bytes on storage behind a piece's records to drawn.behind, or its file to
        drawn.unknown."""
        f = self.files[file]
        if f.reading.format == "parquet" and not (at == 0 and stop < 0 and ended):
            rows = self._parquet(f)[0]
            self.drawn.behind += records * f.shard.size / rows if rows else 0
        elif ended:
            self.drawn.behind += (stop if stop >= 0 else f.shard.size) - at
        elif docs:  # a JSONL line's bytes and its newline; rejected ones as long as the rest
            lines = (text + docs) * records / docs
            if f.shard.path.endswith(COMPRESSED_SUFFIXES):
                found = _compressed_bytes(f.shard, round(lines), self.storage)
                if found is None:
                    self.drawn.unknown.add(file)
                else:
                    self.drawn.behind += found
            else:
                self.drawn.behind += lines

    def _parquet(self, f: WorkUnit) -> tuple[int, int]:
        """A Parquet file's rows and row groups, from its footer (0, 0 where it cannot be read: its
        reader rejects it)."""
        if f.shard.path not in self._meta:
            import pyarrow as pa
            import pyarrow.parquet as pq

            fs, inner = resolve(f.shard.path, self.storage)
            try:
                with fs.open_input_file(inner) as handle:
                    meta = pq.ParquetFile(handle).metadata
                self._meta[f.shard.path] = (meta.num_rows, meta.num_row_groups)
            except (OSError, pa.ArrowInvalid):
                self._meta[f.shard.path] = (0, 0)
        return self._meta[f.shard.path]


# What _compressed_bytes hands the decompressor, and reads of it, at a time: Arrow's gzip takes no
# more input than the output asked for needs (at 1 KiB, under 1 KiB over on 17-275 KB); zstd takes a
# block (up to 128 KiB) before it gives any of it, so the place within a block is interpolated. The
# stream under it reads storage 1 MiB at a time.
_RAW_CHUNK = 1 << 10
_OUT_CHUNK = 4 << 10


class _Counted:
    """A raw stream read at most _RAW_CHUNK bytes at a time, counting them."""

    closed = False

    def __init__(self, raw: Any) -> None:
        self.raw, self.read_bytes = raw, 0

    def read(self, n: int = -1) -> bytes:
        data = bytes(self.raw.read(_RAW_CHUNK if n < 0 else min(n, _RAW_CHUNK)))
        self.read_bytes += len(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _compressed_bytes(shard: Shard, uncompressed: int, storage: StorageConfig | None) -> float | None:
    """About the bytes of a compressed file that its first `uncompressed` bytes come from: its start
    decompressed again past there, the input taken for each piece of output counted (the reader's
    stream gives no place in the file), the place interpolated within the piece of input that gave
    the output around it; None where it cannot be decompressed so."""
    import pyarrow as pa

    try:
        fs, inner = resolve(shard.path, storage)
        with fs.open_input_stream(inner, compression=None, buffer_size=1 << 20) as raw:
            counted = _Counted(raw)
            stream = pa.CompressedInputStream(pa.PythonFile(counted, mode="r"), pa.Codec.detect(inner).name)
            # (output before it, input before and after) of each read that took input: the output
            # from there to the next such read came from that input
            steps: list[tuple[int, int, int]] = []
            out = 0
            while not steps or steps[-1][0] <= uncompressed:
                before = counted.read_bytes
                data = stream.read(_OUT_CHUNK)
                if counted.read_bytes != before:
                    steps.append((out, before, counted.read_bytes))
                if not data:
                    break
                out += len(data)
    except (OSError, ValueError, pa.ArrowException):
        return None
    ends = [o for o, _, _ in steps[1:]] + [out]
    for (o, before, after), end in zip(steps, ends, strict=True):
        if o <= uncompressed < end:
            return before + (uncompressed - o) / (end - o) * (after - before)
    return float(counted.read_bytes)


def _first(batch: Batch, n: int) -> tuple[Batch, bool]:
    """The batch's first `n` documents and the rejects met before the next, and whether that is the
    whole batch."""
    if len(batch) <= n:
        return batch, True
    cut = batch.rows[n]
    return Batch(
        rows=batch.rows[:n],
        ids=batch.ids[:n],
        texts=batch.texts[:n],
        meta=batch.meta[:n],
        rejects=[r for r in batch.rejects if r.row < cut],
        text_bytes=batch.text_bytes * n // len(batch),
    ), False
