"""A trial on a subset (input.limit_bytes, `raypack pack --limit`): a deterministic sample of whole
work units, marked as a sample, every document of it packed whole and nothing else."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.config import InputConfig
from raypack.corpus.cut import sample_units
from raypack.corpus.units import WorkUnit
from raypack.storage import Shard
from tests.conftest import independent_tokens, job_config, packed_documents, random_text, write_jsonl

READING = InputConfig(paths=("unused",)).reading()


def units_of(sizes: list[int]) -> list[WorkUnit]:
    return [
        WorkUnit(Shard(index=i, path=f"/c/f{i}.jsonl", relpath=f"f{i}.jsonl", size=n, mtime_ns=0), READING)
        for i, n in enumerate(sizes)
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 200_000), st.integers(0, 9))
def test_a_sample_is_the_fewest_units_in_seeded_order_that_reach_the_limit(
    sizes: list[int], limit: int, seed: int
) -> None:
    units = units_of(sizes)
    taken = sample_units(units, limit, seed)
    assert taken == sample_units(units, limit, seed)  # deterministic
    assert [u.index for u in taken] == list(range(len(taken)))  # numbered again, from 0
    paths = [u.relpath for u in taken]
    assert paths == sorted(paths, key=lambda p: int(p[1:].split(".")[0]))  # in the job's order
    total = sum(u.size for u in taken)
    if total < limit:
        assert len(taken) == len(units)  # the whole input is smaller than the limit
    else:
        # Without the unit the seeded order took last, the sample would fall short of the limit.
        assert min(total - u.size for u in taken) < limit


def test_seeds_give_other_samples() -> None:
    units = units_of([100] * 50)
    samples = {tuple(u.relpath for u in sample_units(units, 1_000, seed)) for seed in range(5)}
    assert len(samples) == 5 and all(len(s) == 10 for s in samples)


def test_pack_with_a_limit_packs_a_marked_deterministic_sample_whole(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`raypack pack --limit`: files and a large JSONL file's units taken whole; every document of
    them packed (their tokens, independently tokenized), none of the rest; the manifest, the
    summary and the report say it is a sample; the same command gives the same bytes; verify passes
    without naming the files it did not take."""
    rng = random.Random(3)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in range(12):
        write_jsonl(corpus / f"small-{f:02d}.jsonl", [{"text": random_text(rng, 40)} for _ in range(20)])
    write_jsonl(corpus / "large.jsonl", [{"text": random_text(rng, 60)} for _ in range(2_000)])
    whole = sum(p.stat().st_size for p in corpus.iterdir())
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, file_units=False)
    out = tmp_path / "out"
    args = ["pack", str(cfg), "--limit", "0.4MB", "--set", "input.unit_bytes=100000"]
    assert main(args) == 0
    said = capsys.readouterr().out
    sample = json.loads((out / "manifest.json").read_text())["sample"]
    assert sample["limit_bytes"] == 400_000 and sample["of_bytes"] == whole and sample["of_files"] == 13
    assert 400_000 <= sample["bytes"] < whole and whole > 700_000
    assert "a trial on" in said and "not the whole corpus" in said
    assert "a trial on" in (out / "report.html").read_text()

    packed = packed_documents(out)
    everything = independent_tokens(corpus, tokenizer_path)
    assert packed and set(packed) < set(everything)
    assert all(packed[d] == everything[d] for d in packed)  # each sampled document whole
    files = {d.rsplit(":", 1)[0] for d in packed}
    small = {f for f in files if f.startswith("small")}
    assert all(sum(d.startswith(f + ":") for d in packed) == 20 for f in small)  # a small file: all of it
    data = {p.name: p.read_bytes() for p in (out / "data").iterdir()}
    assert main([*args, "--overwrite"]) == 0
    assert {p.name: p.read_bytes() for p in (out / "data").iterdir()} == data
    capsys.readouterr()
    assert main(["verify", str(out)]) == 0
    verified = capsys.readouterr().out
    assert "re-tokenized and equal" in verified and "files match input.paths now" not in verified
    assert "note: a trial on" in verified and "not the whole corpus" in verified
    other = tmp_path / "other"
    assert main([*args, "--set", "pack.seed=7", "--set", f"output.path={other}"]) == 0
    assert set(packed_documents(other)) != set(packed)


def test_a_limit_is_a_size(tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = job_config(tmp_path, f"{tmp_path}/*.jsonl", tokenizer_path)
    for bad in ("0", "ten", "5XB", "-3MB"):
        assert main(["pack", str(cfg), f"--limit={bad}"]) == 2
        assert "--limit takes a size such as 200MB" in capsys.readouterr().err


def test_a_trial_that_takes_the_whole_corpus_says_so(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": random_text(random.Random(1), 30)} for _ in range(10)])
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["pack", str(cfg), "--limit", "1GB"]) == 0
    said = capsys.readouterr().out
    assert "a trial (input.limit_bytes) that took the whole corpus" in said and "not the whole" not in said
