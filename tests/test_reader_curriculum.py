"""Reading a decompose dataset with tokens_per_batch and a length curriculum (iter_batches and
PackedDataset): a fixed token count a batch, one length a step on every rank, the curriculum's
schedule, every chunk once an epoch, and resume (start_step, resume=, load_state_dict)."""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.config import load_config
from raypack.packing.curriculum import Curriculum
from raypack.pipeline.job import run_job
from raypack.reader import Plan, Resume, batching_of, iter_batches, pin
from tests.conftest import job_config, make_corpus

TOKENS = 512  # a rank's batch: 1 chunk of 512, 2 of 256, ... 32 of 16


@pytest.fixture(scope="module")
def decomposed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    tmp = tmp_path_factory.mktemp("decomposed")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=80, seed=4)
    pack = {"algorithm": "decompose", "seq_len": 512, "min_seq_len": 16}
    run_job(
        load_config(
            str(job_config(tmp, f"{corpus}/*", tokenizer_path, pack=pack, output={"shard_rows": 40}))
        ),
        log=lambda _: None,
    )
    return tmp / "out"


def _key(row: np.ndarray) -> str:
    return hashlib.sha1(row.tobytes()).hexdigest()


def _all_chunks(out: Path) -> Counter[str]:
    chunks: Counter[str] = Counter()
    for path in (out / "data").rglob("*.parquet"):
        for ids in pq.read_table(path).column("input_ids").to_pylist():
            chunks[_key(np.asarray(ids, dtype=np.int64))] += 1
    return chunks


def _epoch(out: Path, world: int, **kw: object) -> list[list[dict[str, np.ndarray]]]:
    return [
        list(iter_batches(str(out), rank=r, world_size=world, seed=5, tokens_per_batch=TOKENS, **kw))
        for r in range(world)
    ]


@pytest.mark.parametrize("curriculum", ["natural", Curriculum("grow_p2", 2), Curriculum("grow_linear", 3)])
@pytest.mark.parametrize("world", [1, 3])
def test_a_fixed_token_count_one_length_a_step_and_every_chunk_at_most_once(
    decomposed: Path, curriculum: object, world: int
) -> None:
    ranks = _epoch(decomposed, world, curriculum=curriculum, last_batch="drop")
    steps = {len(r) for r in ranks}
    assert len(steps) == 1 and steps.pop() > 0
    seen: Counter[str] = Counter()
    for batches in zip(*ranks, strict=True):
        lengths = {b["input_ids"].shape[1] for b in batches}
        assert len(lengths) == 1  # every rank the same sequence length at a step
        for b in batches:
            assert b["input_ids"].size == TOKENS  # a fixed token count
            assert (b["labels"][:, 0] == -100).all() and (b["document_ids"] == 0).all()  # a chunk a row
            seen.update(_key(row) for row in b["input_ids"])
    every = _all_chunks(decomposed)
    assert max(seen.values()) == 1 and set(seen) <= set(every)  # no chunk twice
    # What "drop" leaves unread of a bucket is less than one step's chunks on all ranks.
    left = Counter()
    for k in set(every) - set(seen):
        left[k] = 1
    by_length: Counter[int] = Counter()
    for path in (decomposed / "data").rglob("*.parquet"):
        length = int(path.parent.name.split("=")[1])
        for ids in pq.read_table(path).column("input_ids").to_pylist():
            by_length[length] += _key(np.asarray(ids, dtype=np.int64)) in left
    for length, unread in by_length.items():
        assert unread < world * TOKENS // length


def test_wrap_reads_every_chunk(decomposed: Path) -> None:
    ranks = _epoch(decomposed, 2, curriculum="grow_p2", last_batch="wrap")
    seen = {_key(row) for batches in ranks for b in batches for row in b["input_ids"]}
    assert seen == set(_all_chunks(decomposed))


def test_the_steps_follow_the_curriculum_s_schedule(decomposed: Path) -> None:
    pinned = pin(str(decomposed))
    curriculum = Curriculum("grow_p2", 2)
    plan = Plan.of(pinned, batching_of(None, TOKENS, curriculum, "drop"), 0, 2, 5, "drop", None)
    lengths = [plan.buckets[b].length for b in plan.schedule.tolist()]
    got = [
        b["input_ids"].shape[1] for b in _epoch(decomposed, 2, curriculum=curriculum, last_batch="drop")[0]
    ]
    assert got == lengths
    assert got[0] == max(got)  # the longest first
    # Grow-P2 within each cycle: short sequences early, long ones late.
    half = len(got) // 2
    for cycle in (got[:half], got[half:]):
        third = len(cycle) // 3
        assert np.mean(cycle[1:third]) < np.mean(cycle[-third:])
    natural = [b["input_ids"].shape[1] for b in _epoch(decomposed, 2, last_batch="drop")[0]]
    assert sorted(natural) == sorted(got) and natural != got  # the same batches, in another order


def test_start_step_and_elastic_resume_go_on_where_the_epoch_stands(decomposed: Path) -> None:
    full = _epoch(decomposed, 2, curriculum="grow_p2", last_batch="drop")
    later = list(
        iter_batches(
            str(decomposed),
            rank=1,
            world_size=2,
            seed=5,
            tokens_per_batch=TOKENS,
            curriculum="grow_p2",
            last_batch="drop",
            start_step=4,
        )
    )
    assert [_key(b["input_ids"]) for b in later] == [_key(b["input_ids"]) for b in full[1][4:]]

    # Two ranks stop after 5 steps; one rank (and twice the tokens a batch) reads the rest.
    sha = pin(str(decomposed)).sha256
    state = {
        "batch_size": None,
        "tokens_per_batch": TOKENS,
        "curriculum": "grow_p2",
        "num_cycles": 8,
        "world_size": 2,
        "seed": 5,
        "last_batch": "drop",
        "next_step": 5,
        "resumed_from": None,
        "manifest_sha256": sha,
    }
    before = [_key(row) for r in range(2) for b in full[r][:5] for row in b["input_ids"]]
    rest = list(
        iter_batches(
            str(decomposed),
            rank=0,
            world_size=1,
            seed=5,
            tokens_per_batch=2 * TOKENS,
            curriculum="grow_p2",
            last_batch="drop",
            resume=state,
        )
    )
    assert all(b["input_ids"].size == 2 * TOKENS for b in rest)
    after = [_key(row) for b in rest for row in b["input_ids"]]
    assert len(set(before)) == len(before) and not set(before) & set(after)
    assert max(Counter(after).values()) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_dataset_saves_and_loads_its_place(decomposed: Path, workers: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from raypack.torch_data import PackedDataset

    def loader() -> StatefulDataLoader:
        ds = PackedDataset(
            str(decomposed),
            rank=0,
            world_size=1,
            seed=5,
            tokens_per_batch=TOKENS,
            curriculum="grow_p2",
            last_batch="drop",
        )
        return StatefulDataLoader(ds, batch_size=None, num_workers=workers)

    first = loader()
    it = iter(first)
    head = [next(it)["input_ids"].numpy() for _ in range(6)]
    state = first.state_dict()
    rest = [b["input_ids"].numpy() for b in it]
    again = loader()
    again.load_state_dict(state)
    resumed = [b["input_ids"].numpy() for b in again]
    assert [_key(x) for x in resumed] == [_key(x) for x in rest]
    whole = [
        b["input_ids"]
        for b in iter_batches(
            str(decomposed), seed=5, tokens_per_batch=TOKENS, curriculum="grow_p2", last_batch="drop"
        )
    ]
    assert [_key(x) for x in head + rest] == [_key(x) for x in whole]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"batch_size": 4, "tokens_per_batch": TOKENS}, "one of batch_size"),
        ({"tokens_per_batch": 100}, "not a multiple"),
        ({"tokens_per_batch": TOKENS, "last_batch": "short"}, "short"),
        ({"batch_size": 4, "curriculum": "grow_p2"}, "tokens_per_batch"),
        ({"tokens_per_batch": TOKENS, "balance": "attention"}, 'balance="attention" takes batch_size'),
    ],
)
def test_settings_a_fixed_token_count_cannot_keep_are_refused(
    decomposed: Path, kw: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        next(iter_batches(str(decomposed), **kw))  # type: ignore[arg-type]


def _positions(plan: Plan, stop: int | None = None) -> list[tuple[int, int]]:
    """(bucket, position modulo its packs) of each pack the plan's rank yields in its first `stop`
    steps, from the plan alone (nothing read)."""
    streams = plan._streams(0, None)
    out = []
    for b in plan.schedule[:stop].tolist():
        for g, first, count in streams[b].parts(plan.rows[b]):
            start = int(plan.buckets[b].starts[g]) + first
            out += [(b, (start + k) % plan.buckets[b].packs) for k in range(count)]
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.tuples(st.integers(1, 4), st.sampled_from([TOKENS, 2 * TOKENS])),
    second=st.tuples(st.integers(1, 4), st.sampled_from([TOKENS, 4 * TOKENS])),
    curriculum=st.sampled_from(
        [Curriculum("natural"), Curriculum("grow_p2", 3), Curriculum("grow_linear", 2)]
    ),
    cut=st.floats(0, 1),
)
def test_no_chunk_twice_over_a_resume_at_another_world_size_and_token_count(
    decomposed: Path, first: tuple[int, int], second: tuple[int, int], curriculum: Curriculum, cut: float
) -> None:
    """last_batch drop: W1 ranks of T1 tokens stop after some steps; W2 ranks of T2 tokens finish
    from rank 0's state: no chunk twice, every step one length on all ranks, and of each bucket
    fewer chunks unread than a round of each run."""
    pinned = pin(str(decomposed))
    (w1, t1), (w2, t2) = first, second

    def run(world: int, tokens: int, stop: int | None, resume: Resume | None) -> list[tuple[int, int]]:
        plans = [
            Plan.of(pinned, batching_of(None, tokens, curriculum, "drop"), r, world, 5, "drop", None, resume)
            for r in range(world)
        ]
        assert all(np.array_equal(p.schedule, plans[0].schedule) for p in plans)
        return [x for p in plans for x in _positions(p, stop)]

    steps1 = len(Plan.of(pinned, batching_of(None, t1, curriculum, "drop"), 0, w1, 5, "drop", None).schedule)
    s1 = int(cut * steps1)
    state = {
        "batch_size": None,
        "tokens_per_batch": t1,
        "curriculum": curriculum.name,
        "num_cycles": curriculum.num_cycles,
        "world_size": w1,
        "seed": 5,
        "last_batch": "drop",
        "next_step": s1,
    }
    yielded = run(w1, t1, s1, None) + run(w2, t2, None, Resume.of(state)[0])
    assert max(Counter(yielded).values(), default=1) == 1
    buckets = Plan.of(pinned, batching_of(None, TOKENS, curriculum, "drop"), 0, 1, 5, "drop", None).buckets
    for b, bucket in enumerate(buckets):
        unread = bucket.packs - sum(1 for x in yielded if x[0] == b)
        assert unread < (w1 * t1 + w2 * t2) // bucket.length


def test_load_state_dict_at_another_token_count_goes_on_elastically(decomposed: Path) -> None:
    """A framework's restore (make the loader, then load_state_dict) with twice the tokens a batch:
    the rest of the epoch, no chunk twice."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from raypack.torch_data import PackedDataset

    def loader(tokens: int) -> StatefulDataLoader:
        ds = PackedDataset(
            str(decomposed), seed=5, tokens_per_batch=tokens, curriculum="grow_p2", last_batch="drop"
        )
        return StatefulDataLoader(ds, batch_size=None, num_workers=0)

    first = loader(TOKENS)
    it = iter(first)
    head = [_key(row) for _ in range(5) for row in next(it)["input_ids"].numpy()]
    state = first.state_dict()
    again = loader(2 * TOKENS)
    again.load_state_dict(state)
    rest = [b["input_ids"].numpy() for b in again]
    assert rest and all(b.size == 2 * TOKENS for b in rest)
    seen = head + [_key(row) for b in rest for row in b]
    assert len(seen) == len(set(seen))


def test_buckets_a_step_cannot_fill_are_named_in_a_warning(decomposed: Path) -> None:
    """A bucket with fewer chunks than one step of every rank takes is read again to fill it (wrap)
    or never read (drop): the reader says which, where the token count is too large for it."""
    counts = {int(b.length): b.packs for b in Plan.of(pin(str(decomposed)), 1, 0, 1, 0, "wrap", None).buckets}
    large = 512 * max(counts.values())  # every bucket but the 512 one is short of one step's chunks
    with pytest.warns(UserWarning, match=r"never read: length 16 \("):
        list(iter_batches(str(decomposed), tokens_per_batch=large, last_batch="drop"))
    with pytest.warns(UserWarning, match="read again to fill it"):
        next(iter_batches(str(decomposed), tokens_per_batch=large, world_size=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(iter_batches(str(decomposed), tokens_per_batch=TOKENS))
