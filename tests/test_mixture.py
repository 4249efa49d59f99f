"""raypack.mixture, pure: targets from weights, repeats and budgets; the seeded cut; copies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.config import ConfigError, InputConfig, SourceConfig, from_dict
from raypack.mixture import (
    BINS,
    KEY_BITS,
    Cut,
    boundary_bin,
    copies,
    copy_tokens,
    cut,
    document_keys,
    kept,
    rule_for,
    subset_goal,
    targets,
    token_bins,
)


def source(name: str, **rule: float) -> SourceConfig:
    return SourceConfig(name=name, paths=(f"{name}/*",), **rule)  # type: ignore[arg-type]


def test_weights_alone_are_relative_and_the_scarcest_source_sets_the_size() -> None:
    t = targets([source("web", weight=3), source("code", weight=1)], {"web": 1000, "code": 100})
    # code (25% of the output) can give 100 tokens at most: the output is 400, web gives 300 of its 1000.
    assert (t["web"].target, t["code"].target) == (300, 100)
    assert t["web"].share == pytest.approx(0.75) and t["code"].repeat == 1.0
    t = targets([source("web", weight=3), source("code", weight=1, max_repeat=4)], {"web": 1000, "code": 100})
    assert (t["web"].target, t["code"].target) == (999, 333)  # code repeats 3.33x; web whole, but a rounding
    t = targets([source("web", weight=0.5), source("code", weight=0.5)], {"web": 500, "code": 500}, 600)
    assert (t["web"].target, t["code"].target) == (300, 300)


def test_weights_beside_repeats_and_budgets_are_shares_of_the_whole() -> None:
    sources = [
        source("a", repeat=2.5),
        source("b", tokens=100),
        source("c", weight=0.5, max_repeat=10),
        source("d"),
    ]
    t = targets(sources, {"a": 40, "b": 400, "c": 50, "d": 200})
    # fixed: a 100, b 100, d 200 = 400 = half of the whole: c gives the other 400 (8x its 50).
    assert {k: v.target for k, v in t.items()} == {"a": 100, "b": 100, "c": 400, "d": 200}
    assert [t[k].asked for k in "abcd"] == ["repeat 2.5", "tokens 100", "weight 0.5", "whole"]


@pytest.mark.parametrize(
    ("sources", "available", "total", "message"),
    [
        (
            [source("a", weight=0.5), source("b", weight=0.5)],
            {"a": 100, "b": 10},
            400,
            r"a \(weight 0.5\) needs 200 tokens, 2\.00× the 100 tokens it keeps",
        ),
        (
            [source("a", tokens=500), source("b")],
            {"a": 100, "b": 10},
            None,
            r"a \(tokens 500\) needs 500 tokens, 5\.00× the 100 tokens it keeps, over its max_repeat 1",
        ),
        (
            [source("a", weight=0.6), source("b", weight=0.5), source("c")],
            {"a": 1, "b": 1, "c": 1},
            None,
            "must sum below 1; they sum to 1.1",
        ),
        (
            [source("a", weight=1), source("b", weight=1)],
            {"a": 0, "b": 100},
            10,
            "a has a weight but no tokens",
        ),
        (
            [source("a", tokens=5), source("b")],
            {"a": 0, "b": 100},
            None,
            r"a \(tokens 5\) needs 5 tokens but keeps none \(every record rejected.*longer than seq_len",
        ),
    ],
)
def test_targets_that_cannot_be_met_are_config_errors_with_the_numbers(
    sources: list[SourceConfig], available: dict[str, int], total: int | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        targets(sources, available, total)


def _cut_of(keys: np.ndarray, n: np.ndarray, goal: int, parts: int, chunk: int) -> Cut:
    """The driver's path: token bins summed over shards cut anywhere, the boundary bin's documents,
    the cut."""
    hist = np.zeros(BINS, dtype=np.int64)
    for part in np.array_split(np.arange(len(n)), parts):  # shards: partial histograms, summed
        bins, tokens = token_bins(keys[part], n[part])
        np.add.at(hist, bins, tokens)
    b, before = boundary_bin(hist, goal)
    inside = (keys >> np.uint64(64 - KEY_BITS)).astype(np.int64) == b
    return cut(goal, before, keys[inside], n[inside], b, chunk)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=400),
    fraction=st.floats(0.0, 1.0),
    parts=st.integers(1, 5),
    chunk=st.sampled_from([0, 1, 64, 700, 4096]),
    seed=st.integers(0, 2**31),
)
def test_the_cut_lands_nearest_the_goal_whatever_the_shards(
    lengths: list[int], fraction: float, parts: int, chunk: int, seed: int
) -> None:
    """The subset (keys below the threshold, and a partial copy of whole chunks of the next
    document) lands at the point nearest the goal among every prefix in key order and every whole
    number of chunks of the next document: within half of min(chunk, the longest document) with
    chunks, half the longest document without; the same whatever the shards (keys are per file
    and row)."""
    n = np.array(lengths, dtype=np.int64)
    rows = np.arange(1, len(n) + 1)
    keys = document_keys(seed, "web/part-000.jsonl", rows)
    assert np.array_equal(keys, document_keys(seed, "web/part-000.jsonl", rows))  # fixed per document
    total = int(n.sum())
    goal = round(fraction * total)
    if not 0 < goal < total:
        return
    found = _cut_of(keys, n, goal, parts, chunk)
    assert found == _cut_of(keys, n, goal, 1, chunk)
    every = found.threshold >= 1 << 64
    chosen = np.ones(len(n), dtype=bool) if every else keys < np.uint64(found.threshold)
    realized = int(n[chosen].sum())
    if found.partial_tokens:
        (j,) = np.flatnonzero(keys == np.uint64(found.partial_key))
        assert not chosen[j] and found.partial_tokens % chunk == 0 and 0 < found.partial_tokens < n[j]
        realized += found.partial_tokens
    # Every point the cut could land on: each prefix in key order, and each whole number of chunks
    # of the document after it.
    ordered = n[np.argsort(keys)]
    running = np.r_[0, np.cumsum(ordered)]
    points = set(running.tolist())
    if chunk:
        points |= {
            int(r) + m * chunk
            for r, size in zip(running[:-1], ordered, strict=True)
            for m in range(1, -(-int(size) // chunk))
        }
    assert abs(realized - goal) == min(abs(p - goal) for p in points)
    assert 2 * abs(realized - goal) <= (min(chunk, int(n.max())) if chunk else int(n.max()))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=300),
    repeat=st.floats(0.05, 4.0),
    chunk=st.sampled_from([0, 16, 128]),
    seed=st.integers(0, 1000),
)
def test_copies_give_the_target_within_half_a_chunk(
    lengths: list[int], repeat: float, chunk: int, seed: int
) -> None:
    n = np.array(lengths, dtype=np.int64)
    keys = document_keys(seed, "code/a.jsonl", np.arange(len(n)))
    t = targets([source("code", repeat=repeat)], {"code": int(n.sum())})["code"]
    goal = subset_goal(t)
    found = _cut_of(keys, n, goal, 1, chunk) if goal else None
    rule = rule_for("code", t, found)
    k = copies(rule, keys)
    assert set(np.unique(k).tolist()) <= {rule.full, rule.full + 1}
    assert rule.layers >= int(k.max(initial=0))  # a subset may come out empty: an empty last layer
    selected = sum(int(copy_tokens(rule, keys[k > c], n[k > c], c).sum()) for c in range(rule.layers))
    assert 2 * abs(selected - t.target) <= (min(chunk, int(n.max())) if chunk else int(n.max()))
    # Only the last layer's copy of the cut's document is partial.
    short = [c for c in range(rule.layers) if (copy_tokens(rule, keys[k > c], n[k > c], c) < n[k > c]).any()]
    assert short == ([rule.full] if rule.partial_tokens else [])


@pytest.mark.parametrize(
    ("overflow", "want"),
    [("split", [10, 64, 65, 500]), ("truncate", [10, 64, 64, 64]), ("drop", [10, 64, 0, 0])],
)
def test_kept_tokens_are_what_overflow_leaves(overflow: str, want: list[int]) -> None:
    assert kept(np.array([10, 64, 65, 500]), 64, overflow).tolist() == want


def test_keys_differ_by_seed_file_and_row_and_spread_over_the_bins() -> None:
    rows = np.arange(200_000)
    a = document_keys(0, "web/a.jsonl", rows)
    assert len(np.unique(a)) == len(rows)
    assert not np.array_equal(a, document_keys(1, "web/a.jsonl", rows))
    assert not np.array_equal(a, document_keys(0, "web/b.jsonl", rows))
    per_bin = np.bincount((a >> np.uint64(64 - KEY_BITS)).astype(np.int64), minlength=BINS)
    assert per_bin.max() < 20  # ~3 a bin: no clumping


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"paths": ["x/*"], "sources": [{"name": "a", "paths": ["a/*"]}]}, "not both"),
        (
            {"sources": [{"name": "a", "paths": ["a/*"]}, {"name": "a", "paths": ["b/*"]}]},
            "'a' is given twice",
        ),
        ({"sources": [{"name": "web text", "paths": ["a/*"]}]}, "source name 'web text' must be"),
        (
            {"sources": [{"name": "a", "paths": ["a/*"], "weight": 1, "repeat": 2}]},
            "one of weight, repeat, tokens",
        ),
        (
            {"sources": [{"name": "a", "paths": ["a/*"], "repeat": 3, "max_repeat": 2}]},
            "repeat 3 is over its max_repeat 2",
        ),
        ({"sources": [{"name": "a", "paths": ["a/*"], "max_repeat": 0.5}]}, r"max_repeat must be >= 1"),
        ({"sources": [{"name": "a", "paths": ["a/*"], "weight": -1}]}, r"weight must be > 0"),
        ({"sources": [{"name": "a", "paths": []}]}, r"input.sources\[a\].paths is empty"),
        (
            {
                "sources": [{"name": "a", "paths": ["a/*"], "weight": 0.5}, {"name": "b", "paths": ["b/*"]}],
                "tokens": 10,
            },
            "b have none",
        ),
        ({"paths": ["a/*"], "tokens": 10}, "needs input.sources"),
        ({"sources": [{"name": "a", "paths": ["a/*"], "format": "csv"}]}, r"format must be one of"),
    ],
)
def test_bad_sources_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(InputConfig, data)


def test_a_source_inherits_what_it_leaves_out() -> None:
    cfg = from_dict(
        InputConfig,
        {
            "format": "parquet",
            "text_field": "content",
            "sources": [{"name": "a", "paths": ["a/*"]}, {"name": "b", "paths": ["b/*"], "format": "jsonl"}],
        },
    )
    assert (cfg.of("a").format, cfg.of("a").text_field, cfg.of("a").paths) == ("parquet", "content", ("a/*",))
    assert cfg.of("b").format == "jsonl" and cfg.of("") is cfg and cfg.all_paths == ("a/*", "b/*")
    assert SourceConfig(name="c", paths=("c",), repeat=2.5).cap == 2.5
    assert SourceConfig(name="c", paths=("c",), weight=0.1).cap == 1.0
