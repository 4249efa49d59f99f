"""Packing quality on lognormal(6.0, 1.2) lengths, the benchmark distribution (quality only, no timing:
speed lives in benchmarks/). The default tier uses 200k documents; the slow tier the benchmark's 10M."""

from __future__ import annotations

import numpy as np
import pytest

from raypack.metrics import compute_metrics
from raypack.packing import ALGORITHMS, check_assignment, pack

# (algorithm, seq_len) → minimum efficiency; from issue 2's targets, and measured values for the rest.
FLOORS = {
    ("bfd", 2048): 0.9999,
    ("bfd", 8192): 0.9999,
    ("lpfhp", 2048): 0.9999,
    ("lpfhp", 8192): 0.9999,
    ("spfhp", 2048): 0.995,
    ("spfhp", 8192): 0.985,  # measured 98.97-99.20%: Krell's worst fit leaves room at long contexts
    ("nnlshp", 2048): 0.99,
    ("nnlshp", 8192): 0.99,
    ("bucket", 2048): 0.999,
    ("bucket", 8192): 0.999,
    ("ffd", 2048): 0.9999,
    ("ffd", 8192): 0.9999,
    ("greedy", 2048): 0.80,
    ("greedy", 8192): 0.85,
    ("concat", 2048): 0.9999,
    ("concat", 8192): 0.9999,
    ("decompose", 2048): 1.0,  # a chunk a pack: no padding ever
    ("decompose", 8192): 1.0,
}


def lognormal(n: int) -> np.ndarray:
    return np.maximum(1, np.random.default_rng(0).lognormal(6.0, 1.2, n)).astype(np.int64)


def check_quality(lengths: np.ndarray, algorithm: str, seq_len: int) -> None:
    a = pack(lengths, seq_len, algorithm)
    check_assignment(a)
    m = compute_metrics(a)
    assert m.efficiency >= FLOORS[algorithm, seq_len]
    assert m.tokens == lengths.sum()
    if algorithm in ("bfd", "lpfhp"):
        assert m.packs <= 1.0001 * m.lower_bound
    if algorithm == "decompose":
        # Every document whose length is not one power of two up to seq_len is cut (its binary form).
        whole = (lengths <= seq_len) & ((lengths & (lengths - 1)) == 0)
        assert m.truncation_ratio == pytest.approx(np.mean(~whole))
    elif algorithm != "concat":
        # Only documents longer than the context are cut (Ding et al.): concat cuts wherever.
        assert m.truncation_ratio == pytest.approx(np.mean(lengths > seq_len))


@pytest.mark.parametrize("seq_len", [2048, 8192])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_quality_200k(algorithm: str, seq_len: int) -> None:
    check_quality(lognormal(200_000), algorithm, seq_len)


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [2048, 8192])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_quality_10m(algorithm: str, seq_len: int) -> None:
    check_quality(lognormal(10_000_000), algorithm, seq_len)
