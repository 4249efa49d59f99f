"""Stage 1, read: stream one input shard as documents, recording every record that is not one.

We read shards ourselves (through pyarrow filesystems, compression detected from the suffix) rather
than with Ray Data's read_json: a bad line must become a recorded reject, not fail the whole file;
generated ids need the line number; and reading inside the tokenizer actor streams a shard in batches
of `batch_size` documents, so no shard is ever held whole in memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from isal import isal_zlib

from raypack.config import InputConfig, StorageConfig
from raypack.errors import ConfigError
from raypack.storage import Shard, expand_inputs, resolve

__all__ = [
    "COMPRESSED_SUFFIXES",
    "Batch",
    "Reject",
    "input_files",
    "read_shard",
    "scan_range",
    "unit_entry",
    "unit_from_entry",
    "work_units",
]

RAW_PREFIX = 200
# A batch ends at batch_size documents or this much text, whichever comes first. tokenizers keeps
# ~100 bytes per token in an Encoding (ids, offsets, token strings, masks), so a batch bounded by
# count alone grows with the longest documents it happens to meet: the tokenizer actor's peak then
# rose with the corpus (629 → 925 MiB from 50 to 200 MB, benchmarks/bench_job.py). With 4 MiB the
# actor's peak still rose ×1.20 from 50 to 200 MB (the worst batch met grows with the batches met);
# 1 MiB (~250k tokens, ~35 MB of Encodings) encodes as fast on two cores (0.557 against 0.549
# Mtok/s for two processes, measured side by side).
MAX_BATCH_BYTES = 1 << 20
_CHUNK = 256 << 10  # small enough that a corrupt stream loses at most this much before the break


@dataclass(frozen=True, slots=True)
class Reject:
    row: int
    reason: str
    raw: str
    records: int = 1
    """Input records this reject stands for: 1 for a bad record; for a lost file (or the unread rest
    of one), its rows as its Parquet footer counts them, or 1 (at least) where nothing says more."""
    lost_file: bool = False
    """A whole file, or its rest, could not be read: a corpus problem, not a bad record. The job
    fails on one unless input.max_lost_files allows it."""


@dataclass(slots=True)
class Batch:
    rows: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    texts: list[Any] = field(default_factory=list)
    """Each document's text (str), or for chat data its Chat."""
    rejects: list[Reject] = field(default_factory=list)
    text_bytes: int = 0

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: int, doc_id: str, text: Any, size: int | None = None) -> None:
        """`text`: the document's text, or for chat data (input.messages_field / prompt_field) its
        Chat record, rendered and masked by the tokenize stage (raypack.chat)."""
        self.rows.append(row)
        self.ids.append(doc_id)
        self.texts.append(text)
        self.text_bytes += len(text) if size is None else size

    def full(self, batch_size: int) -> bool:
        return len(self.rows) >= batch_size or self.text_bytes >= MAX_BATCH_BYTES


def read_shard(
    shard: Shard, cfg: InputConfig, batch_size: int, storage: StorageConfig | None = None
) -> Iterator[Batch]:
    """Documents of one shard in batches of up to `batch_size`; rejects ride along with the batch in
    which they were met (a batch may hold only rejects).

    Bad data (a bad record, a truncated or corrupt compressed stream, a file that is not Parquet)
    becomes a Reject. A storage failure (network, permissions) is raised as the OSError it is: it
    says nothing about the data; the task that met it is retried (job._from_items), then the job fails."""
    fs, inner = resolve(shard.path, storage)
    cfg = cfg.of(shard.source)  # a source's own format and fields
    if cfg.format == "jsonl":
        yield from _read_jsonl(fs, inner, shard, cfg, batch_size)
    elif cfg.format == "parquet":
        yield from _read_parquet(fs, inner, shard, cfg, batch_size)
    elif cfg.format == "text":
        yield _read_text(fs, inner, shard, cfg)
    else:
        raise ValueError(f"unknown input format {cfg.format!r}")


# How pyarrow words a broken compressed stream (it raises OSError, as for a lost connection).
_CORRUPT_STREAM = ("Truncated compressed stream", "inflate failed", "decompress", "Corrupt", "corrupt")


def input_files(cfg: InputConfig, storage: StorageConfig | None = None) -> list[Shard]:
    """Every input file, numbered in order: input.paths' (storage.expand_inputs), or each source's,
    sources by name, a source's files relative to its root under `<name>/` (so ids never collide
    and listing sources in another order changes nothing). A file two sources both match is a
    ConfigError: its documents would be counted twice."""
    if not cfg.sources:
        return expand_inputs(cfg.paths, cfg.root, storage)
    files: list[Shard] = []
    owner: dict[str, str] = {}
    for source in sorted(cfg.sources, key=lambda s: s.name):
        one = cfg.of(source.name)
        try:
            found = expand_inputs(one.paths, one.root, storage)
        except ConfigError as e:
            raise ConfigError(f"input.sources[{source.name}]: {e}") from None
        for f in found:
            if f.path in owner:
                raise ConfigError(
                    f"{f.path} matches the paths of sources {owner[f.path]} and {source.name}: a file "
                    "belongs to one source"
                )
            owner[f.path] = source.name
            relpath = f"{source.name}/{f.relpath}"
            files.append(dataclasses.replace(f, index=len(files), relpath=relpath, source=source.name))
    return files


def work_units(
    shards: list[Shard],
    cfg: InputConfig,
    storage: StorageConfig | None = None,
    scan: Callable[[list[tuple[Shard, int, int]]], list[tuple[int, int]]] | None = None,
) -> list[Shard]:
    """The tokenize stage's work units, numbered in order: every file whole, but a file larger than
    input.unit_bytes in units of about that many bytes: a Parquet file as runs of consecutive row
    groups, from its footer (one ranged read a file); an uncompressed JSONL file as byte ranges that
    begin at line starts. Ids are `path:line`, so a JSONL unit must know how many lines come before
    it: `scan` maps scan_range over (file, start, stop) ranges that tile each such file (default:
    one after another, here; the job runs them as Ray tasks), reading those files once more, at the
    speed of storage (GB/s locally; tokenizing runs at ~1 MB/s a core). The same inputs give the same
    units on every machine, so the units' indices name the index and rejects files. A footer that
    cannot be read leaves the file whole: its reader records the reject."""
    _check_unit_count(shards, cfg)
    nominal = {s.index: _nominal(s.size, cfg.unit_bytes) for s in shards if _splits_by_bytes(s, cfg)}
    ranges = [(s, a, b) for s in shards for a, b in nominal.get(s.index, [])]
    if scan is None:
        scanned = [scan_range(s, a, b, storage) for s, a, b in ranges]
    else:
        scanned = scan(ranges) if ranges else []
    found: dict[int, list[tuple[int, int]]] = {}
    for (s, _, _), result in zip(ranges, scanned, strict=True):
        found.setdefault(s.index, []).append(result)
    units: list[Shard] = []
    for shard in shards:
        pieces = [(0, -1, 0)]
        if cfg.of(shard.source).format == "parquet" and shard.size > cfg.unit_bytes:
            pieces = _row_group_runs(shard, cfg.unit_bytes, storage) or pieces
        elif shard.index in nominal:
            pieces = _line_ranges(shard.size, nominal[shard.index], found[shard.index]) or pieces
        for start, stop, first_row in pieces:
            units.append(
                dataclasses.replace(
                    shard, index=len(units), unit_start=start, unit_stop=stop, first_row=first_row
                )
            )
    return units


# Work units that splitting files may make in all (files kept whole are not counted: a corpus of many
# files is fine). Each is a task, a token file, an index file: input.unit_bytes=256 cut a 1 GB file
# into ~4M of them.
MAX_SPLIT_UNITS = 100_000


def _check_unit_count(shards: list[Shard], cfg: InputConfig) -> None:
    """ConfigError, before any work, when input.unit_bytes would cut the uncompressed JSONL files into
    more than MAX_SPLIT_UNITS byte ranges. (A Parquet file makes at most one unit a row group, which
    its writer bounded.)"""
    splits = [s.size for s in shards if _splits_by_bytes(s, cfg)]
    units = sum(-(-size // cfg.unit_bytes) for size in splits)
    if units > MAX_SPLIT_UNITS:
        least = -(-sum(splits) // MAX_SPLIT_UNITS)
        raise ConfigError(
            f"input.unit_bytes={cfg.unit_bytes:,} would cut {len(splits):,} files into {units:,} work "
            f"units (a task and files each), over {MAX_SPLIT_UNITS:,}: set input.unit_bytes >= {least:,} "
            f"(the default is {256 << 20:,})"
        )


def unit_entry(shard: Shard, fmt: str, rows: bool = True) -> dict[str, Any]:
    """What names a work unit within its file, for the manifest (with its first row: verify rebuilds
    the units from it) and the token cache key (without: the range fixes it); {} for a whole file."""
    if not shard.split:
        return {}
    kind = "row_groups" if fmt == "parquet" else "bytes"
    entry: dict[str, Any] = {kind: [shard.unit_start, shard.unit_stop]}
    return entry | ({"first_row": shard.first_row} if rows else {})


def unit_from_entry(file: Shard, index: int, entry: dict[str, Any]) -> Shard:
    """The work unit numbered `index` of `file`, from its manifest entry (unit_entry's inverse)."""
    start, stop = entry.get("row_groups") or entry.get("bytes") or (0, -1)
    return dataclasses.replace(
        file, index=index, unit_start=start, unit_stop=stop, first_row=entry.get("first_row", 0)
    )


# What pyarrow's compression="detect" decompresses (by suffix): a compressed stream can only be read
# from its start, so it stays one unit whatever its size.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".lz4", ".zst")
_SCAN_CHUNK = 8 << 20  # one ranged read (a GET on S3) in scan_range; 8 MiB keeps a GET's latency small


def _splits_by_bytes(shard: Shard, cfg: InputConfig) -> bool:
    compressed = shard.path.endswith(COMPRESSED_SUFFIXES)
    return cfg.of(shard.source).format == "jsonl" and shard.size > cfg.unit_bytes and not compressed


def _nominal(size: int, unit_bytes: int) -> list[tuple[int, int]]:
    """Equal byte ranges that tile [0, size), none over unit_bytes."""
    count = -(-size // unit_bytes)
    cuts = [k * size // count for k in range(count + 1)]
    return list(itertools.pairwise(cuts))


def scan_range(shard: Shard, start: int, stop: int, storage: StorageConfig | None = None) -> tuple[int, int]:
    """(newlines in bytes [start, stop), the first line start at or after `start`) of a file: a line
    starts at 0 and after every newline; the file's size if none does. Reads [start - 1, stop), and
    past stop only while no line has started (a line longer than the range)."""
    fs, inner = resolve(shard.path, storage)
    with fs.open_input_file(inner) as f:
        line_start = 0 if start == 0 else None
        if start > 0:
            f.seek(start - 1)
            if f.read(1) == b"\n":
                line_start = start
        newlines, pos = 0, start
        while chunk := f.read(_SCAN_CHUNK if pos >= stop else min(_SCAN_CHUNK, stop - pos)):
            inside = chunk if pos + len(chunk) <= stop else chunk[: max(0, stop - pos)]
            newlines += inside.count(b"\n")
            if line_start is None and (q := chunk.find(b"\n")) >= 0:
                line_start = pos + q + 1
            pos += len(chunk)
            if pos >= stop and line_start is not None:
                break
    return newlines, pos if line_start is None else line_start


def _line_ranges(
    size: int, nominal: list[tuple[int, int]], scanned: list[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """(first byte, end byte, lines before) of each unit of a JSONL file from its scanned nominal
    ranges: unit k runs from the first line start at or after nominal start a_k to the next unit's
    start. The lines before it are the newlines before a_k, plus one when the unit starts later (the
    newline that ends the line running through a_k). [] when that leaves a single unit."""
    units, before = [], 0
    starts = [line_start for _, line_start in scanned] + [size]
    for k, ((a, _), (newlines, _)) in enumerate(zip(nominal, scanned, strict=True)):
        if starts[k] < starts[k + 1]:
            units.append((starts[k], starts[k + 1], before + (starts[k] > a)))
        before += newlines
    return units if len(units) > 1 else []


def _row_group_runs(
    shard: Shard, unit_bytes: int, storage: StorageConfig | None
) -> list[tuple[int, int, int]]:
    """(first row group, end row group, first row) of each unit of a large Parquet file; [] if its
    footer is unreadable or it has one row group."""
    fs, inner = resolve(shard.path, storage)
    try:
        with fs.open_input_file(inner) as f:
            meta = pq.ParquetFile(f).metadata
    except (OSError, pa.ArrowInvalid) as e:
        if not _is_bad_data(e):
            raise
        return []
    if meta.num_row_groups < 2:
        return []
    runs, start, size, row, first_row = [], 0, 0, 0, 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size += sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        row += group.num_rows
        if size >= unit_bytes or i == meta.num_row_groups - 1:
            runs.append((start, i + 1, first_row))
            start, size, first_row = i + 1, 0, row
    return runs if len(runs) > 1 else []


def _is_bad_data(e: BaseException) -> bool:
    """True for errors that describe the bytes (record them as rejects), False for storage failures."""
    if isinstance(e, (pa.ArrowInvalid, EOFError, UnicodeDecodeError)):
        return True
    return isinstance(e, OSError) and any(m in str(e) for m in _CORRUPT_STREAM)


def _raw(data: bytes | str) -> str:
    if isinstance(data, bytes):
        data = data[: RAW_PREFIX * 4].decode("utf-8", errors="replace")
    return data[:RAW_PREFIX]


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
            while chunk := stream.read(_CHUNK):
                yield chunk
        return
    with fs.open_input_file(inner) as f:
        f.seek(shard.unit_start)
        left = shard.unit_stop - shard.unit_start
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):
            left -= len(chunk)
            yield chunk


# isal's stub declares its error class as an instance of Exception.
_INFLATE_ERROR: type[Exception] = isal_zlib.error  # type: ignore[assignment]


def _gunzip(stream: Any) -> Iterator[bytes]:
    """A gzip file's bytes, every member of it, in pieces of at most _CHUNK, inflated by ISA-L (isal):
    80 gzipped shards of 6.25 MB of text inflate in ~0.65 s less of a core than through Arrow's
    zlib (0.049 s against 0.096 for six). Damage raises what Arrow's stream raises, so that
    _is_bad_data makes it the same reject: OSError("Truncated compressed stream") for a cut file,
    OSError("... inflate failed: ...") for corrupt bytes or garbage after the last member."""
    inflate = isal_zlib.decompressobj(31)  # 31: a gzip header and trailer (CRC and size checked)
    member = False  # inside a member: input was given to `inflate` and its end not reached
    while data := stream.read(_CHUNK):
        while data:
            try:
                out = inflate.decompress(data, _CHUNK)
            except _INFLATE_ERROR as e:
                raise OSError(f"gzip inflate failed: {e}") from None
            member = True
            if out:
                yield out
            if inflate.eof:  # the member ended; another may start in what is left
                data, member = inflate.unused_data, False
                inflate = isal_zlib.decompressobj(31)
            else:
                data = inflate.unconsumed_tail
        while member and not inflate.eof and (out := inflate.decompress(b"", _CHUNK)):
            yield out  # output held back by the _CHUNK limit once the input ran out
    if member and not inflate.eof:
        raise OSError("Truncated compressed stream")


def _lines(
    chunks: Iterator[bytes], max_bytes: int, lineno: int = 0
) -> Iterator[tuple[int, bytes | Oversize]]:
    """(line number, line) for every line, numbered on from `lineno`; a line of more than `max_bytes`
    comes as an Oversize. A line spread over many chunks is joined once at its end (joining chunk by
    chunk would copy a 100 MB line ~400 times)."""
    pending: list[bytes] = []
    pending_size = 0
    oversize: Oversize | None = None  # the line being skipped
    for chunk in chunks:
        parts = chunk.split(b"\n")
        for i, part in enumerate(parts):
            if oversize is not None:
                oversize = Oversize(oversize.prefix, oversize.size + len(part))
            elif pending_size + len(part) > max_bytes:
                head = b"".join([*pending, part[: RAW_PREFIX * 4]])[: RAW_PREFIX * 4]
                oversize = Oversize(head, pending_size + len(part))
                pending, pending_size = [], 0
            else:
                pending.append(part)
                pending_size += len(part)
            if i == len(parts) - 1:
                break  # the chunk's last part goes on in the next chunk
            lineno += 1
            if oversize is not None:
                yield lineno, oversize
                oversize = None
            else:
                yield lineno, pending[0] if len(pending) == 1 else b"".join(pending)
            pending, pending_size = [], 0
    if oversize is not None:
        yield lineno + 1, oversize
    elif pending_size:
        yield lineno + 1, b"".join(pending)


def _read_jsonl(
    fs: pafs.FileSystem, inner: str, shard: Shard, cfg: InputConfig, batch_size: int
) -> Iterator[Batch]:
    batch = Batch()
    last = shard.first_row
    limit = cfg.max_document_bytes
    try:
        for lineno, line in _lines(_chunks(fs, inner, shard), limit, shard.first_row):
            last = lineno
            if isinstance(line, Oversize):
                reason = f"record of {line.size} bytes, over input.max_document_bytes ({limit})"
                batch.rejects.append(Reject(lineno, reason, _raw(line.prefix)))
                continue
            if not line.strip():
                continue  # a blank line is not a record
            doc = _parse_json_line(line, lineno, cfg, shard.relpath, batch)
            if doc is not None:
                batch.add(lineno, doc[0], doc[1], len(line))
            if batch.full(batch_size):
                yield batch
                batch = Batch()
    except (OSError, pa.ArrowInvalid, EOFError) as e:
        if not _is_bad_data(e):
            raise
        # A truncated or corrupt compressed stream: keep what was read, record where it broke. How
        # many records the rest held is unknown: at least one.
        reason = f"unreadable shard after line {last}: {_one_line(e)}"
        batch.rejects.append(Reject(last + 1, reason, "", lost_file=True))
    if len(batch) or batch.rejects:
        yield batch


def _parse_json_line(
    line: bytes, lineno: int, cfg: InputConfig, relpath: str, batch: Batch
) -> tuple[str, str] | None:
    default_id = f"{relpath}:{lineno}"
    if not cfg.chat:
        # orjson first: half json's time with the decode (39 MB of JSONL: 0.034 s against 0.063).
        # It reads fewer lines than json (NaN, lone surrogate escapes, nesting over 1,024) and reads
        # an integer over 64 bits as a float; such lines, lines that are not objects and records
        # whose text or id came out a float go the json way below, so that documents, ids and
        # rejects' reasons are json's whichever parser read the line.
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
        else:
            if isinstance(record, dict) and not any(
                type(record.get(f)) is float for f in (cfg.text_field, cfg.id_field) if f is not None
            ):
                return _document(record, lineno, cfg, default_id, batch, line)
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
    except RecursionError:  # json's parser recurses once a level: [[[[...
        batch.rejects.append(Reject(lineno, "malformed JSON: nested too deeply", _raw(decoded)))
        return None
    if not isinstance(record, dict):
        batch.rejects.append(Reject(lineno, f"not a JSON object but {type(record).__name__}", _raw(decoded)))
        return None
    return _document(record, lineno, cfg, default_id, batch, decoded)


@dataclass(frozen=True, slots=True)
class Chat:
    """One record of chat data: a conversation (messages, and the tools it may call) or a
    prompt/completion pair."""

    messages: tuple[dict[str, Any], ...] = ()
    tools: Any = None
    prompt: str = ""
    completion: str = ""

    def __len__(self) -> int:  # characters, for batch sizing
        if self.messages:
            return sum(len(str(m.get("content") or "")) for m in self.messages)
        return len(self.prompt) + len(self.completion)


def _chat(
    record: dict[str, object], row: int, cfg: InputConfig, batch: Batch, raw: bytes | str
) -> Chat | None:
    """The record's Chat, or None with a reject recorded (missing or mistyped fields, no messages)."""

    def reject(reason: str) -> Chat | None:
        batch.rejects.append(Reject(row, reason, _raw(raw)))
        return None

    if cfg.messages_field is not None:
        field_name = cfg.messages_field
        messages = record.get(field_name)
        if messages is None:
            return reject(f"missing messages field {field_name!r}")
        if not isinstance(messages, list):
            return reject(f"messages field {field_name!r} is {type(messages).__name__}, not a list")
        if not messages:
            return reject("empty conversation")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return reject(f"message {i} of {field_name!r} is not an object with a string role")
        tools = record.get("tools")
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError:
                return reject("tools is a string but not JSON")
        return Chat(messages=tuple(messages), tools=tools)
    prompt, completion = record.get(cfg.prompt_field or ""), record.get(cfg.completion_field or "")
    for name, value in ((cfg.prompt_field, prompt), (cfg.completion_field, completion)):
        if value is None:
            return reject(f"missing field {name!r}")
        if not isinstance(value, str):
            return reject(f"field {name!r} is {type(value).__name__}, not a string")
    return Chat(prompt=str(prompt), completion=str(completion))


def _document(
    record: dict[str, object], row: int, cfg: InputConfig, default_id: str, batch: Batch, raw: bytes | str
) -> tuple[str, Any] | None:
    text_field = cfg.text_field
    if cfg.chat:
        chat = _chat(record, row, cfg, batch, raw)
        if chat is None:
            return None
        if len(chat) > cfg.max_document_bytes:  # parquet: a cell over the limit (jsonl lines never get here)
            limit = cfg.max_document_bytes
            why = f"conversation of {len(chat)} characters, over input.max_document_bytes ({limit})"
            batch.rejects.append(Reject(row, why, _raw(raw)))
            return None
        return _with_id(record, row, cfg, default_id, batch, raw, chat)
    if text_field not in record or record[text_field] is None:
        batch.rejects.append(Reject(row, f"missing text field {text_field!r}", _raw(raw)))
        return None
    text = record[text_field]
    if not isinstance(text, str):
        batch.rejects.append(
            Reject(row, f"text field {text_field!r} is {type(text).__name__}, not a string", _raw(raw))
        )
        return None
    if (reason := _empty_reason(text, cfg)) is not None:
        batch.rejects.append(Reject(row, reason, _raw(raw)))
        return None
    if len(text) > cfg.max_document_bytes:  # parquet: a cell over the limit (jsonl lines never get here)
        reason = f"text of {len(text)} characters, over input.max_document_bytes ({cfg.max_document_bytes})"
        batch.rejects.append(Reject(row, reason, _raw(raw)))
        return None
    return _with_id(record, row, cfg, default_id, batch, raw, text)


def _with_id(
    record: dict[str, object],
    row: int,
    cfg: InputConfig,
    default_id: str,
    batch: Batch,
    raw: bytes | str,
    doc: Any,
) -> tuple[str, Any] | None:
    id_field = cfg.id_field
    if id_field is None:
        return default_id, doc
    doc_id = record.get(id_field)
    if doc_id is None or isinstance(doc_id, (dict, list)):
        batch.rejects.append(Reject(row, f"missing or non-scalar id field {id_field!r}", _raw(raw)))
        return None
    return str(doc_id), doc


def _read_parquet(
    fs: pafs.FileSystem, inner: str, shard: Shard, cfg: InputConfig, batch_size: int
) -> Iterator[Batch]:
    """A lost file or column counts as the rows its footer gives (the unit's rows for a unit of a
    split file; the whole file's, recorded once, in its first unit), so the reject ratio sees 100k
    lost records, not one."""
    text_field, id_field = cfg.text_field, cfg.id_field
    # A file split into work units (work_units) records a whole-file reject once, in its first unit.
    first_unit = shard.unit_start == 0
    try:
        pf = pq.ParquetFile(fs.open_input_file(inner))
    except (OSError, pa.ArrowInvalid) as e:
        if not _is_bad_data(e):
            raise
        if first_unit:
            reason = f"unreadable Parquet file: {_one_line(e)}"
            yield Batch(rejects=[Reject(-1, reason, "", lost_file=True)])
        return
    groups = None if shard.unit_stop < 0 else list(range(shard.unit_start, shard.unit_stop))
    meta = pf.metadata
    unit_rows = meta.num_rows if groups is None else sum(meta.row_group(g).num_rows for g in groups)
    names = pf.schema_arrow.names
    wanted = _chat_fields(cfg) if cfg.chat else [text_field]
    missing = [c for c in (*wanted, id_field) if c is not None and c not in names]
    if missing:
        reason = f"Parquet file has no column {missing[0]!r} (columns: {', '.join(names)})"
        if first_unit:
            yield Batch(rejects=[Reject(-1, reason, "", records=max(1, meta.num_rows), lost_file=True)])
        return
    if not cfg.chat:
        text_type = pf.schema_arrow.field(text_field).type
        if not _is_text(text_type):
            if first_unit:
                reason = f"column {text_field!r} is {text_type}, not a string"
                yield Batch(rejects=[Reject(-1, reason, "", records=max(1, meta.num_rows), lost_file=True)])
            return
    columns = wanted + ([id_field] if id_field else [])
    if cfg.messages_field is not None and "tools" in names and "tools" not in columns:
        columns.append("tools")
    row = shard.first_row
    try:
        for record_batch in pf.iter_batches(batch_size=batch_size, columns=columns, row_groups=groups):
            batch = Batch()
            if cfg.chat:  # conversations: a Python object a record (the template renders them anyway)
                for rec in record_batch.to_pylist():
                    doc = _document(rec, row, cfg, f"{shard.relpath}:{row}", batch, str(rec)[:1000])
                    if doc is not None:
                        batch.add(row, doc[0], doc[1])
                    row += 1
                yield batch
                continue
            texts = record_batch.column(text_field)
            if not pa.types.is_string(texts.type) and not pa.types.is_large_string(texts.type):
                texts = texts.cast(pa.large_string())  # dictionary-encoded or string_view (_is_text)
            ids = record_batch.column(id_field).to_pylist() if id_field else None
            for i, text in enumerate(texts.to_pylist()):
                record: dict[str, object] = {text_field: text}
                if ids is not None and id_field is not None:
                    record[id_field] = ids[i]
                doc = _document(record, row, cfg, f"{shard.relpath}:{row}", batch, text or "")
                if doc is not None:
                    batch.add(row, doc[0], doc[1])
                row += 1
            yield batch
    except (OSError, pa.ArrowInvalid) as e:
        if not _is_bad_data(e):
            raise
        lost = max(1, shard.first_row + unit_rows - row)
        reason = f"unreadable Parquet data after row {row - 1}: {_one_line(e)}"
        yield Batch(rejects=[Reject(row, reason, "", records=lost, lost_file=True)])


def _chat_fields(cfg: InputConfig) -> list[str]:
    if cfg.messages_field is not None:
        return [cfg.messages_field]
    return [str(cfg.prompt_field), str(cfg.completion_field)]


def _is_text(t: pa.DataType) -> bool:
    """A column raypack reads as text: string, large_string, string_view, or a dictionary of them
    (pyarrow writes categorical columns so)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _read_text(fs: pafs.FileSystem, inner: str, shard: Shard, cfg: InputConfig) -> Batch:
    batch = Batch()
    limit = cfg.max_document_bytes
    try:
        with fs.open_input_stream(inner, compression="detect") as f:
            data = f.read(limit + 1)
            size = 0  # the whole size, counted without holding it, when over the limit
            if len(data) > limit:
                size = len(data)
                while chunk := f.read(_CHUNK):
                    size += len(chunk)
                data = data[: RAW_PREFIX * 4]
    except (OSError, pa.ArrowInvalid) as e:
        if not _is_bad_data(e):
            raise
        batch.rejects.append(Reject(-1, f"unreadable file: {_one_line(e)}", ""))
        return batch
    if size:
        batch.rejects.append(
            Reject(0, f"file of {size} bytes, over input.max_document_bytes ({limit})", _raw(data))
        )
        return batch
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        batch.rejects.append(Reject(0, f"invalid UTF-8 at byte {e.start}", _raw(data)))
        return batch
    if (reason := _empty_reason(text, cfg)) is not None:
        batch.rejects.append(Reject(0, reason, _raw(text)))
        return batch
    batch.add(0, shard.relpath, text)
    return batch


def _empty_reason(text: str, cfg: InputConfig) -> str | None:
    """Why an empty or whitespace-only text is rejected, or None (not empty, or input.empty: keep)."""
    if text.strip() or cfg.empty == "keep":
        return None
    return "empty document" if not text else "whitespace-only document"


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
