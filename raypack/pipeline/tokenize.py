"""Stage 2, tokenize: TokenizeShards turns whole work units into staged token files (one Arrow IPC
file per unit, schema.TOKENIZED), plus a rejects file when needed. It runs on Ray tasks
(raypack.pipeline.tokenize_pool) in worker processes that load the tokenizer once (preload) and keep
one TokenizeShards from one unit of a run to the next (shards_for).

Documents are encoded by the backend the driver chose (raypack.pipeline.backends): `tokenizers`'
`encode_batch_fast(..., add_special_tokens=False)`, or fastokens where it proved the same ids. With
fastokens, a Checker re-encodes a seeded sample of each unit's pieces with `tokenizers` within a
fifth of the fast encoder's own time; a difference re-tokenizes the unit with `tokenizers`, and
every worker finishes the job on it (a marker in the staging area). The tokenizer's own template
(which may add BOS, CLS/SEP, ...) is off, so `add_bos` / `add_eos` alone decide what frames a document.
Tokens are computed once here; later stages only read these files.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import hashlib
import itertools
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.chat import (
    RENDER_VERSION,
    ChatTemplate,
    RenderError,
    load_template,
    pair_spans,
    template_variables,
    token_mask,
)
from raypack.config import JobConfig, Reading, StorageConfig, TokenizerConfig
from raypack.pipeline.backends import Choice, Encoder, FastokensEncoder, Mismatch, TokenizersEncoder
from raypack.pipeline.histogram import summarize_shard, summarize_shard_warm
from raypack.pipeline.readers import READ_VERSION, Batch, Chat, Reject, read_unit
from raypack.pipeline.tokenizer import LoadedTokenizer, load_tokenizer
from raypack.pipeline.units import WorkUnit, token_file
from raypack.storage import atomic_output, exists, join, open_output, read_bytes, resolve, write_bytes

__all__ = [
    "LoadedTokenizer",
    "TokenizeShards",
    "chat_template",
    "encode_chat",
    "encode_documents",
    "encode_flat",
    "forget",
    "load_tokenizer",
    "preload",
    "read_tokens",
    "reason_counts",
    "rejects_path",
    "shards_for",
    "token_batches",
    "token_file",
    "token_key",
    "token_settings",
    "untrained",
]

# A text longer than this is encoded piece by piece: an Encoding keeps ~100 bytes per token (ids,
# offsets, token strings, masks) and `.ids` is a Python list (~36 bytes per token), so one 50M-token
# document encoded whole would need ~7 GB in the worker. 1M characters ≈ 250k tokens ≈ 35 MB.
PIECE_CHARS = 1 << 20
# Pieces are encoded in groups of at most this much text, so that few Encodings are alive at once
# (the reader's batches are bounded alike: read.MAX_BATCH_BYTES).
_GROUP_CHARS = 1 << 20


def split_text(text: str, size: int = PIECE_CHARS) -> list[str]:
    """Cut `text` into pieces of at most `size` characters, each cut just before a space that stands
    between two non-space characters (searched in the second half of the piece). A pre-tokenizer that
    splits at spaces (byte-level BPE, GPT-2 style: the space opens the next word's token) then gives
    the same tokens as for the whole text. A piece with no such space is cut at `size` exactly: its
    tokens may differ from the whole text's at that cut, none are lost."""
    cuts = [0]
    while len(text) - cuts[-1] > size:
        lo, hi = cuts[-1] + size // 2, cuts[-1] + size
        cut = text.rfind(" ", lo, hi)
        while cut > lo and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.rfind(" ", lo, cut)
        cuts.append(cut if cut > lo else hi)
    cuts.append(len(text))
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def encode_documents(tok: LoadedTokenizer, cfg: TokenizerConfig, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, framed by BOS/EOS as configured (the tokenizer's own template off),
    by `tokenizers`: the reference (verify re-tokenizes with it)."""
    flat, lengths = encode_flat(tok, cfg, texts)
    ends = np.cumsum(lengths)
    return [flat[e - n : e].tolist() for e, n in zip(ends.tolist(), lengths.tolist(), strict=True)]


def encode_flat(
    tok: LoadedTokenizer,
    cfg: TokenizerConfig,
    texts: list[str],
    encoder: Encoder | None = None,
    checker: Checker | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Every text's tokens, framed by BOS/EOS as configured, as one int32 array and per-document
    lengths: no list per document is kept (at 55M tokens per job a per-token Python loop costs
    seconds), and texts over PIECE_CHARS are encoded in pieces. `encoder`: tokenizers' unless
    given; `checker`: re-checks a sample of the pieces (Mismatch on a difference)."""
    encoder = encoder or TokenizersEncoder(tok.tokenizer)
    pieces: list[str] = []
    piece_doc: list[int] = []
    for i, text in enumerate(texts):
        parts = split_text(text) if len(text) > PIECE_CHARS else [text]
        pieces += parts
        piece_doc += [i] * len(parts)
    raws: list[np.ndarray] = []
    piece_len: list[np.ndarray] = []
    start = 0
    while start < len(pieces):
        end, chars = start, 0
        while end < len(pieces) and (end == start or chars + len(pieces[end]) <= _GROUP_CHARS):
            chars += len(pieces[end])
            end += 1
        t0 = time.perf_counter()
        flat, n = encoder.encode(pieces[start:end])
        if checker is not None:
            checker.check(pieces[start:end], flat, n, time.perf_counter() - t0)
        raws.append(flat)
        piece_len.append(n)
        start = end
    raw = np.concatenate(raws) if raws else np.zeros(0, dtype=np.int32)
    lengths_of_pieces = np.concatenate(piece_len) if piece_len else np.zeros(0, dtype=np.int64)
    raw_len = np.bincount(
        np.asarray(piece_doc, dtype=np.int64), weights=lengths_of_pieces, minlength=len(texts)
    ).astype(np.int64)
    bos_id = tok.bos_id if cfg.add_bos else None
    eos_id = tok.eos_id if cfg.add_eos else None
    bos, eos = bos_id is not None, eos_id is not None
    if not (bos or eos):
        return raw, raw_len
    length = raw_len + int(bos) + int(eos)
    start_of = np.cumsum(length) - length
    out = np.empty(int(length.sum()), dtype=np.int32)
    if bos_id is not None:
        out[start_of] = bos_id
    if eos_id is not None:
        out[start_of + length - 1] = eos_id
    body = np.repeat(start_of + int(bos) - (np.cumsum(raw_len) - raw_len), raw_len) + np.arange(len(raw))
    out[body] = raw
    return out, length


def untrained(ids: np.ndarray) -> np.ndarray:
    """Token ids as staged, a token that is not trained stored as -(id + 1): the loss mask rides in
    the sign bit through the token files, items and the exchange (no column of its own to carry,
    sort and copy; a truncated item loses its mask with its tokens). Only the write stage
    (raypack.pipeline.materialize) turns it back into ids and a loss_mask column."""
    return -ids.astype(np.int32) - 1


def chat_template(cfg: JobConfig, tok: LoadedTokenizer) -> ChatTemplate | None:
    """The job's compiled chat template (conversations only; None otherwise), with the special tokens
    the tokenizer names (chat.template_variables) and tokenizer.chat_date as the date it prints."""
    if cfg.input.chat != "messages":
        return None
    source, origin = load_template(cfg.tokenizer, tok.configs, cfg.storage)

    def text(token_id: int | None) -> str | None:
        return tok.tokenizer.id_to_token(token_id) if token_id is not None else None

    variables = template_variables(
        tok.configs,
        {"bos_token": text(tok.bos_id), "eos_token": text(tok.eos_id)},
        {"bos_token": text(cfg.tokenizer.bos_id), "eos_token": text(cfg.tokenizer.eos_id)},
    )
    date = cfg.tokenizer.chat_date
    return ChatTemplate(source, origin, variables, datetime.fromisoformat(date) if date else None)


def encode_chat(
    tok: LoadedTokenizer, cfg: JobConfig, template: ChatTemplate | None, docs: list[Chat]
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Conversations or pairs → (staged ids of them all, trained ones as ids and the rest as
    untrained(ids); tokens per document; per document None or why it is rejected). The text is
    rendered (raypack.chat) and encoded whole with add_special_tokens off, by tokenizers: the
    mask needs each token's character offsets. Pairs are framed by BOS (not trained) and EOS (trained
    with the completion) as configured; a conversation by its template alone."""
    loss = cfg.loss
    texts: list[str] = []
    spans: list[list[tuple[int, int]]] = []
    reasons: list[str | None] = []
    for doc in docs:
        try:
            if template is not None:
                text, trained = template.conversation(list(doc.messages), doc.tools, loss)
            else:
                text, trained = pair_spans(doc.prompt, doc.completion, loss)
        except RenderError as e:
            text, trained = "", []
            reasons.append(str(e))
        else:
            reasons.append(None)
        texts.append(text)
        spans.append(trained)
    encodings = tok.tokenizer.encode_batch(texts, add_special_tokens=False)
    pairs = template is None
    bos = tok.bos_id if pairs and cfg.tokenizer.add_bos else None
    eos = tok.eos_id if pairs and cfg.tokenizer.add_eos else None
    parts: list[np.ndarray] = []
    lengths = np.zeros(len(docs), dtype=np.int64)
    for i, enc in enumerate(encodings):
        if reasons[i] is not None:
            continue
        ids = np.asarray(enc.ids, dtype=np.int32)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        mask = token_mask(offsets, spans[i], len(texts[i]))
        if bos is not None:
            ids, mask = np.r_[np.int32(bos), ids], np.r_[False, mask]
        if eos is not None:
            ids, mask = np.r_[ids, np.int32(eos)], np.r_[mask, True]
        if len(mask):
            mask[0] = False  # a document's first token is no target (nothing before it predicts it)
        if not mask.any():
            what = "assistant turn" if template is not None else "completion token"
            reasons[i] = f"no trained token (pack.loss {loss}: no {what})"
            continue
        parts.append(np.where(mask, ids, untrained(ids)).astype(np.int32))
        lengths[i] = len(ids)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    return flat, lengths, reasons


# The in-run check of a fast backend: re-encoding with tokenizers may take this share of the fast
# encoder's own time, plus CHECK_FLOOR_S a unit (so a small unit is checked too: ~5 KB of text). At
# ×60, checking 1% of the text would cost 60% more; a fifth of the time checks ~0.3% of it. A floor
# of 50 ms made the check cost twice the fast encoder on 6 MB units (cProfile: 0.32 s of tokenizers
# against 0.16 s of fastokens for six units).
CHECK_SHARE = 0.2
CHECK_FLOOR_S = 0.005


class Checker:
    """Re-encodes a seeded sample of one unit's pieces with `tokenizers` and compares every id: a
    Mismatch on the first difference. Bounded by time, not by count (module constants)."""

    def __init__(self, reference: TokenizersEncoder, seed: str) -> None:
        self.reference = reference
        self.rng = random.Random(seed)
        self.fast_s = self.check_s = 0.0
        self.texts = self.bytes = 0
        self.rate = 1e6  # the reference's characters a second, until measured (tokenizers: 1-2.5 MB/s)

    def check(self, pieces: list[str], flat: np.ndarray, lengths: np.ndarray, fast_s: float) -> None:
        self.fast_s += fast_s
        budget = CHECK_SHARE * self.fast_s + CHECK_FLOOR_S - self.check_s
        picked, cost = [], 0.0
        for i in self.rng.sample(range(len(pieces)), len(pieces)):
            need = len(pieces[i]) / self.rate
            if cost + need <= budget:
                picked.append(i)
                cost += need
        if not picked:
            return
        picked.sort()
        t0 = time.perf_counter()
        want, want_len = self.reference.encode([pieces[i] for i in picked])
        spent = time.perf_counter() - t0
        self.check_s += spent
        chars = sum(len(pieces[i]) for i in picked)
        self.rate = max(chars / max(spent, 1e-6), 1e4)
        ends = np.cumsum(lengths)
        at = 0
        for k, i in enumerate(picked):
            got = flat[ends[i] - lengths[i] : ends[i]]
            ref = want[at : at + want_len[k]]
            at += int(want_len[k])
            if not np.array_equal(got, ref):
                raise Mismatch(
                    f"a {len(pieces[i]):,}-character text ({pieces[i][:40]!r}): {len(got)} ids, "
                    f"tokenizers {len(ref)}"
                )
            self.texts += 1
            self.bytes += len(pieces[i].encode("utf-8", errors="surrogatepass"))


# Staged token files are Arrow IPC files (record batches as the units wrote them, lz4 frames), read
# back by raypack alone, whole or by columns. 9.8M tokens (6 units of 6.25 MB of text), written and
# read: Parquet (lz4, no dictionary, no statistics: what TOKEN_FORMAT 3 wrote) 0.121 s and 0.057 s,
# Arrow IPC 0.074 s and 0.020 s, the same 12.7 MB; uncompressed 0.032 s and 0.005 s but 39 MB (3x
# the bytes to move to and from object storage). Parquet's cost was its list encoding (repetition
# levels a token) and decoding, which a file read back whole by the same library does not need.
STAGED_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")
# One thread a task: a worker holds one CPU (decompression would spread over the Arrow pool's).
STAGED_READ = pa.ipc.IpcReadOptions(use_threads=False)
STAGED_DOCS = pa.ipc.IpcReadOptions(
    use_threads=False,
    included_fields=[schema.TOKENIZED.get_field_index(n) for n in ("row", "doc_id", "length")],
)
# Bump when the token file layout or what goes into a key changes: old cache entries then miss.
# 2: keyed on input.empty, input.max_document_bytes and the piece size too; written in place.
# 3: keyed on the tokenizer library's version; rejects count records and lost files (footer JSON).
# 4: Arrow IPC, not Parquet; the completion key rides on an empty last record batch.
TOKEN_FORMAT = 4
# Completion key, on the last record batch (empty), written last: a token file without it is
# unfinished (see TokenizeShards._tokenize). Its value: {"rejects": rows of the rejects file,
# "records": input records they stand for, "lost_files": files (or rests of files) that could not
# be read, "trained": trained tokens}.
_DONE = b"raypack.rejects"


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
    return {
        "chat": chat,
        "token_format": TOKEN_FORMAT,
        "read_version": READ_VERSION,
        "library": tokenizer_library(),
        "backend": backend.label if backend is not None else None,
        "reading": dataclasses.asdict(reading),
        "piece_chars": PIECE_CHARS,
        "tokenizer_sha256": tok.sha256,
        "bos_id": tok.bos_id if cfg.tokenizer.add_bos and reading.chat != "messages" else None,
        "eos_id": tok.eos_id if cfg.tokenizer.add_eos and reading.chat != "messages" else None,
    }


def tokenizer_library() -> str:
    import tokenizers

    return f"tokenizers {tokenizers.__version__}"


def token_key(unit: WorkUnit, settings: dict[str, Any]) -> str:
    """Cache key of a unit's token file: its file's relative path (document ids contain it), its
    fingerprint (size + modification time; an object store sets the time on every PUT), its range
    within the file (a unit of a large file) and the settings."""
    shard = unit.shard
    fingerprint: dict[str, Any] = {"relpath": shard.relpath, "size": shard.size, "mtime_ns": shard.mtime_ns}
    fingerprint |= unit.entry(rows=False)
    fingerprint.update(settings)
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:32]


def token_batches(path: str, storage: StorageConfig | None) -> Iterator[pa.RecordBatch]:
    """A finished token file's record batches (schema.TOKENIZED) in the order they were written,
    the empty completion batch left out."""
    fs, inner = resolve(path, storage)
    with fs.open_input_file(inner) as f:
        reader = pa.ipc.open_file(f, options=STAGED_READ)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            if batch.num_rows:
                yield batch


def read_tokens(path: str, storage: StorageConfig | None) -> pa.Table:
    """A finished token file, whole."""
    return pa.Table.from_batches(list(token_batches(path, storage)), schema=schema.TOKENIZED)


def cached_rejects_file(token_path: str) -> str:
    """The rejects file beside a token file (a finished token file always has it when it has rejects)."""
    return token_path.removesuffix(".arrow") + ".rejects.parquet"


def reason_counts(reasons: list[str]) -> dict[str, int]:
    """Rejects by kind: the reason up to its first colon, numbers replaced by N ("malformed JSON",
    "invalid UTF-8 at byte N", "record of N bytes, over input.max_document_bytes (N)")."""
    kinds = Counter(re.sub(r"\d+", "N", r.split(":", 1)[0]) for r in reasons)
    return dict(sorted(kinds.items()))


def failover_marker(output: str) -> str:
    """Written by the first tokenize worker whose check found a difference: the others then go on with
    tokenizers too (it lives in the staging area, removed with it)."""
    return join(output, "_staging", "backend-failover")


def rejects_path(output: str, shard: int) -> str:
    return join(output, "rejects", f"shard-{shard:06d}.parquet")


def _node_id() -> str:
    """The Ray node this worker runs on ("" outside Ray): metrics.json reports how many nodes tokenized
    each split file."""
    import ray

    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""


@dataclass
class Preloaded:
    """What a tokenize worker process loads once, before it is given units."""

    cfg: JobConfig
    tok: LoadedTokenizer
    fast: FastokensEncoder | None = None
    fast_error: str = ""
    fast_tried: bool = False


_PRELOADED: list[Preloaded] = []
# The process's TokenizeShards, kept from one unit of a run to the next (it holds the tokenizer
# and, once a check found a difference, the failover to tokenizers): (run, cls, backend) and it.
_SHARDS: list[tuple[tuple[str, type[TokenizeShards], str], TokenizeShards]] = []


def preload(cfg: JobConfig, fast: bool) -> Preloaded:
    """The tokenizer of cfg (and fastokens' copy of it when `fast`), loaded once a process: a worker
    loads them as the job starts, while the driver still checks the backend, and every unit it is
    then given finds them here. 128k BPE: fastokens 1.1 s, tokenizers 0.4 s to load. Numba's
    functions of the summary are loaded too (0.5-0.75 s on a unit otherwise)."""
    # Each task holds one CPU (num_cpus=1), but tokenizers' thread pool takes every core of the
    # machine: N workers × N threads on N cores. Two processes on 2 cores encode the demo corpus in
    # 6.7-6.8 s each with the default pool, 5.6-5.7 s each with one thread. Set before the first
    # encode, which builds the pool; a value the user set wins (fastokens: FastokensEncoder).
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    key = (cfg.tokenizer, cfg.storage)
    if not _PRELOADED or (_PRELOADED[0].cfg.tokenizer, _PRELOADED[0].cfg.storage) != key:
        _PRELOADED[:] = [Preloaded(cfg, load_tokenizer(cfg.tokenizer, cfg.storage, framed=cfg.framed))]
        summarize_shard_warm(cfg)
    loaded = _PRELOADED[0]
    if fast and not loaded.fast_tried:
        loaded.fast_tried = True
        try:  # fastokens objects do not pickle: each process builds its own
            loaded.fast = FastokensEncoder(loaded.tok.json)
        except Exception as e:
            loaded.fast_error = str(e).splitlines()[0] if str(e) else type(e).__name__
    return loaded


def shards_for(run: str, cls: type[TokenizeShards], cfg: JobConfig, backend: str) -> TokenizeShards:
    """The process's TokenizeShards for this job run (`run`: a worker that served another run, a later
    job of the same Ray session, starts afresh)."""
    key = (run, cls, backend)
    if not _SHARDS or _SHARDS[0][0] != key:
        _SHARDS[:] = [(key, cls(cfg, backend))]
    return _SHARDS[0][1]


def forget() -> None:
    """Drop this process's tokenizers: the assign, write and sharded-group tasks call it, as Ray
    reuses the tokenize stage's processes for them (a 128k vocabulary loaded twice is ~0.2-0.3 GB
    they would otherwise keep), and give the freed memory back to the system: Arrow's pool keeps
    what the units' buffers used, glibc what the tokenizers' Rust allocations did (through malloc).
    Measured: 429 MiB after preloading a 128k BPE with fastokens, 218 MiB after forget."""
    if not (_PRELOADED or _SHARDS):
        return
    _SHARDS.clear()
    _PRELOADED.clear()
    gc.collect()
    pa.default_memory_pool().release_unused()
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class TokenizeShards:
    """Tokenizes work units one at a time (unit): each names a shard and its token file, and gives the
    shard's summary. A token file that exists already (a rebuild's cache) is reused, not redone."""

    def __init__(self, cfg: JobConfig, backend: str = "tokenizers") -> None:
        self.cfg = cfg
        self.storage = cfg.storage
        loaded = preload(cfg, fast=backend == "fastokens")
        self.tok = loaded.tok
        self.reference = TokenizersEncoder(self.tok.tokenizer)
        self.encoder: Encoder = self.reference
        self.failover = ""
        """Why this worker went back to tokenizers ("" while it has not)."""
        if backend == "fastokens":
            if loaded.fast is not None:
                self.encoder = loaded.fast
            else:  # not installed on this node, or refused: the reference, said so
                self.failover = f"fastokens did not load on this node ({loaded.fast_error})"
        self.marker = failover_marker(cfg.output.path)
        self._checker: Checker | None = None
        self._trained = 0
        self.template = chat_template(cfg, self.tok)
        if cfg.input.chat:  # the mask needs token offsets: tokenizers encodes chat data
            self.encoder = self.reference

    def unit(self, unit: WorkUnit) -> dict[str, Any]:
        """One work unit → its summary, the row histogram.Totals.add folds. Makes sure the unit's
        token file exists (tokenizing only when it does not), writes its index and rejects into the
        output."""
        path = unit.token_file
        finished = self._read_cached(path)
        cached = finished is not None
        if finished is not None:
            docs, lost = finished
            reasons: list[str] = []
            if lost["rejects"]:
                data = read_bytes(cached_rejects_file(path), self.storage)
                write_bytes(rejects_path(self.cfg.output.path, unit.index), data, self.storage)
                reasons = (
                    pq.read_table(pa.BufferReader(data), columns=["reason"]).column("reason").to_pylist()
                )
        else:
            docs, reasons, lost = self._tokenize_checked(unit)
        doc_length = docs.column("length").to_numpy()
        summary = summarize_shard(
            self.cfg,
            unit.shard,
            docs.column("doc_id").combine_chunks(),
            docs.column("row").combine_chunks(),
            doc_length,
        )
        return {
            "shard": unit.index,
            "node": _node_id(),
            "cached": cached,
            "documents": len(doc_length),
            "tokens": int(doc_length.sum()),
            "rejects": lost["rejects"],
            "rejected_records": lost["records"],
            "lost_files": lost["lost_files"],
            "reasons": json.dumps(reason_counts(reasons)),
            # Trained tokens (chat data's loss mask; every token of plain text): a file written
            # before the count was kept trains every token it holds.
            "trained": int(lost.get("trained", doc_length.sum())),
            **summary,
            **self._backend_summary(cached),
        }

    def _tokenize_checked(self, unit: WorkUnit) -> tuple[pa.Table, list[str], dict[str, int]]:
        """_tokenize with the chosen encoder and, for a fast one, a Checker; on a Mismatch the unit
        is tokenized again with tokenizers, and this actor and (by the marker) every other one go on
        with tokenizers."""
        self._checker = None
        if self.encoder is not self.reference and not self.failover and exists(self.marker, self.storage):
            why = read_bytes(self.marker, self.storage).decode("utf-8", errors="replace")
            self._fail_over(f"another actor found a difference: {why}", mark=False)
        if self.encoder is self.reference:
            return self._tokenize(unit)
        self._checker = Checker(self.reference, f"{unit.relpath}:{unit.shard.unit_start}")
        try:
            return self._tokenize(unit)
        except Mismatch as e:
            self._fail_over(f"unit {unit.index} ({unit.relpath}): {e}", mark=True)
            return self._tokenize(unit)

    def _fail_over(self, reason: str, mark: bool) -> None:
        self.encoder, self.failover, self._checker = self.reference, reason, None
        if mark:
            write_bytes(self.marker, reason.encode(), self.storage)

    def _backend_summary(self, cached: bool) -> dict[str, Any]:
        checker = self._checker
        return {
            "backend": "cache" if cached else self.encoder.name,
            "checked_texts": checker.texts if checker is not None and not cached else 0,
            "checked_bytes": checker.bytes if checker is not None and not cached else 0,
            "failover": self.failover,
        }

    def _read_cached(self, path: str) -> tuple[pa.Table, dict[str, int]] | None:
        """A finished token file's documents and reject counts (_DONE); None when there is none
        (absent, cut short by a killed writer, or closed without its completion key by an error)."""
        if not exists(path, self.storage):
            return None
        fs, inner = resolve(path, self.storage)
        try:
            with fs.open_input_file(inner) as f:
                reader = pa.ipc.open_file(f, options=STAGED_DOCS)
                if not reader.num_record_batches:
                    return None
                meta = reader.get_batch_with_custom_metadata(reader.num_record_batches - 1).custom_metadata
                if meta is None or _DONE not in meta:
                    return None
                docs = reader.read_all()
        except pa.ArrowInvalid:  # no footer: a local file whose writer was killed
            return None
        return docs, json.loads(meta[_DONE])

    def _tokenize(self, unit: WorkUnit) -> tuple[pa.Table, list[str], dict[str, int]]:
        """Tokenize the unit into its token file; rejects go beside it and into the output.

        The file is written in place, not to a temporary name then moved: on S3 a move is a
        CopyObject, limited to 5 GB, and a shard of 10 GB of text makes a ~10 GB token file. It counts
        as finished only by the key on its last record batch, written last (_DONE, with the rejects
        count): an error mid-way closes the writer without it, a killed writer leaves no footer
        locally and no object at all on S3 (a multipart upload completes only on close), and
        either is redone."""
        cfg = self.cfg
        path = unit.token_file
        rejects: list[dict[str, Any]] = []
        docs: list[pa.Table] = []
        self._trained = 0
        # The rejects count is known only at the end: it goes on the last, empty record batch.
        with (
            open_output(path, self.storage) as sink,
            pa.ipc.new_file(sink, schema.TOKENIZED, options=STAGED_OPTIONS) as writer,
        ):
            for batch in read_unit(unit, cfg.tokenizer.batch_size, self.storage):
                rejects.extend(r.as_row(unit.relpath) for r in batch.rejects)
                if len(batch):
                    table = self._encode(batch, unit, rejects)
                    writer.write_table(table)
                    docs.append(table.select(["row", "doc_id", "length"]))
            if rejects:
                table = pa.Table.from_pylist(rejects, schema=schema.REJECTS)
                # Beside the token file before its completion key, so a finished token file always
                # has its rejects.
                with atomic_output(cached_rejects_file(path), self.storage) as f:
                    pq.write_table(table, f)
                with open_output(rejects_path(cfg.output.path, unit.index), self.storage) as f:
                    pq.write_table(table, f)
            lost = {
                "rejects": len(rejects),
                "records": sum(r["records"] for r in rejects),
                "lost_files": sum(r["lost_file"] for r in rejects),
                "trained": self._trained,
            }
            done = pa.RecordBatch.from_pylist([], schema=schema.TOKENIZED)
            writer.write_batch(done, custom_metadata={_DONE: json.dumps(lost).encode()})
        empty = schema.TOKENIZED.empty_table().select(["row", "doc_id", "length"])
        return pa.concat_tables(docs) if docs else empty, [r["reason"] for r in rejects], lost

    def _encode(self, batch: Batch, unit: WorkUnit, rejects: list[dict[str, Any]]) -> pa.Table:
        checker = self._checker
        why: list[str | None]
        if unit.reading.chat:
            flat, lengths, why = encode_chat(self.tok, self.cfg, self.template, batch.texts)
            self._trained += int(np.count_nonzero(flat >= 0))
        else:
            flat, lengths = encode_flat(self.tok, self.cfg.tokenizer, batch.texts, self.encoder, checker)
            why = [None] * len(lengths)
            self._trained += len(flat)
        empty = np.flatnonzero(lengths == 0)
        if empty.size:  # plain text without BOS/EOS that the tokenizer maps to nothing; chat rejects
            for i in empty.tolist():
                reason = why[i] or "tokenizes to zero tokens"
                rejects.append(Reject.bad(batch.rows[i], reason, str(batch.texts[i])).as_row(unit.relpath))
            keep = np.flatnonzero(lengths > 0).tolist()
            lengths = lengths[keep]
            batch = Batch(rows=[batch.rows[i] for i in keep], ids=[batch.ids[i] for i in keep])
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        return pa.table(
            {
                "row": pa.array(batch.rows, pa.int64()),
                "doc_id": batch.ids,
                "length": lengths,
                "tokens": tokens,
            },
            schema=schema.TOKENIZED,
        )
