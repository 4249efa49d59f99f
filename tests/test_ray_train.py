"""Ray Train reading a packed dataset: a real TorchTrainer (CPU, two workers) on the local Ray, as
docs/trainers.md's example ("Ray Train") does it, both ways: read_packed's Ray Dataset split by Ray
Train (training_batches), and iter_batches at the worker's rank. Each pack's fields are checked
against iter_batches' for that pack, and which worker got which pack is collected from files the
workers write."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raypack.cli import main
from raypack.reader import iter_batches, read_packed
from tests.conftest import job_config, make_corpus

pytestmark = pytest.mark.ray

WORKERS = 2
BATCH = 4


def _key(row: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(row).tobytes()).hexdigest()


def _loop(config: dict[str, Any]) -> None:
    """The train loop: both ways of reading, each batch's rows saved as the worker got them."""
    import ray.train

    from raypack.reader import iter_batches, training_batches

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    out = Path(config["out"])
    shard = ray.train.get_dataset_shard("train")
    for i, batch in enumerate(training_batches(shard, BATCH)):
        np.savez(out / f"data-{rank}-{i}.npz", **{k: np.asarray(v) for k, v in batch.items()})
    steps = iter_batches(config["path"], BATCH, rank=rank, world_size=world, last_batch="short")
    for i, batch in enumerate(steps):
        np.savez(out / f"ranks-{rank}-{i}.npz", input_ids=batch["input_ids"])


def test_a_torch_trainer_reads_every_pack_with_iter_batches_fields(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    corpus = make_corpus(tmp_path / "c", shards=3, docs_per_shard=60, seed=11)
    cfg = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, output={"path": str(tmp_path / "out"), "shard_rows": 30}
    )
    assert main(["pack", str(cfg), "--quiet"]) == 0
    path = str(tmp_path / "out")
    # Each pack's fields alone (a batch of one), by its tokens: the reference.
    reference = {}
    for b in iter_batches(path, 1, last_batch="short"):
        if len(b["input_ids"]):
            reference[_key(b["input_ids"][0])] = b
    packs = sum(1 for _ in iter_batches(path, 1, last_batch="short"))
    assert len(reference) == packs > 20  # packs are told apart by their tokens

    seen = tmp_path / "seen"
    seen.mkdir()
    trainer = TorchTrainer(
        _loop,
        train_loop_config={"out": str(seen), "path": path},
        datasets={"train": read_packed(path)},
        # Half a CPU a worker: Ray Data's read tasks need the rest of the test's 2 CPUs.
        scaling_config=ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=str(tmp_path / "train"), name="read-packs"),
    )
    result = trainer.fit()
    assert result.error is None

    # read_packed through Ray Train's split: no pack twice; its split is equal, so fewer than
    # WORKERS packs may reach no worker; every row has the fields iter_batches gives that pack.
    got: dict[int, list[str]] = {r: [] for r in range(WORKERS)}
    for f in sorted(seen.glob("data-*.npz")):
        batch = np.load(f)
        rank = int(f.name.split("-")[1])
        ids, length = batch["input_ids"], batch["input_ids"].shape[1]
        assert 1 <= len(ids) <= BATCH and batch["cu_seqlens"][-1] == len(ids) * length
        for r, row in enumerate(ids):
            want = reference[_key(row)]
            got[rank].append(_key(row))
            for field in ("labels", "shift_labels", "position_ids", "document_ids"):
                np.testing.assert_array_equal(batch[field][r], want[field][0], err_msg=field)
            # This row's segments of the batch's cu_seqlens are the pack's own, moved by r rows.
            cu = batch["cu_seqlens"].astype(np.int64)
            mine = cu[(cu >= r * length) & (cu <= (r + 1) * length)] - r * length
            np.testing.assert_array_equal(mine, want["cu_seqlens"])
    everyone = got[0] + got[1]
    assert all(got.values()) and len(everyone) == len(set(everyone))
    assert set(everyone) <= set(reference) and packs - len(everyone) < WORKERS
    assert abs(len(got[0]) - len(got[1])) == 0  # the split is equal

    # iter_batches at each worker's rank: every pack exactly once over the workers.
    ranks = [_key(row) for f in sorted(seen.glob("ranks-*.npz")) for row in np.load(f)["input_ids"]]
    assert sorted(ranks) == sorted(reference)


@pytest.mark.slow  # 15 s; read_packed's other arguments are test_reader's in the light tier
def test_read_packed_of_one_bucket_length_and_a_length_it_does_not_have(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = make_corpus(tmp_path / "c", shards=2, docs_per_shard=40, seed=12)
    cfg = job_config(
        tmp_path,
        f"{corpus}/*",
        tokenizer_path,
        pack={"algorithm": "bucket", "bucket_lengths": [128, 512]},
        output={"path": str(tmp_path / "out")},
    )
    assert main(["pack", str(cfg), "--quiet"]) == 0
    from raypack.reader import training_batches

    path = str(tmp_path / "out")
    short = read_packed(path, bucket=128)
    lengths = {b["input_ids"].shape[1] for b in training_batches(short, 8)}
    assert lengths == {128}
    every = read_packed(path)
    mixed = [b["input_ids"].shape[1] for b in training_batches(every, 1000)]
    assert set(mixed) == {128, 512}  # a batch of several lengths is cut where the length changes
    assert sum(len(b["input_ids"]) for b in training_batches(every, 7)) == every.count()
    with pytest.raises(ValueError, match="no packs of length 256"):
        read_packed(path, bucket=256)
    with pytest.raises(ValueError, match="bucket must be a pack length"):
        read_packed(path, bucket="128")  # type: ignore[arg-type]
    import ray.data

    plain = ray.data.read_parquet(str(tmp_path / "out" / "data"))
    with pytest.raises(ValueError, match="lack bucket_length, pad_id"):
        next(training_batches(plain, 4))
