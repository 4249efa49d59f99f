"""input.sources end to end: three sources (one upsampled ×2.5, one downsampled to 30%, one by
weight) packed globally, every selected document token for token in the packs as many times as its
source's rule gives it, each source within one document of its target; byte-identical for 1 and 2
tokenizer actors, for sources listed in another order, and across a rebuild that re-tokenizes only
a changed source's changed shard."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from raypack.cli import main
from raypack.config import JobConfig, load_config
from raypack.errors import ConfigError
from raypack.pipeline.job import run_job
from raypack.pipeline.rebuild import run_rebuild
from raypack.verifier import verify
from tests.conftest import independent_tokens, make_corpus, random_text, write_jsonl

SEQ = 512
quiet = {"log": lambda _: None}
MIX = {
    "web": {"repeat": 2.5},
    "books": {"repeat": 0.3},
    "code": {"weight": 0.4, "max_repeat": 4},
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    for seed, name in enumerate(MIX):
        make_corpus(root / name, shards=2, docs_per_shard=30, seed=100 + seed)
    return root


def config(
    tmp: Path, corpora: Path, tok: Path, out: Path, order: list[str] | None = None, **sections: Any
) -> JobConfig:
    names = order or list(MIX)
    data: dict[str, Any] = {
        "input": {
            "sources": [{"name": n, "paths": [f"{corpora}/{n}/corpus/*"], **MIX[n]} for n in names],
            "group_bytes": 0,  # a file a unit (conftest.job_config)
        },
        "tokenizer": {"path": str(tok), "concurrency": 1},
        "pack": {"seq_len": SEQ},
        "output": {"path": str(out), "shard_rows": 40},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    path = tmp / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path))


def packed_pieces(out: Path) -> dict[str, dict[int, list[list[int]]]]:
    """Every item in the packs: doc id -> chunk -> the token lists of its copies."""
    pieces: dict[str, dict[int, list[list[int]]]] = {}
    for path in sorted((out / "data").rglob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            ends = row["doc_offsets"]
            for k, doc_id in enumerate(row["doc_ids"]):
                pieces.setdefault(doc_id, {}).setdefault(row["chunk_index"][k], []).append(
                    row["input_ids"][ends[k] : ends[k + 1]]
                )
    return pieces


def data_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "data").rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def mixed(
    tmp_path_factory: pytest.TempPathFactory, corpora: Path, tokenizer_path: Path
) -> tuple[JobConfig, Any]:
    tmp = tmp_path_factory.mktemp("mixed")
    cfg = config(tmp, corpora, tokenizer_path, tmp / "out")
    return cfg, run_job(cfg, **quiet)


def test_each_source_meets_its_target_and_every_copy_is_in_the_packs(
    mixed: tuple[JobConfig, Any], corpora: Path, tokenizer_path: Path
) -> None:
    cfg, result = mixed
    out = Path(cfg.output.path)
    rows = {r["name"]: r for r in result.sources}
    assert set(rows) == set(MIX)
    index = pq.read_table(out / "index").to_pylist()
    copies = Counter(r["doc_id"] for r in index if r["copy"] >= 0)
    left_out = {r["doc_id"] for r in index if r["copy"] == -1}
    pieces = packed_pieces(out)
    longest = {}
    for name in MIX:
        # Independently of raypack: each document's tokens, and what its copies make.
        expected = {
            f"{name}/{doc_id}": tokens
            for doc_id, tokens in independent_tokens(corpora / name / "corpus", tokenizer_path).items()
        }
        longest[name] = max(len(t) for t in expected.values())
        realized = 0
        for doc_id, tokens in expected.items():
            n = copies[doc_id]
            assert (n == 0) == (doc_id in left_out)
            got = pieces.pop(doc_id, {})
            assert all(len(parts) == n for parts in got.values()), doc_id  # each chunk once a copy
            if n:
                for parts in got.values():
                    assert all(p == parts[0] for p in parts)
                assert [t for _, parts in sorted(got.items()) for t in parts[0]] == tokens
            realized += n * len(tokens)
        row = rows[name]
        assert row["tokens"] == sum(len(t) for t in expected.values())
        assert realized == row["selected"]
        assert abs(row["selected"] - row["target"]) <= max(longest[name], row["target"] // 1000)
    assert not pieces  # nothing in the packs that is no source's document
    # The asked shares: web ~2.5x, books ~30%, code 40% of the whole.
    assert rows["web"]["repetition"] == pytest.approx(2.5, abs=longest["web"] / rows["web"]["tokens"])
    assert rows["books"]["repetition"] == pytest.approx(0.3, abs=longest["books"] / rows["books"]["tokens"])
    assert rows["code"]["target_share"] == pytest.approx(0.4, abs=1e-3)
    assert rows["books"]["left_out"] > 0 and rows["web"]["left_out"] == 0
    report = verify(str(out), cfg, sample=40)
    assert report.ok, report.problems
    assert report.documents == 180 and report.sampled == 40
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in manifest["mixture"]["sources"]] == sorted(MIX)
    page = (out / "report.html").read_text()
    assert "<h2>Mixture</h2>" in page and "repeat 2.5" in page and "weight 0.4" in page


def test_the_same_bytes_for_two_actors_and_sources_in_another_order(
    mixed: tuple[JobConfig, Any], corpora: Path, tokenizer_path: Path, tmp_path: Path
) -> None:
    cfg, _ = mixed
    other = config(
        tmp_path,
        corpora,
        tokenizer_path,
        tmp_path / "other",
        order=["code", "books", "web"],
        tokenizer={"concurrency": 2},
    )
    run_job(other, **quiet)
    assert data_files(tmp_path / "other") == data_files(Path(cfg.output.path))
    for a, b in zip(
        sorted((tmp_path / "other" / "index").iterdir()),
        sorted(Path(cfg.output.path, "index").iterdir()),
        strict=True,
    ):
        assert a.read_bytes() == b.read_bytes()


def test_a_source_too_small_for_its_weight_is_a_clear_error(
    corpora: Path, tokenizer_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sections = {
        "input": {
            "sources": [
                {"name": "web", "paths": [f"{corpora}/web/corpus/*"], "weight": 0.9},
                {"name": "code", "paths": [f"{corpora}/code/corpus/*"], "weight": 0.1},
                {"name": "books", "paths": [f"{corpora}/books/corpus/*"], "tokens": 10_000_000},
            ]
        }
    }
    with pytest.raises(ConfigError):
        config(
            tmp_path, corpora, tokenizer_path, tmp_path / "x", **sections
        )  # weights sum to 1 beside a budget
    sections["input"]["sources"][0]["weight"] = 0.5
    cfg = config(tmp_path, corpora, tokenizer_path, tmp_path / "small", **sections)
    with pytest.raises(
        ConfigError,
        match=r"books \(tokens 10,000,000\) needs 10,000,000 tokens, [\d.]+× its [\d,]+ tokens, over its "
        r"max_repeat 1",
    ):
        run_job(cfg, **quiet)
    assert (
        not (tmp_path / "small" / "_staging").exists() and not (tmp_path / "small" / "manifest.json").exists()
    )
    assert main(["pack", str(tmp_path / "small.yaml"), "--overwrite"]) == 2
    assert "raise its max_repeat" in capsys.readouterr().err


@pytest.mark.slow  # 13 s; incremental rebuilds are test_rebuild's in the light tier
def test_a_rebuild_retokenizes_only_the_changed_shard_and_matches_a_fresh_pack(
    corpora: Path, tokenizer_path: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "corpora"
    for name in MIX:
        (copy / name / "corpus").mkdir(parents=True)
        for f in (corpora / name / "corpus").iterdir():
            (copy / name / "corpus" / f.name).write_bytes(f.read_bytes())
    cfg = config(
        tmp_path,
        copy,
        tokenizer_path,
        tmp_path / "root",
        pack={"mode": "sharded", "algorithm": "greedy", "shards_per_group": 2},
    )
    first = run_rebuild(cfg, **quiet)
    assert first.job.shards_tokenized == 6
    rng = random.Random(3)
    changed = copy / "books" / "corpus" / "part-001.jsonl.gz"
    write_jsonl(changed, [{"text": random_text(rng, 200)} for _ in range(25)], "gzip")
    os.utime(changed, ns=(1, 1))
    second = run_rebuild(cfg, **quiet)
    assert (second.job.shards_tokenized, second.job.shards_reused) == (1, 5)
    fresh = tmp_path / "fresh"
    run_job(dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, path=str(fresh))), **quiet)
    rebuilt = tmp_path / "root" / second.version
    assert data_files(rebuilt) == data_files(fresh)
    report = verify(str(tmp_path / "root"), cfg, sample=20)
    assert report.ok, report.problems
    # Sharded mode: every group packed alone, copies included, and none over the depth it reports.
    assert second.job.metrics.documents == sum(r["copies"] for r in second.job.sources)


def test_verify_finds_a_copy_missing_from_the_index(mixed: tuple[JobConfig, Any], tmp_path: Path) -> None:
    cfg, _ = mixed
    out = tmp_path / "broken"
    shutil.copytree(cfg.output.path, out)
    index = next(
        p for p in sorted((out / "index").iterdir()) if 1 in pq.read_table(p).column("copy").to_pylist()
    )
    table = pq.read_table(index)
    twice = [i for i, c in enumerate(table.column("copy").to_pylist()) if c == 1]
    pq.write_table(table.take([i for i in range(table.num_rows) if i != twice[0]]), index)
    problems = verify(str(out)).problems
    assert any("copies in the index, its source's rule gives" in p for p in problems), problems


def test_each_source_is_read_with_its_own_format_fields_and_ids(tmp_path: Path, tokenizer_path: Path) -> None:
    """A source's format, text_field and id_field reach the task that reads its files: a Parquet
    source with its own columns under a JSONL top level, a source whose id_field "" unsets the top
    level's (ids from path and line), and one that inherits it. Every document, by its id, holds the
    tokens tokenizers gives its text; nothing is rejected. A token file read the old way is never
    reused: the readers' code version is in the cache key."""
    from tokenizers import Tokenizer

    from raypack.pipeline import token_files as tokenize_module
    from raypack.pipeline.token_files import token_key, token_settings
    from raypack.pipeline.tokenizer import load_tokenizer
    from raypack.pipeline.units import WorkUnit
    from raypack.storage import Shard

    rng = random.Random(31)
    texts = {
        name: [random_text(rng, 5 + rng.randrange(300)) for _ in range(25)]
        for name in ("web", "code", "notes")
    }
    (tmp_path / "web").mkdir()
    write_jsonl(
        tmp_path / "web" / "a.jsonl", [{"text": t, "id": f"web-{i}"} for i, t in enumerate(texts["web"])]
    )
    (tmp_path / "code").mkdir()
    pq.write_table(
        pa.table({"content": texts["code"], "path": [f"src/{i}.py" for i in range(25)]}),
        tmp_path / "code" / "b.parquet",
        row_group_size=7,
    )
    (tmp_path / "notes").mkdir()
    write_jsonl(tmp_path / "notes" / "c.jsonl", [{"body": t, "id": i} for i, t in enumerate(texts["notes"])])
    data = {
        "input": {
            "format": "jsonl",
            "id_field": "id",
            "max_reject_ratio": 0.0,
            "sources": [
                {"name": "web", "paths": [f"{tmp_path}/web/*"]},
                {
                    "name": "code",
                    "paths": [f"{tmp_path}/code/*"],
                    "format": "parquet",
                    "text_field": "content",
                    "id_field": "path",
                },
                {"name": "notes", "paths": [f"{tmp_path}/notes/*"], "text_field": "body", "id_field": ""},
            ],
        },
        "tokenizer": {"path": str(tokenizer_path), "concurrency": 2},
        "pack": {"seq_len": SEQ},
        "output": {"path": str(tmp_path / "out"), "shard_rows": 10},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(str(tmp_path / "job.yaml"))
    result = run_job(cfg, **quiet)
    assert (result.documents, result.rejects) == (75, 0)
    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id("<|endoftext|>")
    expected = {f"web-{i}": t for i, t in enumerate(texts["web"])}
    expected |= {f"src/{i}.py": t for i, t in enumerate(texts["code"])}
    expected |= {f"notes/c.jsonl:{i + 1}": t for i, t in enumerate(texts["notes"])}
    pieces = packed_pieces(tmp_path / "out")
    assert set(pieces) == set(expected)
    for doc_id, text in expected.items():
        got = [t for _, parts in sorted(pieces[doc_id].items()) for t in parts[0]]
        assert got == [*tok.encode(text, add_special_tokens=False).ids, eos], doc_id
    assert verify(str(tmp_path / "out"), cfg, sample=30).ok

    # The cache key holds the readers' version: a fix to a reader re-reads every file.
    loaded = load_tokenizer(cfg.tokenizer)
    unit = WorkUnit(
        Shard(index=0, path="x", relpath="code/b.parquet", size=1, mtime_ns=1), cfg.input.reading("code")
    )
    before = token_key(unit, token_settings(cfg, loaded, unit.reading))
    tokenize_module.READ_VERSION += 1
    try:
        assert token_key(unit, token_settings(cfg, loaded, unit.reading)) != before
    finally:
        tokenize_module.READ_VERSION -= 1
