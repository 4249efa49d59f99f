"""The tokenize task's side: what a worker process of the tokenize stage does with a work unit.
TokenizeShards turns a unit into its staged token file (raypack.pipeline.token_files) and rejects,
and returns its summary (raypack.pipeline.histogram.summarize_shard). It runs on Ray tasks
(raypack.pipeline.tokenize_pool) in worker processes that load the tokenizer once (preload) and keep
one TokenizeShards from one unit of a run to the next (shards_for).

With fastokens, a Checker (raypack.pipeline.encode) re-encodes a seeded sample of each unit's pieces
with `tokenizers` within a fifth of the fast encoder's own time; on a difference the unit is
tokenized again with `tokenizers`, the summary says why, and the driver tokenizes every unit again
(raypack.pipeline.tokenize). Tokens are computed once here; later stages only read these files.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.pipeline.backends import Encoder, FastokensEncoder, Mismatch, TokenizersEncoder
from raypack.pipeline.encode import Checker, chat_template, encode_chat, encode_flat
from raypack.pipeline.histogram import summarize_shard, summarize_shard_warm
from raypack.pipeline.offsets import ByteOffsets, Coder, reference_coder
from raypack.pipeline.readers import Batch, Reject, read_unit
from raypack.pipeline.token_files import (
    DONE,
    cached_rejects_file,
    read_finished,
    reason_counts,
    rejects_path,
    staged_options,
)
from raypack.pipeline.tokenizer import LoadedTokenizer, load_tokenizer
from raypack.pipeline.units import WorkUnit
from raypack.storage import atomic_output, open_output, read_bytes, write_bytes

__all__ = ["Preloaded", "TokenizeShards", "forget", "load_fast", "preload", "preloaded_fast", "shards_for"]


def _node_id() -> str:
    """The Ray node this worker runs on ("" outside Ray): metrics.json reports how many nodes tokenized
    each split file."""
    import sys

    if "ray" not in sys.modules or _LOCAL:  # a local runner's worker (importing ray costs 0.3 s)
        return ""
    import ray

    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""


_LOCAL: list[bool] = []
"""Set in a local runner's workers (raypack.pipeline.runners), which may be forked from a process
connected to Ray: they must not use that connection."""


def local_worker(cfg: JobConfig, fast: bool) -> None:
    """A local runner's worker initializer: it is one, and it preloads."""
    _LOCAL.append(True)
    preload(cfg, fast)


@dataclass
class Preloaded:
    """What a tokenize worker process loads once, before it is given units."""

    cfg: JobConfig
    tok: LoadedTokenizer
    fast: FastokensEncoder | None = None
    fast_error: str = ""


_PRELOADED: list[Preloaded] = []
# The process's TokenizeShards, kept from one unit of a run to the next (it holds the tokenizer
# and, once a check found a difference, the failover to tokenizers): (run, cls, backend) and it.
_SHARDS: list[tuple[tuple[str, type[TokenizeShards], str], TokenizeShards]] = []


def preload(
    cfg: JobConfig,
    fast: bool,
    tok: LoadedTokenizer | None = None,
    fastokens: tuple[FastokensEncoder | None, str] | None = None,
) -> Preloaded:
    """The tokenizer of cfg (and fastokens' copy of it when `fast`: `fastokens`, load_fast's result,
    when already built), loaded once a process: a worker loads them as the job starts, while the
    driver still checks the backend, and every unit it is then given finds them here. 128k BPE:
    fastokens 1.1 s, tokenizers 0.4 s to load. Numba's functions of the summary are loaded too
    (0.5-0.75 s on a unit otherwise)."""
    # Each task holds one CPU (num_cpus=1), but tokenizers' thread pool takes every core of the
    # machine: N workers × N threads on N cores. Two processes on 2 cores encode the demo corpus in
    # 6.7-6.8 s each with the default pool, 5.6-5.7 s each with one thread. Set before the first
    # encode, which builds the pool; a value the user set wins (fastokens: FastokensEncoder).
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    key = (cfg.tokenizer, cfg.storage)
    if not _PRELOADED or (_PRELOADED[0].cfg.tokenizer, _PRELOADED[0].cfg.storage) != key:
        parsed = tok or load_tokenizer(cfg.tokenizer, cfg.storage, framed=cfg.framed)
        _PRELOADED[:] = [Preloaded(cfg, parsed)]
        summarize_shard_warm(cfg)
    loaded = _PRELOADED[0]
    # Tried until it loads or refuses: a load cut short (a preload task cancelled when a job
    # failed) leaves neither, and the next job of this process tries again.
    if fast and loaded.fast is None and not loaded.fast_error:
        loaded.fast, loaded.fast_error = fastokens if fastokens is not None else load_fast(loaded.tok.json)
    return loaded


def preloaded_fast(cfg: JobConfig) -> FastokensEncoder | None:
    """fastokens' copy of cfg's tokenizer when this process has loaded it (preload), else None."""
    if not _PRELOADED:
        return None
    loaded = _PRELOADED[0]
    return loaded.fast if (loaded.cfg.tokenizer, loaded.cfg.storage) == (cfg.tokenizer, cfg.storage) else None


def load_fast(tokenizer_json: str) -> tuple[FastokensEncoder | None, str]:
    """fastokens' copy of the tokenizer, or why it refused it. Its objects do not pickle, so a Ray
    worker builds its own; a local runner's workers inherit the driver's, built before the fork
    (raypack.pipeline.prepare: it releases the GIL, so it loads beside the driver's own work)."""
    try:
        return FastokensEncoder(tokenizer_json), ""
    except Exception as e:
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


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
        """Why this worker went back to tokenizers after a difference ("" while it has not)."""
        self.note = ""
        """Why it encodes with tokenizers though fastokens was chosen (not a difference: exact either way)."""
        if backend == "fastokens":
            if loaded.fast is not None:
                self.encoder = loaded.fast
            else:  # not installed on this node, or refused: the reference, said so
                self.note = (
                    f"fastokens did not load on a node ({loaded.fast_error}): tokenizers encoded there"
                )
        self._checker: Checker | None = None
        self._trained = 0
        self.template = chat_template(cfg, self.tok)
        # Chat data's mask needs each token's character offsets: tokenizers' own, or a byte-level
        # BPE's from the fast ids (chosen only where the self-check proved them equal).
        self.reference_coder = reference_coder(self.tok.tokenizer)
        self.coder: Coder = self.reference_coder
        if cfg.input.chat and self.encoder is not self.reference:
            offsets = ByteOffsets.of(self.tok.json)
            if offsets is None:
                self.encoder = self.reference
            else:
                self.coder = offsets.coder(self.encoder, self.reference_coder)

    def unit(self, unit: WorkUnit) -> dict[str, Any]:
        """One work unit → its summary, the row histogram.Totals.add folds. Makes sure the unit's
        token file exists (tokenizing only when it does not), writes its index and rejects into the
        output."""
        path = unit.token_file
        finished = read_finished(path, self.storage)
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
        is tokenized again with tokenizers, which this worker keeps (the driver, told by the
        summary's failover, stops giving out units and tokenizes every unit again)."""
        self._checker = None
        if self.encoder is self.reference:
            return self._tokenize(unit)
        self._checker = Checker(self.reference, f"{unit.relpath}:{unit.shard.unit_start}")
        try:
            return self._tokenize(unit)
        except Mismatch as e:
            self.failover = f"unit {unit.index} ({unit.relpath}): {e}"
            self.encoder, self.coder, self._checker = self.reference, self.reference_coder, None
            return self._tokenize(unit)

    def _backend_summary(self, cached: bool) -> dict[str, Any]:
        checker = self._checker
        return {
            "backend": "cache" if cached else self.encoder.name,
            "checked_texts": checker.texts if checker is not None and not cached else 0,
            "checked_bytes": checker.bytes if checker is not None and not cached else 0,
            "failover": self.failover,
            "note": self.note,
        }

    def _tokenize(self, unit: WorkUnit) -> tuple[pa.Table, list[str], dict[str, int]]:
        """Tokenize the unit into its token file; rejects go beside it and into the output.

        The file is written in place, not to a temporary name then moved: on S3 a move is a
        CopyObject, limited to 5 GB, and a shard of 10 GB of text makes a ~10 GB token file. It counts
        as finished only by the key on its last record batch, written last (DONE, with the rejects
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
            pa.ipc.new_file(sink, schema.TOKENIZED, options=staged_options(path, cfg.output.path)) as writer,
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
            writer.write_batch(done, custom_metadata={DONE: json.dumps(lost).encode()})
        empty = schema.TOKENIZED.empty_table().select(["row", "doc_id", "length"])
        return pa.concat_tables(docs) if docs else empty, [r["reason"] for r in rejects], lost

    def _encode(self, batch: Batch, unit: WorkUnit, rejects: list[dict[str, Any]]) -> pa.Table:
        checker = self._checker
        why: list[str | None]
        if unit.reading.chat:
            flat, lengths, why = encode_chat(
                self.tok, self.cfg, self.template, batch.texts, self.coder, checker
            )
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
