"""Shared fixtures: a real trained tokenizer, corpora on disk, a real S3 server, and one local Ray
for the tests that are about Ray.

Which path a test's job takes: the user's. A job run as the CLI and raypack.pack() run it, with
run.executor auto, takes the runner a user's process takes: the local pool for a small corpus when
no Ray is named or running in the process. So Ray is started in this process only for tests marked
`ray` (or asking for ray_session), and those run after every other test (pytest_collection_modifyitems);
every other test checks, as it starts, that no Ray runs here (users_path_or_ray): a test that ran
on Ray while meaning the user's default path would fail instead of passing on another path."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests import s3server

ROOT = Path(__file__).resolve().parents[1]

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


def _on_ray(item: pytest.Item) -> bool:
    return item.get_closest_marker("ray") is not None or "ray_session" in item.fixturenames


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on Ray last, each module's in its order: before them, no Ray runs in this process.

    `make test` runs the suite on two pytest-xdist workers, a module at a time (-n 2 --dist
    loadfile): on one process it took 19 min of a 2-core machine and kept 1.2 cores busy. A module's
    fixtures are made once, and its tests on Ray run after its others; a worker that goes on to
    another module after tests on Ray shuts its Ray down first (users_path_or_ray). Not loadgroup:
    pytest-xdist 3.8 names a group's items by `_nodeid`, which pytest 9.2 no longer reads, so its
    groups are spread over the workers."""
    items.sort(key=_on_ray)  # stable


def _ray_started() -> bool:
    import sys

    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


@pytest.fixture(autouse=True)
def users_path_or_ray(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked `ray` gets the session's Ray. Any other runs with no Ray in this process and no
    RAY_ADDRESS: its jobs take the default executor's choice as a user's `raypack pack` would.

    A test that starts Ray without the mark (ray.data.from_items starts it on first use) fails
    itself, and Ray is shut down behind it: the tests after it keep the user's path, and the
    session's Ray can still start (CI once reported 259 errors for the one unmarked test)."""
    if _on_ray(request.node):
        request.getfixturevalue("ray_session")
        yield
        return
    if _SESSION_RAY and _ray_started():  # this worker ran a module's tests on Ray: now another module
        import ray

        ray.shutdown()
        _SESSION_RAY.clear()
    if _ray_started():
        pytest.fail("Ray runs in this process: this test would not take the user's path (mark it ray)")
    if os.environ.get("RAY_ADDRESS"):
        pytest.fail("RAY_ADDRESS is set: this test would not take the user's path")
    yield
    if _ray_started():
        import ray

        ray.shutdown()
        pytest.fail("this test started Ray in the test process: mark it ray (tests/conftest.py)")


_SESSION_RAY: list[bool] = []
"""[True] while the Ray that ray_session started runs in this process."""


@pytest.fixture
def ray_session() -> None:
    """Local Ray, started once for the tests on Ray that run one after another: each start costs
    seconds on two cores. A new local instance (address "local"), never a head another test started.
    Its workers inherit the test S3 server's credentials from this environment, as a cluster's would
    from its nodes'. Shut down by the next test not on Ray, or at the session's end."""
    import ray

    if _SESSION_RAY and ray.is_initialized():
        return
    os.environ.update(s3server.CREDENTIALS)
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=400 * 2**20,
        logging_level="ERROR",
    )
    _SESSION_RAY[:] = [True]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _SESSION_RAY and _ray_started():
        import ray

        ray.shutdown()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.S3Server]:
    """A real S3 server (SeaweedFS) for the session, with bucket s3server.BUCKET."""
    os.environ.update(s3server.CREDENTIALS)
    server = s3server.start(tmp_path_factory.mktemp("seaweedfs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mistral_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Mistral-7B-v0.1's SentencePiece BPE, its published shape (tests/real_tokenizers.py)."""
    from tests.real_tokenizers import mistral_v1

    return mistral_v1(tmp_path_factory.mktemp("mistral-v1"))


@pytest.fixture(scope="session")
def mistral_v1_metaspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model as transformers 5 converts it: a Metaspace pre-tokenizer."""
    from tests.real_tokenizers import mistral_v1_metaspace

    return mistral_v1_metaspace(tmp_path_factory.mktemp("mistral-v1-metaspace"))


@pytest.fixture(scope="session")
def tekken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Mistral's tekken: a tiktoken-style byte-level BPE of 131,072 ids (tests/real_tokenizers.py)."""
    from tests.real_tokenizers import tekken

    return tekken(tmp_path_factory.mktemp("tekken"))


@pytest.fixture
def driver_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Where tokenizers parsed a tokenizer file in this process (the driver's), from now on: a job
    on local processes leaves the parse to its workers' load."""
    from raypack.text import tokenizer as tokenizer_module

    parsed: list[str] = []
    parse = tokenizer_module._parse

    def counted(raw: bytes, where: str) -> Any:
        parsed.append(where)
        return parse(raw, where)

    monkeypatch.setattr(tokenizer_module, "_parse", counted)
    return parsed


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
    file_units: bool = True,
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
    return job_config(
        tmp, f"s3://{root}/corpus/*", f"s3://{root}/tok/{tokenizer_file.name}", file_units, **merged
    )


def job_config(
    tmp: Path,
    corpus_glob: str,
    tokenizer_file: Path | str,
    file_units: bool = True,
    **sections: dict[str, Any],
) -> Path:
    """A job's config file. `file_units`: a file a work unit (input.group_bytes 0): these corpora's
    files of a few KB stand for shards of many MB, and their tests count on a unit a file (units
    tokenized, reused, retried, on several nodes); runs of small files, the default a user gets, are
    tests/corpus/test_groups.py's, with file_units False."""
    config: dict[str, Any] = {
        "input": {"paths": [corpus_glob], **({"group_bytes": 0} if file_units else {})},
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
    from raypack.corpus.readers import read_unit
    from raypack.corpus.units import WorkUnit
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


def packed_documents(out: Path) -> dict[str, list[int]]:
    """Every document's tokens rebuilt from a parquet dataset's packs (its chunks in order), by id."""
    pieces: dict[str, list[tuple[int, list[int]]]] = {}
    for path in sorted((out / "data").rglob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            ends = row["doc_offsets"]
            for k, doc_id in enumerate(row["doc_ids"]):
                pieces.setdefault(doc_id, []).append(
                    (row["chunk_index"][k], row["input_ids"][ends[k] : ends[k + 1]])
                )
    return {doc_id: [t for _, part in sorted(parts) for t in part] for doc_id, parts in pieces.items()}


def assert_epoch_read_under(
    last_batch: str, everything: Counter[tuple[int, int]], got: Counter[tuple[int, int]], slack: int
) -> None:
    """Per bucket, an epoch read in runs (`got`: each (bucket, position) read, with its count) against
    every pack (`everything`): under "drop" none twice and fewer than `slack` (the runs' rounds) left
    unread; otherwise every one read, fewer than `slack` of them twice."""
    for bucket in {bucket for bucket, _ in everything}:
        want = {p for p in everything if p[0] == bucket}
        have = Counter({p: n for p, n in got.items() if p[0] == bucket})
        if last_batch == "drop":
            assert max(have.values(), default=1) == 1 and set(have) <= want
            assert len(want) - len(have) < slack
        else:
            assert set(have) == want
            assert sum(have.values()) - len(want) < slack


def train_tokenizer(path: Path, vocab_size: int, seed: int) -> Path:
    """A byte-level BPE of `vocab_size` tokens trained on generated text of `seed`, saved at `path`
    (with <|endoftext|> as EOS and <|pad|>): another seed or size gives other ids."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<s>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`raypack ARGS` in a process of its own, as a user types it (no Ray named or running)."""
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-m", "raypack.cli", *args],
        capture_output=True,
        text=True,
        env=base | (env or {}),
        cwd=cwd or ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done
