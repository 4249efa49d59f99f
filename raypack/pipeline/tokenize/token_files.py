"""Staged token files: one Arrow IPC file a work unit (schema.TOKENIZED), its cache key, its rejects
beside it, and how a finished one is told from an unfinished one. Written by the tokenize task,
read by the assign, select and sharded tasks (and reused by a rebuild: raypack.pipeline.rebuild).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from raypack import schema
from raypack.config import JobConfig, Reading, StorageConfig
from raypack.corpus.readers import READ_VERSION
from raypack.corpus.units import WorkUnit
from raypack.errors import JobError
from raypack.paths import is_uri
from raypack.storage import exists, resolve
from raypack.text.backends import Choice
from raypack.text.chat import RENDER_VERSION, ChatTemplate
from raypack.text.encode import PIECE_CHARS
from raypack.text.tokenizer import LoadedTokenizer

__all__ = [
    "DONE",
    "STAGED_OPTIONS",
    "TOKEN_FORMAT",
    "Checksum",
    "MappedTokens",
    "cached_metadata_file",
    "cached_rejects_file",
    "read_finished",
    "read_tokens",
    "reading_key",
    "seal",
    "staged_options",
    "token_batches",
    "token_key",
    "token_settings",
    "tokenizer_library",
]

# Staged token files are Arrow IPC files (record batches as the units wrote them), read back by
# raypack alone, whole or by columns, compressed or not (the reader finds out). 9.8M tokens (6 units
# of 6.25 MB of text), written and read: Parquet (lz4, no dictionary, no statistics) 0.121 s and
# 0.057 s, Arrow IPC 0.074 s and 0.020 s, the same 12.7 MB; uncompressed 0.032 s and 0.005 s but
# 39 MB. lz4 frames (STAGED_OPTIONS) where the bytes move over a network or stay (object storage, a
# rebuild's cache); none in the job's own staging area on a local disk, removed at the end
# (staged_options): ~0.8 s less of a 500 MB job's tokenize stage on 2 cores.
STAGED_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
_UNCOMPRESSED = pa.ipc.IpcWriteOptions(compression=None)
# One thread a task: a worker holds one CPU (decompression would spread over the Arrow pool's).
STAGED_READ = pa.ipc.IpcReadOptions(use_threads=False)
STAGED_DOCS = pa.ipc.IpcReadOptions(
    use_threads=False,
    included_fields=[schema.TOKENIZED.get_field_index(n) for n in ("row", "file", "doc_id", "length")],
)
# Bump when the token file layout or what goes into a key changes: old cache entries then miss
# (`git log -G'TOKEN_FORMAT ='` says what each bump covered).
TOKEN_FORMAT = 5
# Completion key, on the last record batch (empty), written last: a token file without it is
# unfinished (see TokenizeShards._tokenize). Its value: {"rejects": rows of the rejects file,
# "records": input records they stand for, "lost_files": files (or rests of files) that could not
# be read, "trained": trained tokens, and how its long texts were encoded: "long_texts", "cuts",
# "cuts_refused", "long_whole", "cut_rule" (TokenizeShards._long_texts; absent from files written
# before each was kept), and
# "crc32": each column's Checksum (absent from files written before: not checked)}.
DONE = b"raypack.rejects"
_DONE_KEYS = {"rejects", "records", "lost_files"}  # in every completion key (TOKEN_FORMAT 4 on)


def token_settings(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    reading: Reading,
    backend: Choice | None = None,
    template: ChatTemplate | None = None,
) -> dict[str, Any]:
    """Everything besides the shard's bytes that decides its token file: a change in any of these must
    re-tokenize (a rebuild reuses a cached file only when all of them and the shard are unchanged).
    How the file is read (its source's Reading: format, fields, input.empty, max_document_bytes) and
    the readers' code version; PIECE_CHARS, where a long text is cut for encoding (its tokens may
    differ at a cut with no space). The library that encodes, by name and version: an upgrade may
    change ids (a rebuild must not mix old and new); the backend that encodes, by name and version.
    Chat data: pack.loss, the template's text and everything it renders with (RENDER_VERSION, the
    special tokens it sees, the date it prints) decide the ids and the mask."""
    chat: dict[str, Any] | None = None
    if reading.chat:
        if reading.chat == "messages" and template is None:
            raise ValueError("token_settings for conversations needs the job's chat template")
        chat = {"loss": cfg.loss, "render_version": RENDER_VERSION}
        if template is not None:
            chat |= template.key()
    tails = None
    if cfg.pack.algorithm == "decompose" and (cfg.pack.min_seq_len or 1) > 1:
        # decompose's tails are rejects beside the token file (TokenizeShards._tails). In the key only
        # where it leaves tokens out: every other job keys its units as before.
        p = cfg.pack
        tails = {"decompose": {"seq_len": p.seq_len, "min_seq_len": p.min_seq_len, "overflow": p.overflow}}
    return {
        **(tails or {}),
        "chat": chat,
        "token_format": TOKEN_FORMAT,
        "read_version": READ_VERSION,
        "library": tokenizer_library(),
        "backend": backend.label if backend is not None else None,
        "reading": reading_key(reading),
        "piece_chars": PIECE_CHARS,
        "tokenizer_sha256": tok.sha256,
        "bos_id": tok.bos_id if cfg.tokenizer.add_bos and reading.chat != "messages" else None,
        "eos_id": tok.eos_id if cfg.tokenizer.add_eos and reading.chat != "messages" else None,
    }


# Reading's fields added after token files were first keyed. Each enters the key only where it is
# set (not its default), so that a config that sets none of them keys its units as before they
# existed: every token store of an earlier raypack stays valid (tests/pipeline/test_fields.py holds
# a key computed before them). metadata_fields decides no token, but an entry's metadata file
# (cached_metadata_file) holds what it names, and an entry is its files together.
NEW_READING_FIELDS = ("text_fields", "text_separator", "metadata_fields")


def reading_key(reading: Reading) -> dict[str, Any]:
    """The Reading as a token file's key holds it: its fields, but those of NEW_READING_FIELDS
    left at their default (text_separator too where no text_fields are joined)."""
    key = dataclasses.asdict(reading)
    defaults = {f.name: f.default for f in dataclasses.fields(Reading)}
    for name in NEW_READING_FIELDS:
        if key[name] == defaults[name] or (name == "text_separator" and not reading.text_fields):
            del key[name]
    return key


def tokenizer_library() -> str:
    import tokenizers

    return f"tokenizers {tokenizers.__version__}"


def token_key(unit: WorkUnit, settings: dict[str, Any], content: list[str] | None = None) -> str:
    """Key of a unit's token file: its files' relative paths (document ids contain them), what the
    files hold, its range within its file (a unit of a large file) and the settings. What they hold:
    `content`, each file's digest (raypack.dataset.store.file_digest: a token store's keys, the
    same wherever the file lies and whenever it was written), else their sizes and modification
    times (a job's own staging area, which no other job reads)."""
    files = unit.files
    fingerprint: dict[str, Any] = {"relpath": [s.relpath for s in files]}
    if content is not None:
        fingerprint["content"] = content
    else:
        fingerprint |= {"size": [s.size for s in files], "mtime_ns": [s.mtime_ns for s in files]}
    fingerprint |= unit.entry(rows=False)
    fingerprint.update(settings)
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:32]


def staged_options(path: str) -> pa.ipc.IpcWriteOptions:
    """How the token file at `path` is written: uncompressed on a local disk (a job's staging area,
    or a local token store), where every task maps it and reads its tokens in place (the write
    tasks of a local run place items straight from it: MappedTokens); lz4 (STAGED_OPTIONS) on
    object storage, where its bytes move over a network. 500 MB of text with a 128k BPE: 540 MB
    of token files uncompressed, 159 MB with lz4."""
    return STAGED_OPTIONS if is_uri(path) else _UNCOMPRESSED


def token_batches(path: str, storage: StorageConfig | None) -> Iterator[pa.RecordBatch]:
    """A finished token file's record batches (schema.TOKENIZED) in the order they were written,
    the empty completion batch left out."""
    fs, inner = resolve(path, storage)
    # A local file is mapped: an uncompressed one's batches are then views of the page cache, not
    # copies into fresh memory (what the kernel's page faults make slow).
    with fs.open_input_file(inner) if is_uri(path) else pa.memory_map(inner) as f:
        try:
            reader = pa.ipc.open_file(f, options=STAGED_READ)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                if batch.num_rows:
                    yield batch
        except pa.ArrowInvalid as e:  # a token store's entry damaged since it was written
            raise JobError(
                f"token file {path} is damaged ({str(e).splitlines()[0]}): delete it and its "
                ".rejects.parquet, and run again"
            ) from None


class MappedTokens:
    """Every token of some units' token files as they lie in the page cache (local, uncompressed
    files mapped: nothing is read into the heap), for a write task that places items by (unit,
    start) (schema.ITEMS' source and start): `values` a buffer a record batch, and where each
    unit's batches begin among them. The maps stay open until close()."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.values: list[np.ndarray] = []
        self._first: dict[int, int] = {}
        self._starts: dict[int, np.ndarray] = {}
        self._maps: list[pa.MemoryMappedFile] = []
        for unit, path in sorted(paths.items()):
            mapped = pa.memory_map(path)
            self._maps.append(mapped)
            reader = pa.ipc.open_file(mapped, options=STAGED_READ)
            self._first[unit] = len(self.values)
            starts = [0]
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                if batch.num_rows:
                    values = batch.column(batch.schema.get_field_index("tokens")).values.to_numpy()
                    self.values.append(values)
                    starts.append(starts[-1] + len(values))
            self._starts[unit] = np.asarray(starts, dtype=np.int64)

    def locate(self, unit: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For items (unit, start): the index of the buffer in `values` each lies in, and its first
        token's position there (an item never spans two record batches)."""
        buffer = np.empty(len(unit), dtype=np.int64)
        src = np.empty(len(unit), dtype=np.int64)
        for u in np.unique(unit).tolist():
            at = np.flatnonzero(unit == u)
            starts = self._starts[u]
            batch = np.searchsorted(starts, start[at], side="right") - 1
            buffer[at] = self._first[u] + batch
            src[at] = start[at] - starts[batch]
        return buffer, src

    def close(self) -> None:
        self.values.clear()
        for mapped in self._maps:
            mapped.close()
        self._maps.clear()


def read_tokens(path: str, storage: StorageConfig | None) -> pa.Table:
    """A finished token file, whole."""
    return pa.Table.from_batches(list(token_batches(path, storage)), schema=schema.TOKENIZED)


def cached_rejects_file(token_path: str) -> str:
    """The rejects file beside a token file (a finished token file always has it when it has rejects)."""
    return token_path.removesuffix(".arrow") + ".rejects.parquet"


def cached_metadata_file(token_path: str) -> str:
    """The metadata file beside a token file (input.metadata_fields: a finished token file of a
    Reading that keeps some always has it): its documents' kept fields, a row each, in order."""
    return token_path.removesuffix(".arrow") + ".metadata.parquet"


class Checksum:
    """CRC-32s of each column of a token file's documents as they read back, whatever their record
    batches: a stream each of a column's nulls, its lengths (a list's or a string's, not its
    offsets) and the values they span, so that a batch's end changes none. Its writer folds in
    each table it writes, and the completion key keeps the result (DONE's "crc32"), which a
    finished local file must match before it is used (matches). A store's entry damaged in place
    (4 KiB zeroed would otherwise pack 1,024 wrong ids, which `verify` passes) is then tokenized
    again. ISA-L's crc32 runs ~13 GB/s on a core: a 500 MB corpus's 750 MB of tokens in ~0.06 s."""

    def __init__(self) -> None:
        self.crcs: list[dict[str, int]] = [{} for _ in schema.TOKENIZED]

    def add(self, data: pa.Table | pa.RecordBatch) -> None:
        from isal import isal_zlib

        for i, column in enumerate(data.columns):
            crcs = self.crcs[i]
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            for chunk in chunks:
                for kind, part in _canonical(chunk, ""):
                    crcs[kind] = isal_zlib.crc32(part, crcs.get(kind, 0))

    def matches(self, path: str) -> bool:
        """A local finished token file's documents have these checksums."""
        again = Checksum()
        with pa.memory_map(path) as mapped:
            reader = pa.ipc.open_file(mapped, options=STAGED_READ)
            for i in range(reader.num_record_batches):
                again.add(reader.get_batch(i))
        return again.crcs == self.crcs


def _canonical(array: pa.Array, kind: str) -> list[tuple[str, Any]]:
    """The bytes a column's chunk is checked by, by stream: which documents' values are null, a
    list's or a string's lengths, and the values they span (a token list's values are never null)."""
    parts: list[tuple[str, Any]] = []
    if not len(array):
        return parts
    if not kind:  # a byte a document, every chunk (one without nulls too, so that chunks do not count)
        parts.append(("nulls", array.is_null().to_numpy(zero_copy_only=False).view(np.uint8)))
    if pa.types.is_list(array.type) or pa.types.is_string(array.type):
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[
            array.offset : array.offset + len(array) + 1
        ]
        parts.append((f"{kind}lengths", np.diff(offsets).astype(np.int32)))
        if pa.types.is_string(array.type):
            parts.append((f"{kind}values", memoryview(array.buffers()[2])[offsets[0] : offsets[-1]]))
        else:
            values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
            parts += _canonical(values, f"{kind}values.")
    else:
        parts.append((f"{kind}values", array.to_numpy(zero_copy_only=False)))
    return parts


def read_finished(path: str, storage: StorageConfig | None) -> tuple[pa.Table, dict[str, Any]] | None:
    """A finished token file's documents (row, doc_id, length) and reject counts (DONE); None when
    there is none (absent, cut short by a killed writer, or closed without its completion key by
    an error)."""
    if not exists(path, storage):
        return None
    fs, inner = resolve(path, storage)
    try:
        with fs.open_input_file(inner) as f:
            reader = pa.ipc.open_file(f, options=STAGED_DOCS)
            if not reader.num_record_batches:
                return None
            meta = reader.get_batch_with_custom_metadata(reader.num_record_batches - 1).custom_metadata
            if meta is None or DONE not in meta:
                return None
            docs = reader.read_all()
    except pa.ArrowInvalid:  # no footer: a local file whose writer was killed
        return None
    except OSError:
        # A local file damaged since (pyarrow's "Invalid flatbuffers message" is an OSError): not
        # finished as far as anyone can tell. On object storage an OSError may be the network's:
        # raised, for the task's retries.
        if is_uri(path):
            raise
        return None
    try:
        lost = json.loads(meta[DONE])
    except ValueError:  # its completion key damaged since: not finished as far as anyone can tell
        return None
    if not isinstance(lost, dict) or not lost.keys() >= _DONE_KEYS or not _key_sound(lost, path):
        return None
    if "crc32" in lost and not is_uri(path):
        # A local entry is checked whole (its pages are read by the write tasks anyway). One on
        # object storage is not read for it: the store checks what it is given, and an object is
        # replaced whole or not at all.
        expected = Checksum()
        try:
            expected.crcs = [{str(k): int(v) for k, v in c.items()} for c in lost["crc32"]]
            if not expected.matches(inner):
                return None
        except Exception:  # unreadable since (damage in its metadata), or a key that is no checksum
            return None
    return docs, lost


def seal(lost: dict[str, Any], path: str) -> dict[str, Any]:
    """A completion key made whole: the entry's own name (an entry moved to another's name is not
    that entry: two swapped would pack one shard's documents twice and another's not at all) and a
    CRC-32 of the rest (an edited count: "rejects" set to 0 would lose the rejects silently)."""
    named = {**lost, "name": _entry_name(path)}
    return {**named, "key_crc32": _key_crc(named)}


def _key_crc(lost: dict[str, Any]) -> int:
    from isal import isal_zlib

    body = {k: v for k, v in lost.items() if k != "key_crc32"}
    return int(isal_zlib.crc32(json.dumps(body, sort_keys=True).encode()))


def _key_sound(lost: dict[str, Any], path: str) -> bool:
    """A completion key is this entry's, and as written (keys written before `seal` pass)."""
    if "name" in lost and lost["name"] != _entry_name(path):
        return False
    return "key_crc32" not in lost or lost["key_crc32"] == _key_crc(lost)


def _entry_name(path: str) -> str:
    """A token file's name, its key (token_key) and suffix, local path or URI alike."""
    return path.rstrip("/").rsplit("/", 1)[-1]
