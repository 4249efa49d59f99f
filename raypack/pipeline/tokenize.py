"""Stage 2, tokenize: a Ray Data actor that loads the tokenizer once and turns whole shards into staged
token files (one Parquet file per input shard, schema.TOKENIZED), plus a rejects file when needed.

Documents are encoded with `encode_batch(..., add_special_tokens=False)`: the tokenizer's own template
(which may add BOS, CLS/SEP, ...) is off, so `add_bos` / `add_eos` alone decide what frames a document.
Tokens are computed once here; later stages only read these files.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from raypack import schema
from raypack.config import JobConfig, TokenizerConfig
from raypack.errors import ConfigError
from raypack.pipeline.histogram import summarize_shard
from raypack.pipeline.read import Batch, read_shard
from raypack.storage import Shard, join, open_output, read_bytes

__all__ = [
    "LoadedTokenizer",
    "TokenizeShards",
    "encode_documents",
    "encode_flat",
    "load_tokenizer",
    "rejects_path",
    "tokens_path",
]

BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>", "[BOS]")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]")


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    tokenizer: Tokenizer
    sha256: str
    bos_id: int | None
    eos_id: int | None
    vocab_size: int


def load_tokenizer(cfg: TokenizerConfig) -> LoadedTokenizer:
    """Load and check the tokenizer; ConfigError naming the problem (missing file, not a tokenizer
    JSON, no EOS token when add_eos is on...)."""
    try:
        raw = read_bytes(cfg.path)
    except FileNotFoundError:
        raise ConfigError(f"tokenizer file not found: {cfg.path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read tokenizer {cfg.path}: {str(e).splitlines()[0]}") from None
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises its own Exception type on bad JSON
        raise ConfigError(f"{cfg.path} is not a tokenizers JSON file: {str(e).splitlines()[0]}") from None
    bos = cfg.bos_id if cfg.bos_id is not None else _find(tok, BOS_NAMES)
    eos = cfg.eos_id if cfg.eos_id is not None else _find(tok, EOS_NAMES)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if cfg.add_bos and bos is None:
        raise ConfigError(
            f"tokenizer {cfg.path} has no BOS token ({', '.join(BOS_NAMES)}); set tokenizer.bos_id"
        )
    if cfg.add_eos and eos is None:
        raise ConfigError(
            f"tokenizer {cfg.path} has no EOS token ({', '.join(EOS_NAMES)}); set tokenizer.eos_id"
        )
    for name, value in (("bos_id", bos), ("eos_id", eos)):
        if value is not None and value >= vocab:
            raise ConfigError(f"tokenizer.{name}={value} is outside the vocabulary (size {vocab})")
    return LoadedTokenizer(tok, hashlib.sha256(raw).hexdigest(), bos, eos, vocab)


def encode_documents(tok: LoadedTokenizer, cfg: TokenizerConfig, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, framed by BOS/EOS as configured (the tokenizer's own template off)."""
    prefix = [tok.bos_id] if cfg.add_bos and tok.bos_id is not None else []
    suffix = [tok.eos_id] if cfg.add_eos and tok.eos_id is not None else []
    return [prefix + e.ids + suffix for e in tok.tokenizer.encode_batch(texts, add_special_tokens=False)]


def encode_flat(
    tok: LoadedTokenizer, cfg: TokenizerConfig, texts: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """The same tokens as encode_documents, as one int32 array and per-document lengths: no list per
    document is built or copied (at 55M tokens per job a per-token Python loop costs seconds)."""
    ids = [e.ids for e in tok.tokenizer.encode_batch(texts, add_special_tokens=False)]
    raw_len = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    raw = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(raw_len.sum()))
    bos_id = tok.bos_id if cfg.add_bos else None
    eos_id = tok.eos_id if cfg.add_eos else None
    bos, eos = bos_id is not None, eos_id is not None
    if not (bos or eos):
        return raw, raw_len
    length = raw_len + int(bos) + int(eos)
    start = np.cumsum(length) - length
    out = np.empty(int(length.sum()), dtype=np.int32)
    if bos_id is not None:
        out[start] = bos_id
    if eos_id is not None:
        out[start + length - 1] = eos_id
    body = np.repeat(start + int(bos) - (np.cumsum(raw_len) - raw_len), raw_len) + np.arange(len(raw))
    out[body] = raw
    return out, length


def _find(tok: Tokenizer, names: tuple[str, ...]) -> int | None:
    for name in names:
        token_id = tok.token_to_id(name)
        if token_id is not None:
            return int(token_id)
    return None


def tokens_path(staging: str, shard: int) -> str:
    return join(staging, "tokens", f"shard-{shard:06d}.parquet")


def rejects_path(output: str, shard: int) -> str:
    return join(output, "rejects", f"shard-{shard:06d}.parquet")


class TokenizeShards:
    """map_batches callable: each input row names a shard; each output row summarizes it."""

    def __init__(self, cfg: JobConfig, staging: str) -> None:
        self.cfg = cfg
        self.staging = staging
        self.tok = load_tokenizer(cfg.tokenizer)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        out: dict[str, list[Any]] = {
            "shard": [],
            "documents": [],
            "tokens": [],
            "rejects": [],
            "lengths": [],
            "counts": [],
            "stats": [],
        }
        for i in range(len(batch["index"])):
            shard = Shard(
                index=int(batch["index"][i]),
                path=str(batch["path"][i]),
                relpath=str(batch["relpath"][i]),
                size=int(batch["size"][i]),
                mtime_ns=int(batch["mtime_ns"][i]),
            )
            summary = self.tokenize_shard(shard)
            for key, value in summary.items():
                out[key].append(value)
            out["shard"].append(shard.index)
        return {
            "shard": np.asarray(out["shard"], dtype=np.int64),
            "documents": np.asarray(out["documents"], dtype=np.int64),
            "tokens": np.asarray(out["tokens"], dtype=np.int64),
            "rejects": np.asarray(out["rejects"], dtype=np.int64),
            "lengths": out["lengths"],
            "counts": out["counts"],
            "stats": np.asarray(out["stats"], dtype=object),
        }

    def tokenize_shard(self, shard: Shard) -> dict[str, Any]:
        """Write the shard's token file (and rejects file); returns its counts and histogram."""
        cfg = self.cfg
        rejects: list[dict[str, Any]] = []
        ids: list[pa.Array] = []
        rows: list[pa.Array] = []
        lengths: list[np.ndarray] = []
        with (
            open_output(tokens_path(self.staging, shard.index)) as sink,
            pq.ParquetWriter(sink, schema.TOKENIZED) as writer,
        ):
            for batch in read_shard(
                shard, cfg.input.format, cfg.input.text_field, cfg.input.id_field, cfg.tokenizer.batch_size
            ):
                rejects.extend(
                    {"source": shard.relpath, "row": r.row, "reason": r.reason, "raw": r.raw}
                    for r in batch.rejects
                )
                if len(batch):
                    table = self._encode(batch, shard.relpath, rejects)
                    writer.write_table(table)
                    ids.append(table.column("doc_id").combine_chunks())
                    rows.append(table.column("row").combine_chunks())
                    lengths.append(table.column("length").to_numpy())
        if rejects:
            self._write_rejects(shard.index, rejects)
        doc_length = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        tokens = int(doc_length.sum())
        summary = summarize_shard(
            self.cfg,
            shard.index,
            pa.concat_arrays(ids) if ids else pa.array([], pa.string()),
            pa.concat_arrays(rows) if rows else pa.array([], pa.int64()),
            doc_length,
        )
        return {"documents": len(doc_length), "tokens": tokens, "rejects": len(rejects), **summary}

    def _encode(self, batch: Batch, relpath: str, rejects: list[dict[str, Any]]) -> pa.Table:
        flat, lengths = encode_flat(self.tok, self.cfg.tokenizer, batch.texts)
        empty = np.flatnonzero(lengths == 0)
        if empty.size:  # only possible without BOS/EOS: text the tokenizer maps to nothing
            for i in empty.tolist():
                reason = "tokenizes to zero tokens"
                rejects.append(
                    {"source": relpath, "row": batch.rows[i], "reason": reason, "raw": batch.texts[i][:200]}
                )
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

    def _write_rejects(self, shard: int, rejects: list[dict[str, Any]]) -> None:
        with open_output(rejects_path(self.cfg.output.path, shard)) as sink:
            pq.write_table(pa.Table.from_pylist(rejects, schema=schema.REJECTS), sink)
