"""pack.pad_multiple end to end: a real job on real tokenizers, its packs checked against an
independent tokenization, verify, the reader's THD fields, and megatron-core's PackedSeqParams and
context-parallel partition of a THD batch."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.config import load_config
from raypack.formats import PARQUET_SETTINGS, item_spans
from raypack.pipeline.job import run_job
from raypack.reader import IGNORE_INDEX, iter_batches
from raypack.summary import format_summary
from raypack.verifier import verify
from tests.conftest import independent_tokens, job_config, make_corpus

SEQ_LEN, K = 256, 8  # K = 2 × CP for CP 4 (or TP × CP × 2 for TP 2, CP 2)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("aligned")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=25, seed=11)
    sections = {"pack": {"seq_len": SEQ_LEN, "pad_multiple": K}, "output": {"shard_rows": 20}}
    cfg = load_config(str(job_config(tmp, f"{corpus}/*", tokenizer_path, **sections)))
    result = run_job(cfg, log=lambda _: None)
    return {"tmp": tmp, "corpus": corpus, "cfg": cfg, "result": result, "out": tmp / "out"}


def packs_of(out: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((out / "data").rglob("*.parquet")))


def test_every_real_token_arrives_once_aligned_and_a_rerun_is_byte_identical(
    aligned: dict[str, Any], tokenizer_path: Path
) -> None:
    out, result = aligned["out"], aligned["result"]
    table = packs_of(out)
    pad = json.loads((out / "manifest.json").read_text())["tokenizer"]["pad_id"]
    starts, lengths, per_row = item_spans(table)
    assert "padded_offsets" in table.column_names
    assert np.all(starts % K == 0)  # every item starts at a multiple of K
    ids = np.stack(table.column("input_ids").to_numpy(zero_copy_only=False))
    row = np.repeat(np.arange(table.num_rows), per_row)
    padded = [np.asarray(p) for p in table.column("padded_offsets").to_pylist()]
    spans = np.concatenate([np.diff(p) for p in padded])
    assert np.array_equal(spans, -(-lengths // K) * K)  # each item's padding runs to the next multiple
    assert all(p[-1] <= SEQ_LEN for p in padded)
    # Independently of raypack: every document's tokens, rebuilt from its items in chunk order.
    expected = independent_tokens(aligned["corpus"], tokenizer_path)
    pieces: dict[str, list[tuple[int, list[int]]]] = {}
    doc_ids = table.column("doc_ids").combine_chunks().flatten().to_pylist()
    chunks = table.column("chunk_index").combine_chunks().flatten().to_pylist()
    real = np.zeros(ids.shape, dtype=bool)
    for i, (r, s, n) in enumerate(zip(row.tolist(), starts.tolist(), lengths.tolist(), strict=True)):
        pieces.setdefault(doc_ids[i], []).append((chunks[i], ids[r, s : s + n].tolist()))
        real[r, s : s + n] = True
    assert {d: [t for _, p in sorted(parts) for t in p] for d, parts in pieces.items()} == expected
    assert np.all(ids[~real] == pad)  # alignment padding and end padding alike
    # Metrics: real tokens, alignment padding and end padding, apart, adding up to the slots.
    m = result.metrics
    assert m.tokens == sum(len(v) for v in expected.values()) == int(real.sum())
    assert m.alignment_padding == int((spans - lengths).sum()) > 0
    assert m.end_padding == int(sum(SEQ_LEN - p[-1] for p in padded))
    assert m.tokens + m.alignment_padding + m.end_padding == m.slots == table.num_rows * SEQ_LEN
    doc = json.loads((out / "metrics.json").read_text())["metrics"]
    assert (doc["alignment_padding"], doc["end_padding"]) == (m.alignment_padding, m.end_padding)
    line = f"{m.tokens:,} real tokens ({100 * m.tokens / m.slots:.2f}%), {m.alignment_padding:,} alignment"
    assert line in format_summary(result) and line in (out / "report.html").read_text()
    report = verify(str(out), aligned["cfg"], sample=15)
    assert report.ok, report.problems
    # The same inputs, config and seed: byte-identical files.
    again = aligned["tmp"] / "again"
    again.mkdir()
    sections = {"pack": {"seq_len": SEQ_LEN, "pad_multiple": K}, "output": {"shard_rows": 20}}
    cfg = job_config(again, f"{aligned['corpus']}/*", tokenizer_path, **sections)
    run_job(load_config(str(cfg)), log=lambda _: None)
    for path in sorted((out / "data").rglob("*")):
        twin = again / "out" / path.relative_to(out)
        assert hashlib.sha256(twin.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()


def test_verify_finds_a_misaligned_item_and_a_token_in_the_alignment_padding(
    aligned: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(aligned["out"], out)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["files"][0]
    table = pq.read_table(out / entry["path"])
    ids = table.column("input_ids").to_pylist()
    padded = table.column("padded_offsets").to_pylist()
    real = table.column("doc_offsets").to_pylist()
    # A row whose first item has alignment padding: a token there; another row: an item moved by one.
    gap = next(r for r in range(len(ids)) if padded[r][1] > real[r][1])
    ids[gap][real[gap][1]] = ids[gap][0] if ids[gap][0] != manifest["tokenizer"]["pad_id"] else 1
    moved = next(r for r in range(len(ids)) if r != gap and len(padded[r]) > 2)
    padded[moved][1] += 1
    changed = table.set_column(0, "input_ids", pa.array(ids, pa.list_(pa.int32())))
    changed = changed.set_column(
        changed.schema.get_field_index("padded_offsets"),
        "padded_offsets",
        pa.array(padded, pa.list_(pa.int32())),
    )
    pq.write_table(changed, out / entry["path"], **PARQUET_SETTINGS)  # type: ignore[arg-type]
    data = (out / entry["path"]).read_bytes()
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(str(out), aligned["cfg"]).problems
    assert any(f"row {gap}: an alignment padding position does not hold pad_id" in p for p in problems)
    assert any(f"row {moved}: items must start at multiples of pack.pad_multiple=8" in p for p in problems)


def thd_batch(out: Path, batch_size: int = 4) -> dict[str, Any]:
    return next(iter(iter_batches(str(out), batch_size=batch_size, seed=3)))


def test_the_reader_gives_real_and_padded_boundaries_and_positions_through_the_padding(
    aligned: dict[str, Any],
) -> None:
    b = thd_batch(aligned["out"])
    rows, length = b["input_ids"].shape
    cu, cu_padded = b["cu_seqlens"].astype(np.int64), b["cu_seqlens_padded"].astype(np.int64)
    assert len(cu) == len(cu_padded) and cu_padded[-1] == rows * length
    real_len, span = np.diff(cu), np.diff(cu_padded)
    assert np.all(span % K == 0) and np.all(real_len <= span)
    assert b["max_seqlen"] == int(span.max())
    flat = {k: b[k].reshape(-1) for k in ("input_ids", "labels", "position_ids", "document_ids")}
    for s, n, p in zip(cu_padded[:-1].tolist(), real_len.tolist(), span.tolist(), strict=True):
        segment = slice(s, s + p)
        # Positions count on from the segment's start through its alignment padding (Bridge and TE).
        assert flat["position_ids"][segment].tolist() == list(range(p))
        if n == p and flat["document_ids"][s] == -1:  # a row's end padding: a segment of its own
            assert np.all(flat["labels"][segment] == IGNORE_INDEX)
            continue
        doc = flat["document_ids"][s : s + n]
        assert np.all(doc == doc[0]) and doc[0] >= 0
        assert flat["labels"][s : s + n][1:].tolist() == flat["input_ids"][s : s + n][1:].tolist()
        assert np.all(flat["labels"][s + n : s + p] == IGNORE_INDEX)  # padding is never trained
        assert np.all(flat["document_ids"][s + n : s + p] == -1)


def test_rows_without_padded_offsets_read_as_before() -> None:
    """A dataset written without alignment (or before it existed) has no padded_offsets: its
    batches are what they were, cu_seqlens_padded the same as cu_seqlens; and the same rows with
    the column say where each document's padding is."""
    from raypack.reader import batch_fields

    ids = [1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 0, 0, 0, 0, 0, 0]
    old = pa.table(
        {
            "input_ids": [[1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
            "doc_offsets": [[0, 5, 7]],
            "num_tokens": pa.array([7], pa.int32()),
        }
    )
    b = batch_fields(old, 16, pad_id=0)
    assert b["cu_seqlens"].tolist() == b["cu_seqlens_padded"].tolist() == [0, 5, 7, 16]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, *range(9)]
    aligned_rows = old.set_column(0, "input_ids", pa.array([ids])).append_column(
        "padded_offsets", pa.array([[0, 8, 16]], pa.list_(pa.int32()))
    )
    b = batch_fields(aligned_rows, 16, pad_id=0)
    assert b["cu_seqlens"].tolist() == [0, 5, 7] and b["cu_seqlens_padded"].tolist() == [0, 8, 16]
    assert b["position_ids"][0].tolist() == [*range(8), *range(8)]
    assert b["labels"][0].tolist() == [-100, 2, 3, 4, 5, *[-100] * 4, 7, *[-100] * 6]
    assert b["document_ids"][0].tolist() == [0] * 5 + [-1] * 3 + [1] * 2 + [-1] * 6


def test_torch_dataloader_gives_the_same_thd_fields(aligned: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    from raypack.torch_data import PackedDataset

    want = thd_batch(aligned["out"])
    got = next(
        iter(torch.utils.data.DataLoader(PackedDataset(str(aligned["out"]), 4, seed=3), batch_size=None))
    )
    for key in ("cu_seqlens", "cu_seqlens_padded", "position_ids", "labels"):
        assert np.array_equal(got[key].numpy(), want[key]), key


def test_sharded_mode_aligns_each_groups_items(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=20, seed=5)
    pack = {"seq_len": SEQ_LEN, "pad_multiple": 16, "mode": "sharded", "algorithm": "ffd"}
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack=pack)))
    result = run_job(cfg, log=lambda _: None)
    starts, lengths, _ = item_spans(packs_of(tmp_path / "out"))
    assert np.all(starts % 16 == 0) and int(lengths.sum()) == result.metrics.tokens
    assert result.metrics.alignment_padding == int((-(-lengths // 16) * 16 - lengths).sum())
    report = verify(str(tmp_path / "out"), cfg, sample=10)
    assert report.ok, report.problems


def test_megatron_core_partitions_every_document_evenly_over_context_parallel_ranks(
    aligned: dict[str, Any],
) -> None:
    torch = pytest.importorskip("torch")
    mcore_utils = pytest.importorskip("megatron.core.utils")
    from megatron.core.packed_seq_params import PackedSeqParams

    b = thd_batch(aligned["out"])
    tokens = torch.from_numpy(b["input_ids"].reshape(1, -1))
    labels = torch.from_numpy(b["labels"].reshape(1, -1))
    cu = torch.from_numpy(b["cu_seqlens"])
    cu_padded = torch.from_numpy(b["cu_seqlens_padded"])
    max_seqlen = torch.tensor([b["max_seqlen"]])
    batch = {
        "tokens": tokens,
        "labels": labels,
        "position_ids": torch.from_numpy(b["position_ids"].reshape(1, -1)),
    }
    # CP 1 runs on a CPU: megatron-core builds its PackedSeqParams from the reader's fields as they are.
    same, params = mcore_utils.get_thd_batch_on_this_cp_rank(dict(batch), cu, cu_padded, max_seqlen, 1, 0)
    assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
    assert torch.equal(params.cu_seqlens_q, cu) and torch.equal(params.cu_seqlens_q_padded, cu_padded)
    assert torch.equal(params.cu_seqlens_kv_padded, cu_padded) and params.max_seqlen_q == b["max_seqlen"]
    assert torch.equal(same["tokens"], tokens)
    # CP > 1 takes Transformer Engine's thd_get_partitioned_indices, a CUDA kernel (TE is not
    # installed here); its documented rule instead: every sequence of cu_seqlens_padded (which it
    # asserts divisible by 2 × CP) cut into 2 × CP chunks, rank r taking chunks r and 2 × CP - 1 - r.
    if mcore_utils.tex is None:
        with pytest.raises(AssertionError, match="Transformer Engine"):
            mcore_utils.get_thd_batch_on_this_cp_rank(dict(batch), cu, cu_padded, max_seqlen, 2, 0)
    spans = np.diff(b["cu_seqlens_padded"].astype(np.int64))
    trained = labels.reshape(-1) != IGNORE_INDEX
    for cp in (2, 4):
        assert np.all(spans % (2 * cp) == 0)
        owner = np.full(tokens.shape[1], -1)
        for rank in range(cp):
            index = te_partition_rule(b["cu_seqlens_padded"], cp, rank)
            assert np.all(owner[index] == -1)  # no position on two ranks
            owner[index] = rank
            # What megatron-core then does with the index: index_select along the sequence, every key.
            got = {k: v.index_select(1, torch.from_numpy(index)) for k, v in batch.items()}
            assert got["tokens"].shape[1] == tokens.shape[1] // cp
            for s, p in zip(b["cu_seqlens_padded"][:-1].tolist(), spans.tolist(), strict=True):
                assert int(((index >= s) & (index < s + p)).sum()) == p // cp  # an equal share of each
        assert np.all(owner >= 0)  # every position, so every real token, on exactly one rank
        assert int(trained.sum()) == sum(
            int(trained[torch.from_numpy(np.flatnonzero(owner == r))].sum()) for r in range(cp)
        )


def te_partition_rule(cu_seqlens_padded: np.ndarray, cp: int, rank: int) -> np.ndarray:
    """The positions CP rank `rank` of `cp` holds of a THD batch, by Transformer Engine's rule."""
    out = []
    for s, e in zip(cu_seqlens_padded[:-1].tolist(), cu_seqlens_padded[1:].tolist(), strict=True):
        chunk = (e - s) // (2 * cp)
        for c in (rank, 2 * cp - 1 - rank):
            out.append(np.arange(s + c * chunk, s + (c + 1) * chunk))
    return np.concatenate(out).astype(np.int64)
