"""raypack.reader against real job outputs: ranks partition the packs, order is seeded and resumable,
and the training fields agree with a direct computation from doc_offsets."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from raypack.config import load_config
from raypack.pipeline.job import run_job
from raypack.reader import IGNORE_INDEX, iter_batches, read_packed
from raypack.verifier import verify
from tests.conftest import job_config, make_corpus


def _pack_job(tmp: Path, tokenizer: Path, **pack: object) -> Path:
    corpus = make_corpus(tmp, shards=3, docs_per_shard=60, seed=11)
    cfg = job_config(tmp, f"{corpus}/*", tokenizer, pack={"seq_len": 256, **pack}, output={"shard_rows": 9})
    run_job(load_config(str(cfg)), log=lambda _: None)
    return tmp / "out"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    return _pack_job(tmp_path_factory.mktemp("reader"), tokenizer_path)


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    return _pack_job(
        tmp_path_factory.mktemp("reader-buckets"),
        tokenizer_path,
        algorithm="bucket",
        bucket_lengths=[64, 128, 256],
    )


def _digests(batch: dict[str, np.ndarray]) -> list[str]:
    return [hashlib.sha1(row.tobytes()).hexdigest() for row in batch["input_ids"]]


def _all_packs(out: Path) -> list[str]:
    table = pq.read_table(out / "data")
    length = {f["path"]: f["bucket_length"] for f in json.loads((out / "manifest.json").read_text())["files"]}
    digests = []
    for path in sorted(length):
        ids = pq.read_table(out / path).column("input_ids").to_pylist()
        digests += [hashlib.sha1(np.asarray(r, dtype=np.int64).tobytes()).hexdigest() for r in ids]
    assert len(digests) == table.num_rows
    return digests


@pytest.mark.parametrize(("world", "batch"), [(1, 4), (3, 5), (4, 1), (7, 16)])
def test_short_ranks_cover_every_pack_once_in_the_same_number_of_steps(
    packed: Path, world: int, batch: int
) -> None:
    seen: list[str] = []
    steps = []
    for rank in range(world):
        batches = list(iter_batches(str(packed), batch, rank, world, seed=3, last_batch="short"))
        steps.append(len(batches))
        assert all(len(b["input_ids"]) <= batch for b in batches)
        seen += [d for b in batches for d in _digests(b)]
    assert len(set(steps)) == 1
    assert sorted(seen) == sorted(_all_packs(packed))


@pytest.mark.parametrize(("world", "batch"), [(1, 4), (3, 5), (4, 1), (7, 16), (64, 8)])
def test_wrap_and_drop_give_every_rank_full_batches(packed: Path, world: int, batch: int) -> None:
    """No rank ever gets a short or empty batch (an empty one is a NaN loss under DDP). wrap (the
    default) reads every pack, repeating fewer than world × batch of them; drop repeats none and
    leaves fewer than world × batch unread."""
    every = _all_packs(packed)
    for last_batch in ("wrap", "drop"):
        per_rank = [
            [_digests(b) for b in iter_batches(str(packed), batch, r, world, seed=3, last_batch=last_batch)]
            for r in range(world)
        ]
        assert len({len(batches) for batches in per_rank}) == 1
        assert all(len(b) == batch for batches in per_rank for b in batches)
        seen = [d for batches in per_rank for b in batches for d in b]
        if last_batch == "wrap":
            assert set(seen) == set(every) and len(seen) - len(every) < world * batch
            assert len(seen) == -(-len(every) // (world * batch)) * world * batch
        else:
            assert len(set(seen)) == len(seen) and 0 <= len(every) - len(seen) < world * batch
    default = [_digests(b) for b in iter_batches(str(packed), batch, world - 1, world, seed=3)]
    wrapped = [
        _digests(b) for b in iter_batches(str(packed), batch, world - 1, world, seed=3, last_batch="wrap")
    ]
    assert default == wrapped


def test_readers_plan_from_the_manifest_without_reading_footers(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank reading every file's footer at start is files × ranks GETs (10M for 10k files and 1k
    ranks): the manifest lists each file's row groups, and the first batch opens one file."""
    import raypack.reader as reader_module

    manifest = json.loads((packed / "manifest.json").read_text())
    assert len(manifest["files"]) > 3
    for f in manifest["files"]:
        meta = pq.ParquetFile(packed / f["path"]).metadata
        assert f["row_groups"] == [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    opened = []
    real = reader_module.pq.ParquetFile

    def counting(*args: object, **kwargs: object) -> pq.ParquetFile:
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(reader_module.pq, "ParquetFile", counting)
    next(iter_batches(str(packed), 1, rank=1, world_size=3))
    assert len(opened) == 1  # the first pack's file, for its data
    # verify holds the manifest's row groups to the files.
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    manifest["files"][0]["row_groups"] = [1] * len(manifest["files"][0]["row_groups"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.undo()
    problems = verify(str(copy)).problems
    assert any("row groups" in p and manifest["files"][0]["path"] in p for p in problems), problems


def test_order_is_seeded_and_a_resumed_run_continues_exactly(packed: Path) -> None:
    run = [_digests(b) for b in iter_batches(str(packed), 4, 1, 2, seed=5)]
    again = [_digests(b) for b in iter_batches(str(packed), 4, 1, 2, seed=5)]
    other = [_digests(b) for b in iter_batches(str(packed), 4, 1, 2, seed=6)]
    assert run == again and run != other
    # A new seed reorders the whole sequence, so a rank gets other packs; all ranks together, the same.
    both = [
        d
        for r in (0, 1)
        for b in iter_batches(str(packed), 4, r, 2, seed=6, last_batch="short")
        for d in _digests(b)
    ]
    assert sorted(both) == sorted(_all_packs(packed)) and set(d for b in other for d in b) != set(
        d for b in run for d in b
    )
    resumed = [_digests(b) for b in iter_batches(str(packed), 4, 1, 2, seed=5, start_step=5)]
    assert resumed == run[5:]


def _direct(input_ids: list[int], offsets: list[int], length: int) -> tuple[list[int], list[int], list[int]]:
    """labels, position_ids and document number of each position, from doc_offsets by hand."""
    labels, positions, doc = [], [], []
    for t in range(length):
        i = next((k for k in range(len(offsets) - 1) if offsets[k] <= t < offsets[k + 1]), None)
        if i is None:  # padding: a segment of its own
            positions.append(t - offsets[-1])
            labels.append(IGNORE_INDEX)
            doc.append(-1)
            continue
        positions.append(t - offsets[i])
        labels.append(input_ids[t + 1] if t + 1 < offsets[i + 1] else IGNORE_INDEX)
        doc.append(i)
    return labels, positions, doc


def test_labels_positions_and_cu_seqlens_match_doc_offsets_and_no_token_sees_another_document(
    packed: Path,
) -> None:
    table = pq.read_table(packed / "data")
    by_digest = {
        hashlib.sha1(np.asarray(r["input_ids"], dtype=np.int64).tobytes()).hexdigest(): r
        for r in table.to_pylist()
    }
    checked = 0
    for batch in iter_batches(str(packed), 3, seed=1, last_batch="short"):
        rows, length = batch["input_ids"].shape
        cu = batch["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == rows * length and np.all(np.diff(cu) > 0)
        assert batch["max_seqlen"] == int(np.diff(cu).max())
        segment = np.searchsorted(cu, np.arange(rows * length), side="right") - 1
        for r, digest in enumerate(_digests(batch)):
            row = by_digest[digest]
            labels, positions, doc = _direct(row["input_ids"], row["doc_offsets"], length)
            assert batch["shift_labels"][r].tolist() == labels  # the target of each position
            assert batch["labels"][r].tolist() == [IGNORE_INDEX, *labels[:-1]]  # aligned: HF shifts
            assert batch["position_ids"][r].tolist() == positions
            assert batch["document_ids"][r].tolist() == doc
            # The block-diagonal causal mask flash-attention builds from cu_seqlens: i attends to j
            # when both are in one segment and j <= i. Every such pair lies in one document (or both
            # in the padding), and every causal pair inside a document is allowed.
            seg = segment[r * length : (r + 1) * length]
            same_segment = seg[:, None] == seg[None, :]
            same_doc = np.asarray(doc)[:, None] == np.asarray(doc)[None, :]
            causal = np.tril(np.ones((length, length), dtype=bool))
            assert np.array_equal(same_segment & causal, same_doc & causal)
            checked += 1
    assert checked == table.num_rows


def test_bucket_batches_never_mix_lengths_and_ranks_agree_on_the_bucket(bucketed: Path) -> None:
    world = 3
    per_rank = [
        list(iter_batches(str(bucketed), 2, r, world, seed=9, last_batch="short")) for r in range(world)
    ]
    assert len({len(b) for b in per_rank}) == 1
    lengths_seen = set()
    for step in zip(*per_rank, strict=True):
        widths = {b["input_ids"].shape[1] for b in step}
        assert len(widths) == 1  # one bucket per step, on every rank
        lengths_seen |= widths
    assert lengths_seen == {64, 128, 256}
    seen = [d for batches in per_rank for b in batches for d in _digests(b)]
    assert sorted(seen) == sorted(_all_packs(bucketed))


@pytest.mark.ray
def test_read_packed_is_a_ray_dataset_of_every_pack(packed: Path) -> None:
    ds = read_packed(str(packed))
    manifest = json.loads((packed / "manifest.json").read_text())
    assert ds.count() == manifest["counts"]["packs"]
    row = ds.take(1)[0]
    assert len(row["input_ids"]) == row["bucket_length"] == 256
    assert sum(r["num_tokens"] for r in ds.iter_rows()) == manifest["counts"]["tokens"]


def test_mistakes_are_clear(packed: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no complete raypack dataset"):
        next(iter_batches(str(tmp_path), 2))
    with pytest.raises(ValueError, match="rank < world_size"):
        next(iter_batches(str(packed), 2, rank=2, world_size=2))
    with pytest.raises(ValueError, match="batch_size"):
        next(iter_batches(str(packed), 0))
    with pytest.raises(ValueError, match="last_batch must be one of wrap, drop, short"):
        next(iter_batches(str(packed), 2, last_batch="pad"))
    try:
        import torch
    except ImportError:
        with pytest.raises(ImportError, match="raypack\\[torch\\]"):
            next(iter_batches(str(packed), 2, torch=True))
    else:
        batch = next(iter_batches(str(packed), 2, torch=True))
        assert isinstance(batch["input_ids"], torch.Tensor) and batch["input_ids"].dtype == torch.int64
