"""decompose against OLMo-core's own VSL dataset (olmo_core.data.NumpyVSLDataset) on the same token
ids: the same chunks of the same documents in every bucket, and the same batches a bucket for its
curricula (raypack.packing.curriculum, tokens_per_batch)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from olmo_core.data import NumpyVSLDataset, VSLGrowP2Curriculum, VSLNaturalCurriculum
from olmo_core.data.utils import load_array_slice

from raypack.config import load_config
from raypack.packing.curriculum import Curriculum, cycle_counts
from raypack.pipeline.job import run_job
from raypack.reader import Plan, batching_of, pin
from tests.conftest import job_config, make_corpus, packed_documents

# Not 256: OLMo-core 3.0.0 keeps instance lengths in the smallest dtype holding max_sequence_length
# - 1 (uint8 for 256), so its chunks of 256 tokens count as length 0 and its 256 bucket is empty.
SEQ_LEN, LOW = 512, 16


def _pack(tmp: Path, corpus: Path, tokenizer: Path, low: int) -> Path:
    pack = {"algorithm": "decompose", "seq_len": SEQ_LEN, "min_seq_len": low}
    (tmp / f"low{low}").mkdir()
    cfg = job_config(tmp / f"low{low}", f"{corpus}/*", tokenizer, pack=pack)
    run_job(load_config(str(cfg)), log=lambda _: None)
    return tmp / f"low{low}" / "out"


def _chunks(out: Path) -> dict[int, Counter[tuple[str, tuple[int, ...]]]]:
    """Per bucket length: (document, chunk tokens) of every pack."""
    found: dict[int, Counter[tuple[str, tuple[int, ...]]]] = {}
    for path in (out / "data").rglob("*.parquet"):
        length = int(path.parent.name.split("=")[1])
        table = pq.read_table(path).to_pydict()
        for ids, doc in zip(table["input_ids"], table["doc_ids"], strict=True):
            found.setdefault(length, Counter())[doc[0], tuple(ids)] += 1
    return found


@pytest.fixture(scope="module")
def same_tokens(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path
) -> tuple[Path, Path, list[str]]:
    """raypack's decompose dataset (min_seq_len 16), and an .npy of the same documents' token ids
    back to back (each ends in EOS), from a decompose dataset that keeps every token (min 1)."""
    tmp = tmp_path_factory.mktemp("olmo-vsl")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=60, seed=8)
    whole = packed_documents(_pack(tmp, corpus, tokenizer_path, 1))
    order = sorted(whole)
    npy = tmp / "tokens.npy"
    np.concatenate([np.asarray(whole[d], dtype=np.uint16) for d in order]).tofile(npy)
    return _pack(tmp, corpus, tokenizer_path, LOW), npy, order


def _olmo(npy: Path, tokenizer_path: Path, work: Path, curriculum: object = None) -> NumpyVSLDataset:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    ds = NumpyVSLDataset(
        npy,
        pad_token_id=tok.token_to_id("<|pad|>"),
        eos_token_id=tok.token_to_id("<|endoftext|>"),
        vocab_size=tok.get_vocab_size(),
        max_sequence_length=SEQ_LEN,
        min_sequence_length=LOW,
        curriculum=curriculum,  # type: ignore[arg-type]
        dtype=np.uint16,
    )
    ds.work_dir = work
    ds.prepare()
    return ds


def test_olmo_core_cuts_the_same_tokens_into_the_same_chunks_per_bucket(
    same_tokens: tuple[Path, Path, list[str]], tokenizer_path: Path, tmp_path: Path
) -> None:
    ours, npy, order = same_tokens
    ds = _olmo(npy, tokenizer_path, tmp_path)
    tokens = np.fromfile(npy, dtype=np.uint16)
    eos = int(tokens[-1])
    doc_end = np.flatnonzero(tokens == eos) + 1  # each document ends in EOS, and only there
    assert len(doc_end) == len(order)
    theirs: dict[int, Counter[tuple[str, tuple[int, ...]]]] = {}
    for length, count in ds.instances_per_bucket:
        if not count:  # np.memmap cannot map OLMo-core's empty bucket file
            continue
        for index in ds.get_instance_bucket(length).tolist():
            ids = ds[index]["input_ids"].numpy()
            assert len(ids) == length
            # The instance's start in the array names its document.
            start = int(
                load_array_slice(ds._get_document_indices_path(npy), 2 * index, 2 * index + 1, np.uint32)[0]
            )
            doc = order[int(np.searchsorted(doc_end, start, side="right"))]
            theirs.setdefault(length, Counter())[doc, tuple(ids.tolist())] += 1
    got = _chunks(ours)
    assert sorted(got) == sorted(theirs)
    for length in got:
        assert got[length] == theirs[length], length


@pytest.mark.parametrize("cycles", [1, 2])
def test_the_same_batches_a_bucket_as_olmo_core_s_curricula(
    same_tokens: tuple[Path, Path, list[str]], tokenizer_path: Path, tmp_path: Path, cycles: int
) -> None:
    """Batches of `tokens` tokens (OLMo-core's global batch size, one rank): its natural and Grow-P2
    curricula and ours read as many batches of each length. (Grow-P2 drops a bucket's batches past
    a multiple of num_cycles; ours keeps them: equal here at 1 cycle, and at 2 where they divide.)"""
    ours, npy, _ = same_tokens
    tokens = 512
    ds = _olmo(npy, tokenizer_path, tmp_path, VSLGrowP2Curriculum(num_cycles=cycles))
    natural = [n for _, n in VSLNaturalCurriculum().batches_per_bucket(ds, tokens)]
    grow = [n for _, n in ds.curriculum.batches_per_bucket(ds, tokens)]
    pinned = pin(str(ours))
    lengths = [int(b["length"]) for b in pinned.manifest["buckets"]]
    assert lengths == [x for x, n in ds.instances_per_bucket if n]  # the same buckets, none empty
    plan = Plan.of(
        pinned, batching_of(None, tokens, Curriculum("grow_p2", cycles), "drop"), 0, 1, 0, "drop", None
    )
    steps = np.bincount(plan.schedule, minlength=len(lengths)).tolist()
    olmo_natural = [n for x, n in zip(ds.all_sequence_lengths, natural, strict=True) if x in lengths]
    assert steps == olmo_natural
    olmo_grow = [n for x, n in zip(ds.all_sequence_lengths, grow, strict=True) if x in lengths]
    assert [s - s % cycles for s in steps] == olmo_grow


def test_each_step_s_length_follows_olmo_core_s_grow_p2_sub_cycles(
    same_tokens: tuple[Path, Path, list[str]], tokenizer_path: Path, tmp_path: Path
) -> None:
    """The steps of iter_batches' Grow-P2 schedule on this dataset, against OLMo-core's
    get_batch_indices for its own batches_per_bucket on the same tokens: each (cycle, sub-cycle)
    reads the same lengths, the first step the longest (the two shuffle within a sub-cycle each their
    own way; the first sub-cycle and the one the longest first batch came from agree together)."""
    from tests.packing.test_curriculum import _windows

    ours, npy, _ = same_tokens
    tokens, cycles = 512, 1
    ds = _olmo(npy, tokenizer_path, tmp_path, VSLGrowP2Curriculum(num_cycles=cycles))
    per_bucket = [(x, n) for x, n in ds.curriculum.batches_per_bucket(ds, tokens) if n]
    theirs = np.searchsorted(
        np.cumsum([n for _, n in per_bucket]), ds.curriculum.get_batch_indices(per_bucket, 0), side="right"
    )
    plan = Plan.of(
        pin(str(ours)),
        batching_of(None, tokens, Curriculum("grow_p2", cycles), "drop"),
        0,
        1,
        0,
        "drop",
        None,
    )
    assert [b.length for b in plan.buckets] == [x for x, _ in per_bucket]
    steps = [n for _, n in per_bucket]
    counts = cycle_counts("grow_p2", steps, cycles)
    a, b = _windows(plan.schedule, counts), _windows(theirs, counts)
    longest = len(steps) - 1
    moved = next(i for i, row in enumerate(counts.reshape(-1, len(steps))) if row[longest])
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if i not in (0, moved):
            assert (
                np.bincount(x, minlength=len(steps)).tolist() == np.bincount(y, minlength=len(steps)).tolist()
            )
    assert sorted(np.concatenate([a[0], a[moved]]).tolist()) == sorted(
        np.concatenate([b[0], b[moved]]).tolist()
    )
    assert plan.schedule[0] == theirs[0] == longest
