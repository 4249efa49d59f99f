"""Every packing mode a job config accepts, run as a job end to end and checked token for token
against an independent tokenization of the corpus (split: every token; truncate: the first seq_len;
drop: nothing of a document over seq_len, and the loss counted)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main
from raypack.config import JobConfig, load_config
from raypack.errors import JobError
from raypack.packing import pack
from raypack.pipeline.job import run_job
from raypack.verifier import verify
from tests.conftest import independent_tokens, job_config, make_corpus, random_text, write_jsonl

SEQ_LEN = 512

MODES: dict[str, dict[str, Any]] = {
    "lpfhp": {"algorithm": "lpfhp", "max_depth": 4},
    "spfhp": {"algorithm": "spfhp"},
    "nnlshp": {"algorithm": "nnlshp", "max_depth": 2},  # its bfd packs of the rest capped too
    "bucket": {"algorithm": "bucket", "max_depth": 3},  # default bucket lengths and padding threshold
    "sharded-ffd": {"mode": "sharded", "algorithm": "ffd", "shards_per_group": 2, "max_depth": 3},
    "no-shuffle": {"shuffle": False},
    "truncate": {"overflow": "truncate"},
    "drop": {"overflow": "drop"},
}


@dataclasses.dataclass(frozen=True)
class Corpus:
    glob: str
    tokens: dict[str, list[int]]
    """Every document's tokens (EOS-framed), tokenized here without raypack's tokenize stage."""
    cache: Path
    """Token files shared by the jobs of this module (a rebuild's cache): one tokenization for all."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Corpus:
    root = tmp_path_factory.mktemp("modes")
    path = make_corpus(root, shards=4, docs_per_shard=40, seed=17)
    tokens = independent_tokens(path, tokenizer_path)
    assert sum(len(t) > SEQ_LEN for t in tokens.values()) >= 5  # the overflow policies have work to do
    return Corpus(f"{path}/*", tokens, root / "cache")


def kept(tokens: list[int], overflow: str) -> list[int]:
    if overflow == "truncate":
        return tokens[:SEQ_LEN]
    if overflow == "drop" and len(tokens) > SEQ_LEN:
        return []
    return tokens


def packs_in_file_order(out: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((out / "data").rglob("*.parquet")))


# The histogram packers and shuffle's order are drawn by test_combinations too: the light tier runs
# the overflow policies, bucket and sharded here.
LIGHT_MODES = ("bucket", "sharded-ffd", "truncate", "drop")


@pytest.mark.parametrize(
    "mode", [m if m in LIGHT_MODES else pytest.param(m, marks=pytest.mark.slow) for m in MODES]
)
def test_every_mode_packs_every_kept_token_once(
    mode: str, corpus: Corpus, tokenizer_path: Path, tmp_path: Path
) -> None:
    settings = {"seq_len": SEQ_LEN, **MODES[mode]}
    cfg: JobConfig = load_config(str(job_config(tmp_path, corpus.glob, tokenizer_path, pack=settings)))
    result = run_job(cfg, cache=str(corpus.cache), log=lambda _: None)
    out = tmp_path / "out"
    report = verify(str(out), cfg, sample=len(corpus.tokens))  # every document re-tokenized
    assert report.ok, report.problems
    assert report.sampled == len(corpus.tokens)

    # Rebuild every document from the packs, independently of verify.
    packs = packs_in_file_order(out)
    pieces: dict[str, list[tuple[int, list[int]]]] = {}
    for row in packs.to_pylist():
        ends = row["doc_offsets"]
        assert ends[0] == 0 and ends[-1] == row["num_tokens"] <= len(row["input_ids"])
        for k, doc_id in enumerate(row["doc_ids"]):
            pieces.setdefault(doc_id, []).append(
                (row["chunk_index"][k], row["input_ids"][ends[k] : ends[k + 1]])
            )
    overflow = cfg.pack.overflow
    lost_tokens = lost_docs = 0
    for doc_id, tokens in corpus.tokens.items():
        want = kept(tokens, overflow)
        got = [t for _, part in sorted(pieces.pop(doc_id, [])) for t in part]
        assert got == want, doc_id
        lost_tokens += len(tokens) - len(want)
        lost_docs += not want
    assert not pieces  # nothing in the packs that is not a document of the corpus
    m = result.metrics
    assert (m.tokens_dropped, m.documents_dropped) == (lost_tokens, lost_docs)
    assert m.tokens == sum(len(t) for t in corpus.tokens.values()) - lost_tokens
    assert m.documents == len(corpus.tokens) and m.packs == packs.num_rows
    if overflow == "drop":
        assert lost_docs > 0 and all(not kept(t, "drop") for t in corpus.tokens.values() if len(t) > SEQ_LEN)

    lengths = np.array([len(t) for t in corpus.tokens.values()])
    capacity = np.array([len(x) for x in packs.column("input_ids").to_pylist()])
    fills = packs.column("num_tokens").to_numpy()
    if cfg.pack.mode == "global":
        # The same packs (by fill and capacity) as the packer makes on these lengths in one process.
        a = pack(lengths, SEQ_LEN, cfg.pack.algorithm, overflow=overflow, **cfg.pack.algorithm_options())
        assert m.packs == a.num_packs
        assert Counter(zip(fills.tolist(), capacity.tolist(), strict=True)) == Counter(
            zip(a.pack_fill().tolist(), a.capacities().tolist(), strict=True)
        )
        if not cfg.pack.shuffle:  # plan order, file after file
            assert fills.tolist() == a.pack_fill().tolist()
        else:
            assert fills.tolist() != a.pack_fill().tolist()
    else:
        group_of = {f"part-{s:03d}": s // 2 for s in range(4)}  # two shards a group
        for row in packs.to_pylist():
            assert len({group_of[d.split(".")[0]] for d in row["doc_ids"]}) == 1
    if cfg.pack.algorithm == "bucket":
        assert set(capacity.tolist()) <= {64, 128, 256, 512} and len(set(capacity.tolist())) > 1
    else:
        assert set(capacity.tolist()) == {SEQ_LEN}
    deepest = max(len(x) for x in packs.column("doc_ids").to_pylist())
    assert m.max_depth == deepest  # the summary's "at most"
    if cfg.pack.max_depth is not None:
        assert deepest <= cfg.pack.max_depth


def test_a_corpus_that_drop_leaves_empty_is_one_clear_error(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    write_jsonl(corpus / "a.jsonl", [{"text": random_text(rng, 400)} for _ in range(3)])
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"seq_len": 16, "overflow": "drop"})
    with pytest.raises(JobError, match=r"all 3 documents are longer than pack\.seq_len \(16\)"):
        run_job(load_config(str(path)), log=lambda _: None)
    assert not (tmp_path / "out" / "_staging").exists()
    capsys.readouterr()
    assert main(["pack", str(path), "--overwrite"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the stage progress lines
    assert last.startswith("raypack: job failed: nothing to pack: all 3 documents")
