"""Shared fixtures: one local Ray per test session, a real trained tokenizer, corpora on disk."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests import s3server

WORDS = (
    *[
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "for",
        "that",
        "with",
        "as",
        "on",
        "by",
        "packing",
        "token",
        "sequence",
        "document",
        "corpus",
    ],
    *[
        "ray",
        "data",
        "model",
        "train",
        "length",
        "context",
        "shard",
        "parquet",
        "arrow",
        "batch",
        "worker",
        "plan",
        "histogram",
    ],
    *["bucket", "best", "fit"],
)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Local Ray, started once: each start costs seconds on two cores. Its workers inherit the test S3
    server's credentials from this environment, as a cluster's would from its nodes'."""
    import ray

    os.environ.update(s3server.CREDENTIALS)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=400 * 2**20, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.S3Server]:
    """A real S3 server (SeaweedFS) for the session, with bucket s3server.BUCKET."""
    os.environ.update(s3server.CREDENTIALS)
    server = s3server.start(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real byte-level BPE (512 tokens) trained on generated text, with <|endoftext|> and <s>."""
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<s>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tok.save(str(path))
    return path


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_jsonl(path: Path, records: list[Any], compression: str | None = None) -> None:
    """Records are dicts (written as JSON) or bytes (written as they are: bad lines for tests)."""
    data = b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)
    if compression == "gzip":
        path.write_bytes(gzip.compress(data))
    elif compression == "zstd":
        with pa.CompressedOutputStream(str(path), "zstd") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def make_corpus(root: Path, shards: int = 4, docs_per_shard: int = 40, seed: int = 0) -> Path:
    """Shards in every format raypack reads: .jsonl, .jsonl.gz, .jsonl.zst; lengths from 1 word to
    ~3000 (longer than a 512-token context)."""
    rng = random.Random(seed)
    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    kinds = [("jsonl", None), ("jsonl.gz", "gzip"), ("jsonl.zst", "zstd")]
    for s in range(shards):
        suffix, compression = kinds[s % len(kinds)]
        records = [
            {"text": random_text(rng, int(rng.lognormvariate(4.5, 1.2)) + 1)} for _ in range(docs_per_shard)
        ]
        write_jsonl(corpus / f"part-{s:03d}.{suffix}", records, compression)
    return corpus


def write_parquet(path: Path, columns: dict[str, list[Any]]) -> None:
    pq.write_table(pa.table(columns), path)


def s3_job_config(
    tmp: Path,
    server: s3server.S3Server,
    corpus: Path,
    tokenizer_file: Path,
    prefix: str,
    **sections: dict[str, Any],
) -> Path:
    """job_config with the corpus and tokenizer uploaded to the test S3 server under `prefix`, the
    output there too, and storage.endpoint pointing at it."""
    import pyarrow.fs as pafs

    fs, root = server.filesystem(), f"{s3server.BUCKET}/{prefix}"
    pafs.copy_files(str(corpus), f"{root}/corpus", destination_filesystem=fs)
    pafs.copy_files(str(tokenizer_file.parent), f"{root}/tok", destination_filesystem=fs)
    merged: dict[str, dict[str, Any]] = {
        "output": {"path": f"s3://{root}/out"},
        "storage": {"endpoint": server.endpoint},
    }
    for name, values in sections.items():
        merged[name] = {**merged.get(name, {}), **values}
    return job_config(tmp, f"s3://{root}/corpus/*", f"s3://{root}/tok/{tokenizer_file.name}", **merged)


def job_config(tmp: Path, corpus_glob: str, tokenizer_file: Path | str, **sections: dict[str, Any]) -> Path:
    config: dict[str, Any] = {
        "input": {"paths": [corpus_glob]},
        "tokenizer": {"path": str(tokenizer_file)},
        "pack": {"seq_len": 512},
        "output": {"path": str(tmp / "out"), "shard_rows": 50},
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def independent_tokens(corpus: Path, tokenizer_file: Path) -> dict[str, list[int]]:
    """Every document's tokens (then EOS), by doc id, tokenized here with tokenizers directly, not by
    raypack's tokenize stage: what the packs are checked against."""
    from raypack.config import InputConfig
    from raypack.pipeline.readers import read_unit
    from raypack.pipeline.units import WorkUnit
    from raypack.storage import Shard

    tok = Tokenizer.from_file(str(tokenizer_file))
    eos = tok.token_to_id("<|endoftext|>")
    tokens = {}
    reading = InputConfig(paths=("unused",)).reading()
    for shard in sorted(corpus.iterdir()):
        s = Shard(index=0, path=str(shard), relpath=shard.name, size=0, mtime_ns=0)
        for batch in read_unit(WorkUnit(s, reading), 1000):
            for doc_id, text in zip(batch.ids, batch.texts, strict=True):
                tokens[doc_id] = [*tok.encode(text, add_special_tokens=False).ids, eos]
    return tokens
