"""Elastic resume: an epoch saved by any rank at world size W and batch size B goes on at
another W' and B' with the packs no rank had yielded; over the old and the new ranks every pack is
yielded exactly once (last_batch "short"; "drop" and "wrap" within their rule), through a chain of
resumes, by iter_batches and by PackedDataset under torchdata's StatefulDataLoader."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.config import load_config
from raypack.pipeline.job import run_job
from raypack.reader import Plan, Resume, iter_batches, pin
from tests.conftest import assert_epoch_read_under, job_config, make_corpus


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    """Three bucket lengths, row groups of 9 packs: a few hundred packs."""
    tmp = tmp_path_factory.mktemp("elastic")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=60, seed=11)
    pack = {"seq_len": 256, "algorithm": "bucket", "bucket_lengths": [64, 128, 256]}
    cfg = job_config(tmp, f"{corpus}/*", tokenizer_path, pack=pack, output={"shard_rows": 9})
    run_job(load_config(str(cfg)), log=lambda _: None)
    return tmp / "out"


def _state(world: int, batch: int, step: int, last_batch: str, seed: int = 3, before: Any = None) -> dict:
    """A PackedDataset state_dict() of a rank of that run, `step` steps in."""
    return {
        "batch_size": batch,
        "world_size": world,
        "seed": seed,
        "last_batch": last_batch,
        "next_step": step,
        "resumed_from": before,
    }


def _positions(plan: Plan, stop: int | None = None) -> list[tuple[int, int]]:
    """(bucket, position in its sequence modulo its packs) of every pack the plan's rank yields in
    its first `stop` steps (all: None), from the plan alone (nothing read)."""
    streams = plan._streams(0, None)
    out = []
    for b in plan.schedule[:stop].tolist():
        for g, first, count in streams[b].parts(plan.rows[b]):
            start = int(plan.buckets[b].starts[g]) + first
            out += [(b, start + k) for k in range(count)]
    return out


def _run(path: Path, world: int, batch: int, last_batch: str, stop: int | None, resume: Resume | None = None):
    """Every pack each rank of a run yields in its first `stop` steps, and the steps of the run."""
    pinned = pin(str(path))
    yielded: list[tuple[int, int]] = []
    steps = 0
    for rank in range(world):
        plan = Plan.of(pinned, batch, rank, world, 3, last_batch, None, resume)
        steps = len(plan.schedule)
        yielded += _positions(plan, stop)
    return yielded, steps


@settings(max_examples=40, deadline=None)
@given(
    first=st.tuples(st.integers(1, 5), st.integers(1, 7)),
    second=st.tuples(st.integers(1, 5), st.integers(1, 7)),
    third=st.tuples(st.integers(1, 5), st.integers(1, 7)),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_every_pack_once_over_a_chain_of_world_sizes(
    bucketed: Path, first: tuple[int, int], second: tuple[int, int], third: tuple[int, int], cut: Any
) -> None:
    """last_batch short: W1 ranks stop after some steps, W2 ranks go on from rank 0's state and stop,
    W3 ranks finish from W2's rank 0 state: every pack of every bucket exactly once."""
    everything = _run(bucketed, 1, 1, "short", None)[0]
    _, steps1 = _run(bucketed, *first, "short", None)
    s1 = int(cut[0] * steps1)
    a, _ = _run(bucketed, *first, "short", s1)
    one = Resume.of(_state(*first, s1, "short"))[0]
    _, steps2 = _run(bucketed, *second, "short", None, one)
    s2 = int(cut[1] * steps2)
    b, _ = _run(bucketed, *second, "short", s2, one)
    two = Resume.of(_state(*second, s2, "short", before=one.to_state()))[0]
    c, _ = _run(bucketed, *third, "short", None, two)
    assert sorted(a + b + c) == sorted(everything)


@pytest.mark.parametrize("last_batch", ["drop", "wrap"])
def test_drop_and_wrap_keep_their_rule_across_a_resume(bucketed: Path, last_batch: str) -> None:
    """4 ranks of 3 stop half-way; 3 ranks of 5 finish: under drop no pack twice and fewer than a
    round of each run left out per bucket; under wrap every pack at least once and no more repeats
    than a round of each run per bucket."""
    everything = Counter(_run(bucketed, 1, 1, "short", None)[0])
    _, steps = _run(bucketed, 4, 3, last_batch, None)
    a, _ = _run(bucketed, 4, 3, last_batch, steps // 2)
    b, _ = _run(bucketed, 3, 5, last_batch, None, Resume.of(_state(4, 3, steps // 2, last_batch))[0])
    assert_epoch_read_under(last_batch, everything, Counter(a + b), 4 * 3 + 3 * 5)


def _digests(batches: Any) -> list[str]:
    return [hashlib.sha1(np.asarray(row).tobytes()).hexdigest() for b in batches for row in b["input_ids"]]


def test_iter_batches_goes_from_four_ranks_to_two_to_three(bucketed: Path) -> None:
    """The packs themselves (read, as digests): 4 ranks of batch 3 take 2 steps, 2 ranks of batch 5
    take 1 step from rank 3's state, 3 ranks of batch 2 finish from the 2-rank run's rank 0 state:
    together every pack once."""
    path, sha = str(bucketed), pin(str(bucketed)).sha256
    every = Counter(_digests(iter_batches(path, 1, 0, 1, seed=3, last_batch="short")))
    seen = []
    for rank in range(4):
        batches = iter_batches(path, 3, rank, 4, seed=3, last_batch="short")
        seen += _digests(b for _, b in zip(range(2), batches, strict=False))
    at_four = _state(4, 3, 2, "short") | {"manifest_sha256": sha}
    for rank in range(2):
        batches = iter_batches(path, 5, rank, 2, seed=3, last_batch="short", resume=at_four)
        seen += _digests(b for _, b in zip(range(1), batches, strict=False))
    before = Resume.of(at_four)[0].to_state()
    at_two = _state(2, 5, 1, "short", before=before) | {"manifest_sha256": sha}
    for rank in range(3):
        seen += _digests(iter_batches(path, 2, rank, 3, seed=3, last_batch="short", resume=at_two))
    assert Counter(seen) == every
    with pytest.raises(ValueError, match="resume it with that seed"):
        next(iter_batches(path, 5, 0, 2, seed=4, last_batch="short", resume=at_four))
    with pytest.raises(ValueError, match="a rebuild committed since"):
        next(iter_batches(path, 5, 0, 2, seed=3, resume=at_four | {"manifest_sha256": "0" * 64}))


def test_a_stateful_dataloader_state_resumes_on_another_world_size(bucketed: Path) -> None:
    """PackedDataset under StatefulDataLoader: 2 ranks (2 DataLoader workers each) stop after 3
    batches; rank 1's loader state resumes the epoch on 3 ranks of batch 4 (one with workers, two
    without); the 3-rank run's own state resumes again; every pack once. A state given to
    load_state_dict at another world size says to resume instead."""
    pytest.importorskip("torch")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from raypack.torch_data import PackedDataset

    def loader(ds: PackedDataset, workers: int) -> Any:
        return StatefulDataLoader(
            ds, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None
        )

    every = Counter(_digests(iter_batches(str(bucketed), 1, 0, 1, seed=3, last_batch="short")))
    seen: list[str] = []
    states = []
    for rank in range(2):
        dl = loader(PackedDataset(str(bucketed), 2, rank, 2, seed=3, last_batch="short"), 2)
        it = iter(dl)
        seen += _digests([next(it) for _ in range(3)])
        states.append(dl.state_dict())
        del it
    with pytest.raises(ValueError, match="one DataLoader worker's of a loader with several"):
        PackedDataset(str(bucketed), 4, 0, 3, seed=3, last_batch="short").load_state_dict(
            states[1]["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
        )
    # Three ranks go on from rank 1's state and all stop after 2 batches; rank 0's state (a loader
    # with workers) then resumes the rest on one rank.
    again = None
    for rank in range(3):
        ds = PackedDataset(str(bucketed), 4, rank, 3, seed=3, last_batch="short", resume=states[1])
        dl = loader(ds, 2 if rank == 0 else 0)
        it = iter(dl)
        seen += _digests([next(it) for _ in range(2)])
        if rank == 0:
            again = dl.state_dict()
        del it
    assert again is not None
    rest = _digests(iter_batches(str(bucketed), 3, 0, 1, seed=3, last_batch="short", resume=again))
    assert rest and Counter(seen + rest) == every


def test_load_state_dict_resumes_on_another_world_size_as_torchtitan_restores(bucketed: Path) -> None:
    """A framework's checkpointer (torchtitan's, Lightning's) makes the loader, then calls its
    load_state_dict: 2 ranks of batch 2 (StatefulDataLoader, no workers) stop after 3 batches; 3
    ranks of batch 4 each load one old rank's loader state into a fresh loader and stop after 2;
    one rank loads a new rank's state and finishes: every pack once. Another seed is refused."""
    pytest.importorskip("torch")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from raypack.torch_data import PackedDataset

    path = str(bucketed)

    def loader(batch: int, rank: int, world: int) -> Any:
        return StatefulDataLoader(
            PackedDataset(path, batch, rank, world, seed=3, last_batch="short"), batch_size=None
        )

    every = Counter(_digests(iter_batches(path, 1, 0, 1, seed=3, last_batch="short")))
    seen: list[str] = []
    old = []
    for rank in range(2):
        dl = loader(2, rank, 2)
        it = iter(dl)
        seen += _digests([next(it) for _ in range(3)])
        old.append(dl.state_dict())
    new = []
    for rank in range(3):
        dl = loader(4, rank, 3)
        dl.load_state_dict(old[rank % 2])  # any old rank's: they stood at the same step
        it = iter(dl)
        seen += _digests([next(it) for _ in range(2)])
        new.append(dl.state_dict())
    last = loader(3, 0, 1)
    last.load_state_dict(new[2])
    seen += _digests(list(last))
    assert Counter(seen) == every
    other = StatefulDataLoader(PackedDataset(path, 4, 0, 3, seed=4, last_batch="short"), batch_size=None)
    other.load_state_dict(old[0])  # (the loader hands it to the dataset when iterated)
    with pytest.raises(ValueError, match="seed"):
        next(iter(other))


def test_a_state_that_cannot_say_where_the_epoch_stands_is_refused(bucketed: Path) -> None:
    """Each a ValueError that says what is wrong, never a replayed or shortened epoch."""
    from raypack.torch_data import PackedDataset

    path, sha = str(bucketed), pin(str(bucketed)).sha256

    def resumed(state: dict[str, Any], **kw: Any) -> Any:
        return next(iter_batches(path, 2, 0, 3, seed=3, last_batch="short", resume=state, **kw))

    good = _state(2, 4, 3, "short") | {"manifest_sha256": sha}
    assert resumed(good)["input_ids"].shape[0] == 2
    finished = PackedDataset(path, 4, 0, 2, seed=3, last_batch="short")
    for _ in finished:
        pass
    with pytest.raises(ValueError, match="holds no position"):  # after its epoch: not step 0
        resumed(finished.state_dict())
    for bad, match in [
        ({"next_step": -4}, "step -4 is negative"),
        ({"world_size": 0}, "need 0 <= rank < world_size"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"last_batch": "bogus"}, "last_batch must be one of"),
        ({"next_step": 10**6}, "past the"),
        ({"resumed_from": [{"world_size": 2}]}, "not a raypack PackedDataset state"),
    ]:
        with pytest.raises(ValueError, match=match):
            resumed(good | bad)
    with pytest.raises(ValueError, match="does not say which version"):
        resumed(_state(2, 4, 3, "short"))
    assert resumed(_state(2, 4, 3, "short"), follow_latest=True)["input_ids"].shape[0] == 2
    with pytest.raises(ValueError, match="not a StatefulDataLoader state"):
        resumed({"_snapshot": {"_worker_snapshots": {"w": {"dataset_state": good}}}})
    with pytest.raises(ValueError, match="resume it with that seed"):  # at once, not at the first batch
        PackedDataset(path, 2, 0, 3, seed=4, last_batch="short", resume=good)
