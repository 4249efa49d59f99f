"""iter_batches and PackedDataset with balance="attention", on a real job's output: every pack once
across ranks and epochs, the same bytes on every run, an elastic resume at another world size (and
from or to an unbalanced run), torch's DataLoader with workers, and steps whose ranks cost alike
where the unbalanced reader's do not."""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack import balance as balance_module
from raypack.balance import Balance, imbalance, neighbourhood, pack_terms, positions_of, spans_of
from raypack.config import load_config
from raypack.formats import read_offsets
from raypack.packing import PackPermutation
from raypack.pipeline.job import run_job
from raypack.reader import Plan, Resume, _key, _share, iter_batches, pin
from tests.conftest import assert_epoch_read_under, job_config, make_corpus

ATTENTION = Balance(per_token=0.0)
SMALL = Balance(per_token=0.0, window=12, rank_window=3)
"""Windows small enough that the test datasets' epochs hold many, in neighbourhoods of a few ranks."""


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    """Three bucket lengths, row groups of 9 packs, documents up to ~3,000 tokens cut at 256: a
    few hundred packs of very different attention costs."""
    tmp = tmp_path_factory.mktemp("balance")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=60, seed=11)
    pack = {"seq_len": 256, "algorithm": "bucket", "bucket_lengths": [64, 128, 256]}
    cfg = job_config(tmp, f"{corpus}/*", tokenizer_path, pack=pack, output={"shard_rows": 9})
    run_job(load_config(str(cfg)), log=lambda _: None)
    return tmp / "out"


def _digests(batches: Any) -> list[str]:
    return [hashlib.sha1(np.asarray(row).tobytes()).hexdigest() for b in batches for row in b["input_ids"]]


def _cost(batch: dict[str, Any]) -> float:
    """Σ l² of the batch's documents, from the fields the model is given (document_ids)."""
    docs = np.asarray(batch["document_ids"])
    total = 0.0
    for row in docs:
        _, counts = np.unique(row[row >= 0], return_counts=True)
        total += float((counts.astype(np.float64) ** 2).sum())
    return total


def _positions(plan: Plan, stop: int | None = None) -> list[tuple[int, int]]:
    """(bucket, position) of every pack the plan's rank yields in its first `stop` steps, unread."""
    streams = plan._streams(0, None)
    out = []
    for b in plan.schedule[:stop].tolist():
        for g, first, count in streams[b].parts(plan.rows[b]):
            start = int(plan.buckets[b].starts[g]) + first
            out += [(b, start + k) for k in range(count)]
    return out


def _run(
    path: Path,
    world: int,
    batch: int,
    stop: int | None,
    resume: Resume | None,
    balance: Any,
    last_batch: str = "short",
):
    pinned = pin(str(path))
    yielded: list[tuple[int, int]] = []
    steps = 0
    for rank in range(world):
        plan = Plan.of(pinned, batch, rank, world, 3, last_batch, None, resume, balance)
        steps = len(plan.schedule)
        yielded += _positions(plan, stop)
    return yielded, steps


def _state(
    world: int, batch: int, step: int, balance: Balance | None, before: Any = None, last_batch: str = "short"
) -> dict:
    return {
        "batch_size": batch,
        "world_size": world,
        "seed": 3,
        "last_batch": last_batch,
        "next_step": step,
        "balance": balance.to_state() if balance is not None else None,
        "resumed_from": before,
    }


@pytest.mark.parametrize(("world", "batch"), [(8, 2), (3, 1)])
def test_every_pack_once_an_epoch_and_each_steps_ranks_cost_alike(
    bucketed: Path, world: int, batch: int
) -> None:
    """Read, as digests: over the ranks every pack once, in two epochs (seeds) alike, every rank
    the same number of steps and one bucket length a step; the ranks' costs at each step, from
    the batches' document_ids, closer than the unbalanced reader's."""
    path = str(bucketed)
    every = Counter(_digests(iter_batches(path, 1, 0, 1, seed=3, last_batch="short")))
    for seed in (3, 4):
        ranks = [
            list(iter_batches(path, batch, r, world, seed=seed, last_batch="short", balance="attention"))
            for r in range(world)
        ]
        assert Counter(_digests(b for rank in ranks for b in rank)) == every
        assert len({len(rank) for rank in ranks}) == 1
        for step in zip(*ranks, strict=True):
            assert len({b["input_ids"].shape[1] for b in step}) == 1
    costs = {}
    for balance in (None, "attention"):
        ranks = [
            list(iter_batches(path, batch, r, world, seed=3, last_batch="drop", balance=balance))
            for r in range(world)
        ]
        costs[balance] = imbalance(np.array([[_cost(b) for b in rank] for rank in ranks]).T)
    assert costs["attention"] < costs[None]
    assert costs["attention"] < 1.10


def test_the_same_settings_give_the_same_bytes_and_wrap_drop_keep_full_batches(bucketed: Path) -> None:
    """Two runs of 3 ranks give byte-identical batches; wrap and drop batches are all full; the
    balanced order is not the unbalanced one."""
    path = str(bucketed)
    for last_batch in ("wrap", "drop"):
        runs = [
            [
                b
                for r in range(3)
                for b in iter_batches(path, 2, r, 3, seed=5, last_batch=last_batch, balance="attention")
            ]
            for _ in range(2)
        ]
        assert _digests(runs[0]) == _digests(runs[1])
        assert all(b["input_ids"].shape[0] == 2 for b in runs[0])
        assert all(np.array_equal(a["labels"], b["labels"]) for a, b in zip(*runs, strict=True))
    # wrap: every pack at least once, fewer than a round (3 ranks × 2) again in each of 3 buckets
    wrapped = _digests(b for r in range(3) for b in iter_batches(path, 2, r, 3, seed=5, balance="attention"))
    every = set(_digests(iter_batches(path, 1, 0, 1, seed=5, last_batch="short")))
    assert set(wrapped) == every and len(wrapped) - len(every) < 3 * 6
    balanced = _digests(iter_batches(path, 2, 0, 3, seed=5, balance="attention"))
    assert balanced != _digests(iter_batches(path, 2, 0, 3, seed=5))


@settings(max_examples=12, deadline=None)
@given(
    first=st.tuples(st.integers(1, 5), st.integers(1, 4), st.sampled_from([None, ATTENTION, SMALL])),
    second=st.tuples(st.integers(1, 5), st.integers(1, 4), st.sampled_from([None, ATTENTION, SMALL])),
    third=st.tuples(st.integers(1, 4), st.integers(1, 4), st.sampled_from([None, ATTENTION, SMALL])),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_every_pack_once_over_a_chain_of_world_sizes_balanced_or_not(
    bucketed: Path, first: Any, second: Any, third: Any, cut: Any
) -> None:
    """W1 ranks stop mid-epoch, W2 ranks go on from rank 0's state and stop, W3 ranks finish, each
    run balanced (in one window, or in many of small neighbourhoods) or not: every pack of every
    bucket exactly once."""
    runs = [first, second, third]
    everything = _run(bucketed, 1, 1, None, None, None)[0]
    _, steps1 = _run(bucketed, *runs[0][:2], None, None, runs[0][2])
    s1 = int(cut[0] * steps1)
    a, _ = _run(bucketed, *runs[0][:2], s1, None, runs[0][2])
    one = Resume.of(_state(*runs[0][:2], s1, runs[0][2]))[0]
    _, steps2 = _run(bucketed, *runs[1][:2], None, one, runs[1][2])
    s2 = int(cut[1] * steps2)
    b, _ = _run(bucketed, *runs[1][:2], s2, one, runs[1][2])
    two = Resume.of(_state(*runs[1][:2], s2, runs[1][2], before=one.to_state()))[0]
    c, _ = _run(bucketed, *runs[2][:2], None, two, runs[2][2])
    assert sorted(a + b + c) == sorted(everything)


@pytest.mark.parametrize("balance", [ATTENTION, SMALL])
@pytest.mark.parametrize("last_batch", ["drop", "wrap"])
def test_drop_and_wrap_keep_their_rule_across_a_balanced_resume(
    bucketed: Path, last_batch: str, balance: Balance
) -> None:
    """4 balanced ranks of 3 stop half-way, 3 balanced ranks of 5 finish: under drop no pack twice
    and fewer than a round of each run left out per bucket; under wrap every pack at least once and
    fewer repeats than a round of each run per bucket."""
    everything = Counter(_run(bucketed, 1, 1, None, None, None)[0])
    _, steps = _run(bucketed, 4, 3, None, None, balance, last_batch)
    a, _ = _run(bucketed, 4, 3, steps // 2, None, balance, last_batch)
    resume = Resume.of(_state(4, 3, steps // 2, balance, last_batch=last_batch))[0]
    b, _ = _run(bucketed, 3, 5, None, resume, balance, last_batch)
    assert_epoch_read_under(last_batch, everything, Counter(a + b), 4 * 3 + 3 * 5)


def test_a_balanced_dataloader_with_workers_resumes_on_another_world_size(bucketed: Path) -> None:
    """PackedDataset(balance="attention") under StatefulDataLoader with 2 workers gives iter_batches'
    batches in step order; 2 ranks stop after 3 batches, and 3 ranks of batch 3 finish, one made
    with resume= under 2 workers, two restoring a fresh loader with load_state_dict (as torchtitan
    does): every pack once."""
    pytest.importorskip("torch")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from raypack.torch_data import PackedDataset

    path = str(bucketed)
    every = Counter(_digests(iter_batches(path, 1, 0, 1, seed=3, last_batch="short")))

    def dataset(batch: int, rank: int, world: int) -> PackedDataset:
        return PackedDataset(path, batch, rank, world, seed=3, last_batch="short", balance="attention")

    whole = StatefulDataLoader(
        dataset(2, 1, 2), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    want = _digests(iter_batches(path, 2, 1, 2, seed=3, last_batch="short", balance="attention"))
    assert _digests(whole) == want
    seen: list[str] = []
    old = []
    for rank in range(2):
        dl = StatefulDataLoader(dataset(2, rank, 2), batch_size=None)
        it = iter(dl)
        seen += _digests([next(it) for _ in range(3)])
        old.append(dl.state_dict())
    for rank in range(3):
        if rank == 0:  # resume= with 2 workers (they share the row groups they read)
            ds = PackedDataset(
                path, 3, rank, 3, seed=3, last_batch="short", balance="attention", resume=old[0]
            )
            dl = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        else:  # load_state_dict into a fresh loader, as torchtitan restores
            dl = StatefulDataLoader(dataset(3, rank, 3), batch_size=None)
            dl.load_state_dict(old[rank % 2])
        seen += _digests(list(dl))
    assert Counter(seen) == every


def test_a_bad_balance_is_one_clear_error(bucketed: Path) -> None:
    from raypack.torch_data import PackedDataset

    with pytest.raises(ValueError, match="balance must be one of attention or None, got 'tokens'"):
        next(iter_batches(str(bucketed), 2, balance="tokens"))
    with pytest.raises(ValueError, match="per_token must be a finite number >= 0"):
        PackedDataset(str(bucketed), 2, balance="attention", balance_per_token=float("nan"))


@pytest.fixture(scope="module")
def many_groups(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    """One bucket of packs of 64 tokens in row groups of 8 packs (a file each): over 100 groups,
    several to every rank at 8 and 32 ranks."""
    tmp = tmp_path_factory.mktemp("groups")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=120, seed=5)
    cfg = job_config(tmp, f"{corpus}/*", tokenizer_path, pack={"seq_len": 64}, output={"shard_rows": 8})
    run_job(load_config(str(cfg)), log=lambda _: None)
    return tmp / "out"


def _loads(plan: Plan) -> list[tuple[int, int]]:
    """The (bucket, row group) of every row group the plan's rank decodes over its epoch, its
    batches read through the plan's own loader."""
    loads: list[tuple[int, int]] = []

    def load(bucket: int, group: int) -> Any:
        loads.append((bucket, group))
        return plan.read(bucket, group)

    for _ in plan.steps(0, 1, load):
        pass
    return loads


@pytest.mark.parametrize("world", [8, 32])
def test_a_balanced_rank_decodes_its_neighbourhoods_row_groups_not_every_one(
    many_groups: Path, world: int
) -> None:
    """Windows of 16 packs a rank and 64 a neighbourhood (4 ranks): over its epoch each balanced rank
    decodes at most 4 × groups / world + 8 row groups (its 4 shares' groups; a group at a share's
    edge again where another share of the neighbourhood read it long before); an unbalanced rank
    decodes groups /
    world + 2. Every pack is still yielded once over the ranks, and the steps' ranks cost closer
    alike than unbalanced."""
    pinned = pin(str(many_groups))
    groups = sum(len(b.groups) for b in Plan.of(pinned, 2, 0, 1, 3, "short", None).buckets)
    assert groups >= 80
    seen: list[tuple[int, int]] = []
    costs = {}
    small = Balance(per_token=0.0, window=64, rank_window=16)
    for balance in (None, small):
        per_rank = []
        for rank in range(world):
            plan = Plan.of(pinned, 2, rank, world, 3, "short", None, None, balance)
            loads = _loads(plan)
            bound = (4 * groups / world + 8) if balance is not None else (groups / world + 2)
            assert len(loads) <= bound
            if balance is not None:
                seen += _positions(plan)
            per_rank.append([_cost(b) for b in plan.steps(0, 1)])
        costs[balance] = imbalance(np.array(per_rank).T)
    assert sorted(seen) == sorted(_run(many_groups, 1, 1, None, None, None)[0])
    assert costs[small] < costs[None]


def test_a_balanced_rank_holds_only_its_own_rows(bucketed: Path) -> None:
    """A step's packs jump between the row groups of their window's slices: the rank keeps what it
    reads of them, the rows it yields alone, not whole groups."""
    plan = Plan.of(pin(str(bucketed)), 2, 1, 4, 3, "short", None, None, ATTENTION)
    streams = plan._streams(0, plan.read)
    for b in plan.schedule.tolist():
        streams[b].take(plan.rows[b])
    held = sum(t.num_rows for s in streams for t in s._cached.values())
    assert 0 < held <= len(_positions(plan))


@pytest.mark.parametrize("last_batch", ["drop", "short"])
def test_attention_imbalance_is_what_the_ranks_batches_cost(bucketed: Path, last_batch: str) -> None:
    """The figure from the pack indexes alone is the one the batches give: each rank's Σ l² a
    step from its batches' document_ids, unbalanced and balanced, 3 ranks of 2 packs."""
    from raypack.reader import attention_imbalance

    path = str(bucketed)
    got = attention_imbalance(path, 2, 3, seed=3, last_batch=last_batch, balance_per_token=0)
    for balance, name in ((None, "unbalanced"), ("attention", "balanced")):
        ranks = [
            list(
                iter_batches(
                    path, 2, r, 3, seed=3, last_batch=last_batch, balance=balance, balance_per_token=0
                )
            )
            for r in range(3)
        ]
        assert got[name] == pytest.approx(imbalance(np.array([[_cost(b) for b in rank] for rank in ranks]).T))
    assert got["balanced"] < got["unbalanced"]


def _all_packs_steps(
    costs: np.ndarray, shares: np.ndarray, batch: int, key: int, balance: Balance
) -> tuple[np.ndarray, np.ndarray]:
    """The reference: raypack.balance.balanced_steps as it was before a rank planned from its
    neighbourhood alone, every neighbourhood's steps from every pack's costs in one pass."""
    world = len(shares)
    first = np.r_[0, np.cumsum(shares)[:-1]]
    full = int(shares.min()) // batch
    size = neighbourhood(world, batch, full, balance.window, balance.rank_window)
    groups = balance_module._groups(world, size)
    per_window = max(1, balance.rank_window // batch)
    step = np.empty(len(costs), dtype=np.int64)
    rank = np.empty(len(costs), dtype=np.int64)
    for k, lo in enumerate(range(0, full, per_window)):
        steps = min(per_window, full - lo)
        order = PackPermutation(steps, balance_module._key(key, k))(np.arange(steps))
        for g, ranks in enumerate(groups):
            packs = (first[ranks, None] + lo * batch + np.arange(steps * batch)).reshape(-1)
            at, place = balance_module._pool(costs[packs], len(ranks), steps, balance_module._key(key, k, g))
            step[packs] = lo + order[at]
            rank[packs] = ranks[place]
    for r in range(world):
        rest = np.arange(first[r] + full * batch, first[r] + shares[r])
        step[rest] = full + np.arange(len(rest)) // batch
        rank[rest] = r
    return step, rank


def _all_packs_shares(
    path: Path, batch: int, world: int, seed: int, last_batch: str, balance: Balance
) -> list[list[list[tuple[int, int]]]]:
    """Every rank's balanced share of every bucket of a fresh epoch as the reader planned it before:
    every pack index file's doc_offsets read whole, every pack's cost, _all_packs_steps."""
    pinned = pin(str(path))
    files = pinned.manifest["files"]
    out: list[list[list[tuple[int, int]]]] = [[] for _ in range(world)]
    for bucket in Plan.of(pinned, batch, 0, 1, seed, last_batch, None).buckets:
        squares, tokens = np.zeros(bucket.packs), np.zeros(bucket.packs)
        for g, group in enumerate(bucket.groups):
            offsets = read_offsets(pinned.path, files[group.entry], None)
            sq, tok = pack_terms(offsets.flatten().to_numpy(), np.diff(offsets.offsets.to_numpy()))
            order = np.argsort(
                PackPermutation(group.rows, _key(seed, "rows", group.name, group.index))(
                    np.arange(group.rows)
                )
            )
            rows = group.first + order
            lo, hi = int(bucket.starts[g]), int(bucket.starts[g + 1])
            squares[lo:hi], tokens[lo:hi] = sq[rows], tok[rows]
        costs = balance.cost(squares, tokens)
        bounds = [_share(bucket.packs, r, world, batch, last_batch)[:2] for r in range(world)]
        real = positions_of([(0, bucket.packs)], np.arange(bounds[-1][1]))
        shares = np.array([hi - lo for lo, hi in bounds])
        step, owner = _all_packs_steps(
            costs[real], shares, batch, _key(seed, "balance", bucket.length), balance
        )
        for r in range(world):
            mine = np.flatnonzero(owner == r)
            out[r].append(spans_of(real[mine[np.argsort(step[mine], kind="stable")]]))
    return out


@settings(max_examples=14, deadline=None)
@given(
    world=st.integers(1, 9),
    batch=st.integers(1, 4),
    seed=st.integers(0, 3),
    last_batch=st.sampled_from(["wrap", "drop", "short"]),
    balance=st.sampled_from(
        [ATTENTION, SMALL, Balance(window=20, rank_window=4), Balance(window=6, rank_window=6)]
    ),
)
def test_a_fresh_balanced_epoch_plans_every_rank_as_the_all_packs_computation(
    bucketed: Path, world: int, batch: int, seed: int, last_batch: str, balance: Balance
) -> None:
    """Each rank's plan, from its neighbourhood's costs alone, takes the very positions in the very
    order that every pack's costs and every neighbourhood's steps gave (_all_packs_shares): its
    batches are the same bytes."""
    pinned = pin(str(bucketed))
    want = _all_packs_shares(bucketed, batch, world, seed, last_batch, balance)
    for rank in range(world):
        plan = Plan.of(pinned, batch, rank, world, seed, last_batch, None, None, balance)
        assert plan.shares == want[rank]


def test_a_balanced_rank_reads_its_neighbourhoods_index_files_alone(
    many_groups: Path, tmp_path: Path
) -> None:
    """8 ranks in 2 neighbourhoods of 4 (windows of 16 packs a rank, 64 a neighbourhood): with every
    file that holds none of the first neighbourhood's packs deleted, its ranks still plan as every
    pack's costs give (_all_packs_shares, on the whole dataset) and yield the same bytes; so do the
    ranks that take its leftovers after a resume."""
    small = Balance(per_token=0.0, window=64, rank_window=16)
    want = _all_packs_shares(many_groups, 2, 8, 3, "short", small)
    whole = pin(str(many_groups))
    bucket = Plan.of(whole, 2, 0, 1, 3, "short", None).buckets[0]
    shares = np.array([sum(b - a for a, b in want[r][0]) for r in range(8)])
    assert small.neighbourhood(8, 2, int(shares.min()) // 2) == 4
    positions = np.concatenate([np.arange(a, b) for r in range(4) for a, b in want[r][0]])
    groups = np.unique(np.searchsorted(bucket.starts, positions, side="right") - 1)
    kept = {whole.manifest["files"][bucket.groups[g].entry]["path"] for g in groups.tolist()}
    copy = tmp_path / "copy"
    shutil.copytree(many_groups, copy)
    dropped = [f["path"] for f in whole.manifest["files"] if f["path"] not in kept]
    assert len(dropped) >= len(whole.manifest["files"]) // 3
    for name in dropped:
        (copy / name).unlink()
    for rank in range(4):
        plan = Plan.of(pin(str(copy)), 2, rank, 8, 3, "short", None, None, small)
        assert plan.shares == want[rank]
        assert _digests(plan.steps(0, 1)) == _digests(
            Plan.of(whole, 2, rank, 8, 3, "short", None, None, small).steps(0, 1)
        )
    with pytest.raises(FileNotFoundError):
        Plan.of(pin(str(copy)), 2, 7, 8, 3, "short", None, None, small)
    # Resumed half-way by 8 other ranks of 3 packs: the first 4 take what the first neighbourhood
    # left (each neighbourhood left as many packs), from its files alone.
    steps = len(Plan.of(whole, 2, 0, 8, 3, "short", None, None, small).schedule)
    resume = Resume.of(_state(8, 2, steps // 2, small))[0]
    for rank in range(4):
        got = Plan.of(pin(str(copy)), 3, rank, 8, 3, "short", None, resume, small)
        assert got.shares == Plan.of(whole, 3, rank, 8, 3, "short", None, resume, small).shares


@settings(max_examples=14, deadline=None)
@given(
    first=st.tuples(st.integers(1, 6), st.integers(1, 3), st.sampled_from([ATTENTION, SMALL])),
    then=st.tuples(st.integers(1, 6), st.integers(1, 4), st.sampled_from([None, ATTENTION, SMALL])),
    cut=st.floats(0, 1),
    last_batch=st.sampled_from(["wrap", "drop", "short"]),
)
def test_a_resume_of_a_balanced_run_plans_as_every_packs_leftovers_give(
    bucketed: Path, first: Any, then: Any, cut: float, last_batch: str
) -> None:
    """After one balanced run that began the epoch, each new rank's plan, made from the earlier run's
    neighbourhoods that its own holds packs of, yields the positions in the order that every pack's
    costs and Run.left's whole leftovers give (a chain of two runs takes that path)."""
    pinned = pin(str(bucketed))
    w1, b1, balance1 = first
    steps = len(Plan.of(pinned, b1, 0, w1, 3, last_batch, None, None, balance1).schedule)
    one = Resume.of(_state(w1, b1, int(cut * steps), balance1, last_batch=last_batch))[0]
    chained = Resume.of(
        _state(
            w1, b1, 0, balance1, before=Resume.of(_state(1, 1, 0, None))[0].to_state(), last_batch=last_batch
        )
    )[0]
    w2, b2, balance2 = then
    for rank in range(w2):
        got = Plan.of(pinned, b2, rank, w2, 3, last_batch, None, one, balance2)
        want = _reference_resume(pinned, one, b2, rank, w2, last_batch, balance2)
        assert [_flat(s) for s in got.shares] == [_flat(s) for s in want]
    assert len(chained.runs) == 2
    Plan.of(pinned, b2, 0, w2, 3, last_batch, None, chained, balance2)


def _flat(spans: list[tuple[int, int]]) -> list[int]:
    return [p for a, b in spans for p in range(a, b)]


def _reference_resume(
    pinned: Any, resume: Resume, batch: int, rank: int, world: int, last_batch: str, balance: Balance | None
) -> list[list[tuple[int, int]]]:
    """A rank's share of each bucket after `resume`'s one run, from every pack's terms: Run.left's
    whole leftovers, then _all_packs_steps over them (or the unbalanced split)."""
    from raypack.reader import _terms, _within

    buckets = Plan.of(pinned, batch, 0, 1, 3, last_batch, None).buckets
    terms = _terms(pinned, buckets, 3, None)
    left = resume.runs[0].left(buckets, [[(0, b.packs)] for b in buckets], (), terms)
    out = []
    for i, (bucket, spans) in enumerate(zip(buckets, left, strict=True)):
        total = sum(b - a for a, b in spans)
        bounds = [_share(total, r, world, batch, last_batch)[:2] for r in range(world)]
        if balance is None:
            out.append(_within(spans, *bounds[rank]))
            continue
        real = positions_of(spans, np.arange(bounds[-1][1]))
        costs = balance.cost(*terms[i])[real]
        shares = np.array([hi - lo for lo, hi in bounds])
        key = _key(3, "balance", bucket.length, *resume.salt())
        step, owner = _all_packs_steps(costs, shares, batch, key, balance)
        mine = np.flatnonzero(owner == rank)
        out.append(spans_of(real[mine[np.argsort(step[mine], kind="stable")]]))
    return out


def test_attention_imbalance_of_an_epoch_with_no_step_is_an_error(bucketed: Path) -> None:
    """More ranks × packs than the dataset holds under drop: no step to measure, said, not 1.0."""
    from raypack.reader import attention_imbalance

    with pytest.raises(ValueError, match="make no step of 100,000 ranks"):
        attention_imbalance(str(bucketed), 2, 100_000)
